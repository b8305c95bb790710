"""The log D law of the specialization time (docs/model.md section 5, issue 5).

Settings (``--setting``): bsoftmax with trained biases, L=4, F=2, H=2 heads, lr=1, and
* ``flipped`` (default): theta = +-3 e_f, zero mean; the unspecialized point is M = 0;
* ``spikes``: theta = 3 e_f; the heads first align with the mean direction (1, 1).

1. The unspecialized fixed point (head-symmetric subspace, flow + root finding) and the
   linearised ODE there: the escape rate lambda* (largest eigenvalue whose eigenvector breaks
   the head symmetry away from the mean direction), and the same rate lambda(tau) along the
   symmetric trajectory, which creeps towards the fixed point very slowly.
2. Theory from the simulator's D-dependent initial overlaps, D = 250..16000, 8 seeds per D;
   a "scaled" series (one seed's symmetry-breaking part rescaled as D^{-1/2}, D up to 1.6e7);
   simulations at D = 125..2000 with 6-8 seeds per D (spikes: D = 250..2000, 3 seeds).
3. Escape time = first tau at which the risk has fallen halfway from the unspecialized
   fixed point's risk R* to the specialized risk (median theory risk at tau_max) -- one fixed
   threshold for every run (``singleloc.halfway_time``).
4. Fits: tau_esc = a + beta log D (plain), and tau_esc = a + beta log D + gamma log|z| with
   z = A0 sqrt(D) the seed's normalised initial amplitude along the escape mode (removes the
   seed-to-seed scatter, which is the whole spread at fixed D). Predictions: beta = 1/(2 lambda)
   with lambda* (the D -> infinity value) and with the adiabatic rate (lambda(tau) integrated
   along the plateau: ``linear_escape_time``, at the median amplitude), gamma = -1/lambda.
   With a finite D the SGD noise keeps seeding the escape direction, so in simulations the
   escape time depends less on the initial amplitude than in the ODE (gamma closer to 0).

Writes figures/phases_logD.{png,json} (flipped) or figures/phases_logD_spikes.{png,json}. About 25
minutes on 2 CPU cores beside other work, on the exact route (``--quick``: 4 theory seeds per D,
simulations at D = 250, 500, 1000 with 2 seeds each; ``--cache DIR``: keep the stages' results in DIR
and reuse them).
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import matplotlib as mpl  # noqa: E402
import numpy as np  # noqa: E402
from _common import cache_dir, figure, figures_dir, fit, fixed_point, parser, save_json, stage  # noqa: E402

import singleloc as sl  # noqa: E402

SETTINGS = {
    # zero-mean prior: the unspecialized point is M = 0 with relaxed R_orth and biases; it is
    # reached fast and does not move, so the escape rate is one number
    "flipped": dict(overrides=["problem.prior=flipped"], tau_max=30.0, tau_sim=12.0, figure="phases_logD",
                    sim={125: 8, 250: 8, 500: 8, 1000: 8, 2000: 6}),
    # spikes: the heads first align with the mean direction; that plateau creeps (its slowest
    # symmetric eigenvalue is ~ -0.006) and its escape rate drifts from 0.37 down to lambda*
    "spikes": dict(overrides=[], tau_max=40.0, tau_sim=24.0, figure="phases_logD_spikes", sim={250: 3, 500: 3, 1000: 3, 2000: 3}),
}
BASE = ["problem.strength=3.0", "sgd.lr=1.0", "theory.points=1024", "simulation.test_samples=1024"]
D_THEORY = [250, 500, 1000, 2000, 4000, 8000, 16000]
D_SCALED = [16000 * 4**k for k in range(6)]


def stack(ys):
    return sl.OrderParameters(*(jnp.concatenate([getattr(y, k) for y in ys]) for k in ("M", "Q", "b")))


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--setting", choices=list(SETTINGS), default="flipped", help="the prior (default flipped)")
    args = p.parse_args()
    setting = SETTINGS[args.setting]
    cfg = sl.load_config("bsoftmax", BASE + setting["overrides"])
    seeds_theory = 4 if args.quick else 8
    sim_seeds = {D: 2 for D in (250, 500, 1000)} if args.quick else setting["sim"]  # D -> seeds
    d_sim = list(sim_seeds)
    tau_max, tau_sim = setting["tau_max"], setting["tau_sim"]
    cache = cache_dir(args, "phases_logD", args.setting)
    t_start = time.time()
    H, F = cfg.model.heads, cfg.problem.F
    mean = cfg.problem.build_prior().mean()
    ode = sl.OrderParameterODE.from_setup(sl.build(cfg))

    # 1. fixed point and escape rates -------------------------------------------------------
    def fixed():
        fp = fixed_point(cfg, ode, tau_flow=tau_max, dt=0.1)
        path_tau, path_x = fp["path_tau"][::2], fp["path_x"][::2]
        lam_path = sl.escape_rate_along(ode, path_tau, path_x, H, F, mean=mean)
        return {k: fp[k] for k in ("M", "Q", "b", "x", "residual", "risk")} | {"path_tau": path_tau, "lam_path": lam_path}

    fp = stage(cache, "fixed", fixed)
    lin = sl.linearize(ode, fp["M"], fp["Q"], fp["b"])
    lam_star = sl.escape_rate(lin, mean=mean)
    path_tau, lam_path = fp["path_tau"], fp["lam_path"]
    fp = SimpleNamespace(x=fp["x"], residual=float(fp["residual"]), risk=float(fp["risk"]))
    print(f"fixed point: x = {np.round(fp.x, 4)}, residual {fp.residual:.1e}, R* = {fp.risk:.4f}; "
          f"lambda* = {lam_star:.4f} ({lin.method}); lambda(tau) on the plateau: "
          + ", ".join(f"{t:.0f}: {l:.3f}" for t, l in zip(path_tau[::5], lam_path[::5])), flush=True)

    # 2. theory ---------------------------------------------------------------------------
    ts = np.linspace(0.0, tau_max, int(tau_max * 4) + 1)
    y0s = [sl.initial_conditions(cfg.replace(simulation={"D": D}), seeds_theory) for D in D_THEORY]
    D_of = np.repeat(D_THEORY, seeds_theory)
    base = y0s[-1]  # D = 16000: rescale its symmetry-breaking part for the scaled series
    Ms = np.asarray(base.M[0]).mean(0)
    dM = np.asarray(base.M[0]) - Ms
    R0 = np.asarray(base.Q[0]) - np.asarray(base.M[0]) @ np.asarray(base.M[0]).T
    scaled = []
    for D in D_SCALED:
        M = Ms + dM * np.sqrt(D_SCALED[0] / D)
        scaled.append(sl.OrderParameters(jnp.asarray(M[None]), jnp.asarray((M @ M.T + R0)[None]), jnp.zeros((1, H))))
    t0 = time.time()
    th = SimpleNamespace(**stage(cache, "theory", lambda: vars(sl.integrate(cfg, stack(y0s + scaled), ts=ts, progress=False))))
    n_main = len(D_of)
    print(f"theory: {th.risk.shape[0]} trajectories to tau = {tau_max} in {time.time() - t0:.0f} s", flush=True)
    R_spec = float(np.median(th.risk[:n_main, -1]))
    R_half_from, R_half_to = fp.risk, R_spec
    esc = np.array([sl.halfway_time(ts, r, 0.0, R_half_from, R_half_to) for r in th.risk])
    basis = sl.escape_subspace(lin, mean=mean)
    A0 = sl.subspace_amplitude(basis, th.M[:, 0])
    t_lin = sl.linear_escape_time(path_tau, lam_path, A0)

    # 3. simulation -------------------------------------------------------------------------
    sims = []
    t0 = time.time()
    for D in d_sim:
        c = cfg.replace(simulation={"D": D, "seeds": sim_seeds[D]}, sgd={"tau_max": tau_sim, "n_save": int(tau_sim * 4) + 1})
        s = SimpleNamespace(**stage(cache, f"simulation_{D}", lambda c=c: sl.simulate(c, progress=False).arrays()))
        sims.append(s)
        print(f"  simulation D = {D}: {time.time() - t0:.0f} s", flush=True)
    sim_D = np.concatenate([[D] * sim_seeds[D] for D in d_sim])
    sim_esc = np.concatenate([[sl.halfway_time(s.tau, r, 0.0, R_half_from, R_half_to) for r in s.risk_limit] for s in sims])
    sim_A0 = np.concatenate([sl.subspace_amplitude(basis, s.M[:, 0]) for s in sims])

    # 4. fits -------------------------------------------------------------------------------
    lD, lDs = np.log(D_of), np.log(sim_D)
    z_th, z_sim = A0[:n_main] * np.sqrt(D_of), sim_A0 * np.sqrt(sim_D)
    c_plain, se_plain, _ = fit(esc[:n_main], lD)
    c_z, se_z, sd_z = fit(esc[:n_main], lD, np.log(z_th))
    # adiabatic prediction at the typical amplitude A0 = median(z) / sqrt(D), D from 125 to 16000
    D_grid = np.geomspace(min(d_sim + D_THEORY), max(D_THEORY), 9)
    c_lin, _, _ = fit(sl.linear_escape_time(path_tau, lam_path, np.median(z_th) / np.sqrt(D_grid)), np.log(D_grid))
    c_s, se_s, _ = fit(sim_esc, lDs)
    c_sz, se_sz, sd_sz = fit(sim_esc, lDs, np.log(z_sim))
    D_sgrid = np.geomspace(min(d_sim), max(d_sim), 9)
    c_slin, _, _ = fit(sl.linear_escape_time(path_tau, lam_path, np.median(z_th) / np.sqrt(D_sgrid)), np.log(D_sgrid))
    esc_sc = esc[n_main:]
    c_sc, _, _ = fit(esc_sc, np.log(D_SCALED))
    local_sc = np.diff(esc_sc) / np.diff(np.log(D_SCALED))
    pred_star = sl.predicted_escape_slope(lam_star)
    pred_adia = float(c_lin[1])
    pred_adia_sim = float(c_slin[1])
    tmean = [float(np.nanmean(esc[:n_main][D_of == D])) for D in D_THEORY]
    lam_at = float(np.interp(np.nanmean(esc[:n_main]), path_tau, lam_path))
    out = {
        "config": cfg.to_dict(),
        "fixed_point": {"x": fp.x.tolist(), "residual": fp.residual, "risk": fp.risk, "lambda_star": lam_star,
                        "method": lin.method,
                        "eigenvalues": [[float(e.real), float(e.imag)] for e in lin.eigenvalues]},
        "lambda_path": {"tau": path_tau.tolist(), "rate": lam_path.tolist()},
        "threshold": {"from": R_half_from, "to": R_half_to},
        "theory": {"D": D_of.tolist(), "escape": esc[:n_main].tolist(), "A0": A0[:n_main].tolist(),
                   "linear_escape": t_lin[:n_main].tolist(),
                   "mean_escape_per_D": dict(zip(map(str, D_THEORY), tmean)),
                   "slope_plain": [float(c_plain[1]), float(se_plain[1])], "slope_at_fixed_z": [float(c_z[1]), float(se_z[1])],
                   "gamma": [float(c_z[2]), float(se_z[2])], "residual_sd": sd_z},
        "scaled": {"D": D_SCALED, "escape": esc_sc.tolist(), "slope": float(c_sc[1]), "local_slopes": local_sc.tolist()},
        "simulation": {"D": sim_D.tolist(), "escape": sim_esc.tolist(), "A0": sim_A0.tolist(),
                       "slope_plain": [float(c_s[1]), float(se_s[1])], "slope_at_fixed_z": [float(c_sz[1]), float(se_sz[1])],
                       "gamma": [float(c_sz[2]), float(se_sz[2])], "residual_sd": sd_sz},
        "predicted": {"slope_fixed_point": pred_star, "slope_adiabatic_theory": pred_adia,
                      "slope_adiabatic_simulation": pred_adia_sim,
                      "lambda_at_mean_escape": lam_at, "slope_at_mean_escape": sl.predicted_escape_slope(lam_at)},
        "runtime_s": time.time() - t_start,
    }
    save_json(figures_dir(args) / f"{setting['figure']}.json", out)

    print(f"R* = {fp.risk:.4f}, specialized R = {R_spec:.4f}, threshold {0.5 * (R_half_from + R_half_to):.4f}")
    print("theory: mean escape per D: " + ", ".join(f"{D}: {t:.2f}" for D, t in zip(D_THEORY, tmean)))
    print(f"theory slope d tau_esc / d log D: plain {c_plain[1]:.3f} +- {se_plain[1]:.3f}; "
          f"at fixed z {c_z[1]:.3f} +- {se_z[1]:.3f} "
          f"(gamma {c_z[2]:.3f} vs -1/lambda(tau_esc) = {-1 / lam_at:.3f}; residual sd {sd_z:.2f})")
    print(f"scaled series slope {c_sc[1]:.3f}, local slopes {np.round(local_sc, 3)}")
    print(f"simulation slope: plain {c_s[1]:.3f} +- {se_s[1]:.3f}; at fixed z {c_sz[1]:.3f} +- {se_sz[1]:.3f} "
          f"(gamma {c_sz[2]:.3f}; residual sd {sd_sz:.2f})")
    print(f"predicted: 1/(2 lambda*) = {pred_star:.3f}; adiabatic (lambda(tau) along the plateau) "
          f"D in {min(d_sim + D_THEORY)}..{max(D_THEORY)}: {pred_adia:.3f}, D in simulation range: {pred_adia_sim:.3f}; "
          f"1/(2 lambda(mean tau_esc = {np.nanmean(esc[:n_main]):.1f})) = {sl.predicted_escape_slope(lam_at):.3f}")
    for name, val in (("theory", c_z[1]), ("simulation", c_sz[1])):
        ref = pred_adia if name == "theory" else pred_adia_sim
        print(f"  {name}: fitted/adiabatic = {val / ref:.3f}, fitted/fixed-point = {val / pred_star:.3f}")

    # 5. figure -----------------------------------------------------------------------------
    fig = figure(figsize=(19, 4.2), layout="constrained")
    axes = fig.subplots(1, 4)
    cmap = mpl.colormaps["viridis"]
    allD = sorted(set(D_THEORY) | set(d_sim))
    color = lambda D: cmap(allD.index(D) / (len(allD) - 1))  # noqa: E731
    ax = axes[0]
    for j, D in enumerate(D_THEORY):
        i = j * seeds_theory
        ax.plot(ts, th.risk[i], color=color(D), lw=1.2, label=f"D={D}")
    for D, s in zip(d_sim, sims):
        ax.plot(s.tau, s.risk_limit[0], "o", ms=2.5, color=color(D), alpha=0.7)
    ax.axhline(0.5 * (R_half_from + R_half_to), color="gray", ls=":", lw=1, label="escape threshold")
    ax.axhline(fp.risk, color="k", ls="--", lw=0.8, label=r"$R^*$ (unspecialized)")
    ax.set_xlim(0, tau_max)
    ax.set_xlabel(r"$\tau$")
    ax.set_ylabel("risk")
    ax.set_title("risk: theory (lines, seed 0), simulation (points)")
    ax.legend(fontsize=7, frameon=False, ncol=2)

    ax = axes[1]
    ax.plot(D_of, esc[:n_main], ".", color="0.6", ms=4, label=f"theory, {seeds_theory} seeds/D")
    ax.plot(D_THEORY, tmean, "o", color="k", ms=5, label="theory mean")
    n_lo, n_hi = min(sim_seeds.values()), max(sim_seeds.values())
    ax.plot(sim_D, sim_esc, "s", color="C3", ms=5, mfc="none",
            label=f"simulation, {n_lo}" + (f"-{n_hi}" if n_hi > n_lo else "") + " seeds/D")
    xx = np.geomspace(min(d_sim) * 0.8, 2e4, 50)
    ax.plot(xx, c_plain[0] + c_plain[1] * np.log(xx), "k-", lw=1, label=f"fit: slope {c_plain[1]:.2f}±{se_plain[1]:.2f}")
    ax.plot(xx, c_s[0] + c_s[1] * np.log(xx), "C3-", lw=0.8, alpha=0.7, label=f"simulation fit: {c_s[1]:.2f}±{se_s[1]:.2f}")
    mid = np.log(np.sqrt(250 * 16000))
    ax.plot(xx, c_plain[0] + c_plain[1] * mid + pred_adia * (np.log(xx) - mid), "C0--", lw=1,
            label=f"adiabatic $1/2\\lambda$: {pred_adia:.2f}")
    ax.plot(xx, c_plain[0] + c_plain[1] * mid + pred_star * (np.log(xx) - mid), "C1:", lw=1.2,
            label=rf"$1/2\lambda^*$: {pred_star:.2f}")
    ax.set_xscale("log")
    ax.set_xlabel("D")
    ax.set_ylabel(r"escape time $\tau_{esc}$")
    ax.set_title(r"escape time vs $\log D$")
    ax.legend(fontsize=7, frameon=False)

    ax = axes[2]
    ax.plot(np.log(1 / A0[:n_main]), esc[:n_main], ".", color="0.5", ms=4, label="theory (random D-dependent starts)")
    ax.plot(np.log(1 / A0[n_main:]), esc_sc, "D", color="C2", ms=4, label=r"theory, one start rescaled ($D\leq1.6\cdot10^7$)")
    ax.plot(np.log(1 / sim_A0), sim_esc, "s", color="C3", ms=5, mfc="none", label="simulation")
    ax.plot(np.log(1 / A0), t_lin + np.nanmedian(esc - t_lin), "-", color="C0", lw=0, marker="_", ms=6,
            label=r"adiabatic linear theory $+$ const")
    ax.set_xlabel(r"$\log(1/A_0)$, initial amplitude in the escape subspace")
    ax.set_ylabel(r"$\tau_{esc}$")
    ax.set_title("escape time vs initial amplitude")
    ax.legend(fontsize=7, frameon=False)

    ax = axes[3]
    ax.plot(path_tau, lam_path, "C0-", label=r"$\lambda(\tau)$ along the symmetric trajectory")
    ax.axhline(lam_star, color="C1", ls=":", label=rf"$\lambda^*$ at the fixed point = {lam_star:.3f}")
    lo, hi = np.nanpercentile(esc, [5, 95])
    ax.axvspan(lo, hi, color="0.85", label="escape times (5-95%)")
    ax.set_xlabel(r"$\tau$")
    ax.set_ylabel("escape rate")
    ax.set_ylim(0, max(0.8, lam_path.max() * 1.05))
    ax.set_title("unstable eigenvalue of the linearised ODE")
    ax.legend(fontsize=7, frameon=False)
    fig.suptitle(f"log D law: bsoftmax, H={H}, F={F}, L={cfg.problem.L}, {cfg.problem.prior} prior of strength "
                 f"{cfg.problem.strength}, lr={cfg.sgd.lr}", fontsize=10)
    path = sl.save_figure(figures_dir(args) / f"{setting['figure']}.png", fig)
    print(f"wrote {path} and .json in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
