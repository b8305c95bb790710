"""All normalization diagnostics of an array of dumped attention (docs/model.md section 8).

:func:`diagnose_attention` takes the weights of any model, e.g. GPT-2's ``(layers, heads, L, L)``,
and runs the diagnostics of :mod:`singleloc.attention._vanishing_attention`, :mod:`singleloc.attention._top_n` and
:mod:`singleloc.attention._sensitivity` on them; it is what ``singleloc diagnose`` prints and saves.

Layout of ``weights`` ``(..., Lq, L)``: the last axis runs over the ``L`` tokens of a row, the second-to-last over
the query rows, the axes before it index heads (a 1-D array is one row). Rows need not sum to one; weights must be
finite and non-negative. ``values`` (the token vectors ``x_i``, optional) are ``(heads..., L, d)`` (one set per
head, shared by its query rows) or ``weights.shape + (d,)`` (one set per row).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from jaxtyping import ArrayLike, Integer

from ..ground._choices import KS_SAMPLES, MASKS
from ._attention_rows import Rows, _as_float, _n_grid, _positive, _significance, _weights, logits_from_weights
from ._sensitivity import FD_EPSILONS, finite_difference_sensitivity, random_directions, softmax_jacobian_norm
from ._top_n import STABLE_SHIFT, _ks_samples, ks_critical_n, stable_samples, top_n_diagnostics
from ._vanishing_attention import vanishing_attention

#: The figures of a diagnosis (``singleloc diagnose``), ``STEM_NAME.png``.
FIGURES = ("vanishing", "jacobian", "topn")

#: Temperatures of the gradient-sensitivity table (from very sharp to nearly uniform rows).
TEMPERATURES = (0.001, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 100.0)


def _stats(x: np.ndarray) -> dict:
    x = np.asarray(x, dtype=np.float64).ravel()
    x = x[np.isfinite(x)]
    return {key: float(f(x)) if x.size else None for key, f in (("mean", np.mean), ("median", np.median),
                                                                  ("min", np.min), ("max", np.max))}


def _fmt(x) -> str:
    return "     n/a" if x is None or not np.isfinite(x) else f"{x:8.4g}"


def _finite_or_none(x) -> list:
    return [float(v) if np.isfinite(v) else None for v in x]


@dataclasses.dataclass(frozen=True, eq=False)
class AttentionDiagnosis:
    """The result of :func:`diagnose_attention`.

    Summary (what :meth:`to_dict` writes): ``shape`` of the weights, ``heads`` (product of the head axes),
    ``query_rows`` (indices of the analysed rows), ``queries`` (query rows per head), ``mask`` (``"causal"`` or
    ``"none"``), ``rows_analysed`` (rows with at least two tokens); ``vanishing``: mean/median/min/max over those
    rows of ``L * max alpha``, ``L * min alpha``, the effective logit bound and the row sum; ``jacobian``: per
    temperature ``T``, the mean and median spectral norm, the mean Frobenius norm of the exact Jacobian, the bound
    ``1/(2T)`` and the mean finite difference per ``eps``; ``top_n`` (None without values): the grid ``N``, the
    statistics of ``d`` and ``N_s/N`` per ``N``, the KS statistics and p-values, ``critical_n``,
    ``detectable_shift`` and ``stable_samples`` (:func:`~singleloc.attention._top_n.detectable_shift`,
    :func:`~singleloc.attention._top_n.stable_samples`). Also ``epsilons``, ``value_dim`` (``d``, None without
    values) and ``ks_sample_count`` (the finite samples of the KS test at the first ``N``).

    Per analysed row with at least two tokens (1-D arrays, for the figures): ``tokens`` (its
    length), ``max_weight``, ``max_scaled = L * max alpha`` and ``min_scaled = L * min alpha``.
    """

    shape: tuple[int, ...]
    heads: int
    query_rows: tuple[int, ...]
    queries: int
    mask: str
    rows_analysed: int
    vanishing: dict
    jacobian: tuple[dict, ...]
    epsilons: tuple[float, ...]
    top_n: dict | None
    value_dim: int | None
    ks_sample_count: int | None
    tokens: np.ndarray
    max_weight: np.ndarray
    max_scaled: np.ndarray
    min_scaled: np.ndarray

    @property
    def L(self) -> int:
        return self.shape[-1]

    def to_dict(self) -> dict:
        """The summary as plain JSON-serialisable data."""
        out = {"shape": list(self.shape), "heads": self.heads, "query_rows": list(self.query_rows), "mask": self.mask,
               "rows_analysed": self.rows_analysed, "vanishing": self.vanishing, "jacobian": list(self.jacobian)}
        return out | ({} if self.top_n is None else {"top_n": self.top_n})

    def table(self) -> str:
        """The summary as text tables (what ``singleloc diagnose`` prints)."""
        lines = [f"shape {self.shape}, {self.heads} head(s), {len(self.query_rows)} of {self.queries} query row(s) per head, "
                 f"L = {self.L}, mask: {self.mask}",
                 "", f"vanishing attention ({self.rows_analysed} rows with >= 2 tokens; uniform rows give L*alpha = 1)",
                 "  quantity                          median      mean       min       max"]
        for label, key in (("L * max_i alpha_i", "L_times_max_weight"), ("L * min_i alpha_i", "L_times_min_weight"),
                           ("effective logit bound a", "effective_logit_bound"), ("row sum", "row_sum")):
            s = self.vanishing[key]
            lines.append(f"  {label:30s} {_fmt(s['median'])}  {_fmt(s['mean'])}  {_fmt(s['min'])}  {_fmt(s['max'])}")
        lines += ["", "gradient sensitivity of softmax(log(alpha)/T): exact Jacobian norms and finite differences "
                  "(means over rows)",
                  "         T  |J|_2 mean  |J|_2 median  |J|_F mean    1/(2T)"
                  + "".join(f"{'FD eps=' + format(e, 'g'):>14s}" for e in self.epsilons)]
        for r in self.jacobian:
            lines.append(f"  {r['T']:8.3g}  {_fmt(r['spectral_mean']):>10s}  {_fmt(r['spectral_median']):>12s}  "
                         f"{_fmt(r['frobenius_mean']):>10s}  {_fmt(r['bound']):>8s}"
                         + "".join(f"{_fmt(v):>14s}" for v in r["finite_difference"].values()))
        lines.append("")
        t = self.top_n
        if t is None:
            lines.append("top-N diagnostics skipped (no values)")
            return "\n".join(lines)
        lines += [f"top-N diagnostics (values of dimension d = {self.value_dim}; KS samples: {t['ks_samples']}, "
                  f"{self.ks_sample_count} of them)",
                  "      N   mean d      mean N_s/N   KS stat   p (d at next N larger)"]
        grid = t["N"]
        for k, n in enumerate(grid):
            last = t["ks_statistic"] is None or k >= len(grid) - 1
            ks = "" if last else f"{_fmt(t['ks_statistic'][k])}  {_fmt(t['ks_pvalue'][k])}"
            lines.append(f"  {n:5d}  {_fmt(t['distance'][k]['mean'])}    {_fmt(t['separability'][k]['mean'])}    {ks}")
        crit = t["critical_n"]
        if t["ks_statistic"] is None:
            lines.append("critical top-N: needs at least two top-N sizes")
        elif crit is None:
            lines.append(f"critical top-N: none on the grid (d keeps growing significantly up to N = {grid[-1]})")
        else:
            lines.append(f"critical top-N: {crit} ({crit / self.L:.3g} L): d at the next N is not "
                         f"significantly larger (level {t['significance']:g})")
        shift = t.get("detectable_shift")
        if shift is not None:
            lines.append(f"power: with {self.ks_sample_count} samples per N the tests detect a rise of d only where it moves "
                         f"the distribution function of d by at least {shift:.2f} (KS distance at level {t['significance']:g})")
            if shift > STABLE_SHIFT:
                lines.append(f"warning: low power: fewer than {t['stable_samples']} samples ({t['ks_samples']}: "
                             f"{self.ks_sample_count}), so the critical top-N is unstable (a smaller rise of d is missed and "
                             "the answer comes out early, moving from one sample to another); use more heads or layers, "
                             "or --ks-over rows")
        return "\n".join(lines)


def _row_values(values, shape: tuple[int, ...], rows: np.ndarray) -> np.ndarray:
    """The values of the analysed rows, broadcasting against the weights ``shape[:-2] + (rows, L)``."""
    heads_shape, L = shape[:-2], shape[-1]
    v = values if isinstance(values, np.ndarray) else np.asarray(values)
    if len(shape) >= 2 and v.ndim == len(shape) and v.shape[:-2] == heads_shape and v.shape[-2] == L:
        v = v[..., None, :, :]  # shared by the query rows of a head
    elif v.ndim == len(shape) + 1 and v.shape[:-1] == shape:
        v = v[..., rows, :, :] if len(shape) >= 2 else v
    else:
        per_head = ", ".join(str(n) for n in heads_shape + (L,))
        raise ValueError(f"values of shape {v.shape} do not match the weights {shape}: expected ({per_head}, d) "
                         f"(per head) or ({', '.join(str(n) for n in shape)}, d) (per row)")
    return _as_float("values", v, min_ndim=2)


def _mask(name: str, w: np.ndarray, rows: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, str]:
    """The token mask of the analysed rows ``w`` of weights of ``shape``, and its name (``"causal"`` or ``"none"``)."""
    if name not in MASKS:
        raise ValueError(f"mask must be one of {', '.join(MASKS)}, got {name!r}")
    square = len(shape) >= 2 and shape[-2] == shape[-1]
    if name == "causal" and not square:
        raise ValueError(f"mask 'causal' needs square (L, L) last axes, got shape {shape}")
    causal = (np.arange(w.shape[-1])[None, :] <= rows[:, None]) if square else None
    use_causal = name == "causal" or (name == "auto" and square and not np.any(w[..., ~causal]))
    if use_causal and np.any(w[..., ~causal] > 0):
        raise ValueError("mask 'causal': the weights have positive entries above the diagonal (future tokens); e.g. mask "
                         "'none' (every token of a row)")
    return (np.broadcast_to(causal, w.shape), "causal") if use_causal else (np.ones(w.shape, dtype=bool), "none")


def diagnose_attention(weights: Rows, values: Rows | None = None, *,
                       top_n: Sequence[int] | Integer[ArrayLike, " K"] | None = None,
                       temperatures: Sequence[float] = TEMPERATURES, epsilons: Sequence[float] = FD_EPSILONS, directions: int = 4,
                       mask: str = "auto", max_rows: int = 32, ks_samples: str = "auto", significance: float = 0.01,
                       seed: int = 0) -> AttentionDiagnosis:
    """Vanishing attention, gradient sensitivity and (with ``values``) the top-N diagnostics.

    ``weights`` ``(heads..., Lq, L)`` (a NumPy array, possibly memory-mapped: only the analysed rows are read) and
    ``values`` as in the module docstring. Of the ``Lq`` query rows of each head at most ``max_rows`` are analysed (0 =
    all), evenly spaced and always including the last one; rows with a single token are left out of every statistic.

    * ``mask``: ``"causal"`` (the tokens ``0..q`` of query ``q``; square last axes),
      ``"none"`` (all ``L`` tokens, zero weights included) or ``"auto"`` (causal when the last
      axes are square and every weight above the diagonal is exactly 0).
    * Vanishing attention (:func:`~singleloc.attention._vanishing_attention.vanishing_attention`) with the
      effective logit bound of each row.
    * Gradient sensitivity of ``softmax(log(alpha)/T)`` at each of ``temperatures``: exact
      Jacobian norms and finite differences of size ``epsilons`` along ``directions`` random
      unit directions per row (from ``seed``).
    * With ``values``: for each ``N`` of the increasing ``top_n`` (default ``1, 2, 4, ... < L``),
      the representation distance and the geometric separability of every row, and the
      critical top-N (:func:`~singleloc.attention._top_n.critical_top_n`) with level
      ``significance``, its samples being the heads (``d`` averaged over each head's rows) or
      the rows (``ks_samples``; ``"auto"``: heads when there are at least two).

    Returns an :class:`AttentionDiagnosis`; raises ``ValueError`` naming the offending input.
    """
    temperatures = [_positive("temperatures", t) for t in temperatures]
    epsilons = [_positive("epsilons", e) for e in epsilons]
    significance = _significance(significance)
    if ks_samples not in KS_SAMPLES:
        raise ValueError(f"ks_samples must be one of {', '.join(KS_SAMPLES)}, got {ks_samples!r}")
    if isinstance(max_rows, bool) or not isinstance(max_rows, (int, np.integer)) or max_rows < 0:
        raise ValueError(f"max_rows must be a non-negative integer, got {max_rows!r}")
    raw = weights if isinstance(weights, np.ndarray) else np.asarray(weights)
    if raw.ndim < 1 or any(n == 0 for n in raw.shape):
        raise ValueError(f"weights must be a non-empty array of shape (..., L), got shape {raw.shape}")
    L = raw.shape[-1]
    if L < 2:
        raise ValueError(f"the rows need at least 2 tokens, got L = {L}")
    grid = _n_grid(top_n if top_n is not None else [n for n in 2 ** np.arange(0, 20) if n < L], L, at_least=1, name="top_n")
    has_queries = raw.ndim >= 2
    queries = raw.shape[-2] if has_queries else 1
    heads = int(np.prod(raw.shape[:-2])) if has_queries else 1
    rows = np.arange(queries)  # at most max_rows (0: all), evenly spaced, always including the last one
    if max_rows and queries > max_rows:
        rows = np.unique(np.linspace(queries - 1, 0, max_rows).round().astype(int))
    w = _weights(raw[..., rows, :] if has_queries else raw)
    m, mask_name = _mask(mask, w, rows, raw.shape)
    length = m.sum(axis=-1)
    if not (np.where(m, w, 0.0) > 0).any(axis=-1).all():
        raise ValueError("the weights have a row without any positive weight")
    keep = np.broadcast_to(length >= 2, w.shape[:-1])  # rows with a single token carry no information
    if not keep.any():
        raise ValueError("no analysed row has at least 2 tokens (analyse more rows: max_rows)")
    v = None if values is None else _row_values(values, raw.shape, rows)

    va = vanishing_attention(w, mask=m)
    vanishing = {"L_times_max_weight": _stats(va.max_scaled[keep]), "L_times_min_weight": _stats(va.min_scaled[keep]),
                 "effective_logit_bound": _stats(va.a[keep]), "row_sum": _stats(np.sum(np.where(m, w, 0.0), axis=-1)[keep])}

    logits = logits_from_weights(w, m)[keep]
    dirs = random_directions(logits.shape, directions, seed=seed, mask=np.isfinite(logits))
    jacobian = []
    for T in temperatures:
        spec = softmax_jacobian_norm(logits, T)
        fd = {f"{e:g}": float(finite_difference_sensitivity(logits, T, e, directions=dirs).mean()) for e in epsilons}
        jacobian.append({"T": T, "spectral_mean": float(spec.mean()), "spectral_median": float(np.median(spec)),
                         "frobenius_mean": float(softmax_jacobian_norm(logits, T, norm="frobenius").mean()), "bound": 0.5 / T,
                         "finite_difference": fd})

    topn, count = None, None
    if v is not None:
        ks_over = ks_samples if ks_samples != "auto" else ("heads" if heads >= 2 else "rows")
        if ks_over == "heads" and not has_queries:
            ks_over = "rows"
        diagnostics = [top_n_diagnostics(w, v, n, mask=m) for n in grid]
        distances, separabilities = [t.distance for t in diagnostics], [t.separability for t in diagnostics]
        samples = _ks_samples(distances, (distances[0].ndim - 1,) if ks_over == "heads" else ())
        count = int(np.isfinite(samples[0]).sum())
        crit = ks_critical_n(np.array(grid), samples, significance=significance) if len(grid) >= 2 else None
        topn = {"N": grid, "ks_samples": ks_over, "significance": significance,
                "distance": [_stats(d) for d in distances], "separability": [_stats(s) for s in separabilities],
                "ks_statistic": None if crit is None else _finite_or_none(crit.statistic),
                "ks_pvalue": None if crit is None else _finite_or_none(crit.pvalue),
                "critical_n": None if crit is None else crit.critical_n,
                "detectable_shift": None if crit is None or not np.isfinite(crit.detectable) else crit.detectable,
                "stable_samples": stable_samples(significance)}

    return AttentionDiagnosis(
        shape=tuple(raw.shape), heads=heads, query_rows=tuple(int(r) for r in rows), queries=queries, mask=mask_name,
        rows_analysed=int(keep.sum()), vanishing=vanishing, jacobian=tuple(jacobian), epsilons=tuple(epsilons), top_n=topn,
        value_dim=None if v is None else int(v.shape[-1]), ks_sample_count=count,
        tokens=np.broadcast_to(length, keep.shape)[keep], max_weight=va.max_weight[keep],
        max_scaled=va.max_scaled[keep], min_scaled=va.min_scaled[keep])
