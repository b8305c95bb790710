"""The trajectory figure of :mod:`singleloc.plots`: :func:`plot_compare` (theory against simulation, heads
matched to the spike they learn, :func:`matched_heads`) and the helpers the other figures share (the
colour cycle, the time axis). Imported by :mod:`singleloc.plots`, which is where to take them from."""

from __future__ import annotations

from textwrap import fill

import matplotlib as mpl
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from .runtime._numerics import TINY


def _colors() -> list[str]:
    """The colour cycle of the current matplotlib style."""
    return mpl.rcParams["axes.prop_cycle"].by_key()["color"]


def matched_heads(M_last) -> np.ndarray:
    """The heads of each trajectory reordered to match the spikes: ``M_last`` (S, H, F) (or (H, F)), the overlaps
    at the last saved time; returns ``order`` (S, H) (or (H,)) such that ``M[s, :, order[s]]`` puts in slot ``k`` a
    head on spike ``k mod F``: the assignment of heads to spikes that maximises ``sum |M_hf|`` (the Hungarian
    algorithm, :func:`scipy.optimize.linear_sum_assignment`) fills slots ``0 .. F-1``, the same assignment of the
    heads left fills the next ``F`` slots, and so on (with ``H < F``, the ``H`` slots in the order of the spikes
    assigned): slot ``k`` is "the head that learns spike ``k``" in every seed."""
    from scipy.optimize import linear_sum_assignment

    M_last = np.abs(np.nan_to_num(np.asarray(M_last, dtype=float)))
    flat = M_last.reshape((-1,) + M_last.shape[-2:])
    orders = []
    for m in flat:
        left, order = list(range(m.shape[0])), []
        while left:
            rows, spikes = linear_sum_assignment(m[left], maximize=True)
            chosen = [left[r] for _, r in sorted(zip(spikes, rows))]
            order += chosen
            left = [h for h in left if h not in chosen]
        orders.append(order)
    return np.asarray(orders).reshape(M_last.shape[:-1])


def _time_axis(ax, tau, log_time: bool | None) -> None:
    ax.set_xlabel(r"$\tau = t/D$")
    steps = np.diff(np.asarray(tau, dtype=float)[1:])  # growing steps: log-spaced saved times (sgd.spacing = "log")
    if log_time or (log_time is None and len(steps) > 2 and steps[0] > 0 and steps[-1] > 3 * steps[0]):
        ax.set_xscale("symlog", linthresh=max(float(tau[1]), 1e-6) if len(tau) > 1 else 1.0)
        ax.set_xlim(float(tau[0]), float(tau[-1]))  # no margin into negative times


def head_labels(result, match: bool, mean=None) -> list[str]:
    """The legend labels of the heads of ``result`` (in :func:`matched_heads` order with ``match``): what each has
    learned by its last saved time, as the phase analysis classes it
    (:func:`~singleloc.analysis._head_classes.classify_heads` with the prior's ``mean``, without the attention
    weights: no head is called ``off``), e.g. ``"head 1: aligned to spike 2"``, ``"head 3: combination"``, and
    ``"(in 3 of 4 starts)"`` where the starts differ; ``"head k"`` without ``Q``."""
    from collections import Counter

    from .analysis._head_classes import classify_heads

    M, Q = np.asarray(result.M, dtype=float)[:, -1], getattr(result, "Q", None)
    S, H, F = M.shape
    if Q is None:
        return [f"head {k + 1}" for k in range(H)]
    Q = np.asarray(Q, dtype=float)[:, -1]
    classes = classify_heads(M, Q, mean=mean)
    names, spikes = classes.names(), classes.spike
    if match:
        order = matched_heads(M)
        names, spikes = np.take_along_axis(names, order, axis=1), np.take_along_axis(spikes, order, axis=1)
    labels = []
    for k in range(H):
        said = Counter(f"{n} to spike {f + 1}" if n in ("aligned", "leaning") else str(n)
                       for n, f in zip(names[:, k], spikes[:, k]))
        ((text, n),) = said.most_common(1)
        labels.append(f"head {k + 1}: {text}" + (f" (in {n} of {S} starts)" if n < S else ""))
    return labels


def _matched(result, match: bool):
    """``M`` (S, T, H, F), ``v`` (S, T, H) or None and the key norms ``sqrt(Q_hh)`` (S, T, H) or None
    of a result, with the heads of each trajectory in :func:`matched_heads` order when ``match``."""
    M = np.asarray(result.M, dtype=float)
    v = getattr(result, "v", None)
    Q = getattr(result, "Q", None)
    norms = None if Q is None else np.sqrt(np.maximum(np.diagonal(np.asarray(Q, dtype=float), axis1=-2, axis2=-1), TINY))
    if not match:
        return M, v, norms
    order = matched_heads(M[:, -1])
    M = np.take_along_axis(M, order[:, None, :, None], axis=2)
    H, F = M.shape[-2:]
    own = M[:, -1, np.arange(H), np.arange(H) % F]  # (S, H): each slot's overlap with its spike at the end
    M = M * np.where(own < 0, -1.0, 1.0)[:, None, :, None]  # a head on -e_f (zero-mean priors) drawn as on +e_f
    take = lambda a: None if a is None else np.take_along_axis(np.asarray(a, dtype=float), order[:, None, :], axis=2)
    return M, take(v), take(norms)


def _mean_and_spread(ax, tau, values, color, kind: str, label: str | None, each: bool = False) -> None:
    """The mean over the first axis of ``values`` (S, T) with its min-max spread: a line and a
    band for the theory, markers with bars for the simulation; ``each``: every start (seed) as a thin
    line too, solid for the theory and dashed for the simulation."""
    mean, lo, hi = values.mean(0), values.min(0), values.max(0)
    if each and values.shape[0] > 1:
        ax.plot(tau, values.T, "-" if kind == "theory" else "--", color=color, lw=0.6, alpha=0.5)
    if kind == "theory":
        ax.plot(tau, mean, "-", color=color, lw=1.6, label=label)
        if values.shape[0] > 1:
            ax.fill_between(tau, lo, hi, color=color, alpha=0.2, lw=0)
    else:
        every = max(1, len(tau) // 30)
        yerr = np.stack([mean - lo, hi - mean])[:, ::every] if values.shape[0] > 1 else None
        ax.errorbar(tau[::every], mean[::every], yerr=yerr, fmt="o", ms=3.5, mfc="none", color=color, lw=0.8, alpha=0.7,
                    label=label)


def _style_legend(theory, simulation) -> list:
    """A legend of the line styles: theory (line, band) and simulation (markers, bars)."""
    from matplotlib.patches import Patch

    handles = []
    if theory is not None:
        S = theory.M.shape[0]
        handles.append(Line2D([], [], color="0.2", lw=1.6, label="theory" + (f": mean of {S} starts" if S > 1 else "")))
        if S > 1:
            handles.append(Patch(color="0.2", alpha=0.2, lw=0, label="theory: min to max over starts"))
    if max(np.shape(r.risk)[0] if np.ndim(r.risk) > 1 else 1 for r in (theory, simulation) if r is not None) > 1:
        handles.append(Line2D([], [], color="0.2", lw=0.6, alpha=0.5, label="thin lines: each start (seed) on its own"))
    if simulation is not None:
        S = simulation.M.shape[0]
        handles.append(Line2D([], [], color="0.2", marker="o", mfc="none", ls="none",
                              label=f"simulation: mean of {S} seeds" + (", bars min to max" if S > 1 else "")))
    return handles


def plot_compare(theory=None, simulation=None, title: str = "", *, log_time: bool | None = None,
                 match: bool = True, mean=None, outcomes: tuple[str, ...] | None = None) -> Figure:
    """Risk against tau and the overlaps ``M_hf(tau)``, theory against simulation, each as its mean over starts
    (seeds) with the spread from the min to the max: theory a line with a band, simulation markers with bars.

    ``theory`` and ``simulation`` are :class:`~singleloc.Trajectory` records (or anything with ``tau``, ``risk``
    (S, T), ``M`` (S, T, H, F)); either may be ``None``. With ``match`` (default; with ``H >= F``) the heads of
    every trajectory are put in :func:`matched_heads` order, so that colours and means are over like heads, and a
    head whose overlap with its spike ends negative is drawn with its signs flipped; the legend names each head by
    its class at the end (:func:`head_labels`, with the prior's ``mean``). One panel per spike ``f`` shows ``M_hf``
    of every head; with ``match`` and ``Q`` one more shows the cosine ``M_hf / sqrt(Q_hh)`` of each head with its
    own spike (``1/sqrt(F)`` along the mean of the spikes, 1 once specialized). With trained head weights
    (``theory.v`` not ``None``) a last panel shows ``v_h(tau)``; with a stated quadrature error
    (``theory.risk_se``, ``theory.replicates > 1``) an inset shows its size. When both are given on the same saved
    times, the risk panel states the largest per-seed ``|sim - theory|``. The risk panel draws every start and seed
    as a thin line beside the means; ``outcomes``: what the heads of the theory's starts and the simulation's seeds
    have learned at the end, in words (:func:`~singleloc.analysis._head_classes.outcomes_text`), written below the
    panels. ``log_time``: a log time axis (``None``: when the saved times are log-spaced).
    """
    if theory is None and simulation is None:
        raise ValueError("plot_compare needs a theory or a simulation result")
    colors = _colors()
    first = theory if theory is not None else simulation
    S, T, H, F = first.M.shape
    match = match and H >= F  # with fewer heads than spikes, no head is "the one that learns spike f"
    v_of = getattr(theory, "v", None) if theory is not None else getattr(simulation, "v", None)
    aligned = match and getattr(first, "Q", None) is not None  # the alignment panel: matched heads, with Q
    panels = 1 + F + aligned + (v_of is not None)
    fig = Figure(figsize=(4.2 * panels, 3.8), constrained_layout=True)
    axes = fig.subplots(1, panels)
    series = [(kind, r, *_matched(r, match)) for kind, r in (("theory", theory), ("simulation", simulation)) if r is not None]
    ax = axes[0]
    for kind, r, *_ in series:
        _mean_and_spread(ax, r.tau, np.atleast_2d(np.asarray(r.risk, dtype=float)), "k" if kind == "theory" else colors[0],
                         kind, None, each=True)
    se = getattr(theory, "risk_se", None)
    se = se if se is not None and np.all(np.isfinite(se)) else None  # theory.replicates > 1: quadrature error
    if se is not None:  # the quadrature's error is often thinner than the line: its width, on a log scale
        inset = ax.inset_axes([0.55, 0.36, 0.42, 0.28])
        inset.semilogy(theory.tau, 2 * np.atleast_2d(se).T, color="k", lw=0.8)
        inset.set_title("theory: 2 standard errors", fontsize=7)
        inset.tick_params(labelsize=6, which="both")
        inset.yaxis.set_minor_formatter(mpl.ticker.NullFormatter())
    handles = _style_legend(theory, simulation)
    if theory is not None and simulation is not None and np.shape(theory.risk) == np.shape(simulation.risk):
        dev = float(np.max(np.abs(np.asarray(simulation.risk) - np.asarray(theory.risk))))
        handles.append(Line2D([], [], ls="none", label=f"largest |simulation - theory| of one seed: {dev:.3f}"))
    ax.legend(handles=handles, frameon=False, fontsize=7, loc="best")
    ax.set(ylabel="risk", title="risk")
    _time_axis(ax, first.tau, log_time)
    heads = [(k, colors[k % len(colors)]) for k in range(H)]
    labels = head_labels(first, match, mean)
    for f in range(F):
        ax = axes[1 + f]
        for k, c in heads:
            for kind, r, M, *_ in series:
                _mean_and_spread(ax, r.tau, M[:, :, k, f], c, kind, labels[k] if kind == series[0][0] else None)
        _time_axis(ax, first.tau, log_time)
        ax.set_title(rf"$M_{{h{f + 1}}}$: overlap of each head with spike {f + 1}", fontsize=9)
        if f == 0:  # the colours of the heads, once
            ax.legend(frameon=False, fontsize=7, loc="best")
    if aligned:  # the cosine of each matched head with its own spike: 1/sqrt(F) on the plateau, 1 once specialized
        ax = axes[1 + F]
        for k, c in heads:
            for kind, r, M, _, norms in series:
                if norms is not None:
                    _mean_and_spread(ax, r.tau, M[:, :, k, k % F] / norms[:, :, k], c, kind, None)
        along = np.asarray(first.tau, dtype=float)  # reference lines drawn through every saved time, so that the
        for level, ls, label in ((1 / np.sqrt(F), ":", rf"$1/\sqrt{{{F}}}$: heads along the mean of the spikes"),
                                 (0.9, "--", "0.9: specialized")):  # legend's loc="best" sees them as data
            ax.plot(along, np.full(len(along), level), color="0.5", ls=ls, lw=1, label=label)
        _time_axis(ax, first.tau, log_time)
        ax.set_title(r"specialization: $M_{hf}/\sqrt{Q_{hh}}$ of each head with its spike", fontsize=9)
        ax.legend(frameon=False, fontsize=7, loc="best")
    if v_of is not None:
        ax = axes[-1]
        for k, c in heads:
            for kind, r, _, v, _ in series:
                if v is not None:
                    _mean_and_spread(ax, r.tau, v[:, :, k], c, kind, labels[k] if kind == series[0][0] else None)
        _time_axis(ax, first.tau, log_time)
        ax.set_title(r"head weights $v_h$ of $a_l = \sum_h v_h A_{hl}$", fontsize=9)
        ax.legend(frameon=False, fontsize=7, loc="best")
    if outcomes:  # the heads at the end, per start and seed: below the panels, over no data
        fig.supxlabel("\n".join(fill(f"heads at tau = {first.tau[-1]:g}, {kind}: {text}", 60 * panels)
                                for kind, text in zip(("theory", "simulation"), outcomes)), fontsize=8)
    if title:
        fig.suptitle(title + ("; heads matched across starts by their largest overlap" if match and (H > 1 or F > 1) else ""),
                     fontsize=10)
    return fig
