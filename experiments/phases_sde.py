"""Finite-D fluctuations of the escape: ODE vs SDE vs simulation (issue 5, item 5).

Setting: the flipped case of ``phases_logD.py`` (bsoftmax, trained biases, L=4, F=2, H=2,
theta = +-3 e_f, lr=1), at D = 1000 and 4000. For each D:

* ODE from the simulator's D-dependent initial overlaps (16 seeds): the only randomness is the
  initial condition;
* SDE (:func:`singleloc.integrate_sde`): the same starts plus the SGD noise, whose covariance is
  the per-step update covariance of the order parameters divided by D (16 Brownian paths,
  Euler-Maruyama, dt = 0.05, on a diffrax VirtualBrownianTree);
* simulations (8 seeds at D=1000, 4 at D=4000), whose initial overlaps are those of the first
  seeds of the ODE and SDE runs.

Escape time: the risk halfway from the unspecialized plateau to the median ODE risk at
tau = 14 (one threshold for every run). Reported: mean and spread of the escape times, and their dependence on
the initial amplitude along the escape subspace. Writes figures/phases_sde.png and .json;
about 27 minutes on 2 CPU cores beside other work, on the exact route (``--cache DIR`` keeps the
stages' results; ``--quick``: D = 1000 only, 4 ODE and SDE runs, 2 simulations).
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import cache_dir, figure, figures_dir, fixed_point, parser, save_json, stage  # noqa: E402

import singleloc as sl  # noqa: E402

CONFIG = sl.load_config("bsoftmax", ["problem.prior=flipped", "problem.strength=3.0", "sgd.lr=1.0", "theory.points=1024",
                                     "simulation.test_samples=1024"])
DS = {1000: 8, 4000: 4}  # D -> simulation seeds
SEEDS = 16
TAU = 14.0


def main() -> None:
    args = parser(__doc__).parse_args()
    cache = cache_dir(args, "phases_sde")
    ds, seeds = ({1000: 2}, 4) if args.quick else (DS, SEEDS)
    t_start = time.time()
    cfg = CONFIG
    H, F = cfg.model.heads, cfg.problem.F
    mean = cfg.problem.build_prior().mean()
    ode = sl.OrderParameterODE.from_setup(sl.build(cfg))

    fp = stage(cache, "fixed", lambda: fixed_point(cfg, ode, tau_flow=20.0, dt=0.1))
    lin = sl.linearize(ode, fp["M"], fp["Q"], fp["b"])
    lam = sl.escape_rate(lin, mean=mean)
    basis = sl.escape_subspace(lin, mean=mean)
    ts = np.linspace(0.0, TAU, int(TAU * 4) + 1)
    res = {}
    for D, n_sim in ds.items():
        c = cfg.replace(simulation={"D": D, "seeds": seeds})
        y0 = sl.initial_conditions(c)
        t0 = time.time()
        ode_r = SimpleNamespace(**stage(cache, f"ode_{D}", lambda c=c, y0=y0: vars(sl.integrate(c, y0, ts=ts, progress=False))))
        t1 = time.time()
        keys = jax.random.split(jax.random.PRNGKey(D), seeds)
        sde_r = SimpleNamespace(**stage(cache, f"sde_{D}", lambda c=c, y0=y0, keys=keys: vars(
            sl.integrate_sde(sl.build(c), y0, keys, ts=ts, dt=0.05))))
        t2 = time.time()
        cs = c.replace(simulation={"seeds": n_sim}, sgd={"tau_max": TAU, "n_save": int(TAU * 4) + 1})
        sim_r = SimpleNamespace(**stage(cache, f"sim_{D}", lambda cs=cs: sl.simulate(cs, progress=False).arrays()))
        t3 = time.time()
        print(f"D = {D}: ODE {t1 - t0:.0f} s, SDE {t2 - t1:.0f} s, simulation {t3 - t2:.0f} s", flush=True)
        res[D] = (ode_r, sde_r, sim_r)
    R_to = float(np.median(np.concatenate([r[0].risk[:, -1] for r in res.values()])))
    R_from = float(fp["risk"])
    out = {"config": cfg.to_dict(), "lambda": lam, "threshold": [R_from, R_to], "D": {}}
    fig = figure(figsize=(15, 4.2), layout="constrained")
    axes = fig.subplots(1, len(ds) + 1)
    for j, (D, (o, s, m)) in enumerate(res.items()):
        rows = {}
        for name, r, risk in (("ODE", o, o.risk), ("SDE", s, s.risk), ("simulation", m, m.risk_limit)):
            esc = np.array([sl.halfway_time(r.tau, x, 0.0, R_from, R_to) for x in risk])
            A0 = sl.subspace_amplitude(basis, r.M[:, 0])
            ok = np.isfinite(esc)
            slope = float(np.polyfit(np.log(1 / A0[ok]), esc[ok], 1)[0]) if ok.sum() > 2 else float("nan")
            em = esc[: ds[D]]  # the starts shared with the simulations
            rows[name] = {"escape": esc.tolist(), "mean": float(np.nanmean(esc)), "std": float(np.nanstd(esc, ddof=1)),
                          "n": int(ok.sum()), "d_escape_d_log_inv_A0": slope,
                          "matched_mean": float(np.nanmean(em)), "matched_std": float(np.nanstd(em, ddof=1))}
            print(f"  D = {D} {name:10s}: escape {np.nanmean(esc):.2f} +- {np.nanstd(esc, ddof=1):.2f} (n = {ok.sum()}); "
                  f"on the {ds[D]} starts shared with the simulations {np.nanmean(em):.2f} +- {np.nanstd(em, ddof=1):.2f}; "
                  f"d tau_esc / d log(1/A0) = {slope:.2f} (noise-free linear theory: 1/lambda = {1 / lam:.2f})")
        out["D"][str(D)] = rows
        ax = axes[j]
        for name, r, risk, col in (("ODE", o, o.risk, "k"), ("SDE", s, s.risk, "C0"), ("simulation", m, m.risk_limit, "C3")):
            lo, mid, hi = np.nanpercentile(risk, [10, 50, 90], axis=0)
            ax.plot(r.tau, mid, color=col, lw=1.4, label=f"{name} median, 10-90% band ({risk.shape[0]} runs)")
            ax.fill_between(r.tau, lo, hi, color=col, alpha=0.15, lw=0)
        ax.axhline(0.5 * (R_from + R_to), color="gray", ls=":", lw=1)
        ax.set_xlabel(r"$\tau$")
        ax.set_ylabel("risk")
        ax.set_title(f"D = {D}")
        ax.legend(fontsize=7, frameon=False)
    ax = axes[-1]
    names = ["ODE", "SDE", "simulation"]
    for j, D in enumerate(res):
        for i, name in enumerate(names):
            e = np.asarray(out["D"][str(D)][name]["escape"])
            x = j * 4 + i + np.linspace(-0.15, 0.15, len(e))
            ax.plot(x, e, "o", ms=3.5, color=["k", "C0", "C3"][i], alpha=0.7)
            ax.errorbar(j * 4 + i + 0.3, np.nanmean(e), yerr=np.nanstd(e, ddof=1), fmt="s", color=["k", "C0", "C3"][i], capsize=3)
            em = e[: ds[D]]
            ax.errorbar(j * 4 + i + 0.45, np.nanmean(em), yerr=np.nanstd(em, ddof=1), fmt="s", mfc="none",
                        color=["k", "C0", "C3"][i], capsize=3)
    ax.set_xticks([j * 4 + i for j in range(len(res)) for i in range(3)], [f"{n}\nD={D}" for D in res for n in names], fontsize=7)
    ax.set_ylabel("escape time")
    ax.set_title("escape times (mean, sd; open: starts shared with the simulations)")
    fig.suptitle(f"finite-D fluctuations: bsoftmax, H={H}, F={F}, flipped prior of strength {cfg.problem.strength}, "
                 f"lr={cfg.sgd.lr}; SDE noise = per-step update covariance / D", fontsize=10)
    path = sl.save_figure(figures_dir(args) / "phases_sde.png", fig)
    out["runtime_s"] = time.time() - t_start
    save_json(figures_dir(args) / "phases_sde.json", out)
    print(f"wrote {path} and .json in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
