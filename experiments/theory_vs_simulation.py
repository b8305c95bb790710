"""Theory against simulation: agreement of the risk, the overlaps and the escape times.

Part 1 (``--part agreement``): the default preset (softmax), and the softmax1 and bsoftmax
presets (biases trained), simulated at D = 4000 with 4 seeds, each seed against the ODE
started from its own initial overlaps. Reported:

* the escape time of each theory curve that drops by more than 0.02 after a plateau: by the
  rule of :func:`singleloc.escape_times` (halfway from the plateau value to the next plateau's
  value, or to the final value); the simulation's escape time is when its risk (3-point moving
  average) crosses the same level; and their relative difference;
* the escape window: the saved times at which the theory risk or the smoothed simulation
  risk lies between 10% and 90% of the way from the plateau to the final value;
* the maximal deviation of the risk outside and inside the windows, and of the overlaps M
  outside them.

Part 2 (``--part scaling``): the default preset to tau = 10 at D = 1000, 4000, 16000
(2 seeds each): the maximal deviation of M (pure finite-D fluctuation; the test risk also
carries the Monte Carlo error of its test set) against D, with the fitted exponent.

Writes figures/theory_vs_simulation.png and figures/theory_vs_simulation_D.png.
Run: ``python experiments/theory_vs_simulation.py [--part agreement|scaling|both]``; ``--quick``:
2 seeds, D divided by 8, 4096 test sequences (agreement) and 256 quadrature points; ``--cache
DIR`` keeps every simulation and ODE run.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import cache_dir, figure, figures_dir, parser, stage  # noqa: E402

import singleloc as sl  # noqa: E402

# 65536 test sequences: Monte Carlo error of each saved test risk about 0.0015, so that the
# pointwise 0.01 criterion measures the dynamics, not the test set.
COMMON = ["simulation.D=4000", "simulation.test_samples=65536"]
QUICK = ["simulation.D=500", "simulation.test_samples=4096", "simulation.seeds=2", "theory.points=256"]
AGREEMENT = {
    "softmax (default)": ("default", ["sgd.tau_max=30", "sgd.n_save=61"]),
    "softmax1 + bias": ("softmax1", ["sgd.tau_max=30", "sgd.n_save=61"]),
    "bsoftmax + bias": ("bsoftmax", ["sgd.tau_max=80", "sgd.n_save=81"]),
}
SCALING_D = [1000, 4000, 16000]


def run_pair(preset, overrides, cache, name):
    """The simulation of ``preset`` with ``overrides`` and the ODE from each seed's initial
    overlaps on its saved times (kept in ``cache`` as ``sim_<name>``, ``theory_<name>``)."""
    cfg = sl.load_config(preset, overrides)
    t0 = time.perf_counter()
    sim = SimpleNamespace(**stage(cache, f"sim_{name}", lambda: sl.simulate(cfg, progress=False).arrays()))
    t1 = time.perf_counter()
    th = SimpleNamespace(**stage(cache, f"theory_{name}",
                                 lambda: vars(sl.integrate(cfg, sl.initial_conditions(cfg), ts=sim.tau, progress=False))))
    t2 = time.perf_counter()
    return cfg, sim, th, t1 - t0, t2 - t1


def escape(tau, risk):
    """``(escape time, plateau value, value escaped to)`` of the last escape of a theory curve
    (:func:`singleloc.escape_times`) whose risk drops by more than 0.02, or None without one."""
    ps = sl.plateaus(tau, risk)
    levels = [p.risk for p in ps[1:]] + [float(risk[-1])]  # the next plateau's value, or the final risk
    for p, t, to in reversed(list(zip(ps, sl.escape_times(tau, risk, ps), levels))):
        if p.risk - to > 0.02:
            return t, p.risk, to
    return None


def smooth(risk):
    """Three-point moving average (ends kept): the simulation's test risk is noisy."""
    out = risk.copy()
    out[1:-1] = (risk[:-2] + risk[1:-1] + risk[2:]) / 3
    return out


def window(tau, risk, plateau, final):
    """Saved times where the risk is between 10% and 90% of the way from plateau to final."""
    frac = (plateau - risk) / (plateau - final)
    inside = (frac > 0.1) & (frac < 0.9)
    idx = np.flatnonzero(inside)
    return (tau[idx[0]], tau[idx[-1]]) if len(idx) else None


def agreement(args) -> None:
    quick, cache = args.quick, cache_dir(args, "theory_vs_simulation")
    fig = figure(figsize=(13, 6.5), layout="constrained")
    axes = fig.subplots(2, 3)
    print("| config | seed | escape theory | escape sim | rel. diff | max dR outside | max dR inside | max dM outside |")
    print("|---|---|---|---|---|---|---|---|")
    for col, (name, (preset, overrides)) in enumerate(AGREEMENT.items()):
        cfg, sim, th, t_sim, t_th = run_pair(preset, [*(QUICK if quick else COMMON), *overrides], cache, preset)
        tau = sim.tau
        for s in range(sim.risk.shape[0]):
            # the plateau and final levels come from the theory; the simulation's escape is
            # the time its (smoothed) risk crosses the same halfway level
            e_th = escape(tau, th.risk[s])
            e_sim = None
            inside = np.zeros(len(tau), bool)
            if e_th is not None:
                _, plateau, final = e_th
                start = tau[np.argmin(np.abs(th.risk[s] - plateau))]
                e_sim = (sl.halfway_time(tau, smooth(sim.risk[s]), start, plateau, final),)
                for r in (th.risk[s], smooth(sim.risk[s])):
                    if (w := window(tau, r, plateau, final)) is not None:
                        inside |= (tau >= w[0]) & (tau <= w[1])
            dR = np.abs(sim.risk[s] - th.risk[s])
            dM = np.abs(sim.M[s] - th.M[s]).max(axis=(1, 2))
            out_R = dR[~inside].max()
            in_R = dR[inside].max() if inside.any() else float("nan")
            out_M = dM[~inside].max()
            rel = abs(e_sim[0] - e_th[0]) / e_th[0] if (e_th and e_sim) else float("nan")
            print(f"| {name} | {s} | {e_th[0] if e_th else float('nan'):.2f} | {e_sim[0] if e_sim else float('nan'):.2f} | "
                  f"{rel:.3f} | {out_R:.4f} | {in_R:.4f} | {out_M:.4f} |")
        print(f"<!-- {name}: simulation {t_sim:.1f} s, theory {t_th:.1f} s -->")
        ax = axes[0, col]
        for s in range(sim.risk.shape[0]):
            ax.plot(tau, th.risk[s], "k", lw=1.0, alpha=0.7, label="theory" if s == 0 else None)
            ax.plot(tau, sim.risk[s], "o", ms=2.2, color=f"C{s}", alpha=0.8, label=f"sim seed {s}")
        ax.set_title(f"{name}, D = {cfg.simulation.D}", fontsize=10)
        ax.set_xlabel(r"$\tau$")
        ax.set_ylabel("risk")
        ax.legend(frameon=False, fontsize=7)
        ax = axes[1, col]
        H, F = th.M.shape[2:]
        for h in range(H):
            for f in range(F):
                ax.plot(tau, th.M[0, :, h, f], color=f"C{h * F + f}", lw=1.2, label=f"$M_{{{h + 1}{f + 1}}}$")
                ax.plot(tau, sim.M[0, :, h, f], ".", ms=2.5, color=f"C{h * F + f}")
        ax.set_xlabel(r"$\tau$")
        ax.set_title("overlaps of seed 0 (lines: theory, dots: simulation)", fontsize=9)
        ax.legend(frameon=False, fontsize=7, ncol=2)
    print(f"wrote {sl.save_figure(figures_dir(args) / 'theory_vs_simulation.png', fig)}")


def scaling(args) -> None:
    quick, cache = args.quick, cache_dir(args, "theory_vs_simulation")
    Ds = [D // 8 for D in SCALING_D] if quick else SCALING_D
    devM, devR = [], []
    for D in Ds:
        overrides = [f"simulation.D={D}", "simulation.seeds=2", "sgd.tau_max=10", "sgd.n_save=21"]
        overrides += ["theory.points=256"] if quick else []
        _, sim, th, t_sim, t_th = run_pair("default", overrides, cache, f"default_D{D}")
        devM.append(np.abs(sim.M - th.M).max())
        devR.append(np.abs(sim.risk - th.risk).max())
        print(f"D = {D:6d}: max |dM| = {devM[-1]:.4f}, max |dR| = {devR[-1]:.4f} (simulation {t_sim:.0f} s, theory {t_th:.0f} s)")
    slope = np.polyfit(np.log(Ds), np.log(devM), 1)[0]
    print(f"fitted exponent of max |dM| against D: {slope:.2f} (finite-D fluctuations: -0.5)")
    fig = figure(figsize=(4.5, 3.5), layout="constrained")
    ax = fig.subplots()
    ax.loglog(Ds, devM, "o-", label=r"max $|M_{sim} - M_{theory}|$")
    ax.loglog(Ds, devR, "s-", label=r"max $|R_{sim} - R_{theory}|$")
    ax.loglog(Ds, devM[0] * (np.array(Ds) / Ds[0]) ** -0.5, "k--", lw=0.8, label=r"$D^{-1/2}$")
    ax.set_xlabel("D")
    ax.set_title(f"default preset, tau <= 10; fitted exponent {slope:.2f}", fontsize=9)
    ax.legend(frameon=False, fontsize=8)
    print(f"wrote {sl.save_figure(figures_dir(args) / 'theory_vs_simulation_D.png', fig)}")


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--part", choices=["agreement", "scaling", "both"], default="both", help="what to run (default both)")
    args = p.parse_args()
    if args.part in ("agreement", "both"):
        agreement(args)
    if args.part in ("scaling", "both"):
        scaling(args)


if __name__ == "__main__":
    main()
