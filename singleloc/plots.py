"""Figures of the package: trajectories, phases, pruning curves and attention diagnostics.

Every function builds and returns a :class:`matplotlib.figure.Figure` through the object API: nothing here touches
pyplot, the backend or any other global state, and a figure is freed as soon as it is no longer referenced (no
``close`` needed). Save one with ``fig.savefig`` or :func:`save_figure` (atomic PNG).
"""

from __future__ import annotations

import math

import matplotlib as mpl
import numpy as np
from matplotlib.figure import Figure

from ._plot_trajectories import _colors, _time_axis, matched_heads, plot_compare
from .analysis._head_classes import CLASS_LETTERS, LEARNED_CLASSES, class_counts_text
from .io._run_folders import save_figure
from .runtime._numerics import TINY

__all__ = ["matched_heads", "plot_compare", "plot_heads_needed", "plot_phase_diagram", "plot_phases", "plot_pruning",
           "plot_sensitivity", "plot_top_n", "plot_vanishing", "save_figure"]


def plot_phases(analysis, risk, index: int = 0, *, title: str = "", log_time: bool | None = None,
                direction_names=None, predicted_escape: float | None = None) -> Figure:
    """Four panels for trajectory ``index`` of a :class:`~singleloc.PhaseAnalysis`: the risk with its plateaus
    (dots), the escape from each (thin dashed lines), the measured escape from the unspecialized phase
    (``escape_time``: a solid line) and, given ``predicted_escape`` (:func:`~singleloc.predicted_escape`), the
    prediction (a dotted line with a diamond), each named in the legend; the alignment ``M_hf / sqrt(Q_hh)`` of
    every head (colour) with every spike (line style), with a triangle where a head specializes (named in the
    legend when one is drawn); the number of heads in each class (:data:`~singleloc.HEAD_CLASSES`, the classes that
    occur; thin vertical lines: aligned heads change spike); the numbers of redundant head pairs and of pairs with
    a shared spike profile. ``risk`` is (S, T) or (T,). ``log_time``: a log time axis (``None``: when the saved
    times are log-spaced). Legends where they cover the least data (``loc="best"``)."""
    from matplotlib.lines import Line2D

    colors = _colors()
    a = analysis
    tau = a.tau
    r = np.atleast_2d(np.asarray(risk))[index]
    fig = Figure(figsize=(17, 3.6), constrained_layout=True)
    axes = fig.subplots(1, 4)
    ax = axes[0]
    ax.plot(tau, r, "k-", lw=1.3)
    for p in a.plateaus[index]:
        ax.plot([p.start, p.end], [p.risk, p.risk], "-", color="C1", lw=4, alpha=0.4)
        ax.plot(p.tau, p.risk, "o", color="C1", ms=4)
    named = False
    for e in a.escapes[index]:
        if np.isfinite(e):
            ax.axvline(e, color="C3", ls="--", lw=0.8, label=None if named else "escape from a plateau (halfway drop)")
            named = True
    if np.isfinite(a.escape_time[index]):
        ax.axvline(a.escape_time[index], color="C3", lw=1.5, label=f"measured escape: {a.escape_time[index]:.3g}")
    if predicted_escape is not None and np.isfinite(predicted_escape):
        ax.axvline(predicted_escape, color="C0", ls=":", lw=1.5)
        ax.plot([predicted_escape], [1.0], "D", color="C0", ms=6, transform=ax.get_xaxis_transform(), clip_on=False,
                label=f"predicted escape: {predicted_escape:.3g} (linearisation)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, frameon=False, loc="best")
    ax.set(ylabel="risk", title="risk, plateaus, escapes")
    ax = axes[1]
    H, F = a.cos.shape[-2:]
    styles = ["-", "--", ":", "-."]
    specialized = False
    for h in range(H):
        for f in range(F):
            ax.plot(tau, a.cos[index, :, h, f], styles[f % 4], color=colors[h % len(colors)], lw=1.2)
        t = a.specialization_times[index, h]
        if np.isfinite(t):
            ax.plot(t, a.cos[index, np.searchsorted(tau, t), h].max(), "v", color=colors[h % len(colors)], ms=6)
            specialized = True
    names = [direction_names[f] if direction_names else f"spike {f + 1}" for f in range(F)]
    final = a.classes.names()[index, -1]
    key = ([Line2D([], [], color=colors[h % len(colors)], lw=1.2, label=f"head {h + 1} ({final[h]} at the end)")
            for h in range(H)]
           + [Line2D([], [], color="0.3", ls=styles[f % 4], lw=1.2, label=names[f]) for f in range(F)]
           + ([Line2D([], [], color="0.3", marker="v", ls="none", label="specializes (stays aligned from here)")]
              if specialized else []))
    ax.set_title(r"alignment $M_{hf}/\sqrt{Q_{hh}}$ of each head with each spike", fontsize=9)
    ax.legend(handles=key, fontsize=6, frameon=False, ncol=2 if H + F > 6 else 1, loc="best")
    ax = axes[2]
    for k, (name, count) in enumerate(a.classes.counts().items()):
        if np.any(count[index]):
            ax.step(tau, count[index], where="post", color=colors[k % len(colors)], ls=styles[k % 4], label=f"{name} heads")
    for t, *_ in a.rearrangements[index]:
        ax.axvline(t, color="0.4", ls=":", lw=0.8)
    ax.set_ylim(-0.2, H + 0.2)
    ax.set_title("head classes (vertical lines: aligned heads change spike)", fontsize=9)
    ax.legend(fontsize=8, frameon=False, loc="best")
    ax = axes[3]
    ax.step(tau, a.redundant[index], where="post", color="C4", label="redundant keys (cosine > 0.99)")
    ax.step(tau, a.profiles[index], where="post", color="C5", ls="--", label="shared spike profile")
    ax.set_ylim(-0.2, max(1, H * (H - 1) // 2) + 0.2)
    ax.set_title("head pairs")
    ax.legend(fontsize=8, frameon=False, loc="best")
    for ax in axes:
        _time_axis(ax, tau, log_time)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def _value(row, key: str) -> float:
    v = row.get(key, math.nan)
    return math.nan if v is None or v == "" else float(v)


def _grid(rows, value, prefix: str):
    """Heads, spikes and the (F, H) array of ``value(row, prefix)``."""
    Hs = sorted({int(r["heads"]) for r in rows})
    Fs = sorted({int(r["F"]) for r in rows})
    A = np.full((len(Fs), len(Hs)), np.nan)
    for r in rows:
        A[Fs.index(int(r["F"])), Hs.index(int(r["heads"]))] = value(r, prefix)
    return Hs, Fs, A


def _escape_text(row, prefix: str) -> str:
    measured, pred, escaped = (_value(row, k) for k in (prefix + "first_learned", "predicted_escape", prefix + "escaped"))
    head = f"{measured:.3g}" if escaped >= 1 and np.isfinite(measured) else ("not yet" if np.isfinite(pred) else "none")
    return head + (f"\npred {pred:.3g}" if np.isfinite(pred) else "")


def plot_phase_diagram(rows, *, title: str = "", simulate: bool = False) -> Figure:
    """Heat maps over (heads H, spikes F) of sweep rows (dicts) of one activation, at the last saved time and as
    means over seeds: the final risk; the head classes (colour: heads in a learned class,
    ``aligned + leaning + combination``; text: the count of each class, ``A`` aligned, ``L`` leaning, ``C``
    combination, ``R`` redundant, ``O`` off, ``U`` unspecialized); the escape (colour: ``first_learned``, the first
    time from which a head stays learned; text: that time or "not yet", and ``predicted_escape``); the escape rate
    ``lambda`` with the ``horizon`` ``h``. Panels are titled by the sweep's column names. A second row for the
    simulation when ``simulate`` (without the last panel: the prediction is the theory's)."""
    panels = [("final_risk", "viridis", lambda r, p: _value(r, p + "final_risk"),
               lambda r, p: f"{_value(r, p + 'final_risk'):.3g}"),
              ("head classes (colour: learned heads)", "magma", lambda r, p: sum(_value(r, f"{p}n_{c}") for c in LEARNED_CLASSES),
               lambda r, p: class_counts_text({c: _value(r, f"{p}n_{c}") for c in CLASS_LETTERS}) or "n/a"),
              ("first_learned (pred: predicted_escape)", "plasma", lambda r, p: _value(r, p + "first_learned"),
               _escape_text),
              ("lambda (h: horizon)", "cividis", lambda r, p: _value(r, "lambda"),
               lambda r, p: (f"{lam:.3g}" if np.isfinite(lam := _value(r, "lambda")) else "none")
               + f"\nh {_value(r, 'horizon'):.4g}")]
    prefixes = [""] + (["sim_"] if simulate else [])
    fig = Figure(figsize=(4.0 * len(panels), 3.3 * len(prefixes)), constrained_layout=True)
    axes = fig.subplots(len(prefixes), len(panels), squeeze=False)
    for i, pre in enumerate(prefixes):
        for j, (label, cmap, value, text) in enumerate(panels):
            ax = axes[i, j]
            if pre and j == len(panels) - 1:
                ax.set_axis_off()
                continue
            Hs, Fs, A = _grid(rows, value, pre)
            im = ax.imshow(A, origin="lower", cmap=cmap, aspect="auto")
            ax.set_xticks(range(len(Hs)), [str(h) for h in Hs])
            ax.set_yticks(range(len(Fs)), [str(f) for f in Fs])
            ax.set(xlabel="heads H", ylabel="spikes F")
            ax.set_title(("simulation: " if pre else "theory: ") + label, fontsize=9)
            finite = np.any(np.isfinite(A))
            for r in rows:
                x, y = Hs.index(int(r["heads"])), Fs.index(int(r["F"]))
                light = bool(finite and np.isfinite(A[y, x]) and im.norm(A[y, x]) > 0.6)
                ax.text(x, y, text(r, pre), ha="center", va="center", fontsize=7,
                        color="k" if (light or not np.isfinite(A[y, x])) else "w")
            if finite:
                fig.colorbar(im, ax=ax, shrink=0.8)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_heads_needed(rows, other_keys=(), *, title: str = "") -> Figure:
    """The gap to the Bayes risk against the number of heads, from sweep rows (``activation``, ``heads``, ``F``,
    ``gap_to_bayes``, ``heads_needed``, ``gap_tol``): one panel per spike count ``F``, one line per activation (and
    value of the ``other_keys``), a dashed line at ``gap_tol`` and a star at ``heads_needed`` (the legend's answer:
    :func:`~singleloc.analysis._sweep_answers.count_text`); error bars ``gap_to_bayes_error`` where stated. Log
    scale; a gap at or below zero (within the Bayes risk's error) is drawn at the bottom of the panel."""
    from .analysis._sweep_answers import count_text

    Fs = sorted({int(r["F"]) for r in rows})
    fig = Figure(figsize=(4.4 * len(Fs), 3.8), constrained_layout=True)
    axes = np.atleast_1d(fig.subplots(1, len(Fs)))
    colors = _colors()
    gap_tol = _value(rows[0], "gap_tol") if rows else math.nan
    finite = [g for r in rows if np.isfinite(g := _value(r, "gap_to_bayes")) and g > 0]
    floor = min([*finite, gap_tol if np.isfinite(gap_tol) else 1.0]) / 3
    for ax, F in zip(axes, Fs):
        lines: dict[tuple, list] = {}
        for r in rows:
            if int(r["F"]) == F:
                lines.setdefault((r["activation"], *(r[k] for k in other_keys)), []).append(r)
        for n, (key, group) in enumerate(lines.items()):
            group = sorted(group, key=lambda r: int(r["heads"]))
            H = np.array([int(r["heads"]) for r in group])
            gap = np.array([_value(r, "gap_to_bayes") for r in group])
            need = _value(group[0], "heads_needed")
            name = key[0] + "".join(f", {k.split('.')[-1]}={v}" for k, v in zip(other_keys, key[1:]))
            answer = count_text(group[0], int(H.max()))
            c = colors[n % len(colors)]
            error = np.array([_value(r, "gap_to_bayes_error") for r in group])
            ax.errorbar(H, np.maximum(gap, floor), yerr=np.where(np.isfinite(error), error, 0.0), fmt="o-", color=c, ms=4,
                        capsize=2, label=f"{name}: " + (answer.replace(" (", " heads (", 1) if " (" in answer else
                                                       f"{answer} head{'s' if answer != '1' else ''}"))
            if np.isfinite(need):
                ax.plot(need, max(gap[H == need][0], floor), "*", color=c, ms=14, mec="k", mew=0.5)
        if np.isfinite(gap_tol):
            ax.axhline(gap_tol, color="grey", ls="--", lw=0.9, label=f"gap_tol = {gap_tol:g}")
        ax.set(yscale="log", xlabel="heads H", ylabel="gap_to_bayes = final_risk - bayes_risk")
        ax.set_title(f"F = {F} spike{'s' if F > 1 else ''}: heads needed (stars)", fontsize=9)
        ax.xaxis.set_major_locator(mpl.ticker.MaxNLocator(integer=True))
        ax.legend(frameon=False, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    fig.suptitle(title or "heads needed to come within gap_tol of the Bayes risk", fontsize=10)
    return fig


def plot_pruning(curves: dict, *, F: int | None = None, tol: float | None = 0.01, title: str = "", ax=None) -> Figure:
    """Risk against the number of heads removed, one curve per entry of ``curves`` (``label -> PruningResult``);
    random orders get a band of +- one standard deviation over draws, Monte Carlo results error bars. ``F`` marks
    ``H - F`` removed heads; ``tol`` draws the unpruned risk + tol of the first curve. Draws into ``ax`` when given
    (and returns its figure)."""
    if ax is None:
        ax = Figure(figsize=(5.2, 3.8), constrained_layout=True).subplots()
    first = None
    for label, res in curves.items():
        x = res.n_removed
        if res.risks.shape[0] > 1:
            line, = ax.plot(x, res.risk, "-", lw=1.2, label=f"{label} (mean of {res.risks.shape[0]})")
            ax.fill_between(x, res.risk - res.risk_std, res.risk + res.risk_std, color=line.get_color(), alpha=0.2, lw=0)
        elif res.stderr is not None:
            ax.errorbar(x, res.risk, yerr=res.stderr[0], fmt="o", ms=4, capsize=2, label=label)
        else:
            ax.plot(x, res.risk, "-", marker=".", lw=1.4, label=label)
        first = res if first is None else first
    if first is not None:
        H = first.heads
        if F is not None and 0 <= H - F < H:
            ax.axvline(H - F, color="grey", ls=":", lw=1, label=f"H - F = {H - F}")
        if tol is not None:
            ax.axhline(first.risk[0] + tol, color="grey", ls="--", lw=0.8, label=f"unpruned + {tol:g}")
        ax.set_xticks(np.arange(H))
    ax.set(xlabel="heads removed", ylabel="risk")
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(frameon=False, fontsize=7)
    return ax.figure


def _plain_log_axis(axis, ticks=None) -> None:
    """A log axis labelled with plain numbers (``2``, ``64``), its minor ticks unlabelled (their
    ``3x10^1``-style labels overlapped on a range of one or two decades); ``ticks``: label those values."""
    if ticks is not None:
        ticks = np.unique(np.asarray(ticks, float))
        if len(ticks) > 8:  # at most about 8 labels: every k-th of them
            ticks = ticks[:: int(np.ceil(len(ticks) / 8))]
        axis.set_major_locator(mpl.ticker.FixedLocator(ticks))
    else:
        axis.set_major_locator(mpl.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(mpl.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    axis.set_minor_formatter(mpl.ticker.NullFormatter())


def plot_vanishing(diagnosis) -> Figure:
    """Vanishing attention of an :class:`~singleloc.AttentionDiagnosis`: histograms of
    ``L * max alpha`` and ``L * min alpha`` (log scale), and the largest weight of each row
    against its number of tokens with the median per length and ``1/L``."""
    fig = Figure(figsize=(11, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    mx, mn = diagnosis.max_scaled, diagnosis.min_scaled
    lo = max(min(mn[mn > 0].min() if (mn > 0).any() else 1e-3, 1.0) / 2, 1e-12)
    hi = max(mx.max(), 1.0) * 2
    bins = np.logspace(np.log10(lo), np.log10(hi), 50)
    ax1.hist(np.clip(mx, lo, hi), bins=bins, alpha=0.6, label="L * max alpha")
    ax1.hist(np.clip(mn, lo, hi), bins=bins, alpha=0.6, label="L * min alpha (zeros at the left edge)")
    ax1.axvline(1.0, color="k", lw=0.8, ls="--", label="uniform row")
    ax1.set(xscale="log", xlabel="L * weight", ylabel="rows", title="vanishing attention: weights in units of 1/L")
    ax1.legend(fontsize=8)
    lens, wmax = diagnosis.tokens, diagnosis.max_weight
    ax2.loglog(lens, wmax, ".", ms=2, alpha=0.3, color="C0", label="rows")
    ul = np.unique(lens)
    ax2.loglog(ul, [np.median(wmax[lens == u]) for u in ul], "o-", ms=3, color="C3", label="median per length")
    ax2.loglog(ul, 1.0 / ul, color="k", lw=0.8, ls="--", label="1/L")
    _plain_log_axis(ax2.xaxis)
    ax2.set(xlabel="tokens in the row", ylabel="max_i alpha_i", title="largest weight against the row length")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_sensitivity(diagnosis) -> Figure:
    """Gradient sensitivity of an :class:`~singleloc.AttentionDiagnosis` against the temperature: exact Jacobian
    norms (mean, median), the worst case ``1/(2T)`` and the finite differences of each size ``eps``."""
    jac = diagnosis.jacobian
    fig = Figure(figsize=(6.5, 4.6))
    ax = fig.subplots()
    T = np.array([r["T"] for r in jac])
    ax.loglog(T, 0.5 / T, color="gray", lw=1, ls="-.", label="1/(2T): worst case")
    ax.loglog(T, [r["spectral_mean"] for r in jac], "k-", lw=2, label="exact |J|_2, mean")
    ax.loglog(T, [max(r["spectral_median"], TINY) for r in jac], "k--", lw=1.2, label="exact |J|_2, median")
    for i, e in enumerate(diagnosis.epsilons):
        ax.loglog(T, [r["finite_difference"][f"{e:g}"] for r in jac], "o-", ms=3, lw=1, color=f"C{i}",
                  label=f"finite difference, eps = {e:g}")
    top = max(max(r["bound"] for r in jac), 1e-3)
    ax.set_ylim(max(min(min(r["spectral_mean"] for r in jac), 1e-8) / 10, 1e-12), top * 3)
    ax.set(xlabel="temperature T", ylabel="sensitivity of softmax(log(alpha)/T)", title="gradient sensitivity")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_top_n(diagnosis) -> Figure:
    """Top-N diagnostics of an :class:`~singleloc.AttentionDiagnosis` computed with values:
    the mean representation distance and the mean geometric separability against ``N``, with
    the critical top-N. Raises ``ValueError`` for a diagnosis without values."""
    topn = diagnosis.top_n
    if topn is None:
        raise ValueError("the diagnosis has no top-N diagnostics (computed without values)")
    fig = Figure(figsize=(11, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    N = np.array(topn["N"])
    for ax, key, color in ((ax1, "distance", "C0"), (ax2, "separability", "C1")):
        ax.plot(N, [s["mean"] if s["mean"] is not None else np.nan for s in topn[key]], "o-", color=color)
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        _plain_log_axis(ax.xaxis, N)
        if topn["critical_n"] is not None:
            ax.axvline(topn["critical_n"], color="C3", lw=0.8, ls="--", label=f"critical top-N = {topn['critical_n']}")
            ax.legend(fontsize=8)
    ax1.set(xlabel="N (top-N)", ylabel="mean representation distance d", title=f"distance (L = {diagnosis.L})")
    ax2.set(xlabel="N (top-N)", ylabel="mean N_s / N", ylim=(-0.02, 1.02), title="geometric separability")
    fig.tight_layout()
    return fig
