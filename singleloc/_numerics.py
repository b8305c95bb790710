"""Numerical building blocks shared by the theory, the simulator and the analysis.

One home for the small pieces that several modules need: the symmetric square root of a PSD
matrix (and its pseudo-inverse root), the first crossing of a level by a sampled curve (escape
and halfway times), and the named thresholds that decide when a state is "runaway" or a norm is
"zero". Thresholds are tied to the floating-point format where they
are floors, and stated in ``docs/model.md`` where they are modelling choices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

#: Keys whose overlaps exceed this in absolute value are "runaway": the dynamics diverged.
#: Used by the ODE's terminating event and by the simulator's finiteness check.
Q_RUNAWAY = 1e6

#: Smallest positive normal float64: the floor under norms and diagonals before a division
#: (a zero key has cosine 0 with everything instead of NaN).
TINY = float(np.finfo(np.float64).tiny)

#: The slack of the positive semi-definiteness tests, one per kind of check: an eigenvalue may be
#: negative by this fraction of the matrix's size (``1 + max |entry|``, or the check's own measure of it).
#: ``PSD_ROUNDING``: a matrix given or computed in closed form (a prior's covariance, a polished fixed
#: point), rounding only. ``PSD_INPUT``: overlaps given as a start (``Q0 - M0 M0^T``; they may come from
#: a finite-D run or single precision). ``PSD_SOLVE``: ``R_orth`` along an ODE solve, which also carries
#: the solver's error (the terminating event).
PSD_ROUNDING = 1e-10
PSD_INPUT = 1e-8
PSD_SOLVE = 1e-6

#: Eigenvalues below this fraction of the largest count as zero in pseudo-inverse roots
#: (about 4500 float64 ulps: rounding of an eigendecomposition stays below it).
PINV_RTOL = 1e-12


def _namespace(A):
    return jnp if isinstance(A, jax.Array) else np


def psd_sqrt_and_pinv_sqrt(A):
    """``(A^{1/2}, (A^+)^{1/2})`` of a symmetric PSD matrix from one eigendecomposition.

    ``A`` is symmetrised first and negative eigenvalues (rounding) are clipped at zero;
    eigenvalues below ``PINV_RTOL`` times the largest are zero in the pseudo-inverse. The
    root is continuous in ``A``, defined for singular ``A`` and equivariant under
    permutations (two identical heads keep identical fields). Works on NumPy arrays (on the
    host, in float64) and on JAX arrays (traceable), with the same arithmetic.
    """
    xp = _namespace(A)
    w, v = xp.linalg.eigh((A + xp.swapaxes(A, -1, -2)) / 2)
    w = xp.clip(w, 0.0, None)
    keep = w > PINV_RTOL * xp.max(w, axis=-1, keepdims=True)
    root = xp.sqrt(w)
    inv_root = xp.where(keep, 1.0 / xp.where(keep, root, 1.0), 0.0)
    vt = xp.swapaxes(v, -1, -2)
    return (v * root[..., None, :]) @ vt, (v * inv_root[..., None, :]) @ vt


def psd_sqrt(A):
    """Symmetric square root ``A^{1/2}`` of a symmetric PSD matrix (negative eigenvalues,
    from rounding, clipped at zero); NumPy in, NumPy out; JAX in, JAX out."""
    return psd_sqrt_and_pinv_sqrt(A)[0]


def principal_factor(C: jax.Array) -> jax.Array:
    """``S`` with ``S^T S = C`` whose row ``j`` is the ``j``-th principal direction scaled by its
    standard deviation (largest first; signs with non-negative component sums): node
    coordinate ``j`` of ``x = mu + z S`` moves the field along that direction. Heads that are
    copies make ``C`` of low rank, and the leading coordinates of the rule then carry all of
    the variance (rank-aware). Permuting the heads permutes the columns of ``S``."""
    return principal_factor_and_pinv(C)[0]


def principal_factor_and_pinv(C: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(S, T)``: the principal factor ``S`` of :func:`principal_factor` and ``T = S C^+``, whose row
    ``j`` is the ``j``-th principal direction divided by its standard deviation (zero for an eigenvalue
    below ``PINV_RTOL`` times the largest), from one eigendecomposition. For fields ``x = z S`` of
    standard normals ``z``, ``T`` maps a covariance with the fields back to one with ``z``:
    ``E[y x^T] C^+ = E[y z^T] T``, and ``T^T T = C^+``; with the symmetric root,
    :func:`psd_sqrt_and_pinv_sqrt` gives the same pair ``(C^{1/2}, (C^+)^{1/2})``."""
    lam, V = jnp.linalg.eigh((C + C.T) / 2)
    lam, V = jnp.clip(lam[::-1], 0.0, None), V[:, ::-1]
    V = V * jnp.where(jnp.sum(V, axis=0) < 0, -1.0, 1.0)
    keep = lam > PINV_RTOL * jnp.max(lam)
    root = jnp.sqrt(lam)
    inv_root = jnp.where(keep, 1.0 / jnp.where(keep, root, 1.0), 0.0)
    return (V * root).T, (V * inv_root).T


def first_crossing(t, y, level: float) -> float:
    """The first time at which a curve ``y`` sampled at increasing times ``t`` reaches ``level``
    (``y >= level``), interpolated linearly within the step where it does; ``t[0]`` if it starts
    there, NaN if it never does."""
    t, y = np.asarray(t, float), np.asarray(y, float)
    past = np.flatnonzero(y >= level)
    if not len(past):
        return float("nan")
    i = past[0]
    return float(t[0] if i == 0 else t[i - 1] + (level - y[i - 1]) / (y[i] - y[i - 1]) * (t[i] - t[i - 1]))


def require_x64(where: str) -> None:
    """Refuse to build the theory in single precision: the order-parameter ODE, its quadrature and
    the exact route's Laplace form (powers ``P^(L-1)``, profiles down to ``1e-11``) are float64
    computations. The library does not switch JAX's global mode itself (the command line does)."""
    if not jax.config.jax_enable_x64:
        raise RuntimeError(f"{where} needs JAX's float64 mode, which is off: call jax.config.update('jax_enable_x64', True) "
                           "before using singleloc's theory (the singleloc command line does it; in float32 the exact "
                           "route's powers lose every digit at long sequences)")
