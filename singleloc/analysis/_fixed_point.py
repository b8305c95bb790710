"""The unspecialized fixed point of the ODE (docs/model.md section 5).

The head-symmetric subspace (coordinates ``x = [m (F), r_d, r_o, b_0]``,
:func:`singleloc.analysis._stability.symmetric_state`) is invariant under the flow and contains the
unspecialized fixed point (:func:`unspecialized_point`: the restricted flow, then a root finder whose
point must be a valid set of overlaps, :func:`valid_symmetric_state`).
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Real
from scipy import optimize

from ..ground._validation import integer
from ..runtime._numerics import PSD_ROUNDING, TINY
from ..runtime._progress import Phase
from ..theory._theory import OrderParameterODE
from ._drift_jacobian import _jacobian
from ._stability import _symmetric_risk, symmetric_drift, symmetric_flow, symmetric_start, symmetric_state

#: ``xtol`` of the root finder that polishes the fixed point: the relative change of the
#: coordinates below which MINPACK's ``hybr`` stops, about 450 float64 ulps (the drift's
#: rounding, not the tolerance, then limits the residual).
_ROOT_XTOL = 1e-13


def valid_symmetric_state(x, H: int, F: int) -> bool:
    """Whether symmetric coordinates ``x`` are finite overlaps of real keys: ``R_orth = r_d I + r_o 1 1^T`` is PSD, i.e.
    its eigenvalues ``r_d`` and ``r_d + H r_o`` are non-negative (up to the rounding slack ``PSD_ROUNDING`` relative to
    the size of ``Q``: a point on the boundary of the PSD cone, not more); then ``Q = M M^T + R_orth`` is PSD too."""
    x = np.asarray(x, float)
    if not np.all(np.isfinite(x)):
        return False
    m, rd = x[:F], x[F]
    ro = x[F + 1] if H > 1 else 0.0
    slack = PSD_ROUNDING * (1.0 + H * (m @ m + abs(rd) + abs(ro)))
    return bool(min(rd, rd + H * ro) >= -slack)


# One compilation per ODE structure and state shape (equinox traces the ODE's arrays; H, F are static).
_symmetric_drift_jit = eqx.filter_jit(symmetric_drift)
_symmetric_drift_jacobian = eqx.filter_jit(jax.jacobian(symmetric_drift, argnums=1))
_symmetric_risk_jit = eqx.filter_jit(_symmetric_risk)


@dataclasses.dataclass(frozen=True)
class FixedPoint:
    """The unspecialized fixed point: state ``M`` (H, F), ``Q`` (H, H), ``b`` (H,); symmetric coordinates ``x``;
    ``residual`` = max |drift| there; ``converged``; its ``risk``; the symmetric trajectory ``path_*`` that led to it."""

    M: np.ndarray
    Q: np.ndarray
    b: np.ndarray
    x: np.ndarray
    residual: float
    converged: bool
    risk: float
    path_tau: np.ndarray
    path_x: np.ndarray
    path_risk: np.ndarray


def unspecialized_point(ode: OrderParameterODE, H: int, F: int, x0: Real[ArrayLike, " N"] | None = None, *,
                        init_scale: float = 0.5, bias_init: float = 0.0,
                        tau_flow: float = 60.0, dt: float = 0.1, polish: bool = True, tol: float = 1e-10) -> FixedPoint:
    """The unspecialized (head-symmetric) fixed point of the ODE.

    Integrates the restricted flow (:func:`~singleloc.analysis._stability.symmetric_flow`, step ``dt``) from ``x0``
    (default: ``M = 0``, ``R_orth = init_scale^2 I``, ``b = bias_init``, the ``D -> infinity`` limit of a random
    start) for ``tau_flow``, then polishes with ``scipy.optimize.root`` over the coordinates the drift depends on:
    a coordinate whose row and column of the restricted Jacobian vanish (below ``1e-8`` of its largest entry) is a
    gauge and is left alone (a common bias shift is a symmetry of softmax and bsoftmax). The polished point is kept
    only if it is a valid set of overlaps (``R_orth`` PSD, :func:`valid_symmetric_state`) and its residual is
    smaller; otherwise the flow's end point is kept. ``converged`` tells whether the residual fell below ``tol``.
    Where the restricted flow creeps (slow modes) it has no fixed point within reach: at the default problem
    (softmax, spikes of strength 2.5) the root finder lands at ``r_d = -0.29``, outside the valid set, and the
    result is the flow's end point with ``converged=False``; use the rate along the flow there
    (:func:`~singleloc.escape_rate_along`, :func:`singleloc.analysis._predictions.predicted_escape`).
    """
    H, F = integer("H", H, 1), integer("F", F, 1)
    if x0 is None:
        x0 = symmetric_start(H, F, init_scale, bias_init)
    with Phase((f"following the symmetric flow of {H} heads to tau = {tau_flow:g} ({ode.expectation.route} route)",
                "followed the symmetric flow")):
        taus, xs, risks = symmetric_flow(ode, x0, H, F, tau_flow, dt)
    x = xs[-1].copy()

    def drift(z):
        return np.asarray(_symmetric_drift_jit(ode, jnp.asarray(z), H, F))

    if polish:
        with Phase(("polishing the fixed point (a root of the drift)", "polished the fixed point"), quiet=True):
            x = _polished(ode, drift, x, H, F)
    res = float(np.max(np.abs(drift(x))))
    M, Q, b = (np.asarray(a) for a in symmetric_state(jnp.asarray(x), H, F))
    risk = float(_symmetric_risk_jit(ode, jnp.asarray(x), H, F))
    return FixedPoint(M, Q, b, x, res, res < tol, risk, taus, xs, risks)


def _polished(ode: OrderParameterODE, drift, x: np.ndarray, H: int, F: int) -> np.ndarray:
    """``x`` moved to a root of the restricted drift over its free coordinates (those the Jacobian
    couples), if that root is a valid state with a smaller drift; ``x`` otherwise."""
    Q = symmetric_state(jnp.asarray(x), H, F)[1]
    J, _ = _jacobian(drift, lambda z: _symmetric_drift_jacobian(ode, z, H, F), x, Q, method="auto", step=1e-6,
                     differentiable=ode.expectation.second_derivatives)
    scale = max(np.abs(J).max(), TINY)
    free = [i for i in range(len(x)) if np.abs(J[:, i]).max() > 1e-8 * scale or np.abs(J[i, :]).max() > 1e-8 * scale]

    def restricted(y):
        z = x.copy()
        z[free] = y
        return drift(z)[free]

    sol = optimize.root(restricted, x[free], method="hybr", options={"xtol": _ROOT_XTOL})
    cand = x.copy()
    cand[free] = sol.x
    return cand if valid_symmetric_state(cand, H, F) and np.max(np.abs(drift(cand))) < np.max(np.abs(drift(x))) else x
