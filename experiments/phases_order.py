"""Order of specialization with an anisotropic prior (docs/model.md section 5, issue 5).

Setting: bsoftmax with trained biases, L=4, H=4 heads, F=2 latent directions, discrete prior
theta in {+-3.5 e_1, +-2.5 e_2} (uniform), so Var theta = (6.1, 3.1): a zero-mean prior whose
unspecialized point is M = 0 (heads aligned with nothing, R_orth and biases relaxed); lr = 1.

1. Linearisation at the unspecialized point: the unstable modes that break the head symmetry,
   grouped by the latent direction their M block loads on: one rate lambda_f per direction.
2. Theory from the simulator's initial overlaps at D = 1000 (8 seeds) and simulations (D =
   1000, 3 seeds): the first time a head is specialized to each direction
   (the labels of :func:`singleloc.analyze`: |cos| >= 0.9 with e_f, spike fraction >= 0.3).
3. Prediction: direction f escapes when A_f exp(lambda_f tau) reaches a fixed size, A_f being
   the initial amplitude in the escape subspace of direction f: tau_f = c + log(1/A_f)/lambda_f.

Writes figures/phases_order.png and figures/phases_order.json; about 3 minutes on 2 CPU cores
(``--cache DIR`` keeps the stages' results to redo the figure; ``--quick``: 2 theory seeds, one
simulation to tau = 10).
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import cache_dir, figure, figures_dir, fixed_point, parser, save_json, stage  # noqa: E402

import singleloc as sl  # noqa: E402

STRENGTHS = (3.5, 2.5)
F = len(STRENGTHS)
SUPPORT = [[s * (f == g) * sign for g in range(F)] for f, s in enumerate(STRENGTHS) for sign in (1.0, -1.0)]
CONFIG = sl.load_config("bsoftmax", ["problem.prior=discrete", f"problem.F={F}", f"problem.support={SUPPORT}", "model.heads=4",
                                     "sgd.lr=1.0", "theory.points=1024", "simulation.D=1000", "simulation.test_samples=1024"])
SEEDS_THEORY, SEEDS_SIM = 8, 3
TAU_MAX, TAU_SIM = 60.0, 40.0


def first_times(tau, labels, K):
    """(S, K): first saved time at which some head carries label k (NaN if never), from the
    labels (S, T, H) of :func:`singleloc.analyze`. Not :attr:`PhaseAnalysis.specialization_times`
    (per head, from when it *stays* specialized); its minimum over ``k`` is
    :attr:`PhaseAnalysis.first_specialization`."""
    out = np.full((labels.shape[0], K), np.nan)
    for s in range(labels.shape[0]):
        for k in range(K):
            hit = np.flatnonzero((labels[s] == k).any(axis=-1))
            if len(hit):
                out[s, k] = tau[hit[0]]
    return out


def main() -> None:
    args = parser(__doc__).parse_args()
    cache = cache_dir(args, "phases_order")
    seeds_theory, seeds_sim, tau_sim = (2, 1, 10.0) if args.quick else (SEEDS_THEORY, SEEDS_SIM, TAU_SIM)
    t_start = time.time()
    cfg = CONFIG
    H = cfg.model.heads
    prior = cfg.problem.build_prior()
    mean, var = prior.mean(), np.diag(prior.cov())
    ode = sl.OrderParameterODE.from_setup(sl.build(cfg))

    fp = stage(cache, "fixed", lambda: fixed_point(cfg, ode, tau_flow=40.0, dt=0.1))
    lin = sl.linearize(ode, fp["M"], fp["Q"], fp["b"])
    modes = sl.unstable_modes(lin, min_asymmetry=0.5)
    print(f"unspecialized point: m = {np.round(fp['x'][:F], 3)}, residual {float(fp['residual']):.1e}, "
          f"R* = {float(fp['risk']):.4f} ({lin.method})")
    for m in modes:
        load = np.linalg.norm(m["M"], axis=0)
        print(f"  unstable symmetry-breaking mode: rate {m['rate']:.4f}, loading on directions {np.round(load / load.sum(), 2)}")
    # one rate and one escape subspace per direction: the modes whose M block loads on it
    lam, basis = np.full(F, np.nan), []
    sel = np.flatnonzero((lin.eigenvalues.real > 1e-6) & (lin.asymmetry > 0.5))
    for f in range(F):
        idx = [i for i in sel if np.argmax(np.linalg.norm(lin.eigenvectors[: H * F, i].reshape(H, F), axis=0)) == f]
        if not idx:
            basis.append(np.zeros((0, H * F)))
            continue
        lam[f] = lin.eigenvalues.real[idx].max()
        top = [i for i in idx if lin.eigenvalues.real[i] >= lam[f] * 0.98]
        V = lin.eigenvectors[: H * F, top]
        u, sv, _ = np.linalg.svd(np.concatenate([V.real, V.imag], axis=1), full_matrices=False)
        basis.append(u[:, sv > 1e-8 * sv.max()].T)
    print(f"escape rate per direction: {np.round(lam, 4)} (ratio {lam[0] / lam[1]:.3f}; variance ratio {var[0] / var[1]:.3f})")

    # theory and simulation ----------------------------------------------------------------
    ts = np.linspace(0.0, TAU_MAX, int(TAU_MAX * 4) + 1)
    t0 = time.time()
    y0 = sl.initial_conditions(cfg, seeds_theory)
    th = SimpleNamespace(**stage(cache, "theory", lambda: vars(sl.integrate(cfg, y0, ts=ts, progress=False))))
    print(f"theory: {seeds_theory} seeds to tau = {TAU_MAX} in {time.time() - t0:.0f} s", flush=True)
    t0 = time.time()
    csim = cfg.replace(simulation={"seeds": seeds_sim}, sgd={"tau_max": tau_sim, "n_save": int(tau_sim * 2) + 1})
    sim = SimpleNamespace(**stage(cache, "simulation", lambda: sl.simulate(csim, progress=False).arrays()))
    print(f"simulation: {seeds_sim} seeds at D = {cfg.simulation.D} to tau = {tau_sim} in {time.time() - t0:.0f} s", flush=True)

    a_th = sl.analyze(th.tau, th.M, th.Q, th.risk, mean=mean)
    a_sim = sl.analyze(sim.tau, sim.M, sim.Q, sim.risk_limit, mean=mean)
    ft_th, ft_sim = first_times(th.tau, a_th.labels, F), first_times(sim.tau, a_sim.labels, F)
    first_th = np.nanargmin(np.where(np.isfinite(ft_th), ft_th, np.inf), axis=1)
    first_sim = np.nanargmin(np.where(np.isfinite(ft_sim), ft_sim, np.inf), axis=1)
    A_th = np.stack([sl.subspace_amplitude(basis[f], th.M[:, 0]) for f in range(F)], 1)
    A_sim = np.stack([sl.subspace_amplitude(basis[f], sim.M[:, 0]) for f in range(F)], 1)
    pred_th, pred_sim = np.log(1 / A_th) / lam, np.log(1 / A_sim) / lam  # up to a common constant
    ok = np.isfinite(ft_th)
    offset = float(np.median((ft_th - pred_th)[ok]))
    resid = (ft_th - pred_th - offset)[ok]
    print("theory: first specialization time per direction (seeds x directions):\n", np.round(ft_th, 2))
    print("  predicted log(1/A_f)/lambda_f + const:\n", np.round(pred_th + offset, 2))
    print(f"  direction specialized first: {first_th.tolist()}; residual sd of the prediction {resid.std():.2f}")
    print("simulation:\n", np.round(ft_sim, 2), f"\n  first: {first_sim.tolist()}")
    print("final labels (theory):", a_th.labels[:, -1].tolist(), "final risk", np.round(a_th.final_risk, 4).tolist())
    print("rearrangements (theory):", [len(r) for r in a_th.rearrangements],
          "(simulation):", [len(r) for r in a_sim.rearrangements])

    out = {
        "config": cfg.to_dict(), "variances": var.tolist(),
        "fixed_point": {"x": np.asarray(fp["x"]).tolist(), "risk": float(fp["risk"]), "method": lin.method,
                        "modes": [{"rate": m["rate"],
                                   "loading": (np.linalg.norm(m["M"], axis=0) / np.linalg.norm(m["M"], axis=0).sum()).tolist()}
                                  for m in modes],
                        "rate_per_direction": lam.tolist()},
        "theory": {"first_times": ft_th.tolist(), "predicted_plus_offset": (pred_th + offset).tolist(),
                   "first_direction": first_th.tolist(),
                   "residual_sd": float(resid.std()), "escapes": [e.tolist() for e in a_th.escapes],
                   "final_risk": a_th.final_risk.tolist(), "final_labels": a_th.labels[:, -1].tolist(),
                   "rearrangements": [[list(e) for e in r] for r in a_th.rearrangements]},
        "simulation": {"first_times": ft_sim.tolist(), "first_direction": first_sim.tolist(),
                       "escapes": [e.tolist() for e in a_sim.escapes],
                       "final_risk": a_sim.final_risk.tolist(), "final_labels": a_sim.labels[:, -1].tolist()},
        "runtime_s": time.time() - t_start,
    }
    save_json(figures_dir(args) / "phases_order.json", out)

    # figure --------------------------------------------------------------------------------
    fig = figure(figsize=(19, 4.2), layout="constrained")
    axes = fig.subplots(1, 4)
    cols = ["C0", "C1"]
    ax = axes[0]
    for s in range(seeds_theory):
        ax.plot(th.tau, th.risk[s], color="k", lw=1.2 if s == 0 else 0.6, alpha=1 if s == 0 else 0.4,
                label="theory, D=1000 starts" if s == 0 else None)
    for s in range(seeds_sim):
        ax.plot(sim.tau, sim.risk_limit[s], "o", ms=2.5, color="C3", alpha=0.6, label="simulation, D=1000" if s == 0 else None)
    for f in range(F):
        ax.axvspan(np.nanmin(ft_th[:, f]), np.nanmax(ft_th[:, f]), color=cols[f], alpha=0.15,
                   label=f"first head on e_{f + 1} (theory seeds)")
    ax.set_xlabel(r"$\tau$")
    ax.set_ylabel("risk")
    ax.set_title("risk")
    ax.legend(fontsize=7, frameon=False)
    ax = axes[1]
    styles = ["-", "--", ":", "-."]
    for h in range(H):
        for f in range(F):
            ax.plot(th.tau, a_th.cos[0, :, h, f], styles[h % 4], color=cols[f], lw=1.3, label=f"head {h + 1}, f={f + 1}")
    ax.set_xlabel(r"$\tau$")
    ax.set_title(r"theory seed 0: $M_{hf}/\sqrt{Q_{hh}}$ (colour: f, style: head)")
    ax.legend(fontsize=6, frameon=False, ncol=2)
    ax = axes[2]
    for f in range(F):
        ax.plot(np.full(seeds_theory, f + 1) - 0.08, ft_th[:, f], "o", color=cols[f], ms=5, label="theory" if f == 0 else None)
        ax.plot(np.full(seeds_sim, f + 1) + 0.08, ft_sim[:, f], "s", color=cols[f], mfc="none", ms=6,
                label="simulation" if f == 0 else None)
    for s in range(seeds_theory):
        ax.plot([0.92, 1.92], ft_th[s], "-", color="0.7", lw=0.6)
    ax.set_xticks(range(1, F + 1), [f"e_{f + 1}\nVar={v:.2f}\n" + rf"$\lambda$={lam[f]:.3f}" for f, v in enumerate(var)])
    ax.set_xlim(0.5, F + 0.5)
    ax.set_ylabel(r"first $\tau$ with a head specialized to $e_f$")
    ax.set_title("order of specialization (per seed)")
    ax.legend(fontsize=7, frameon=False)
    ax = axes[3]
    for f in range(F):
        ax.plot(pred_th[:, f] + offset, ft_th[:, f], "o", color=cols[f], ms=5, label=f"theory, e_{f + 1}")
        ax.plot(pred_sim[:, f] + offset, ft_sim[:, f], "s", color=cols[f], mfc="none", ms=6, label=f"simulation, e_{f + 1}")
    lo = np.nanmin([np.nanmin(pred_th + offset), np.nanmin(ft_th)]) - 1
    hi = np.nanmax([np.nanmax(pred_th + offset), np.nanmax(ft_th)]) + 1
    ax.plot([lo, hi], [lo, hi], "k:", lw=1)
    ax.set_xlabel(r"predicted $\log(1/A_f)/\lambda_f$ + const")
    ax.set_ylabel("measured first specialization time")
    ax.set_title(rf"escape times vs eigenvalues ($\lambda_1/\lambda_2$ = {lam[0] / lam[1]:.2f})")
    ax.legend(fontsize=7, frameon=False)
    fig.suptitle(f"order of specialization: bsoftmax, H={H}, L={cfg.problem.L}, "
                 f"theta in {{+-{STRENGTHS[0]} e_1, +-{STRENGTHS[1]} e_2}}, lr={cfg.sgd.lr}", fontsize=10)
    path = sl.save_figure(figures_dir(args) / "phases_order.png", fig)
    print(f"wrote {path} and .json in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
