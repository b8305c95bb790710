"""Figures of the phase analysis: one trajectory's phases, and (H, F) phase diagrams."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

_COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def close(fig) -> None:
    plt.close(fig)


def plot_phases(analysis, risk, index: int = 0, *, title: str = "", log_time: bool = False, direction_names=None):
    """Four panels for trajectory ``index`` of a :class:`~singleloc._phases.PhaseAnalysis`:
    the risk with its plateaus (dots) and escape times (dashed lines); the alignment
    ``M_hf / sqrt(Q_hh)`` of every head with every spike; the number of specialized heads and
    of covered directions; the numbers of redundant head pairs and of pairs with a shared
    spike profile. ``risk`` is (S, T) or (T,)."""
    a = analysis
    tau = a.tau
    r = np.atleast_2d(np.asarray(risk))[index]
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6), constrained_layout=True)
    ax = axes[0]
    ax.plot(tau, r, "k-", lw=1.3)
    for p in a.plateaus[index]:
        ax.plot([p.start, p.end], [p.risk, p.risk], "-", color="C1", lw=4, alpha=0.4)
        ax.plot(p.tau, p.risk, "o", color="C1", ms=4)
    for e in a.escapes[index]:
        if np.isfinite(e):
            ax.axvline(e, color="C3", ls="--", lw=0.8)
    if np.isfinite(a.escape_time[index]):
        ax.axvline(a.escape_time[index], color="C3", lw=1.5, label=f"escape {a.escape_time[index]:.1f}")
        ax.legend(fontsize=8, frameon=False)
    ax.set_ylabel("risk")
    ax.set_title("risk, plateaus, escapes")
    ax = axes[1]
    H, F = a.cos.shape[-2:]
    styles = ["-", "--", ":", "-."]
    for h in range(H):
        for f in range(F):
            name = direction_names[f] if direction_names else f"f={f + 1}"
            ax.plot(tau, a.cos[index, :, h, f], styles[f % 4], color=_COLORS[h % len(_COLORS)], lw=1.2, label=f"head {h + 1}, {name}")
        t = a.specialization_times[index, h]
        if np.isfinite(t):
            ax.plot(t, a.cos[index, np.searchsorted(tau, t), h].max(), "v", color=_COLORS[h % len(_COLORS)], ms=6)
    ax.set_title(r"alignment $M_{hf}/\sqrt{Q_{hh}}$ (triangles: specialization)")
    ax.legend(fontsize=6, frameon=False, ncol=2)
    ax = axes[2]
    ax.step(tau, a.n_specialized[index], where="post", label="specialized heads")
    ax.step(tau, a.n_directions[index], where="post", ls="--", label="directions covered")
    for t, h, old, new in a.rearrangements[index]:
        ax.axvline(t, color="C3", lw=0.8, alpha=0.6)
    ax.set_ylim(-0.2, H + 0.2)
    ax.set_title("specialization (red: rearrangements)")
    ax.legend(fontsize=8, frameon=False)
    ax = axes[3]
    ax.step(tau, a.redundant[index], where="post", color="C4", label="redundant keys (cosine > 0.99)")
    ax.step(tau, a.profiles[index], where="post", color="C5", ls="--", label="shared spike profile")
    ax.set_ylim(-0.2, max(1, H * (H - 1) // 2) + 0.2)
    ax.set_title("head pairs")
    ax.legend(fontsize=8, frameon=False)
    for ax in axes:
        ax.set_xlabel(r"$\tau$")
        if log_time:
            ax.set_xscale("symlog", linthresh=max(tau[1], 1e-3))
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def _grid(rows, key):
    Hs = sorted({int(r["heads"]) for r in rows})
    Fs = sorted({int(r["F"]) for r in rows})
    A = np.full((len(Fs), len(Hs)), np.nan)
    for r in rows:
        v = r.get(key, math.nan)
        A[Fs.index(int(r["F"])), Hs.index(int(r["heads"]))] = np.nan if v is None else float(v)
    return Hs, Fs, A


def plot_phase_diagram(rows, *, title: str = "", simulate: bool = False):
    """Heat maps over (heads H, spikes F) of the final risk, the number of specialized heads
    (annotated ``n / min(H, F)``), the head pairs with a shared spike profile and the first
    specialization time (means over seeds, at the last saved time); a second row for the
    simulation when ``simulate``. ``rows`` are sweep rows (dicts) of one activation."""
    panels = [("final_risk", "final risk", "viridis"), ("n_specialized", "specialized heads", "magma"),
              ("shared_profiles", "head pairs with a shared spike profile", "cividis"), ("first_specialization", "first specialization time", "plasma")]
    prefixes = [""] + (["sim_"] if simulate else [])
    fig, axes = plt.subplots(len(prefixes), len(panels), figsize=(4.0 * len(panels), 3.3 * len(prefixes)), constrained_layout=True, squeeze=False)
    for i, pre in enumerate(prefixes):
        for j, (key, label, cmap) in enumerate(panels):
            ax = axes[i, j]
            Hs, Fs, A = _grid(rows, pre + key)
            im = ax.imshow(A, origin="lower", cmap=cmap, aspect="auto")
            ax.set_xticks(range(len(Hs)), [str(h) for h in Hs])
            ax.set_yticks(range(len(Fs)), [str(f) for f in Fs])
            ax.set_xlabel("heads H")
            ax.set_ylabel("spikes F")
            ax.set_title(("simulation: " if pre else "theory: ") + label, fontsize=9)
            for y, F in enumerate(Fs):
                for x, H in enumerate(Hs):
                    v = A[y, x]
                    txt = "n/a" if not np.isfinite(v) else (f"{v:.2g}/{min(H, F)}" if key == "n_specialized" else f"{v:.3g}")
                    light = np.isfinite(v) and im.norm(v) > 0.6 if np.any(np.isfinite(A)) else False
                    ax.text(x, y, txt, ha="center", va="center", fontsize=8, color="k" if (light or not np.isfinite(v)) else "w")
            if np.any(np.isfinite(A)):
                fig.colorbar(im, ax=ax, shrink=0.8)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
