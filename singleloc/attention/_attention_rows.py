"""Normalization diagnostics for attention rows (docs/model.md section 8): the conventions and
the validation every diagnostic shares.

These functions take attention from any model: the ``alpha`` of a softmax-type layer, one row
per query, and (where needed) the token vectors the row averages. They are written in NumPy
and accept NumPy or JAX arrays; results are NumPy arrays in float64.

Conventions
-----------
* ``weights`` (or ``logits``) have shape ``(..., L)``: the last axis runs over the ``L`` tokens
  of a row, every leading axis is a batch axis (layers, heads, query positions, samples...).
* ``values`` (the token vectors ``x_i``) have shape ``(..., L, d)``; their leading shape must
  broadcast against the leading shape of ``weights``. Values shared by all query rows of a
  head are passed with a length-1 query axis, e.g. weights ``(layers, heads, Lq, L)`` with
  values ``(layers, heads, 1, L, d)``.
* ``mask`` (optional, boolean, broadcastable to ``weights``): ``True`` marks the tokens that
  belong to the row. Masked tokens (e.g. the future tokens of causal attention) are ignored
  everywhere: they are never selected, they do not count in ``L`` and they are not in the
  complement of a selection. For logits, a value of ``-inf`` also marks a token as absent.
* ``|.|`` is the Euclidean norm.

This module validates the arguments and turns weights into logits (:func:`logits_from_weights`).
"""

from __future__ import annotations

import numpy as np
from jaxtyping import ArrayLike, Bool, Real

from ..ground._validation import integer, number

#: The annotations of the public functions' arrays (checked at the door: a real array of any shape, a boolean mask).
Rows, Mask = Real[ArrayLike, "..."], Bool[ArrayLike, "..."] | None


def _as_float(name: str, x, *, min_ndim: int = 1, allow_neg_inf: bool = False) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)  # a number type: checked at the door (singleloc.ground._arguments)
    if arr.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape {arr.shape}")
    if any(n == 0 for n in arr.shape):
        raise ValueError(f"{name} must not be empty, got shape {arr.shape}")
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN")
    bad = np.isposinf(arr) if allow_neg_inf else ~np.isfinite(arr)
    if bad.any():
        raise ValueError(f"{name} contains {'+inf' if allow_neg_inf else 'inf'}")
    return arr


def _weights(weights) -> np.ndarray:
    w = _as_float("weights", weights)
    if (w < 0).any():
        raise ValueError("weights must be non-negative")
    return w


def _logits(logits) -> np.ndarray:
    lg = _as_float("logits", logits, allow_neg_inf=True)
    if not np.isfinite(lg).any(axis=-1).all():
        raise ValueError("logits: every row needs at least one finite logit")
    return lg


def _mask(mask, shape: tuple[int, ...]) -> np.ndarray:
    if mask is None:
        return np.ones(shape, dtype=bool)
    m = np.asarray(mask)  # boolean: checked at the door
    try:
        return np.broadcast_to(m, shape)
    except ValueError:
        raise ValueError(f"mask of shape {m.shape} does not broadcast to the weights' shape {shape}") from None


def _values(values, weights_shape: tuple[int, ...]) -> np.ndarray:
    v = _as_float("values", values, min_ndim=2)
    L = weights_shape[-1]
    if v.shape[-2] != L:
        raise ValueError(f"values must have shape (..., L, d) with L = {L} tokens, got shape {v.shape}")
    try:
        np.broadcast_shapes(v.shape[:-2], weights_shape[:-1])
    except ValueError:
        raise ValueError(f"values' leading shape {v.shape[:-2]} does not broadcast against the weights' leading shape "
                         f"{weights_shape[:-1]}") from None
    return v


def _count(name: str, n, L: int) -> int:
    """A top-N size: an integer ``1 <= n < L``."""
    try:
        return integer(name, n, 1, L - 1)
    except ValueError as err:
        head, sep, tail = str(err).partition("; e.g.")
        raise ValueError(f"{head} (1 <= {name} < L = {L}){sep}{tail}") from None


#: Range of a temperature or a perturbation size: the logits over a temperature (``|log alpha| <= 745`` for
#: float64 weights, plus a perturbation) and the Jacobian's bound ``1/(2T)`` then stay far inside float64
#: and the figures' logarithmic axes; beyond it a row is one-hot (small ``T``) or uniform (large ``T``) to double
#: precision anyway.
SCALE_RANGE = (1e-100, 1e100)


def _positive(name: str, x) -> float:
    """A positive finite number (a temperature, a perturbation size) within :data:`SCALE_RANGE`."""
    value = number(name, x, positive=True)
    low, high = SCALE_RANGE
    if not low <= value <= high:
        raise ValueError(f"{name}: must lie in [{low:g}, {high:g}] (beyond, the diagnostics' numbers leave float64 and a "
                         f"row is one-hot or uniform anyway), got {value!r}; e.g. {min(max(value, low), high):g}")
    return value


def _n_grid(n_grid, L: int, *, at_least: int, name: str = "n_grid") -> list[int]:
    """An increasing grid of top-N sizes ``1 <= N < L`` with at least ``at_least`` entries."""
    grid = [_count(f"{name} entry", n, L) for n in n_grid]
    if len(grid) < at_least or any(b <= a for a, b in zip(grid, grid[1:])):
        raise ValueError(f"{name} must be an increasing sequence of at least {at_least} value(s), got {list(n_grid)!r}; "
                         f"e.g. {sorted(set(grid)) if len(set(grid)) >= at_least else list(range(1, min(at_least, L - 1) + 1))}")
    return grid


def _significance(significance) -> float:
    """A level in the open interval (0, 1)."""
    return number("significance", significance, positive=True, below=1, example=0.01)


def _softmax(logits: np.ndarray) -> np.ndarray:
    """Max-subtracted softmax over the last axis; ``-inf`` logits get weight exactly 0."""
    m = np.max(logits, axis=-1, keepdims=True)
    e = np.exp(logits - m)
    return e / np.sum(e, axis=-1, keepdims=True)


def logits_from_weights(weights: Rows, mask: Mask = None) -> np.ndarray:
    """Logits that reproduce softmax weights: ``log(alpha)``, with ``-inf`` for zero or masked weights.

    Softmax is invariant under adding a constant to a row, so these are the logits up to that shift, which none of
    the diagnostics here depends on. ``softmax(logits_from_weights(w)/T)`` is the row sharpened (``T < 1``) or
    flattened (``T > 1``) to temperature ``T``; ``T = 1`` gives back ``w`` normalised to sum one.
    """
    w = _weights(weights)
    m = _mask(mask, w.shape)
    if not (m & (w > 0)).any(axis=-1).all():
        raise ValueError("weights: every row needs at least one positive (unmasked) weight")
    with np.errstate(divide="ignore"):
        return np.where(m & (w > 0), np.log(np.where(w > 0, w, 1.0)), -np.inf)
