"""Figures of trajectories: theory lines against simulation points."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

_COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def plot_compare(theory, simulation=None, title: str = ""):
    """Risk against tau and the overlaps ``M_hf(tau)``: theory lines (one per start, the
    first solid), simulation means as points with a band from the min to the max over seeds.

    ``theory`` and ``simulation`` are :class:`TheoryResult` / :class:`SimulationResult`
    (or anything with ``tau``, ``risk`` (S, T), ``M`` (S, T, H, F)).
    """
    S, T, H, F = theory.M.shape
    fig, axes = plt.subplots(1, 1 + F, figsize=(4.2 * (1 + F), 3.6), constrained_layout=True)
    ax = axes[0]
    for s in range(S):
        ax.plot(theory.tau, theory.risk[s], color="k", lw=1.4 if s == 0 else 0.8, alpha=1.0 if s == 0 else 0.45,
                label="theory (one line per seed)" if s == 0 else None)
    if simulation is not None:
        r = simulation.risk
        ax.fill_between(simulation.tau, r.min(0), r.max(0), color=_COLORS[0], alpha=0.25, lw=0)
        ax.plot(simulation.tau, r.mean(0), "o", ms=3, color=_COLORS[0], label=f"simulation, {r.shape[0]} seeds")
    ax.set_xlabel(r"$\tau = t/D$")
    ax.set_ylabel("risk")
    ax.set_title("risk")
    ax.legend(frameon=False, fontsize=8)
    for f in range(F):
        ax = axes[1 + f]
        for h in range(H):
            c = _COLORS[h % len(_COLORS)]
            for s in range(S):
                ax.plot(theory.tau, theory.M[s, :, h, f], color=c, lw=1.4 if s == 0 else 0.8, alpha=1.0 if s == 0 else 0.45,
                        label=f"head {h + 1}" if s == 0 else None)
            if simulation is not None:
                ax.plot(simulation.tau, simulation.M[:, :, h, f].T, ".", ms=2.5, color=c, alpha=0.6)
        ax.set_xlabel(r"$\tau$")
        ax.set_title(rf"$M_{{h{f + 1}}}$: overlap with spike {f + 1}")
        ax.legend(frameon=False, fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def close(fig) -> None:
    plt.close(fig)
