"""Long sequences: how attention heads learn as the context grows (docs/long_context.md).

The single-location model at sequence lengths ``L`` = 4 ... 4096 on the exact route of the
theory (Laplace form, singleloc/expectations/_laplace.py), whose risk and ``O(lr)`` drift cost nothing more
at large ``L``, nor does the ``lr^2`` Gram term of one head, or of two per-head heads from ``L H >= 64``
(``theory.gram = "auto"``); with more heads, or bsoftmax, the Gram term is a Sobol rule whose cost
grows with ``L``. Spikes prior of strength 2.5, lr 0.5, init scale 0.5, no biases; every
ODE starts from the overlaps of seed 0's random keys at ``D = 1000`` (``M(0) = O(D^-1/2)``).

1. Trajectories (``F = 1``): softmax with one head at every ``L`` (4, 16, 64, 256, 1024, 4096);
   ssmax (the registered one, scale 1) at 4, 64, 256, 1024, 4096; softmax1 at 64; bsoftmax with two heads at
   4, 64 (with one head bsoftmax *is* softmax). Horizon ``tau_max(L) = max(200, 4 L / (lr
   strength^2))``, four times the plateau's scale (docs/long_context.md), 2600 at ``L = 4096``.
   Read off: the plateau length (the first time the risk has moved halfway from its start to its
   final value), the final risk against the Bayes risk at the same ``L`` (exact: the Bayes point
   of the prior through the exact route), ``M``, ``Q_hh`` and ``E[a_eps]`` at the end.
2. Along every ``F = 1`` trajectory, at 11 saved times: the norm of the drift (the ODE's own
   ``drift``) and of its ``lr^2`` part, ``E[a_eps]`` and the mean spectral norm of the softmax
   Jacobian ``(diag(a) - a a^T)`` of the rows (the source paper's gradient signal;
   ``singleloc.softmax_jacobian_norm``), both by Monte Carlo over 2048 sequences of local
   fields drawn from the order parameters (the library's activations on them).
3. Specialization (softmax, ``H = F = 2``, ``L`` = 4, 16): the escape rate ``lambda(L)`` of the
   unspecialized saddle along the symmetric flow and the predicted escape time at ``D = 1000``
   (``singleloc.predicted_escape``).
4. Simulations (softmax, ``H = F = 1``): ``L = 64`` at ``D = 500`` (3 seeds, tau <= 80), ``L = 256``
   at ``D`` = 500 and 1000 (2 seeds, tau <= 160) and ``L = 1024`` at ``D = 500`` (2 seeds, tau <= 320),
   each seed against the ODE from its own initial
   overlaps; the agreement outside and inside the escape window. ``--simulations-only``: only these,
   written to figures/long_context_simulations.json (about 10 minutes without ``L = 1024``, which
   took 49 minutes of simulation here beside another job).
5. Fits with standard errors (``_common.fit``) over ``L >= 64``: plateau length against ``L`` (power
   law), ``M`` and ``Q_hh`` at the end against ``log L``, ``E[a_eps]`` against ``L``, the plateau's
   drift norm against ``L``.
6. ``--heads``: more heads and two spikes against ``L`` (4 ... 4096), written to
   figures/long_context_heads.json and .png instead: softmax with ``H`` = 1, 2, 4 and softmax1 with
   ``H = 2`` at every ``L``, bsoftmax with ``H = 2`` at ``L`` <= 1024 and ssmax at ``L`` <= 64 (``F = 2``), and two
   softmax heads with one spike at ``L`` = 64, 256 (four at 64). Horizon ``max(600, 4 L / (lr strength^2))``,
   twice that from ``L = 1024`` (the specialization escape of ``H = F = 2`` comes after the first plateau: 270 at
   ``L = 4``, 1101 of 1310 at ``L = 1024``).
   Read off: the first plateau's end, the escape (the head spread orthogonal to the prior mean
   reaching half its final value), the final risk against the Bayes risk of the prior at that
   ``L``, and the head classes at the end (``singleloc.classify_heads``). And the escape rate
   ``lambda(L)`` of the unspecialized saddle (as in 3) for softmax at every ``L`` and ssmax at
   ``L`` <= 64, with its power law.

Writes figures/long_context_*.png and figures/long_context.json. About 38 minutes on the
2-core machine while it was shared (one compiled solve per activation, ``H`` and ``L``, 30-120 s
each; ssmax at ``L = 1024`` 10 minutes, softmax at ``L = 4096`` 3); ``--cache DIR`` keeps every stage
(``.cache/long_context`` is the gitignored choice) and reuses it; ``--cached-only`` draws from the
stages in the cache and skips the others; ``--quick``: ``L`` = 4, 16, short horizons, figures in
the temporary folder. ``--heads``: about an hour and three quarters here from an empty cache (4675 s
of trajectories, about 1600 s of escape rates, on the machine shared with another job; two heads of softmax, softmax1
and ssmax have the exact ``lr^2`` Gram term from ``L = 32`` on, tens of milliseconds per drift at
any ``L``; bsoftmax and four heads keep its Sobol rule, 0.2-0.5 s per drift at ``L = 1024``: four softmax
heads at ``L = 4096`` took 42 minutes beside another job, bsoftmax at 1024 53).
"""

from __future__ import annotations

import math
import time

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import cache_dir, figure, figures_dir, fit, parser, save_json  # noqa: E402
from _common import stage as cached_stage  # noqa: E402

import singleloc as sl  # noqa: E402
from singleloc.analysis._head_classes import class_counts_text  # noqa: E402

STRENGTH, LR, D_START = 2.5, 0.5, 1000
ACTIVATIONS = ("softmax", "softmax1", "bsoftmax", "ssmax")
COLORS = {"softmax": "C0", "softmax1": "C1", "bsoftmax": "C2", "ssmax": "C3", "bayes": "k"}
MC_SEQUENCES, N_PROBES = 2048, 10
FIT_FROM = 64  # the large-L laws are fitted from this L on


def plan(quick: bool) -> dict:
    """What is computed (chosen to fit about an hour of the shared 2-core machine: every
    activation, ``H`` and ``L`` is one more compiled solve of 30-120 s there)."""
    lengths = (4, 16) if quick else (4, 16, 64, 256, 1024, 4096)
    pick = (lambda *Ls: (4, 16)) if quick else (lambda *Ls: Ls)  # noqa: E731
    runs = [("softmax", 1, 1, L) for L in lengths]
    runs += [("ssmax", 1, 1, L) for L in pick(4, 64, 256, 1024, 4096)]
    runs += [("softmax1", 1, 1, L) for L in pick(64)]
    runs += [("bsoftmax", 2, 1, L) for L in pick(4, 64)]
    escape = [("softmax", L) for L in pick(4, 16)]
    sims = [(16, 250, 2, 40.0)] if quick else [(64, 500, 3, 80.0), (256, 500, 2, 160.0), (256, 1000, 2, 160.0),
                                               (1024, 500, 2, 320.0)]
    return {"lengths": lengths, "runs": runs, "escape": escape, "sims": sims, "quick": quick}


def heads_plan(quick: bool) -> dict:
    """Section 6 (``--heads``): ``(activation, H, F, L)`` runs with two spikes and more heads."""
    lengths = (4, 16) if quick else (4, 16, 64, 256, 1024, 4096)
    mid = [L for L in lengths if L <= 1024]  # bsoftmax: its Sobol Gram term at L = 4096 would take hours
    short = [L for L in lengths if L <= 64]
    runs = [("softmax", H, 2, L) for L in lengths for H in (1, 2, 4)]
    runs += [("bsoftmax", 2, 2, L) for L in mid]
    runs += [("softmax1", 2, 2, L) for L in lengths] + [("ssmax", 2, 2, L) for L in short]
    runs += [("softmax", 2, 1, L) for L in ((16,) if quick else (64, 256))]
    runs += [] if quick else [("softmax", 4, 1, 64)]  # one spike: does the excess fall like 1/H?
    escape = [("softmax", L) for L in lengths] + [("ssmax", L) for L in short]
    return {"lengths": lengths, "runs": sorted(runs, key=lambda r: (r[3], r[1], r[0])), "escape": escape, "quick": quick}


def heads_horizon(L: int, quick: bool = False) -> float:
    """Section 6's horizon: four plateau scales and at least 600 (the ``H = F = 2`` escape); eight from
    ``L = 1024`` (2620 and 10490), where two heads escape at 0.84 and 0.7 of four (1101 of 1310, 3699 of
    5240), too late to read a final risk."""
    return 30.0 if quick else float(max(600, plateau_scales(8 if L >= 1024 else 4, L)))


def plateau_scales(n: int, L: int) -> int:
    """``n L / (lr strength^2)`` (``n`` plateau scales), rounded to a multiple of 10."""
    return 10 * round(0.1 * n * L / (LR * STRENGTH**2))


def horizon(L: int, quick: bool = False) -> float:
    """Four times the plateau's scale ``L / (lr strength^2)``, at least 200 (30 with ``--quick``);
    at ``L = 4096`` two times (2600: the solve costs about 1 s per drift there)."""
    if quick:
        return 30.0
    return 2600.0 if L >= 4096 else float(max(200, plateau_scales(4, L)))


def config(act: str, H: int, F: int, L: int, tau_max: float, extra=()) -> sl.Config:
    return sl.load_config("default", [f"model.activation={act}", f"model.heads={H}", f"problem.F={F}", f"problem.L={L}",
                                      f"problem.strength={STRENGTH}", f"sgd.lr={LR}", f"simulation.D={D_START}",
                                      f"sgd.tau_max={tau_max}", "sgd.n_save=121", "sgd.spacing=log", *extra])


def name(act, H, F, L) -> str:
    return f"{act}_H{H}_F{F}_L{L}"


# -- stages -----------------------------------------------------------------------------------


def trajectory(act, H, F, L, quick, tau_max=None) -> dict:
    """The ODE from seed 0's start to ``tau_max`` (default :func:`horizon`); a diverging solve
    is recorded with its message."""
    cfg = config(act, H, F, L, horizon(L, quick) if tau_max is None else tau_max)
    start = time.time()
    try:
        th = sl.integrate(cfg, sl.initial_conditions(cfg, 1))
    except FloatingPointError as err:
        return {"status": str(err), "seconds": time.time() - start}
    return {"status": "ok", "tau": th.tau, "M": th.M[0], "Q": th.Q[0], "b": th.b[0], "risk": th.risk[0],
            "risk_error": th.risk_error, "gram_error": th.gram_error, "seconds": time.time() - start}


def sample_fields(key, M, Q, b, prior: sl.Prior, L: int, n: int):
    """Scores (n, H, L) of ``n`` sequences with the relevant token at position 0: noise tokens
    ``g ~ N(0, Q)``, the relevant one shifted by ``M theta`` (``theta`` drawn from the prior's atoms)."""
    H = M.shape[0]
    k1, k2 = jax.random.split(key)
    w, V = np.linalg.eigh(Q)
    root = V * np.sqrt(np.clip(w, 0, None))
    g = jnp.einsum("hk,nkl->nhl", root, jax.random.normal(k1, (n, H, L)))
    atoms, probs = np.asarray(prior.atoms, float), prior.probs_array()
    pick = jax.random.choice(k2, len(atoms), (n,), p=jnp.asarray(probs))
    shift = jnp.asarray(atoms @ M.T)[pick]  # (n, H)
    return g.at[:, :, 0].add(shift) + jnp.asarray(b)[None, :, None]


def attention_logits(act: str, s, L: int):
    """The logits whose softmax is each head's row (ssmax: scaled; softmax1: a zero-logit sink
    token appended; bsoftmax: one row over all heads and tokens)."""
    if act == "ssmax":
        return s * math.log(L)
    if act == "softmax1":
        return jnp.concatenate([s, jnp.zeros(s.shape[:-1] + (1,))], axis=-1)
    if act == "bsoftmax":
        return s.reshape(s.shape[0], 1, -1)
    return s


def probes(act, H, F, L, traj, quick) -> dict:
    """Drift norms, ``E[a_eps]`` and the softmax Jacobian norm at ``N_PROBES`` saved times."""
    cfg = config(act, H, F, L, horizon(L, quick))
    ode = sl.OrderParameterODE.from_setup(sl.build(cfg))
    prior = cfg.problem.build_prior()
    drift = eqx.filter_jit(lambda ode, M, Q, b: (ode.drift(M, Q, b), ode.gram(M, Q, b)))
    weights = jax.jit(jax.vmap(lambda s: sl.token_weights(sl.get_activation(act), s)[0]))
    idx = np.unique(np.linspace(0, len(traj["tau"]) - 1, N_PROBES + 1).round().astype(int))  # log-spaced times
    out = {k: [] for k in ("tau", "drift", "drift_M", "gram_part", "a_eps", "a_eps_se", "jacobian", "jacobian_se")}
    key = jax.random.PRNGKey(1)
    n = 256 if quick else MC_SEQUENCES
    for i in idx:
        M, Q, b = (jnp.asarray(traj[k][i]) for k in ("M", "Q", "b"))
        d, gram = drift(ode, M, Q, b)
        s = sample_fields(jax.random.fold_in(key, int(i)), np.asarray(M), np.asarray(Q), np.asarray(b), prior, L, n)
        a = np.asarray(weights(s))
        jac = np.asarray(sl.softmax_jacobian_norm(np.asarray(attention_logits(act, s, L)))).mean(axis=-1)
        out["tau"].append(traj["tau"][i])
        out["drift"].append(float(jnp.sqrt(jnp.sum(d.M**2) + jnp.sum(d.Q**2))))
        out["drift_M"].append(float(jnp.sqrt(jnp.sum(d.M**2))))
        out["gram_part"].append(float(LR**2 * jnp.sqrt(jnp.sum(gram**2))))
        out["a_eps"].append(a.mean())
        out["a_eps_se"].append(a.std() / math.sqrt(n))
        out["jacobian"].append(jac.mean())
        out["jacobian_se"].append(jac.std() / math.sqrt(n))
    return out


def bayes(lengths) -> dict:
    """Bayes risk against ``L`` for ``F = 1, 2``: exactly (``singleloc.bayes_risk`` on the exact route:
    the risk at the Bayes point, softmax with one head for the one-atom prior, bsoftmax with ``H = F``
    heads), and the closed-form posterior on the Sobol rule where it is cheap, as a check."""
    out = {}
    for F in (1, 2):
        prior = sl.spikes(F, STRENGTH)
        exact = [sl.bayes_risk(prior, L, route="exact") for L in lengths]
        out[f"F{F}"] = np.array([e.value for e in exact])
        out[f"F{F}_error"] = np.array([e.error for e in exact])
        check = [sl.bayes_risk(prior, L, route="rule") if L <= 64 else None for L in lengths]
        out[f"F{F}_sobol"] = np.array([np.nan if c is None else c.value for c in check])
        out[f"F{F}_sobol_se"] = np.array([np.nan if c is None else c.error for c in check])
    return out


def escape(act, L, quick) -> dict:
    """The escape rate along the symmetric flow (``H = F = 2``) and the predicted escape at ``D_START``."""
    cfg = config(act, 2, 2, L, horizon(L, quick))
    pred = sl.predicted_escape(cfg, tau_flow=max(1000.0, 8.0 * L) if not quick else 200.0)
    return {"rate": pred.rate, "tau_plateau": pred.tau_plateau, "plateau_risk": pred.plateau_risk,
            "predicted_escape": pred.predicted_escape, "path_tau": pred.path_tau, "path_rate": pred.path_rate}


def simulation(L, D, seeds, tau_max) -> dict:
    cfg = config("softmax", 1, 1, L, tau_max, [f"simulation.D={D}", f"simulation.seeds={seeds}", "sgd.n_save=41",
                                               "sgd.spacing=linear"])
    start = time.time()
    sim = sl.simulate(cfg, progress=False)
    t_sim = time.time() - start
    th = sl.integrate(cfg, sl.initial_conditions(cfg), ts=sim.tau)
    return {**{f"sim_{k}": v for k, v in sim.arrays().items()}, "th_M": th.M, "th_Q": th.Q, "th_risk": th.risk,
            "seconds_simulation": t_sim, "seconds_theory": time.time() - start - t_sim}


# -- analysis ---------------------------------------------------------------------------------


def plateau_end(tau, risk) -> float:
    """First time the risk has moved halfway from its start to its final value."""
    return sl.halfway_time(tau, risk, 0.0, float(risk[0]), float(risk[-1]))


def settled(tau, risk) -> bool:
    """The risk moved by less than 1e-3 over the last fifth of the horizon (``tau >= 0.8 tau_max``; the
    last fifth of the log-spaced saved times would reach back to ``tau_max / 7`` and so take in an escape)."""
    last = tau >= tau[0] + 0.8 * (tau[-1] - tau[0])
    return bool(np.ptp(risk[last]) < 1e-3 and np.isfinite(plateau_end(tau, risk)))


def spread(M) -> np.ndarray:
    """Head spread orthogonal to the mean of the spikes prior (late_specialization.py)."""
    u = np.ones(M.shape[-1]) / math.sqrt(M.shape[-1])
    dev = M - M.mean(axis=-2, keepdims=True)
    dev = dev - (dev @ u)[..., None] * u
    return np.sqrt(np.mean(np.sum(dev**2, axis=-1), axis=-1))


def spread_escape(tau, M) -> float:
    """The escape from the unspecialized saddle: the first saved time at which the head spread has
    reached half its final value (NaN when it ends below 0.3: no escape by the horizon)."""
    s = spread(M)
    k = np.flatnonzero(s >= 0.5 * s[-1])
    return float(tau[k[0]]) if s[-1] > 0.3 and len(k) else float("nan")


def power_law(x, y, xmin=FIT_FROM) -> dict:
    """``log y = c + beta log x`` over ``x >= xmin`` (finite, positive ``y``): beta and its standard error."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = (x >= xmin) & np.isfinite(y) & (y > 0)
    if keep.sum() < 3:
        return {"beta": float("nan"), "se": float("nan"), "points": int(keep.sum())}
    coef, se, _ = fit(np.log(y[keep]), np.log(x[keep]))
    return {"beta": float(coef[1]), "se": float(se[1]), "c": float(coef[0]), "points": int(keep.sum())}


def log_law(L, y, Lmin=FIT_FROM) -> dict:
    """``y = c + beta log L`` over ``L >= Lmin``."""
    L, y = np.asarray(L, float), np.asarray(y, float)
    keep = (L >= Lmin) & np.isfinite(y)
    if keep.sum() < 3:
        return {"beta": float("nan"), "se": float("nan"), "points": int(keep.sum())}
    coef, se, _ = fit(y[keep], np.log(L[keep]))
    return {"beta": float(coef[1]), "se": float(se[1]), "c": float(coef[0]), "points": int(keep.sum())}


def simulation_agreement(sims) -> dict:
    """Per simulation stage: theory against simulation outside and inside the escape window."""
    agreement = {}
    for (L, D, seeds, tau_max), s in sims.items():
        diff = s["sim_risk"] - s["th_risk"]
        diff_lim = s["sim_risk_limit"] - s["th_risk"]
        dM = s["sim_M"][..., 0, 0] - s["th_M"][..., 0, 0]
        r = s["th_risk"].mean(0)  # the escape window: the theory's risk 10% to 90% of the way down
        frac = (r[0] - r) / (r[0] - r[-1])
        window = (frac > 0.1) & (frac < 0.9)
        lim_mean, lim_se = diff_lim.mean(0), diff_lim.std(0, ddof=1) / math.sqrt(seeds)
        agreement[f"L{L}_D{D}"] = {
            "L": L, "D": D, "seeds": seeds, "tau_max": tau_max,
            "seconds_simulation": float(s["seconds_simulation"]), "seconds_theory": float(s["seconds_theory"]),
            "max_abs_risk_diff": float(np.max(np.abs(diff))),
            "max_abs_mean_risk_diff": float(np.max(np.abs(diff.mean(0)))),
            "seed_se_at_max": float(diff.std(0, ddof=1)[np.argmax(np.abs(diff.mean(0)))] / math.sqrt(seeds)),
            "max_abs_mean_risk_limit_diff": float(np.max(np.abs(lim_mean))),
            "outside_window": {"max_abs_mean_risk_limit_diff": float(np.max(np.abs(lim_mean[~window]))),
                               "seed_se_at_max": float(lim_se[~window][np.argmax(np.abs(lim_mean[~window]))]),
                               "max_abs_mean_M_diff": float(np.max(np.abs(dM.mean(0)[~window])))},
            "inside_window": {"tau": [float(s["sim_tau"][window].min()), float(s["sim_tau"][window].max())],
                              "max_abs_mean_risk_limit_diff": float(np.max(np.abs(lim_mean[window]))),
                              "seed_se_at_max": float(lim_se[window][np.argmax(np.abs(lim_mean[window]))]),
                              "max_abs_mean_M_diff": float(np.max(np.abs(dM.mean(0)[window])))},
            "max_abs_M_diff": float(np.max(np.abs(dM))),
            "max_abs_mean_M_diff": float(np.max(np.abs(dM.mean(0)))),
            "M_seed_se_at_max": float(dM.std(0, ddof=1)[np.argmax(np.abs(dM.mean(0)))] / math.sqrt(seeds)),
            "escape_theory": [plateau_end(s["sim_tau"], r) for r in s["th_risk"]],
            "escape_simulation": [plateau_end(s["sim_tau"], r) for r in s["sim_risk_limit"]],
        }
    return agreement


def summarise(p, trajs, probe, bayes_r, escapes, sims) -> dict:
    lengths = list(p["lengths"])
    rows = {}
    for (act, H, F, L), tr in trajs.items():
        key = name(act, H, F, L)
        if str(tr["status"]) != "ok":
            rows[key] = {"activation": act, "H": H, "F": F, "L": L, "status": str(tr["status"]),
                         "tau_max": horizon(L, p["quick"]), "seconds": float(tr["seconds"])}
            continue
        tau, risk, M, Q = tr["tau"], tr["risk"], tr["M"], tr["Q"]
        rb = float(bayes_r[f"F{F}"][lengths.index(L)])
        pr = probe.get(key) or {k: [np.nan] for k in ("a_eps", "a_eps_se", "jacobian", "drift", "drift_M", "gram_part")}
        rows[key] = {
            "activation": act, "H": H, "F": F, "L": L, "status": "ok", "tau_max": float(tau[-1]),
            "seconds": float(tr["seconds"]), "risk_start": float(risk[0]), "risk_end": float(risk[-1]),
            "bayes": rb, "excess": float(risk[-1]) - rb, "plateau_end": plateau_end(tau, risk),
            "settled": settled(tau, risk), "M_end": M[-1].tolist(), "Q_diag_end": np.diag(Q[-1]).tolist(),
            "R_orth_end": float(np.mean(np.diag(Q[-1] - M[-1] @ M[-1].T))),
            "a_eps_end": float(pr["a_eps"][-1]), "a_eps_end_se": float(pr["a_eps_se"][-1]),
            "L_a_eps_end": float(L * pr["a_eps"][-1]), "jacobian_end": float(pr["jacobian"][-1]),
            "drift_start": float(pr["drift"][0]), "drift_M_start": float(pr["drift_M"][0]),
            "gram_part_start": float(pr["gram_part"][0]), "risk_error": float(tr["risk_error"]),
            "gram_error": float(tr["gram_error"]),
            "head_spread_end": float(spread(M[-1])) if H > 1 else 0.0,
        }
    laws = {}
    for act, H in (("softmax", 1), ("softmax1", 1), ("ssmax", 1), ("bsoftmax", 2)):
        rs = [rows.get(name(act, H, 1, L)) for L in lengths]
        rs = [r for r in rs if r and r["status"] == "ok"]
        if len(rs) < 3:
            continue
        Ls = [r["L"] for r in rs]
        laws[f"{act}_H{H}"] = {
            "plateau_vs_L": power_law(Ls, [r["plateau_end"] for r in rs]),
            "M_end_vs_logL": log_law(Ls, [np.mean(r["M_end"]) if r["settled"] else np.nan for r in rs]),
            "Q_end_vs_logL": log_law(Ls, [np.mean(r["Q_diag_end"]) if r["settled"] else np.nan for r in rs]),
            "a_eps_end_vs_L": power_law(Ls, [r["a_eps_end"] for r in rs]),
            "drift_start_vs_L": power_law(Ls, [r["drift_start"] for r in rs]),
            "jacobian_end_vs_L": power_law(Ls, [r["jacobian_end"] for r in rs]),
            "excess_vs_L": power_law(Ls, [r["excess"] for r in rs]),
        }
    laws["bayes_F1_vs_L"] = power_law(lengths, 1 - bayes_r["F1"])
    esc = {}
    for (act, L), e in escapes.items():
        esc[f"{act}_L{L}"] = {"activation": act, "L": L, "rate": float(e["rate"]), "tau_plateau": float(e["tau_plateau"]),
                              "plateau_risk": float(e["plateau_risk"]), "predicted_escape": float(e["predicted_escape"])}
    for (act, _H, F, L), tr in trajs.items():  # the escape of the ODE from seed 0's start (head spread)
        if F == 2 and str(tr["status"]) == "ok":
            esc.setdefault(f"{act}_L{L}", {"activation": act, "L": L})["ode_escape"] = spread_escape(tr["tau"], tr["M"])
            esc[f"{act}_L{L}"]["spread_end"] = float(spread(tr["M"])[-1])
    for act in ("softmax", "ssmax"):
        es = [e for e in esc.values() if e["activation"] == act]
        laws[f"rate_{act}_vs_L"] = power_law([e["L"] for e in es], [e["rate"] for e in es], xmin=4)
        laws[f"predicted_escape_{act}_vs_L"] = power_law([e["L"] for e in es], [e["predicted_escape"] for e in es], xmin=4)
    es = [e for e in esc.values() if e["activation"] == "bsoftmax"]
    laws["ode_escape_bsoftmax_vs_L"] = power_law([e["L"] for e in es], [e["ode_escape"] for e in es], xmin=4)
    agreement = simulation_agreement(sims)
    return {"setting": {"strength": STRENGTH, "lr": LR, "D_start": D_START, "lengths": lengths,
                        "horizons": {L: horizon(L, p["quick"]) for L in lengths}, "mc_sequences": MC_SEQUENCES},
            "bayes": {f"F{F}": bayes_r[f"F{F}"].tolist() for F in (1, 2)},
            "bayes_sobol_check": {f"F{F}": bayes_r[f"F{F}_sobol"].tolist() for F in (1, 2)},
            "runs": rows, "laws": laws, "escape": esc, "simulations": agreement}


def print_runs(res: dict, header: str, line) -> None:
    """The table of runs (``line(r)``: the columns after the name and horizon of a run that
    finished) and the fitted laws, each ``beta +- standard error (points)``."""
    print(f"\nrun                       tau_max  {header}")
    for k, r in res["runs"].items():
        tail = line(r) if r["status"] == "ok" else f"FAILED: {r['status'][:90]}"
        print(f"{k:25s} {r['tau_max']:7.0f}  {tail}")
    print("\nlaws (power laws in L or laws in log L, fitted for L >= 64; beta +- standard error (points))")
    fmt = lambda w: f"{w['beta']:.3f} +- {w['se']:.3f} ({w['points']})"  # noqa: E731
    for k, v in res["laws"].items():
        print(f"  {k}: " + (fmt(v) if "beta" in v else "; ".join(f"{q} {fmt(w)}" for q, w in v.items())))


def report(res: dict) -> None:
    print_runs(res, "plateau   R_end   Bayes  excess  M_end   Q_end   E[a_eps] L*E[a_eps]  |drift|_0  settled  s",
               lambda r: f"{r['plateau_end']:7.1f} {r['risk_end']:7.4f} {r['bayes']:7.4f} {r['excess']:7.4f} "
                         f"{np.mean(r['M_end']):6.3f} {np.mean(r['Q_diag_end']):7.3f} {r['a_eps_end']:8.4f} "
                         f"{r['L_a_eps_end']:9.2f} {r['drift_start']:10.2e}  {'yes' if r['settled'] else 'no ':4s} "
                         f"{r['seconds']:6.0f}")
    print("\nspecialization, H = F = 2")
    for k, e in res["escape"].items():
        if "rate" in e:
            print(f"  {k}: lambda {e['rate']:.4f}, plateau from tau {e['tau_plateau']:.1f} (risk {e['plateau_risk']:.4f}), "
                  f"predicted escape at D = {D_START}: {e['predicted_escape']:.0f}")
        else:
            print(f"  {k}: ODE escape from seed 0's start {e['ode_escape']:.1f} (head spread at the end {e['spread_end']:.2f})")
    print("\nsimulations against theory (softmax, H = F = 1)")
    for k, a in res["simulations"].items():
        o, i = a["outside_window"], a["inside_window"]
        print(f"  {k}: D = {a['D']}, {a['seeds']} seeds, tau <= {a['tau_max']:.0f} ({a['seconds_simulation']:.0f} s): "
              f"max |R_sim - R_th| {a['max_abs_risk_diff']:.4f} (seed mean {a['max_abs_mean_risk_diff']:.4f} +- "
              f"{a['seed_se_at_max']:.4f}; limit loss of the same sequences {a['max_abs_mean_risk_limit_diff']:.4f}); "
              f"max |M_sim - M_th| {a['max_abs_M_diff']:.3f} (seed mean "
              f"{a['max_abs_mean_M_diff']:.3f} +- {a['M_seed_se_at_max']:.3f}); limit loss outside the escape window "
              f"{o['max_abs_mean_risk_limit_diff']:.4f} +- {o['seed_se_at_max']:.4f} (M {o['max_abs_mean_M_diff']:.3f}), inside "
              f"(tau {i['tau'][0]:.0f}-{i['tau'][1]:.0f}) {i['max_abs_mean_risk_limit_diff']:.4f} +- {i['seed_se_at_max']:.4f} "
              f"(M {i['max_abs_mean_M_diff']:.3f}); escape theory "
              f"{np.round(a['escape_theory'], 1)}, simulation {np.round(a['escape_simulation'], 1)}")


# -- figures ----------------------------------------------------------------------------------


def draw(p, trajs, probe, bayes_r, escapes, sims, res, out) -> None:
    lengths = np.array(p["lengths"], float)
    shade = lambda i, n: 0.35 + 0.65 * i / max(n - 1, 1)  # noqa: E731
    # 1. risk curves of softmax and ssmax, H = 1, and the final risk against L
    fig = figure(figsize=(15, 4.4))
    axes = fig.subplots(1, 3)
    for ax, act in zip(axes[:2], ("softmax", "ssmax")):
        for i, L in enumerate(p["lengths"]):
            tr = trajs.get((act, 1, 1, L))
            if tr is None or str(tr["status"]) != "ok":
                continue
            line, = ax.plot(tr["tau"][1:], tr["risk"][1:], color=COLORS[act], alpha=shade(i, len(lengths)), label=f"L = {L}")
            ax.axhline(bayes_r["F1"][i], color=line.get_color(), alpha=shade(i, len(lengths)), ls=":", lw=0.8)
        ax.set(xscale="log", xlabel="tau", ylabel="risk", title=f"{act}, H = F = 1 (dotted: Bayes risk at that L)")
        ax.legend(fontsize=7)
    ax = axes[2]
    for act, H, marker in (("softmax", 1, "o"), ("softmax1", 1, "s"), ("ssmax", 1, "^"), ("bsoftmax", 2, "D")):
        rs = [res["runs"].get(name(act, H, 1, L)) for L in p["lengths"]]
        Ls = [r["L"] for r in rs if r and r["status"] == "ok"]
        ex = [r["risk_end"] for r in rs if r and r["status"] == "ok"]
        ax.plot(Ls, ex, marker=marker, color=COLORS[act], ls="-" if H == 1 else "--", mfc="none" if H == 2 else None,
                ms=5, label=f"{act}, H = {H}")
    ax.plot(lengths, bayes_r["F1"], "k-", lw=2, alpha=0.4, label="Bayes risk")
    ax.set(xscale="log", xlabel="L", ylabel="risk at the end", title="final risk, F = 1 (horizon 4 plateau scales)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    sl.save_figure(out / "long_context_risk.png", fig)

    # 2. plateau length, M, Q, E[a_eps] against L
    fig = figure(figsize=(15, 4.4))
    ax_t, ax_q, ax_a = fig.subplots(1, 3)
    for act, H, marker in (("softmax", 1, "o"), ("softmax1", 1, "s"), ("ssmax", 1, "^"), ("bsoftmax", 2, "D")):
        rs = [r for r in (res["runs"].get(name(act, H, 1, L)) for L in p["lengths"]) if r and r["status"] == "ok"]
        Ls = np.array([r["L"] for r in rs], float)
        law = res["laws"].get(f"{act}_H{H}", {})
        lab = f"{act}, H = {H}"
        t_lab = lab + (f": slope {law['plateau_vs_L']['beta']:.2f} +- {law['plateau_vs_L']['se']:.2f}" if law else "")
        ax_t.loglog(Ls, [r["plateau_end"] for r in rs], marker=marker, color=COLORS[act], label=t_lab)
        ok = [r["settled"] for r in rs]
        ax_q.semilogx(Ls, [np.mean(r["M_end"]) if s else np.nan for r, s in zip(rs, ok)], marker=marker, color=COLORS[act],
                      label=f"{lab}: M")
        ax_q.semilogx(Ls, [np.mean(r["Q_diag_end"]) if s else np.nan for r, s in zip(rs, ok)], marker=marker, ls="--",
                      mfc="none", color=COLORS[act], label=f"{lab}: Q_hh")
        a_lab = lab + (f": slope {law['a_eps_end_vs_L']['beta']:.2f}" if law else "")
        ax_a.errorbar(Ls, [r["a_eps_end"] for r in rs], [r["a_eps_end_se"] for r in rs], marker=marker, color=COLORS[act],
                      label=a_lab, capsize=2)
    ax_t.loglog(lengths, lengths / (2 * LR * STRENGTH**2), "k:", lw=1, label="L / (2 lr strength^2)")
    ax_t.set(xlabel="L", ylabel="plateau end (risk halfway down)", title="length of the unspecialized phase")
    ax_t.legend(fontsize=7)
    ax_q.axhline(STRENGTH, color="k", lw=0.8, ls=":")
    ax_q.axhline(STRENGTH**2, color="k", lw=0.8, ls=":")
    ax_q.semilogx(lengths, np.log(lengths) / STRENGTH, color="gray", lw=0.8, ls="-.", label="log(L) / strength")
    ax_q.set(xlabel="L", ylabel="overlap at the end", title="trained keys (dotted: Bayes point M = 2.5, Q = 6.25)")
    ax_q.legend(fontsize=6.5, ncol=2)
    ax_a.set(xscale="log", yscale="log", xlabel="L", ylabel="E[a_eps] at the end",
             title="weight on the relevant token after training")
    ax_a.loglog(lengths, 0.5 * lengths[0] / lengths, color="gray", lw=0.8, ls="-.", label="1/L")
    ax_a.legend(fontsize=7)
    fig.tight_layout()
    sl.save_figure(out / "long_context_laws.png", fig)

    # 3. gradient signal along the trajectories
    fig = figure(figsize=(15, 4.4))
    ax_d, ax_j, ax_p = fig.subplots(1, 3)
    for i, L in enumerate(p["lengths"]):
        pr = probe.get(name("softmax", 1, 1, L))
        if pr is None:
            continue
        a = shade(i, len(lengths))
        ax_d.loglog(pr["tau"][1:], pr["drift"][1:], marker="o", ms=3, color="C0", alpha=a, label=f"L = {L}")
        ax_d.loglog(pr["tau"][1:], pr["gram_part"][1:], ls=":", color="C0", alpha=a)
        ax_j.loglog(pr["tau"][1:], pr["jacobian"][1:], marker="o", ms=3, color="C0", alpha=a, label=f"L = {L}")
    ax_d.set(xlabel="tau", ylabel="|drift| (dotted: lr^2 Gram part)", title="softmax, H = F = 1: drift along training")
    ax_d.legend(fontsize=7)
    ax_j.axhline(0.5, color="k", lw=0.8, ls=":")
    ax_j.set(xlabel="tau", ylabel="mean spectral norm of diag(a) - a a^T", title="softmax Jacobian along training (bound 1/2)")
    ax_j.legend(fontsize=7)
    for act, marker in (("softmax", "o"), ("softmax1", "s"), ("ssmax", "^")):
        rs = [r for r in (res["runs"].get(name(act, 1, 1, L)) for L in p["lengths"]) if r and r["status"] == "ok"]
        law = power_law([r["L"] for r in rs], [r["drift_M_start"] for r in rs])
        ax_p.loglog([r["L"] for r in rs], [r["drift_M_start"] for r in rs], marker=marker, color=COLORS[act],
                    label=f"{act}: |dM/dtau| at the start, slope {law['beta']:.2f}")
        ax_p.loglog([r["L"] for r in rs], [r["jacobian_end"] for r in rs], marker=marker, ls="--", mfc="none",
                    color=COLORS[act], label=f"{act}: Jacobian norm at the end")
    ax_p.set(xlabel="L", title="gradient signal against L")
    ax_p.legend(fontsize=7)
    fig.tight_layout()
    sl.save_figure(out / "long_context_signal.png", fig)

    # 4. specialization and simulations
    fig = figure(figsize=(15, 4.4))
    ax_r, ax_e, ax_s = fig.subplots(1, 3)
    for act, marker in (("softmax", "o"), ("ssmax", "^")):
        es = [e for e in res["escape"].values() if e["activation"] == act]
        law = res["laws"].get(f"rate_{act}_vs_L", {"beta": np.nan, "se": np.nan})
        ax_r.loglog([e["L"] for e in es], [e["rate"] for e in es], marker=marker, color=COLORS[act],
                    label=f"{act}: slope {law['beta']:.2f} +- {law['se']:.2f}")
        ax_e.loglog([e["L"] for e in es], [e["predicted_escape"] for e in es], marker=marker, color=COLORS[act],
                    label=f"{act}: predicted escape (D = {D_START})")
        ax_e.loglog([e["L"] for e in es], [e["tau_plateau"] for e in es], marker=marker, ls=":", mfc="none",
                    color=COLORS[act], label=f"{act}: plateau reached")
    es = [e for e in res["escape"].values() if e["activation"] == "bsoftmax"]
    ax_e.loglog([e["L"] for e in es], [e["ode_escape"] for e in es], marker="D", color=COLORS["bsoftmax"],
                label="bsoftmax: ODE escape from seed 0")
    ax_r.set(xlabel="L", ylabel="escape rate lambda", title="H = F = 2: escape rate of the unspecialized saddle")
    ax_r.legend(fontsize=7)
    ax_e.set(xlabel="L", ylabel="tau", title="escape from the unspecialized saddle")
    ax_e.legend(fontsize=7)
    for j, ((L, D, seeds, _tau), s) in enumerate(sims.items()):
        c = f"C{j}"
        t = s["sim_tau"][1:]  # a log axis: the start (tau = 0) is left out
        for i in range(seeds):
            ax_s.plot(t, s["th_risk"][i][1:], color=c, lw=1, label=f"L = {L}, theory (one per seed)" if i == 0 else None)
        m, sd = s["sim_risk"].mean(0)[1:], s["sim_risk"].std(0)[1:]
        ax_s.errorbar(t, m, sd, fmt=".", color=c, ms=3, lw=0.6, label=f"L = {L}, D = {D}, {seeds} seeds (mean, sd)")
    ax_s.set(xlabel="tau", ylabel="risk", title="softmax, H = F = 1: simulations against theory", xscale="log")
    ax_s.legend(fontsize=7)
    fig.tight_layout()
    sl.save_figure(out / "long_context_specialization.png", fig)


# -- section 6: more heads and two spikes (--heads) ---------------------------------------------


def summarise_heads(hp, trajs, bayes_r, bayes_lengths, escapes) -> dict:
    """Per run: the first plateau (the unspecialized saddle's risk and when it is reached halfway),
    the escape from it (:func:`spread_escape`), the final risk against the Bayes risk at that ``L``,
    and the head classes at the end."""
    rows = {}
    for (act, H, F, L), tr in trajs.items():
        key = name(act, H, F, L)
        base = {"activation": act, "H": H, "F": F, "L": L, "tau_max": heads_horizon(L, hp["quick"]),
                "seconds": float(tr["seconds"]), "status": str(tr["status"])}
        if base["status"] != "ok":
            rows[key] = base
            continue
        tau, risk, M, Q = tr["tau"], tr["risk"], tr["M"], tr["Q"]
        rb = float(bayes_r[f"F{F}"][list(bayes_lengths).index(L)])
        esc = spread_escape(tau, M) if H > 1 and F > 1 else float("nan")
        sp = spread(M)
        saddle = np.flatnonzero(sp < 0.1 * sp[-1]) if np.isfinite(esc) else np.arange(len(tau))
        r_saddle = float(risk[saddle[-1]])  # the last saved time still on the unspecialized saddle
        prior = sl.spikes(F, STRENGTH)
        classes = sl.classify_heads(M[-1], Q[-1], mean=prior.mean())
        rows[key] = {**base, "risk_start": float(risk[0]), "risk_end": float(risk[-1]), "bayes": rb,
                     "excess": float(risk[-1]) - rb, "saddle_risk": r_saddle,
                     "first_plateau_end": sl.halfway_time(tau, risk, 0.0, float(risk[0]), r_saddle),
                     "escape": esc, "settled": settled(tau, risk), "M_end": M[-1].tolist(),
                     "Q_end": Q[-1].tolist(), "head_spread_end": float(sp[-1]),
                     "classes": class_counts_text({k: int(v) for k, v in classes.counts().items()}),
                     "risk_error": float(tr["risk_error"]), "gram_error": float(tr["gram_error"])}
    laws = {}
    for act, H, F in sorted({(r["activation"], r["H"], r["F"]) for r in rows.values()}):
        rs = [r for r in rows.values() if (r["activation"], r["H"], r["F"]) == (act, H, F) and r["status"] == "ok"]
        Ls = [r["L"] for r in rs]
        laws[f"{act}_H{H}_F{F}"] = {"first_plateau_vs_L": power_law(Ls, [r["first_plateau_end"] for r in rs]),
                                    "escape_vs_L": power_law(Ls, [r["escape"] for r in rs]),
                                    "excess_vs_L": power_law(Ls, [r["excess"] for r in rs])}
    rates = {f"{act}_L{L}": {"activation": act, "L": L, "rate": float(e["rate"]), "tau_plateau": float(e["tau_plateau"]),
                             "plateau_risk": float(e["plateau_risk"]), "predicted_escape": float(e["predicted_escape"])}
             for (act, L), e in escapes.items()}
    for act in sorted({a for a, _ in escapes}):
        es = [e for e in rates.values() if e["activation"] == act]
        laws[f"rate_{act}_vs_L"] = {"rate_vs_L": power_law([e["L"] for e in es], [e["rate"] for e in es], xmin=16)}
    return {"setting": {"strength": STRENGTH, "lr": LR, "D_start": D_START, "lengths": list(hp["lengths"]),
                        "horizons": {L: heads_horizon(L, hp["quick"]) for L in hp["lengths"]}},
            "escape_rates": rates,
            "bayes": {f"F{F}": {L: float(bayes_r[f"F{F}"][list(bayes_lengths).index(L)]) for L in hp["lengths"]}
                      for F in (1, 2)},
            "runs": rows, "laws": laws}


def report_heads(res: dict) -> None:
    print_runs(res, "1st plateau  saddle R  escape   R_end   Bayes  excess  settled  classes    s",
               lambda r: f"{r['first_plateau_end']:10.1f} {r['saddle_risk']:9.4f} {r['escape']:7.1f} {r['risk_end']:7.4f} "
                         f"{r['bayes']:7.4f} {r['excess']:7.4f}  {'yes' if r['settled'] else 'no ':7s} {r['classes']:10s} "
                         f"{r['seconds']:4.0f}")
    print("\nescape rate of the unspecialized saddle, H = F = 2")
    for k, e in res["escape_rates"].items():
        print(f"  {k}: lambda {e['rate']:.4f}, plateau from tau {e['tau_plateau']:.1f} (risk {e['plateau_risk']:.4f}), "
              f"predicted escape at D = {D_START}: {e['predicted_escape']:.0f}")


def draw_heads(hp, trajs, bayes_r, bayes_lengths, res, out) -> None:
    lengths = np.array(hp["lengths"], float)
    bayes2 = np.array([res["bayes"]["F2"][L] for L in hp["lengths"]])
    styles = {("softmax", 1): ("C0", "o", ":"), ("softmax", 2): ("C0", "s", "-"), ("softmax", 4): ("C0", "^", "--"),
              ("bsoftmax", 2): ("C2", "D", "-"), ("softmax1", 2): ("C1", "v", "-"), ("ssmax", 2): ("C3", "P", "-")}
    fig = figure(figsize=(20, 4.4))
    ax_c, ax_r, ax_t, ax_l = fig.subplots(1, 4)
    for i, L in enumerate(hp["lengths"]):
        a = 0.35 + 0.65 * i / max(len(lengths) - 1, 1)
        for act, H in (("softmax", 2), ("bsoftmax", 2)):
            tr = trajs.get((act, H, 2, L))
            if tr is not None and str(tr["status"]) == "ok":
                c, _, ls = styles[(act, H)]
                ax_c.plot(tr["tau"][1:], tr["risk"][1:], color=c, ls=ls, alpha=a,
                          label=f"{act}, L = {L}" if act == "softmax" else (f"{act}, L = {L} ..." if i == 0 else None))
        ax_c.axhline(bayes2[i], color="k", alpha=a, ls=":", lw=0.8)
    ax_c.set(xscale="log", xlabel="tau", ylabel="risk", title="H = F = 2: softmax (C0), bsoftmax (C2); dotted: Bayes")
    ax_c.legend(fontsize=7)
    for (act, H), (c, marker, ls) in styles.items():
        rs = [r for r in res["runs"].values() if (r["activation"], r["H"], r["F"]) == (act, H, 2) and r["status"] == "ok"]
        if not rs:
            continue
        Ls = [r["L"] for r in rs]
        ax_r.loglog(Ls, [r["excess"] for r in rs], marker=marker, color=c, ls=ls, label=f"{act}, H = {H}")
        ax_t.loglog(Ls, [r["first_plateau_end"] for r in rs], marker=marker, color=c, ls=ls, mfc="none",
                    label=f"{act}, H = {H}: first plateau")
        if H > 1:
            ax_t.loglog(Ls, [r["escape"] for r in rs], marker=marker, color=c, ls=ls, label=f"{act}, H = {H}: escape")
    ax_r.set(xlabel="L", ylabel="final risk - Bayes risk", title="F = 2: excess risk at the horizon")
    ax_r.legend(fontsize=7)
    ax_t.loglog(lengths, lengths / (2 * LR * STRENGTH**2), "k:", lw=1, label="L / (2 lr strength^2)")
    ax_t.set(xlabel="L", ylabel="tau", title="F = 2: first plateau (open) and specialization escape (filled)")
    ax_t.legend(fontsize=6.5, ncol=2)
    for act, marker in (("softmax", "s"), ("ssmax", "P")):
        es = [e for e in res["escape_rates"].values() if e["activation"] == act]
        law = res["laws"].get(f"rate_{act}_vs_L", {}).get("rate_vs_L", {"beta": np.nan, "se": np.nan})
        slope = f": slope {law['beta']:.2f} +- {law['se']:.2f} (L >= 16)" if np.isfinite(law["beta"]) else ""
        ax_l.loglog([e["L"] for e in es], [e["rate"] for e in es], marker=marker, color=COLORS[act], label=act + slope)
    ax_l.set(xlabel="L", ylabel="escape rate lambda", title="H = F = 2: escape rate of the unspecialized saddle")
    ax_l.legend(fontsize=7)
    fig.tight_layout()
    sl.save_figure(out / "long_context_heads.png", fig)


def main() -> None:
    cli = parser(__doc__)
    cli.add_argument("--cached-only", action="store_true", help="draw from the stages already in --cache, skip the others")
    cli.add_argument("--simulations-only", action="store_true", help="only the simulation stages (section 4), their "
                     "agreement written to long_context_simulations.json")
    cli.add_argument("--heads", action="store_true", help="section 6 only: more heads and two spikes against L, "
                     "written to long_context_heads.json and .png")
    args = cli.parse_args()
    p = plan(args.quick)
    cache = cache_dir(args, "long_context")
    start = time.time()
    bayes_r = cached_stage(cache, "bayes", lambda: bayes(p["lengths"]))
    trajs, probe, escapes, sims = {}, {}, {}, {}
    missing = []

    def stage(cache, key, fn):  # _common.stage, or with --cached-only a LookupError for a stage not in the cache
        if args.cached_only and not (cache / f"{key}.npz").is_file():
            missing.append(key)
            raise LookupError(key)
        return cached_stage(cache, key, fn)

    def run_trajectory(run):
        key = name(*run)
        try:
            trajs[run] = stage(cache, f"traj_{key}", lambda: trajectory(*run, p["quick"]))
        except LookupError:
            return
        print(f"{key}: {trajs[run]['status']!s:.80} ({float(trajs[run]['seconds']):.0f} s; {time.time() - start:.0f} s so far)",
              flush=True)
        if str(trajs[run]["status"]) == "ok" and run[2] == 1:
            try:
                probe[key] = stage(cache, f"probe_{key}", lambda: probes(*run, trajs[run], p["quick"]))
            except LookupError:
                pass

    def run_simulation(s):
        try:
            sims[s] = stage(cache, f"sim_L{s[0]}_D{s[1]}_S{s[2]}_T{s[3]:g}", lambda: simulation(*s))
        except LookupError:
            return
        print(f"simulation L = {s[0]}: {float(sims[s]['seconds_simulation']):.0f} s ({time.time() - start:.0f} s so far)",
              flush=True)

    def run_escape(act, L):
        try:
            escapes[(act, L)] = stage(cache, f"escape_{act}_L{L}", lambda: escape(act, L, p["quick"]))
        except LookupError:
            return
        print(f"escape {act} L = {L}: lambda {float(escapes[(act, L)]['rate']):.4f} ({time.time() - start:.0f} s so far)",
              flush=True)

    if args.heads:
        hp = heads_plan(args.quick)
        for run in hp["runs"]:
            key = name(*run)
            try:
                trajs[run] = stage(cache, f"traj_{key}_T{heads_horizon(run[3], p['quick']):g}",
                                   lambda run=run: trajectory(*run, p["quick"], heads_horizon(run[3], p["quick"])))
            except LookupError:
                continue
            print(f"{key}: {trajs[run]['status']!s:.80} ({float(trajs[run]['seconds']):.0f} s; "
                  f"{time.time() - start:.0f} s so far)", flush=True)
        for act, L in hp["escape"]:
            run_escape(act, L)
        if missing:
            print(f"--cached-only: not in the cache, left out: {', '.join(missing)}")
        res = summarise_heads(hp, trajs, bayes_r, p["lengths"], escapes)
        report_heads(res)
        out = figures_dir(args)
        draw_heads(hp, trajs, bayes_r, p["lengths"], res, out)
        save_json(out / "long_context_heads.json", res)
        print(f"{out}/long_context_heads.png written in {time.time() - start:.0f} s")
        return
    if args.simulations_only:
        for s in p["sims"]:
            run_simulation(s)
        save_json(figures_dir(args) / "long_context_simulations.json", simulation_agreement(sims))
        print(f"simulations written in {time.time() - start:.0f} s")
        return
    # one-head runs up to L = 1024, the simulations, the escape rates, two heads, L = 4096
    order = sorted(p["runs"], key=lambda r: (r[3] > 1024, r[1], r[2], r[3], r[0]))
    for run in [r for r in order if r[1] == 1 and r[3] <= 1024]:
        run_trajectory(run)
    for s in p["sims"]:
        run_simulation(s)
    for act, L in p["escape"]:
        run_escape(act, L)
    for run in [r for r in order if r[1] > 1 and r[3] <= 1024]:
        run_trajectory(run)
    for run in [r for r in order if r[3] > 1024]:
        run_trajectory(run)
    if missing:
        print(f"--cached-only: not in the cache, left out: {', '.join(missing)}")
    res = summarise(p, trajs, probe, bayes_r, escapes, sims)
    report(res)
    out = figures_dir(args)
    draw(p, trajs, probe, bayes_r, escapes, sims, res, out)
    save_json(out / "long_context.json", res)
    print(f"{out}/long_context_*.png written in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
