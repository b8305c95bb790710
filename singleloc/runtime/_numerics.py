"""Numerical building blocks shared by the theory, the simulator and the analysis: PSD roots and factors, the
first crossing of a level, and the named thresholds (tied to the floating-point format where they are floors,
stated in ``docs/model.md`` where they are modelling choices)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Real

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


#: The expected adaptive steps of an ODE solve per unit of ``tau`` at unit rate, and the fewest expected
#: (:func:`expected_steps`).
STEPS_PER_TAU = 0.15
MIN_EXPECTED_STEPS = 32
#: The largest rate :func:`expected_steps` was fitted at (beyond it the law is extrapolated: a solve there usually
#: diverges, or leaves its rule's resolved fields, long before its expected steps).
FITTED_RATE = 256.0
#: The expected steps of a solve with trained head weights, whose mode holds the step from the start, over the law's
#: (two heads, softmax or softmax1, spikes or a Gaussian prior: 0.84-3.8 times the law to ``tau`` = 300, 3000 and
#: 20000, where uniform weights take 0.12-1.2 of it).
WEIGHTED_STEPS = 2.3


def expected_steps(rate: float, span: float, weighted: bool = False) -> float:
    """The adaptive steps a solve of the order-parameter ODE over ``span`` of ``tau`` is expected to take at the
    rate per sequence ``rate`` (the learning rate; :meth:`~singleloc.sgd._sgd_rule.AbstractSGDRule.rate`): the
    drift's fastest mode moves at about ``rate`` and the steps follow it, ``STEPS_PER_TAU * span * max(1, rate)^0.75``
    and at least ``MIN_EXPECTED_STEPS``; :data:`WEIGHTED_STEPS` times that with trained head weights (``weighted``).
    Fitted on Tsit5 at ``rtol = 1e-6`` (the default): 43, 285 and 2648 steps to ``tau = 300`` at ``lr = 1, 16, 256``
    on the default problem. The step budget (:mod:`~singleloc.theory._step_budget`) and the time estimates read it."""
    return max(MIN_EXPECTED_STEPS, STEPS_PER_TAU * span * max(1.0, rate) ** 0.75) * (WEIGHTED_STEPS if weighted else 1.0)


def psd_sqrt_and_pinv_sqrt(A):
    """``(A^{1/2}, (A^+)^{1/2})`` of a symmetric PSD matrix from one eigendecomposition.

    ``A`` is symmetrised first and negative eigenvalues (rounding) are clipped at zero; eigenvalues below
    ``PINV_RTOL`` times the largest are zero in the pseudo-inverse. The root is continuous in ``A``, defined for
    singular ``A`` and equivariant under permutations (two identical heads keep identical fields). Works on NumPy
    arrays (on the host, in float64) and on JAX arrays (traceable), with the same arithmetic.
    """
    xp = jnp if isinstance(A, jax.Array) else np
    w, v = xp.linalg.eigh((A + xp.swapaxes(A, -1, -2)) / 2)
    w = xp.clip(w, 0.0, None)
    keep = w > PINV_RTOL * xp.max(w, axis=-1, keepdims=True)
    root = xp.sqrt(w)
    inv_root = xp.where(keep, 1.0 / xp.where(keep, root, 1.0), 0.0)
    vt = xp.swapaxes(v, -1, -2)
    return (v * root[..., None, :]) @ vt, (v * inv_root[..., None, :]) @ vt


def psd_sqrt(A: Real[ArrayLike, "*S N N"]):
    """Symmetric square root ``A^{1/2}`` of a symmetric PSD matrix (negative eigenvalues,
    from rounding, clipped at zero); NumPy in, NumPy out; JAX in, JAX out."""
    return psd_sqrt_and_pinv_sqrt(A)[0]


def principal_factor(C: jax.Array) -> jax.Array:
    """``S`` with ``S^T S = C`` whose row ``j`` is the ``j``-th principal direction scaled by its
    standard deviation (largest first; signs with non-negative component sums): node
    coordinate ``j`` of ``x = mu + z S`` moves the field along that direction."""
    lam, V = jnp.linalg.eigh((C + C.T) / 2)
    lam, V = jnp.clip(lam[::-1], 0.0, None), V[:, ::-1]
    V = V * jnp.where(jnp.sum(V, axis=0) < 0, -1.0, 1.0)
    return (V * jnp.sqrt(lam)).T


#: The rank-aware factor's blend (:func:`rank_aware_factor_and_pinv`): a principal direction takes its own
#: rule coordinates in full where its eigenvalue is at least ``RANK_AWARE_GAP[1]`` times itself away from both
#: neighbours and the cube sum of its components is at least ``RANK_AWARE_SKEW[1]`` in absolute value, not at
#: all where either is below ``[0]`` (it is then left to the symmetric root), smoothly in between.
RANK_AWARE_GAP = (0.05, 0.1)
RANK_AWARE_SKEW = (0.05, 0.1)


def _smoothstep(x, edges):
    t = jnp.clip((x - edges[0]) / (edges[1] - edges[0]), 0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)


def rank_aware_factor_and_pinv(C: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(S, T)``: a factor ``S`` (2H, H) of ``C`` (``S^T S = C``) with ``T = S C^+`` (``T^T T = C^+``), that puts the
    principal directions which are well defined on rows of their own and the rest of ``C`` on a symmetric root: with ``C
    = V Lambda V^T`` (largest first),

        lead = diag(sin phi) Lambda^{1/2} V^T,    sym = V diag(cos phi) Lambda^{1/2} V^T,
        S = [lead_1; sym; lead_2 .. lead_H]     (rows, in the order of the rule's coordinates).

    Each eigenvector's sign makes the cube sum of its components ``k_j = sum_h V_hj^3`` positive (odd and
    permutation-invariant, so a permutation of the heads permutes the chosen vectors; zero where a permutation maps a
    vector onto its negative, e.g. ``(1, -1)`` at a state that a head swap maps onto itself). The angle ``phi_j = (pi /
    2) s_gap s_skew`` runs from 0 to ``pi / 2`` with two smooth steps (:data:`RANK_AWARE_GAP`, :data:`RANK_AWARE_SKEW`):
    of the distance of ``lambda_j`` to its neighbours relative to ``lambda_j``, and of ``|k_j|``. A direction gets its
    own coordinates only where it and its sign are determined; where eigenvalues nearly coincide (eigenvectors that turn
    quickly) or the sign is not fixed, the symmetric block carries it. ``S`` is therefore continuous in ``C`` (the
    principal factor is not at a near-crossing of eigenvalues, where solves on it took many short steps), and where
    every ``phi_j = pi / 2`` it is the principal factor, whose rows a permutation of the heads permutes with the
    columns. Heads that are (near) copies make a leading direction of large, well separated variance, which gets the
    rule's first coordinates (rank-aware). Eigenvalues below ``PINV_RTOL`` times the largest count as zero in ``T``."""
    lam, V = jnp.linalg.eigh((C + C.T) / 2)
    lam, V = jnp.clip(lam[::-1], 0.0, None), V[:, ::-1]
    skew = jnp.sum(V**3, axis=0)
    V = V * jnp.where(skew < 0, -1.0, 1.0)
    top = jnp.maximum(lam[0], TINY)
    gaps = -jnp.diff(lam)
    ends = jnp.full((1,), top, lam.dtype)  # no neighbour: a gap of the largest eigenvalue (relative >= 1)
    gap = jnp.minimum(jnp.concatenate([ends, gaps]), jnp.concatenate([gaps, ends]))
    phi = jnp.pi / 2 * _smoothstep(gap / jnp.maximum(lam, PINV_RTOL * top), RANK_AWARE_GAP) * _smoothstep(
        jnp.abs(skew), RANK_AWARE_SKEW)
    keep = lam > PINV_RTOL * top
    root = jnp.sqrt(lam)
    inv_root = jnp.where(keep, 1.0 / jnp.where(keep, root, 1.0), 0.0)

    def rows(scale):
        lead, sym = (V * (jnp.sin(phi) * scale)).T, (V * (jnp.cos(phi) * scale)) @ V.T
        return jnp.concatenate([lead[:1], sym, lead[1:]])

    return rows(root), rows(inv_root)


def first_crossing(t, y, level: float) -> float:
    """The first time at which a curve ``y`` sampled at increasing times ``t`` reaches ``level`` (``y >= level``),
    interpolated linearly within the step where it does; ``t[0]`` if it starts there, NaN if it never does."""
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
