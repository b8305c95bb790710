"""Late specialization of softmax heads: escape time against log D, theory and simulation.

The default problem (spikes prior of strength 2.5, L = 4, H = F = 2, lr = 0.5) with softmax
and softmax1 (no biases). The two heads first share the mean-direction profile
(``M_h ~ (1.4, 1.4)``: the unspecialized plateau); the plateau is a saddle whose unstable
direction breaks the head symmetry with a small rate ``lambda ~ 0.01-0.016``, so the heads
split late, at ``tau ~ tau_0 + log(D) / (2 lambda)`` (docs/model.md section 9).

1. The symmetric flow (both heads equal) to tau = 600 and the escape rate ``lambda(tau)`` of
   the linearised ODE along it (the plateau creeps, it has no fixed point at finite times);
   the adiabatic prediction of the slope ``d tau_esc / d log D`` is ``1 / (2 lambda)`` with
   ``lambda`` averaged over the plateau window where the escapes happen.
2. Simulations at D = 250, 500, 1000, 2000 (4 seeds each) to 2.2-3.6 times the predicted
   escape time, and the ODE from each seed's own initial overlaps on the same time grid.
3. Symmetry breaking is measured on the overlaps, not on the risk (the risk falls by only
   0.005 at the split, the Monte Carlo error of a test risk): the head spread orthogonal to
   the prior mean, ``S = sqrt(mean_h |P_perp (M_h - mean_h' M_h')|^2)``, is ``O(D^-1/2)`` on
   the plateau and ``O(1)`` after the split; the escape time is the first saved time at
   which ``S`` reaches half its final value (theory median at D = 2000).
4. Fits ``tau_esc = a + beta log D`` for theory and simulation (least squares over seeds,
   standard errors from the residuals), ``beta`` against ``1 / (2 lambda)``; final head
   profiles of theory and simulation (heads matched by the best permutation).

Writes figures/late_specialization.png and figures/late_specialization.json. Runtime about
15 minutes on 2 CPU cores (the D = 2000 simulations dominate); ``--cache DIR`` keeps every
stage in DIR and reuses it.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import cache_dir, figure, figures_dir, fit, fixed_point, parser, save_json, stage  # noqa: E402

import singleloc as sl  # noqa: E402
from singleloc.runtime._numerics import first_crossing  # noqa: E402

ACTIVATIONS = ("softmax", "softmax1")
PLATEAU_WINDOW = (150.0, 500.0)  # where the escapes of D = 250..2000 happen


@dataclasses.dataclass(frozen=True)
class Plan:
    """Sizes of a run: simulated D (with their horizons), seeds, the rescaled series."""

    tau_max: dict  # simulated D -> tau_max
    seeds: dict  # simulated D -> number of seeds
    d_scaled: tuple
    tau_scaled: float
    tau_plateau: float

    @property
    def d_sim(self) -> tuple:
        return tuple(self.tau_max)


FULL = Plan({250: 600, 500: 700, 1000: 800, 2000: 900}, {250: 8, 500: 8, 1000: 8, 2000: 4},
            tuple(250 * 4**k for k in range(7)), 1500.0, 600.0)
QUICK = Plan({250: 500, 500: 550}, {250: 2, 500: 2}, (250, 4000, 64000), 700.0, 300.0)


def config(activation: str, D: int, plan: Plan) -> sl.Config:
    tau = plan.tau_max[D]
    return sl.load_config("default", [f"model.activation={activation}", f"simulation.D={D}", f"sgd.tau_max={tau}",
                                      f"sgd.n_save={tau // 5 + 1}", f"simulation.seeds={plan.seeds[D]}"])


def spread(M: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """Head spread orthogonal to the prior mean: ``sqrt(mean_h |P_perp (M_h - Mbar)|^2)``."""
    u = mean / np.linalg.norm(mean)
    dev = M - M.mean(axis=-2, keepdims=True)
    dev = dev - (dev @ u)[..., None] * u
    return np.sqrt(np.mean(np.sum(dev**2, axis=-1), axis=-1))


def fit_log(D, t):
    """Least squares ``t = a + beta log D``: ``(beta, se_beta, a)``."""
    coef, se, _ = fit(np.asarray(t, float), np.log(np.asarray(D, float)))
    return float(coef[1]), float(se[1]), float(coef[0])


def matched_difference(Ma: np.ndarray, Mb: np.ndarray) -> tuple[float, bool]:
    """``max |Ma - P Mb|`` over the best head permutation ``P``, and whether ``P`` is the identity."""
    H = Ma.shape[0]
    errs = {p: float(np.max(np.abs(Ma - Mb[list(p)]))) for p in itertools.permutations(range(H))}
    best = min(errs, key=errs.get)
    return errs[best], best == tuple(range(H))


def scaled_theory(activation: str, plan: Plan) -> dict[str, np.ndarray]:
    """The ODE from one start whose head-asymmetric part is rescaled as ``D^{-1/2}``.

    Seed 0's initial overlaps at D = 2000 are split into the head mean of ``M`` and the
    deviations from it; the deviations are rescaled by ``sqrt(2000 / D)`` for each D of
    ``plan.d_scaled`` (``R_orth`` kept). Without the seed-to-seed scatter of the amplitude,
    the escape times of these runs measure the ``log D`` slope of the ODE itself.
    """
    cfg = config(activation, plan.d_sim[0], plan).replace(
        simulation={"D": 2000}, sgd={"tau_max": plan.tau_scaled, "n_save": int(plan.tau_scaled) // 5 + 1})
    y0 = sl.initial_conditions(cfg, 1)
    M0, Q0 = np.asarray(y0.M[0]), np.asarray(y0.Q[0])
    R0 = Q0 - M0 @ M0.T
    Mbar = M0.mean(axis=0, keepdims=True)
    Ms = [Mbar + (M0 - Mbar) * np.sqrt(2000 / D) for D in plan.d_scaled]
    starts = sl.OrderParameters(np.stack(Ms), np.stack([M @ M.T + R0 for M in Ms]), np.zeros((len(Ms), cfg.model.heads)))
    th = sl.integrate(cfg, starts, progress=False)
    return {"tau": th.tau, "M": th.M, "risk": th.risk, "D": np.asarray(plan.d_scaled, float)}


def plateau_rates(activation: str, plan: Plan) -> dict[str, np.ndarray]:
    """The symmetric flow and the escape rate ``lambda(tau)`` of the linearised ODE along it."""
    cfg = sl.load_config("default", [f"model.activation={activation}"])
    ode = sl.OrderParameterODE.from_setup(sl.build(cfg))
    mean = cfg.problem.build_prior().mean()
    fp = fixed_point(cfg, ode, tau_flow=plan.tau_plateau, polish=False)
    keep = slice(None, None, 5)
    rates = sl.escape_rate_along(ode, fp["path_tau"][keep], fp["path_x"][keep], cfg.model.heads, cfg.problem.F, mean=mean)
    return {"tau": fp["path_tau"][keep], "rate": rates, "risk": fp["path_risk"][keep]}


def analyse(act: str, plan: Plan, cache) -> tuple[dict, dict]:
    """Stages of one activation and their analysis: ``(runs, results)``."""
    plateau = stage(cache, f"plateau_{act}", lambda: plateau_rates(act, plan))
    window = (plateau["tau"] >= PLATEAU_WINDOW[0]) & (plateau["tau"] <= PLATEAU_WINDOW[1])
    window = window if window.any() else plateau["tau"] > 0
    lam = float(np.mean(plateau["rate"][window]))
    mean = config(act, plan.d_sim[0], plan).problem.build_prior().mean()
    runs = {}
    for D in plan.d_sim:
        cfg = config(act, D, plan)
        sim = stage(cache, f"sim_{act}_D{D}", lambda cfg=cfg: sl.simulate(cfg, progress=False).arrays())
        th = stage(cache, f"theory_{act}_D{D}", lambda cfg=cfg, sim=sim: {
            k: v for k, v in vars(sl.integrate(cfg, sl.initial_conditions(cfg), ts=sim["tau"], progress=False)).items()
            if k in ("tau", "M", "Q", "b", "risk")})
        runs[D] = (sim, th)
    level = 0.5 * float(np.median(spread(runs[plan.d_sim[-1]][1]["M"][:, -1], mean)))
    esc = {kind: [[first_crossing(data["tau"], si, level) for si in spread(data["M"], mean)]
                  for sim, th in runs.values() for data in [th if kind == "theory" else sim]]
           for kind in ("theory", "simulation")}
    profiles = [matched_difference(th["M"][i, -1], sim["M"][i, -1])
                for sim, th in runs.values() for i in range(len(th["M"]))]
    Ds = np.repeat(plan.d_sim, [plan.seeds[D] for D in plan.d_sim])
    fits = {kind: fit_log(Ds, np.concatenate(v)) for kind, v in esc.items()}
    # the same fits at fixed normalised initial amplitude z = S(0) sqrt(D): the seed-to-seed
    # scatter of the start removed (prediction for the ODE: coefficient -1/lambda on log z)
    z = np.concatenate([spread(th["M"][:, 0], mean) * np.sqrt(D) for D, (sim, th) in runs.items()])
    amplitude = {}
    for kind in ("theory", "simulation"):
        coef, se, _ = fit(np.concatenate(esc[kind]), np.log(Ds), np.log(z))
        fits[f"{kind}, fixed amplitude"] = (float(coef[1]), float(se[1]), float(coef[0]))
        amplitude[kind] = {"value": float(coef[2]), "se": float(se[2]), "ode_prediction": -1 / lam}
    scaled = stage(cache, f"scaled_{act}", lambda: scaled_theory(act, plan))
    esc["theory, rescaled start"] = [first_crossing(scaled["tau"], si, level) for si in spread(scaled["M"], mean)]
    fits["theory, rescaled start"] = fit_log(scaled["D"], esc["theory, rescaled start"])
    final = {kind: data["M"][:, -1] for kind, data in zip(("simulation", "theory"), runs[plan.d_sim[-1]])}
    results = {
        "lambda_plateau_mean": lam,
        "lambda_plateau": dict(zip(map(float, plateau["tau"]), map(float, plateau["rate"]))),
        "predicted_slope": 1 / (2 * lam),
        "level": level,
        "D_simulated": list(plan.d_sim),
        "D_scaled": list(plan.d_scaled),
        "escape_times": {k: [np.asarray(t).tolist() for t in v] for k, v in esc.items()},
        "slope": {k: {"beta": f[0], "se": f[1], "intercept": f[2], "ratio_to_prediction": f[0] * 2 * lam}
                  for k, f in fits.items()},
        "log_amplitude_coefficient": amplitude,
        "final_M_max_difference": [p[0] for p in profiles],
        "same_split_as_theory": int(sum(p[1] for p in profiles)),
        "runs": len(profiles),
        "final_M_largest_D": {k: v.tolist() for k, v in final.items()},
    }
    return runs, results


def report(act: str, r: dict, plan: Plan) -> None:
    lam = r["lambda_plateau_mean"]
    rates = [v for t, v in r["lambda_plateau"].items() if PLATEAU_WINDOW[0] <= t <= PLATEAU_WINDOW[1]]
    print(f"{act}: lambda on the plateau (tau {PLATEAU_WINDOW[0]:.0f}-{PLATEAU_WINDOW[1]:.0f}) {lam:.4f} "
          f"(from {min(rates, default=lam):.4f} to {max(rates, default=lam):.4f}); 1/(2 lambda) = {1 / (2 * lam):.1f}")
    for kind, v in r["log_amplitude_coefficient"].items():
        print(f"  {kind}: coefficient of log z {v['value']:.0f} +- {v['se']:.0f} (ODE prediction -1/lambda = {-1 / lam:.0f})")
    for kind, f in r["slope"].items():
        times = r["escape_times"][kind.split(",")[0] if "fixed" in kind else kind]
        Ds = plan.d_scaled if "rescaled" in kind else plan.d_sim
        by_D = ", ".join(f"{D}: {np.nanmean(t):.0f}" for D, t in zip(Ds, times))
        print(f"  {kind}: tau_esc = {f['intercept']:.0f} + {f['beta']:.1f} log D (+- {f['se']:.1f}); ratio to 1/(2 lambda) "
              f"{f['ratio_to_prediction']:.2f}; mean escape time by D: {by_D}")
    diffs = r["final_M_max_difference"]
    print(f"  final profiles: max |M_sim - M_th| {max(diffs):.3f} (median {np.median(diffs):.3f}); {r['same_split_as_theory']}/"
          f"{r['runs']} runs split the heads the same way as their own ODE")


def main() -> None:
    args = parser(__doc__).parse_args()
    plan = QUICK if args.quick else FULL
    cache = cache_dir(args, "late_specialization")
    start = time.time()
    runs, results = {}, {}
    for act in ACTIVATIONS:
        runs[act], results[act] = analyse(act, plan, cache)
        report(act, results[act], plan)
    out = figures_dir(args)
    draw(runs, results, plan, out)
    save_json(out / "late_specialization.json", results)
    print(f"{out / 'late_specialization.png'} written in {time.time() - start:.0f} s")


def draw(runs, results, plan: Plan, out) -> None:
    fig = figure(figsize=(15, 4.3))
    ax_s, ax_t, ax_m = fig.subplots(1, 3)
    colors = dict(zip(plan.d_sim, ["C0", "C1", "C2", "C3"]))
    mean = config("softmax", plan.d_sim[0], plan).problem.build_prior().mean()
    for D, (sim, th) in runs["softmax"].items():
        for i in range(plan.seeds[D]):
            ax_s.plot(th["tau"][1:], spread(th["M"][i], mean)[1:], color=colors[D], lw=1, label=f"D = {D}" if i == 0 else None)
            ax_s.plot(sim["tau"][1::4], spread(sim["M"][i], mean)[1::4], ".", color=colors[D], ms=2)
    ax_s.axhline(results["softmax"]["level"], color="k", ls=":", lw=1)
    ax_s.set(xscale="log", yscale="log", xlabel="tau", ylabel="head spread orthogonal to the mean",
             title="softmax: theory (lines), simulation (dots)")
    ax_s.legend(fontsize=8)
    for act, marker in zip(ACTIVATIONS, ("o", "s")):
        r = results[act]
        color = "C0" if act == "softmax" else "C3"
        for kind, fill in (("theory", "none"), ("simulation", None)):
            t = r["escape_times"][kind]
            x = np.log(np.repeat(plan.d_sim, [plan.seeds[D] for D in plan.d_sim])) + (0.03 if kind == "simulation" else -0.03)
            ax_t.plot(x, np.concatenate(t), marker, mfc=fill, color=color, ms=4,
                      label=f"{act} {kind}: slope {r['slope'][kind]['beta']:.0f} +- {r['slope'][kind]['se']:.0f}")
        kind = "theory, rescaled start"
        ax_t.plot(np.log(plan.d_scaled), r["escape_times"][kind], "-", marker=marker, mfc="none", color=color, lw=0.8, ms=3,
                  label=f"{act} {kind}: slope {r['slope'][kind]['beta']:.1f}")
        xs = np.log(np.array([plan.d_scaled[0], plan.d_scaled[-1]]))
        beta = r["predicted_slope"]
        t_mid = np.nanmean(np.asarray(r["escape_times"][kind]))
        ax_t.plot(xs, t_mid + beta * (xs - np.log(np.array(plan.d_scaled)).mean()), "--", color=color, lw=1,
                  label=f"{act}: 1/(2 lambda) = {beta:.0f}")
    ax_t.set(xlabel="log D", ylabel="escape time tau_esc", title="escape time vs log D")
    ax_t.legend(fontsize=7)
    D = 1000 if 1000 in runs["softmax"] else plan.d_sim[-1]
    sim, th = runs["softmax"][D]
    for h, f in itertools.product(range(2), range(2)):
        c, ls = f"C{f}", ("-", "--")[h]
        ax_m.plot(th["tau"][1:], th["M"][0, 1:, h, f], color=c, ls=ls, lw=1.2, label=f"head {h}, spike {f}")
        ax_m.plot(sim["tau"][1::4], sim["M"][0, 1::4, h, f], ".", color=c, ms=2)
    ax_m.set(xscale="log", xlabel="tau", ylabel="M_hf", title=f"softmax, D = {D}, seed 0: the profiles turn")
    ax_m.legend(fontsize=8)
    fig.tight_layout()
    sl.save_figure(out / "late_specialization.png", fig)


if __name__ == "__main__":
    main()
