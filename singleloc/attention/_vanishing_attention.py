"""Vanishing attention (docs/model.md section 8.1): a normaliser that does not know ``L`` keeps
every weight within ``[C1/L, C2/L]``; for softmax with logits in ``[-a, a]``, ``alpha_i = exp(l_i)/sum_j exp(l_j)``
lies between ``exp(-a)/(L exp(a))`` and ``exp(a)/(L exp(-a))``, so weights are of order ``1/L`` unless the logits
grow like ``log L`` (:func:`vanishing_attention`).

Shapes, masks and validation follow the conventions of :mod:`singleloc.attention._attention_rows`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._attention_rows import Mask, Rows, _as_float, _logits, _mask, _softmax, _weights


class VanishingAttention(NamedTuple):
    """Per-row vanishing-attention diagnostics, every field of shape ``weights.shape[:-1]``.

    ``L``: tokens in the row; ``a``: the logit bound used; ``lower = exp(-2a)/L`` and ``upper = exp(2a)/L``: the
    softmax bounds; ``min_weight``/``max_weight``: the extreme weights; ``min_scaled = L*min_weight`` and
    ``max_scaled = L*max_weight`` (both 1 for uniform attention); ``lower_ratio = min_weight/lower >= 1`` and
    ``upper_ratio = max_weight/upper <= 1``: how close the row comes to the bounds (1 = the bound is attained);
    ``holds``: whether both bounds hold (up to a relative tolerance of 1e-9).
    """

    L: np.ndarray
    a: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    min_weight: np.ndarray
    max_weight: np.ndarray
    min_scaled: np.ndarray
    max_scaled: np.ndarray
    lower_ratio: np.ndarray
    upper_ratio: np.ndarray
    holds: np.ndarray


def effective_logit_bound(weights: Rows, mask: Mask = None) -> np.ndarray:
    """The smallest ``a`` such that logits in ``[-a, a]`` give these weights through softmax.

    Softmax weights fix the logits up to a shift, ``l_i = log(alpha_i) + c``; the smallest
    ``max_i |l_i|`` over ``c`` is ``a = (log max_i alpha_i - log min_i alpha_i) / 2``. It is
    ``inf`` for a row with a zero (unmasked) weight. Shape ``weights.shape[:-1]``.
    """
    w = _weights(weights)
    m = _mask(mask, w.shape)
    if not m.any(axis=-1).all():
        raise ValueError("mask: every row needs at least one token")
    wmax = np.max(np.where(m, w, -np.inf), axis=-1)
    wmin = np.min(np.where(m, w, np.inf), axis=-1)
    if (wmax <= 0).any():
        raise ValueError("weights: every row needs at least one positive (unmasked) weight")
    with np.errstate(divide="ignore"):
        return 0.5 * (np.log(wmax) - np.log(wmin))


def vanishing_attention(weights: Rows | None = None, *, logits: Rows | None = None, logit_bound: Rows | None = None,
                        mask: Mask = None) -> VanishingAttention:
    """Compare attention rows with the softmax bounds ``exp(-2a)/L <= alpha_i <= exp(2a)/L`` (module docstring).

    Give the rows in one of three ways:

    * ``logits`` (``-inf`` = absent token): the weights are their softmax (unless ``weights``
      is given too) and ``a = max_i |l_i|`` over the finite logits of the row;
    * ``weights`` and ``logit_bound``: a scalar or an array broadcasting to
      ``weights.shape[:-1]`` (a known bound on the logits);
    * ``weights`` alone: ``a`` is :func:`effective_logit_bound`, the smallest bound consistent
      with the weights, for which the bounds are as tight as softmax allows.

    ``L`` is the number of unmasked tokens of each row. Returns :class:`VanishingAttention`.
    """
    if logits is not None:
        lg = _logits(logits)
        m = _mask(mask, lg.shape) & np.isfinite(lg)
        a = np.max(np.where(m, np.abs(np.where(m, lg, 0.0)), -np.inf), axis=-1)
        if weights is None:
            w = _softmax(np.where(m, lg, -np.inf))
        else:
            w = _weights(weights)
            if w.shape != lg.shape:
                raise ValueError(f"weights shape {w.shape} differs from logits shape {lg.shape}")
    else:
        if weights is None:
            raise ValueError("vanishing_attention needs weights or logits")
        w = _weights(weights)
        m = _mask(mask, w.shape)
        if not m.any(axis=-1).all():
            raise ValueError("mask: every row needs at least one token")
        if logit_bound is None:
            a = effective_logit_bound(w, m)
        else:
            a = _as_float("logit_bound", logit_bound, min_ndim=0)
            if (a < 0).any():
                raise ValueError("logit_bound must be non-negative")
            try:
                a = np.broadcast_to(a, w.shape[:-1]).copy()
            except ValueError:
                raise ValueError(f"logit_bound of shape {a.shape} does not broadcast to the rows' shape {w.shape[:-1]}") from None
    L = m.sum(axis=-1).astype(np.float64)
    wmax = np.max(np.where(m, w, -np.inf), axis=-1)
    wmin = np.min(np.where(m, w, np.inf), axis=-1)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        lower, upper = np.exp(-2 * a) / L, np.exp(2 * a) / L
        ratios = wmin / lower, wmax / upper
    holds = (wmin >= lower * (1 - 1e-9)) & (wmax <= upper * (1 + 1e-9))
    return VanishingAttention(L, a, lower, upper, wmin, wmax, L * wmin, L * wmax, *ratios, holds)
