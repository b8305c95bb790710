"""Jacobians of the drift (docs/model.md section 5) over the flattened state ``v = (M, upper triangle of Q, b)`` of
:func:`singleloc.theory._theory.flatten_state` (``b`` only when the biases train).

``jax.jacobian`` of the drift, or central finite differences where it cannot be trusted: the derivative of
``jnp.linalg.eigh`` (inside ``Q^{1/2}``) divides by the gaps between eigenvalues, so where ``Q`` has repeated
eigenvalues (symmetric states with ``H >= 3``, or with ``M = 0``) autodiff is NaN when the computed eigenvalues are
exactly equal and finite but wrong when rounding separates them (15% off at a symmetric ``H = 3`` state).
``Q^{1/2}`` itself is smooth there, so differences are accurate. The fallback is taken when two eigenvalues of
``Q`` are within ``_EIGH_GAP_RTOL`` of each other (relative), when autodiff is not finite, and always for a route
whose autodiff is exact to first order only (a joint layer on the exact route, whose token expectation is
differentiated by Price's theorem with its conditional law held fixed:
:attr:`~singleloc.expectations._expectation.AbstractExpectation.second_derivatives`). One routine
(:func:`_jacobian`) serves the full drift (:func:`drift_jacobian`, linearised by :func:`~singleloc.linearize`) and
the drift restricted to the symmetric subspace (the gauge detection of :func:`~singleloc.unspecialized_point`).
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..runtime._numerics import TINY
from ..theory._theory import OrderParameterODE, flatten_state, unflatten_state

#: Eigenvalues of ``Q`` closer than this fraction of its largest ``|eigenvalue|`` count as
#: repeated (module docstring). Above it, the rounding error of the eigenvector derivatives,
#: ``~ 1e-16 |Q| / gap``, stays below 1e-10 relative, under the finite-difference error.
_EIGH_GAP_RTOL = 1e-6


def _flat_drift(ode: OrderParameterODE, v: jax.Array, b: jax.Array, H: int, F: int) -> jax.Array:
    """The drift over :func:`flatten_state` coordinates; ``b`` is used when biases are frozen."""
    d = ode.drift(*unflatten_state(v, H, F, b))
    return flatten_state(d.M, d.Q, d.b, bool(ode.train_bias))


# One compilation per ODE structure and state shape (equinox traces the ODE's arrays; H, F are static).
_flat_drift_jit = eqx.filter_jit(_flat_drift)
_flat_drift_jacobian = eqx.filter_jit(jax.jacobian(_flat_drift, argnums=1))


def _repeated_eigenvalues(Q) -> bool:
    """Whether two eigenvalues of the symmetric ``Q`` are within ``_EIGH_GAP_RTOL`` (relative)."""
    w = np.linalg.eigvalsh(np.asarray(Q, float))
    return len(w) > 1 and bool(np.min(np.diff(w)) <= _EIGH_GAP_RTOL * max(np.abs(w).max(), TINY))


def _jacobian(field: Callable, jacobian: Callable, v0, Q, *, method: str, step: float,
              differentiable: bool = True, basis=None) -> tuple[np.ndarray, str]:
    """Jacobian of the vector field ``field(v)`` at ``v0`` (a state whose ``Q`` is given) and the
    method used; with ``basis`` (n, k), its product ``J U`` with those directions (differences
    along the k columns instead of the n axes: 2k evaluations of the field instead of 2n).

    ``jacobian(v)`` is its ``jax.jacobian``. ``method="autodiff"`` uses it; ``"finite-difference"``
    takes central differences with relative step ``step`` (``h_i = step * max(1, |v0_i|)``);
    ``"auto"`` uses autodiff unless ``Q`` has repeated eigenvalues or autodiff is not finite,
    then differences (module docstring). ``differentiable``: whether autodiff of the field is its
    derivative (the route's :attr:`~singleloc.expectations._expectation.AbstractExpectation.second_derivatives`);
    if not, ``"auto"`` takes differences and ``"autodiff"`` is refused.
    """
    if method not in ("auto", "autodiff", "finite-difference"):
        raise ValueError(f"method must be 'auto', 'autodiff' or 'finite-difference', got {method!r}")
    if method == "autodiff" and not differentiable:
        raise ValueError("method = 'autodiff': this drift's autodiff is not its derivative (a joint layer on the exact "
                         "route is differentiated once, by Price's theorem); use method = 'auto' or 'finite-difference'")
    v0 = jnp.asarray(v0, dtype=jnp.result_type(float))
    if method == "autodiff" or (method == "auto" and differentiable and not _repeated_eigenvalues(Q)):
        J = np.asarray(jacobian(v0))
        if np.all(np.isfinite(J)) or method == "autodiff":
            return (J if basis is None else J @ basis), "autodiff"
    U = np.eye(len(v0)) if basis is None else np.asarray(basis, float)
    cols = []
    for u in U.T:  # the step of an axis i: step * max(1, |v0_i|); of a direction, the largest over its support
        h = step * max(1.0, float(np.max(np.abs(np.asarray(v0))[u != 0], initial=0.0)))
        delta = jnp.asarray(h * u, v0.dtype)
        cols.append((np.asarray(field(v0 + delta)) - np.asarray(field(v0 - delta))) / (2 * h))
    return np.stack(cols, axis=1), "finite-difference"


def drift_jacobian(ode: OrderParameterODE, M, Q, b, *, method: str = "auto", step: float = 1e-6,
                   basis=None) -> tuple[np.ndarray, str]:
    """Jacobian of ``ode.drift`` over :func:`flatten_state` coordinates at ``(M, Q, b)``, and the
    method used (``method``, ``step`` and ``basis`` as :func:`_jacobian`'s)."""
    M = jnp.asarray(M, dtype=jnp.result_type(float))
    Q, b = jnp.asarray(Q, dtype=M.dtype), jnp.asarray(b, dtype=M.dtype)
    H, F = M.shape
    v0 = flatten_state(M, Q, b, bool(ode.train_bias))
    return _jacobian(lambda v: _flat_drift_jit(ode, v, b, H, F), lambda v: _flat_drift_jacobian(ode, v, b, H, F), v0, Q,
                     method=method, step=step, differentiable=ode.expectation.second_derivatives, basis=basis)
