"""Gradient sensitivity of softmax attention at a temperature (docs/model.md section 8).

A row of weights ``alpha`` gives logits ``l = log(alpha)`` up to a per-row shift (see
:func:`singleloc.attention._attention_rows.logits_from_weights`); sharpening (``T < 1``) or flattening
(``T > 1``) the row is ``softmax(l/T)``. Its sensitivity to the logits is measured two ways:

* the exact Jacobian ``(diag(alpha) - alpha alpha^T)/T`` with ``alpha = softmax(l/T)``
  (:func:`softmax_jacobian`) and its spectral or Frobenius norm (:func:`softmax_jacobian_norm`);
* the finite difference ``|softmax((l + eps v)/T) - softmax(l/T)| / eps`` along random unit
  directions ``v`` (:func:`random_directions`, :func:`finite_difference_sensitivity`).

Shapes and masks follow the conventions of :mod:`singleloc.attention._attention_rows`: logits ``(..., L)``,
``-inf`` for an absent token; NumPy in float64.
"""

from __future__ import annotations

import numpy as np

from ._attention_rows import Mask, Rows, _as_float, _logits, _mask, _positive, _softmax

#: The perturbation sizes of the finite-difference sensitivity (as in the source paper).
FD_EPSILONS = (1e-3, 1e-1, 10.0)

#: Relative gap ``(a_(1) - a_(2)) / a_(1)`` below which the two largest weights count as tied
#: (a few float64 epsilons: the secular equation has no usable bracket in between).
_TIE_RTOL = 1e-15


def _softmax_complement(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``alpha = softmax(logits)``, ``1 - alpha`` and the top-token indicator, all to full relative precision: for the
    top token ``1 - alpha = sum_{j != top} alpha_j`` is summed directly instead of subtracting a number close to one."""
    m = np.max(logits, axis=-1, keepdims=True)
    e = np.exp(logits - m)
    z = np.sum(e, axis=-1, keepdims=True)
    top = np.zeros(e.shape, dtype=bool)
    np.put_along_axis(top, np.argmax(logits, axis=-1)[..., None], True, axis=-1)
    rest = np.sum(np.where(top, 0.0, e), axis=-1, keepdims=True)
    alpha = e / z
    return alpha, np.where(top, rest / z, 1.0 - alpha), top


def softmax_jacobian(logits: Rows, temperature: float = 1.0) -> np.ndarray:
    """Exact Jacobian of ``l -> softmax(l/T)``: ``(diag(alpha) - alpha alpha^T)/T``, shape (..., L, L).

    ``alpha = softmax(l/T)``; entry ``[..., i, j] = d alpha_i / d l_j`` (the diagonal is evaluated as
    ``alpha_i (1 - alpha_i)/T``). Tokens with logit ``-inf`` have weight 0 and zero rows and columns.
    """
    lg = _logits(logits)
    t = _positive("temperature", temperature)
    a, c, _ = _softmax_complement(lg / t)
    jac = -a[..., :, None] * a[..., None, :]
    idx = np.arange(a.shape[-1])
    jac[..., idx, idx] = a * c
    return jac / t


def _largest_eigenvalue(a: np.ndarray, c: np.ndarray, top: np.ndarray, iterations: int = 80) -> np.ndarray:
    """Largest eigenvalue of ``diag(a) - a a^T`` per row, for a probability vector ``a``.

    ``c = 1 - a`` and ``top`` marks the largest entry (see :func:`_softmax_complement`). The eigenvalues of a diagonal
    matrix minus a rank-one term interlace with the diagonal, so the largest lies in ``[a_(2), a_(1)]`` (the two largest
    entries) and, when ``a_(1) > a_(2) > 0``, solves the secular equation ``sum_i a_i^2 / (a_i - lam) = 1``. Since
    ``a_(1)^2/(a_(1) - lam) - 1 = (lam - a_(1) c_(1))/(a_(1) - lam)`` this is written as ``(lam - a_(1) c_(1))/(a_(1) -
    lam) + sum_{i != (1)} a_i^2/(a_i - lam) = 0``, increasing in ``lam`` and free of cancellation for nearly one-hot
    rows, and solved by bisection on a logarithmic scale. If ``a_(1) = a_(2)`` the eigenvalue is ``a_(1)`` (eigenvector
    ``e_(1) - e_(2)``); if ``a_(2) = 0`` it is ``a_(1) c_(1)``.
    """
    a1 = np.sum(np.where(top, a, 0.0), axis=-1)
    c1 = np.sum(np.where(top, c, 0.0), axis=-1)
    others = np.where(top, 0.0, a)
    if a.shape[-1] == 1:
        return a1 * c1
    a2 = np.max(others, axis=-1)
    tie = a1 - a2 <= _TIE_RTOL * a1
    single = a2 <= 0
    lo = np.where(single | tie, 0.5 * a1, a2)  # placeholders keep the iteration finite
    hi = a1.copy()
    sq = others * others
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for _ in range(iterations):
            mid = np.sqrt(lo * hi)
            f = (mid - a1 * c1) / (a1 - mid) + np.sum(sq / (others - mid[..., None]), axis=-1)
            up = f < 0  # the root lies above mid
            lo = np.where(up, mid, lo)
            hi = np.where(up, hi, mid)
    lam = np.clip(np.sqrt(lo * hi), a2, a1)
    return np.where(tie, a1, np.where(single, a1 * c1, lam))


def softmax_jacobian_norm(logits: Rows, temperature: float = 1.0, *, norm: str = "spectral") -> np.ndarray:
    """Norm of the exact Jacobian ``J = (diag(alpha) - alpha alpha^T)/T`` per row, shape (...).

    ``alpha = softmax(l/T)``. ``norm="spectral"`` (default): the operator 2-norm, i.e. the largest eigenvalue of the
    positive semi-definite ``J``, solved from the secular equation (no ``L x L`` matrices; full relative precision also
    when it is tiny). It never exceeds ``1/(2T)`` (Gershgorin: ``2 alpha_i (1 - alpha_i) <= 1/2``), attained by two tied
    top tokens; the source paper's ``1/(4T)`` bounds a single entry ``alpha_i (1 - alpha_i)/T``. ``norm="frobenius"``:
    ``|J|_F^2 = sum_i alpha_i^2 (1 - alpha_i)^2 + sum_{i != j} alpha_i^2 alpha_j^2`` over ``T^2``.
    """
    lg = _logits(logits)
    t = _positive("temperature", temperature)
    a, c, top = _softmax_complement(lg / t)
    if norm == "spectral":
        return _largest_eigenvalue(a, c, top) / t
    if norm == "frobenius":
        sq = a * a
        p2 = np.sum(sq, axis=-1, keepdims=True)
        rest_top = np.sum(np.where(top, 0.0, sq), axis=-1, keepdims=True)
        rest = np.where(top, rest_top, p2 - sq)  # sum_{j != i} alpha_j^2
        return np.sqrt(np.sum(sq * c * c + sq * rest, axis=-1)) / t
    raise ValueError(f"norm must be 'spectral' or 'frobenius', got {norm!r}")


def random_directions(shape: tuple[int, ...], num: int = 1, *, seed: int = 0, mask: Mask = None) -> np.ndarray:
    """``num`` random unit vectors per row, shape ``shape[:-1] + (num, L)``.

    Uniform on the unit sphere of the unmasked coordinates (normalised Gaussians, zero on the
    masked ones), from ``numpy.random.default_rng(seed)``.
    """
    if not isinstance(num, (int, np.integer)) or isinstance(num, bool) or num < 1:
        raise ValueError(f"num (number of directions) must be a positive integer, got {num!r}")
    shape = tuple(shape)
    m = _mask(mask, shape)
    v = np.random.default_rng(seed).standard_normal(shape[:-1] + (num, shape[-1]))
    v = np.where(m[..., None, :], v, 0.0)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def finite_difference_sensitivity(logits: Rows, temperature: float, eps: float, *, num_directions: int = 1, seed: int = 0,
                                  directions: Rows | None = None) -> np.ndarray:
    """Finite-difference gradient sensitivity ``|softmax((l + eps v)/T) - softmax(l/T)| / eps``.

    Euclidean norm, one value per row and direction: shape ``logits.shape[:-1] + (K,)``. The unit directions ``v``
    are ``directions`` (shape ``(..., K, L)`` broadcasting against the rows; normalised here) or
    ``K = num_directions`` random ones (:func:`random_directions` with ``seed``, restricted to the finite logits).
    As ``eps -> 0`` the estimate tends to ``|J v|`` with ``J`` of :func:`softmax_jacobian`; for large ``eps`` it is
    at most ``sqrt(2)/eps`` (two probability vectors are at most ``sqrt(2)`` apart).
    """
    lg = _logits(logits)
    t = _positive("temperature", temperature)
    e = _positive("eps", eps)
    if directions is None:
        v = random_directions(lg.shape, num_directions, seed=seed, mask=np.isfinite(lg))
    else:
        v = _as_float("directions", directions, min_ndim=2)
        if v.shape[-1] != lg.shape[-1]:
            raise ValueError(f"directions must have shape (..., K, L) with L = {lg.shape[-1]}, got {v.shape}")
        nv = np.linalg.norm(v, axis=-1, keepdims=True)
        if (nv == 0).any():
            raise ValueError("directions must be non-zero vectors")
        v = v / nv
    base = _softmax(lg / t)[..., None, :]
    moved = _softmax((lg[..., None, :] + e * v) / t)
    return np.linalg.norm(moved - base, axis=-1) / e
