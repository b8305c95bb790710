"""Finite-D fluctuations of the escape: ODE vs SDE vs simulation (issue 5, item 5).

Setting: the flipped case of ``phases_logD.py`` (bsoftmax, trained biases, L=4, F=2, H=2,
theta = +-3 e_f, lr=1), at D = 1000 and 4000. For each D:

* ODE from the simulator's D-dependent initial overlaps (16 seeds): the only randomness is the
  initial condition;
* SDE (``singleloc._fluctuations``): the same starts plus the SGD noise, whose covariance is
  the per-step update covariance of the order parameters divided by D (16 Brownian paths,
  Euler-Maruyama, dt = 0.05, on a diffrax VirtualBrownianTree);
* simulations (8 seeds at D=1000, 4 at D=4000), whose initial overlaps are those of the first
  seeds of the ODE and SDE runs.

Escape time: the risk halfway from the unspecialized plateau to the median ODE risk at
tau = 14 (one threshold for every run). Reported: mean and spread of the escape times, and their dependence on
the initial amplitude along the escape subspace. Writes figures/phases_sde.png and .json;
about 6 minutes on 2 CPU cores (``--cache DIR`` keeps the stages' results).
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import jax

jax.config.update("jax_enable_x64", True)

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from singleloc import OrderParameterODE, initial_conditions, integrate, load_config, simulate  # noqa: E402
import singleloc as sl  # noqa: E402
from singleloc._fluctuations import integrate_sde  # noqa: E402
from _stages import cache_dir, stage  # noqa: E402
from singleloc._io import save_figure, save_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = load_config("bsoftmax", ["problem.prior=flipped", "problem.strength=3.0", "sgd.lr=1.0", "theory.points=1024", "simulation.test_samples=1024"])
DS = {1000: 8, 4000: 4}  # D -> simulation seeds
SEEDS = 16
TAU = 14.0
CACHE = cache_dir()


def main() -> None:
    t_start = time.time()
    cfg = CONFIG
    H, F = cfg.model.heads, cfg.problem.F
    mean = cfg.problem.build_prior().mean()
    ode = OrderParameterODE.from_config(cfg)
    fp = stage(CACHE, "fixed", lambda: (lambda p: {"M": p.M, "Q": p.Q, "b": p.b, "risk": p.risk})(sl.unspecialized_point(ode, H, F, tau_flow=20.0, dt=0.1)))
    lin = sl.linearize(ode, fp["M"], fp["Q"], fp["b"])
    lam = sl.escape_rate(lin, mean=mean)
    basis = sl.escape_subspace(lin, mean=mean)
    ts = np.linspace(0.0, TAU, int(TAU * 4) + 1)
    res = {}
    for D, n_sim in DS.items():
        c = cfg.replace(simulation={"D": D, "seeds": SEEDS})
        y0 = initial_conditions(c)
        t0 = time.time()
        ode_r = SimpleNamespace(**stage(CACHE, f"ode_{D}", lambda: integrate(c, y0, ts=ts, progress=False).__dict__))
        t1 = time.time()
        keys = jax.random.split(jax.random.PRNGKey(D), SEEDS)
        sde_r = SimpleNamespace(**stage(CACHE, f"sde_{D}", lambda: integrate_sde(c, y0, keys, ts=ts, dt=0.05).__dict__))
        t2 = time.time()
        cs = c.replace(simulation={"seeds": n_sim}, sgd={"tau_max": TAU, "n_save": int(TAU * 4) + 1})
        sim_r = SimpleNamespace(**stage(CACHE, f"sim_{D}", lambda: {k: v for k, v in simulate(cs, progress=False).__dict__.items() if k not in ("K", "kstar")}))
        t3 = time.time()
        print(f"D = {D}: ODE {t1 - t0:.0f} s, SDE {t2 - t1:.0f} s, simulation {t3 - t2:.0f} s", flush=True)
        res[D] = (ode_r, sde_r, sim_r)
    R_to = float(np.median(np.concatenate([r[0].risk[:, -1] for r in res.values()])))
    R_from = float(fp["risk"])
    out = {"config": cfg.to_dict(), "lambda": lam, "threshold": [R_from, R_to], "D": {}}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), constrained_layout=True)
    for j, (D, (o, s, m)) in enumerate(res.items()):
        rows = {}
        for name, r, risk in (("ODE", o, o.risk), ("SDE", s, s.risk), ("simulation", m, m.risk_limit)):
            esc = np.array([sl.halfway_time(r.tau, x, 0.0, R_from, R_to) for x in risk])
            A0 = sl.subspace_amplitude(basis, r.M[:, 0])
            ok = np.isfinite(esc)
            slope = float(np.polyfit(np.log(1 / A0[ok]), esc[ok], 1)[0]) if ok.sum() > 2 else float("nan")
            em = esc[: DS[D]]  # the starts shared with the simulations
            rows[name] = {"escape": esc.tolist(), "mean": float(np.nanmean(esc)), "std": float(np.nanstd(esc, ddof=1)),
                          "n": int(ok.sum()), "d_escape_d_log_inv_A0": slope,
                          "matched_mean": float(np.nanmean(em)), "matched_std": float(np.nanstd(em, ddof=1))}
            print(f"  D = {D} {name:10s}: escape {np.nanmean(esc):.2f} +- {np.nanstd(esc, ddof=1):.2f} (n = {ok.sum()}); on the {DS[D]} starts "
                  f"shared with the simulations {np.nanmean(em):.2f} +- {np.nanstd(em, ddof=1):.2f}; "
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
    ax = axes[2]
    names = ["ODE", "SDE", "simulation"]
    for j, D in enumerate(res):
        for i, name in enumerate(names):
            e = np.asarray(out["D"][str(D)][name]["escape"])
            x = j * 4 + i + np.linspace(-0.15, 0.15, len(e))
            ax.plot(x, e, "o", ms=3.5, color=["k", "C0", "C3"][i], alpha=0.7)
            ax.errorbar(j * 4 + i + 0.3, np.nanmean(e), yerr=np.nanstd(e, ddof=1), fmt="s", color=["k", "C0", "C3"][i], capsize=3)
            em = e[: DS[D]]
            ax.errorbar(j * 4 + i + 0.45, np.nanmean(em), yerr=np.nanstd(em, ddof=1), fmt="s", mfc="none", color=["k", "C0", "C3"][i], capsize=3)
    ax.set_xticks([j * 4 + i for j in range(len(res)) for i in range(3)], [f"{n}\nD={D}" for D in res for n in names], fontsize=7)
    ax.set_ylabel("escape time")
    ax.set_title("escape times (mean, sd; open: starts shared with the simulations)")
    fig.suptitle(f"finite-D fluctuations: bsoftmax, H={H}, F={F}, flipped prior of strength {cfg.problem.strength}, lr={cfg.sgd.lr}; "
                 f"SDE noise = per-step update covariance / D", fontsize=10)
    save_figure(ROOT / "figures" / "phases_sde.png", fig)
    plt.close(fig)
    out["runtime_s"] = time.time() - t_start
    save_json(ROOT / "figures" / "phases_sde.json", out)
    print(f"wrote figures/phases_sde.png and .json in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
