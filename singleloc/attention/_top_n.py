"""Top-N selection and the critical top-N (docs/model.md sections 8.2-8.3).

* Top-N selection ``I_N`` (the ``N`` largest weights, :func:`select_top_n`), context
  ``s = sum_{i in I_N} alpha_i x_i`` and representation distance
  ``d = sum_{i not in I_N} |alpha_i x_i - s|`` (:func:`top_n_diagnostics`).
* Geometric separability ``N_s/N``: with ``r = min_{j not in I_N} |s - alpha_j x_j|``, a
  selected ``i`` is separable when ``|s - alpha_i x_i| < r``.
* Critical top-N (:func:`critical_top_n`): the ``N`` from which selecting more tokens no
  longer increases the representation distance (distance collapse), by a one-sided
  two-sample Kolmogorov-Smirnov test between consecutive ``N`` across rows or heads.
* Its power (:func:`detectable_shift`): with ``n`` and ``m`` samples at level ``alpha`` the test
  rejects only when the distribution functions of ``d`` at the two ``N`` differ by at least
  ``D = sqrt(-ln(alpha) (n + m) / (2 n m))`` (Smirnov's limit ``P(D+ >= x) ~ exp(-2 x^2 n m / (n + m))``);
  a smaller rise of ``d`` is missed, so with few samples the critical top-N comes out early and
  moves from one sample to another (45 heads of a language model gave 1 where 270 gave 2-4). Above
  :data:`STABLE_SHIFT` (fewer than :func:`stable_samples` samples) the answer is flagged unstable.

Shapes, masks and validation follow the conventions of :mod:`singleloc.attention._attention_rows`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from jaxtyping import ArrayLike, Integer, Shaped
from scipy import stats

from ._attention_rows import Mask, Rows, _count, _mask, _n_grid, _significance, _values, _weights


def _select(keys: np.ndarray, valid: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` valid tokens with the smallest keys (ties: lower index first)."""
    keys = np.where(valid, keys, np.inf)
    order = np.argsort(keys, axis=-1, kind="stable")
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(keys.shape[-1]), axis=-1)
    return (ranks < n) & valid


def select_top_n(weights: Rows, n: int, mask: Mask = None) -> np.ndarray:
    """``I_N``: a boolean array of ``weights``' shape marking the ``n`` largest weights of each row.

    Ties are broken towards the lower token index; masked tokens are never selected (a row with
    fewer than ``n`` tokens selects all of them). Requires ``1 <= n < L``.
    """
    w = _weights(weights)
    n = _count("n", n, w.shape[-1])
    return _select(-w, _mask(mask, w.shape), n)


class TopN(NamedTuple):
    """Top-N diagnostics of each row (shapes: ``B`` = broadcast leading shape of weights/values).

    ``selected`` (B, L): ``I_N``; ``context`` (B, d): ``s = sum_{i in I_N} alpha_i x_i``; ``token_distance`` (B, L):
    ``|alpha_i x_i - s|`` for every token (NaN for masked ones); ``distance`` (B): ``d = sum_{i not in I_N} |alpha_i x_i
    - s|``; ``radius`` (B): ``r = min_{j not in I_N} |s - alpha_j x_j|``; ``n_separable`` (B): ``N_s``, the selected
    tokens with ``|s - alpha_i x_i| < r``; ``separability`` (B): ``N_s/N``. ``distance``, ``radius``, ``n_separable``
    and ``separability`` are NaN for rows with no unselected token.
    """

    selected: np.ndarray
    context: np.ndarray
    token_distance: np.ndarray
    distance: np.ndarray
    radius: np.ndarray
    n_separable: np.ndarray
    separability: np.ndarray


def top_n_diagnostics(weights: Rows, values: Rows, n: int | None = None, *, mask: Mask = None,
                      selected: Shaped[ArrayLike, "..."] | None = None) -> TopN:
    """Context, representation distance and geometric separability of a selection of tokens.

    With ``I`` the top-``n`` tokens (:func:`select_top_n`) or any boolean ``selected`` of the
    weights' shape (e.g. a random selection, as a baseline):

    * ``s = sum_{i in I} alpha_i x_i``;
    * ``d = sum_{i not in I} |alpha_i x_i - s|`` (Euclidean norms, unmasked tokens only);
    * ``r = min_{j not in I} |s - alpha_j x_j|``; ``N_s = #{i in I : |s - alpha_i x_i| < r}``
      and the separability ratio is ``N_s / |I|``.

    ``weights`` (..., L), ``values`` (..., L, d). The distances are computed from Gram products,
    ``|alpha_i x_i - s|^2 = alpha_i^2 |x_i|^2 - 2 alpha_i <x_i, s> + |s|^2``, in float64, without temporaries of
    the broadcast size ``(B, L, d)``: values shared by many query rows (a length-1 query axis) cost little memory.
    Absolute accuracy about ``1e-8`` times the token scale ``alpha_i |x_i| + |s|``.
    """
    w = _weights(weights)
    v = _values(values, w.shape)
    m = _mask(mask, w.shape)
    if selected is None:
        if n is None:
            raise ValueError("top_n_diagnostics needs n or selected")
        sel = select_top_n(w, n, m)
    else:
        sel = np.asarray(selected)
        if sel.dtype != bool or sel.shape != w.shape:
            raise ValueError(f"selected must be a boolean array of the weights' shape {w.shape}")
        sel = sel & m
    w = np.broadcast_to(w, np.broadcast_shapes(w.shape[:-1], v.shape[:-2]) + w.shape[-1:])
    sel, m = np.broadcast_to(sel, w.shape), np.broadcast_to(m, w.shape)
    s = np.matmul(np.where(sel, w, 0.0)[..., None, :], v)[..., 0, :]  # (B, d)
    norms2 = np.sum(v * v, axis=-1)  # (Bv, L)
    cross = np.matmul(v, s[..., :, None])[..., 0]  # (B, L)
    s2 = np.sum(s * s, axis=-1, keepdims=True)
    dist = np.where(m, np.sqrt(np.maximum(w * w * norms2 - 2 * w * cross + s2, 0.0)), np.nan)
    rest = m & ~sel
    has_rest = rest.any(axis=-1)
    d = np.where(has_rest, np.sum(np.where(rest, dist, 0.0), axis=-1), np.nan)
    r = np.where(has_rest, np.min(np.where(rest, dist, np.inf), axis=-1), np.nan)
    ns = np.where(has_rest, np.sum(sel & (dist < r[..., None]), axis=-1).astype(np.float64), np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = ns / sel.sum(axis=-1)
    return TopN(sel, s, dist, d, r, ns, ratio)


#: The largest detectable shift (:func:`detectable_shift`) at which the critical top-N counts as stable:
#: a rise of ``d`` that moves its distribution function by a fifth is detected.
STABLE_SHIFT = 0.2


def detectable_shift(n: int, m: int, significance: float) -> float:
    """The smallest one-sided two-sample KS statistic that rejects at level ``significance`` with ``n`` and ``m``
    samples, ``sqrt(-ln(significance) (n + m) / (2 n m))`` (the asymptotic critical value; within ``1/n`` of the
    exact one of :func:`scipy.stats.ks_2samp` from 20 samples): a rise of ``d`` between two ``N`` that moves its
    distribution function by less is not detected. NaN with fewer than two samples on either side."""
    return float(np.sqrt(-np.log(significance) * (n + m) / (2.0 * n * m))) if min(n, m) >= 2 else float("nan")


def stable_samples(significance: float) -> int:
    """The samples per ``N`` (equal on both sides) from which the detectable shift is at most
    :data:`STABLE_SHIFT`: ``ceil(-ln(significance) / STABLE_SHIFT^2)`` (116 at the level 0.01)."""
    return int(np.ceil(-np.log(significance) / STABLE_SHIFT**2))


class CriticalTopN(NamedTuple):
    """Result of :func:`critical_top_n` (K = ``len(n_grid)``, S = number of samples).

    ``n_grid`` (K,); ``distance`` (K, S): the samples of ``d`` at each N (NaN where undefined, left out of the
    test); ``statistic`` and ``pvalue`` (K - 1,): the one-sided two-sample KS test of "``d`` at ``n_grid[k+1]`` is
    stochastically larger than at ``n_grid[k]``"; ``critical_n``: the first ``n_grid[k]`` at which that test fails
    to reject at level ``significance`` (None if the distance grows significantly over the whole grid);
    ``significance``: the level used; ``detectable``: the power of the tests, the largest over the grid of their
    :func:`detectable_shift` (NaN where no test ran).
    """

    n_grid: np.ndarray
    distance: np.ndarray
    statistic: np.ndarray
    pvalue: np.ndarray
    critical_n: int | None
    significance: float
    detectable: float = float("nan")


def ks_critical_n(n_grid: Rows | Sequence[int], distance: Rows, *, significance: float = 0.01) -> CriticalTopN:
    """The statistical part of :func:`critical_top_n`, on precomputed samples ``distance`` (K, S).

    Row ``k`` holds the samples of the representation distance at ``N = n_grid[k]`` (NaNs are dropped). For each
    ``k < K - 1``, ``scipy.stats.ks_2samp(distance[k], distance[k+1], alternative="greater")`` tests the null "the
    distribution function of ``d(n_grid[k])`` is nowhere above that of ``d(n_grid[k+1])``" against the alternative
    that it is somewhere above, i.e. that ``d`` at the larger N tends to be larger. ``critical_n`` is the first
    ``n_grid[k]`` with ``pvalue >= significance``: from there, selecting more tokens no longer increases the
    distance between the context and the other tokens.
    """
    grid = np.asarray(n_grid)
    if grid.ndim != 1 or grid.size < 2:
        raise ValueError(f"n_grid must be a 1-D sequence of at least two values, got shape {grid.shape}")
    dist = np.asarray(distance, dtype=np.float64)
    if dist.ndim != 2 or dist.shape[0] != grid.size:
        raise ValueError(f"distance must have shape (len(n_grid) = {grid.size}, S), got {dist.shape}")
    significance = _significance(significance)
    stat, pval, shift = (np.full(grid.size - 1, np.nan) for _ in range(3))
    critical = None
    for k in range(grid.size - 1):
        a, b = dist[k][np.isfinite(dist[k])], dist[k + 1][np.isfinite(dist[k + 1])]
        if a.size >= 2 and b.size >= 2:
            res = stats.ks_2samp(a, b, alternative="greater")
            stat[k], pval[k] = res.statistic, res.pvalue
            shift[k] = detectable_shift(a.size, b.size, significance)
            if critical is None and res.pvalue >= significance:
                critical = int(grid[k])
    detectable = float(np.nanmax(shift)) if np.isfinite(shift).any() else float("nan")
    return CriticalTopN(grid, dist, stat, pval, critical, significance, detectable)


def critical_top_n(weights: Rows, values: Rows, n_grid: Sequence[int] | Integer[ArrayLike, " K"], *,
                   significance: float = 0.01, mask: Mask = None,
                   pool_axes: Sequence[int] | Integer[ArrayLike, " K"] = ()) -> CriticalTopN:
    """Critical top-N: the N at which the representation distance stops growing (distance collapse).

    For every ``N`` of the increasing ``n_grid``, the representation distance ``d(N) = sum_{i not in I_N} |alpha_i x_i -
    s|`` of :func:`top_n_diagnostics` is computed for every row. Growing ``N`` moves weight into the context ``s``
    (``d`` grows) while the complement shrinks (``d`` falls to 0 at ``N = L``); the source paper's Theorem 1 says that
    once ``N`` is a fixed fraction of ``L`` the distance must collapse. The samples of the test are the rows, after
    averaging ``d`` over the leading axes ``pool_axes`` (indices into ``weights.shape[:-1]``; e.g. ``pool_axes=(-1,)``
    for weights ``(layers, heads, Lq, L)`` averages over query positions, so that every head is one sample: the
    distribution over heads). Consecutive grid values are compared by :func:`ks_critical_n` at level ``significance``.
    With a doubling grid this locates the onset of the collapse to within a factor of two; pass ``range(1, L)`` to
    compare ``N`` with ``N + 1``. The result depends on the number of samples (more samples detect smaller increases).
    """
    w = _weights(weights)
    grid = _n_grid(n_grid, w.shape[-1], at_least=2)
    axes = _pool_axes(pool_axes, w.ndim - 1)
    distances = [top_n_diagnostics(w, values, n, mask=mask).distance for n in grid]
    return ks_critical_n(np.array(grid), _ks_samples(distances, axes), significance=significance)


def _pool_axes(pool_axes: Sequence[int], batch_ndim: int) -> tuple[int, ...]:
    """``pool_axes`` as sorted non-negative indices into the ``batch_ndim`` leading axes of the weights."""
    if not all(isinstance(a, (int, np.integer)) and -batch_ndim <= a < batch_ndim for a in pool_axes):
        raise ValueError(f"pool_axes {tuple(pool_axes)!r} must be indices into the {batch_ndim} leading axes of weights")
    return tuple(sorted({int(a) % batch_ndim for a in pool_axes}))


def _ks_samples(distances: Sequence[np.ndarray], axes: tuple[int, ...]) -> np.ndarray:
    """The samples of the test of :func:`critical_top_n`, shape (K, S): the distance of every row
    at each of the K grid values, averaged over the leading ``axes`` (NaN rows ignored)."""
    samples = []
    for d in distances:
        if axes:
            with warnings.catch_warnings():  # all-NaN slices (rows too short for n) stay NaN
                warnings.simplefilter("ignore", RuntimeWarning)
                d = np.nanmean(d, axis=axes)
        samples.append(np.ravel(d))
    return np.stack(samples)
