"""Training variants (issue 24): mini-batches, weight decay, annealed learning rates, gradient flow.

The default problem (spikes prior of strength 2.5, L = 4, F = 2, trained biases) at
``sgd.lr = 0.5``; docs/model.md section 11 derives every variant. Four questions, one figure
each:

1. Mini-batches (figures/training_batch.png): the noise floor above the Bayes risk and the
   escape time from the unspecialized plateau against ``B`` at a fixed number of sequences seen
   (time ``tau`` counts sequences). Theory (bsoftmax, H = 2, 3 seeds' starts at D = 1000) for
   B = 1, 2, 4, 8 at lr = 0.5 to tau = 100 B; simulations at D = 400 (3 seeds, tau = 90) for
   (B, lr) = (1, 0.5), (4, 0.5) and (4, 2.0): the theory says a batch of B at lr is one sequence at lr / B, so (4, 2.0) should
   follow (1, 0.5) and (4, 0.5) be four times slower.
2. Weight decay (figures/training_decay.png): softmax1 and bsoftmax with H = 4 > F = 2 (two
   redundant heads) at wd = 0, 0.01, 0.05 to tau = 400: each head's attention mass w_h, its
   spike overlap |M_h| and the final risk.
3. Annealed rates (figures/training_schedule.png): bsoftmax and softmax (H = 2) to tau = 1000,
   constant against ``inverse`` (lr / (1 + tau / 20)) and ``cosine`` (to 1% over 1000): the gap
   to the Bayes risk over time (dynamics on the Sobol rule, the risk of each state exact).
4. Gradient flow (figures/training_flow.png): bsoftmax, the gradient flow against SGD's ODE at
   lr = 0.5, 0.2, 0.05 on the time lr tau.

Writes figures/training_*.png and figures/training_variants.json (``seconds``: each stage's time in
that run, 0 when read from the cache). Runtime about 12 minutes on the shared 2-core machine
(batch 215 s, decay 172 s, schedule 260 s, flow 52 s); ``--cache DIR`` keeps every stage;
``--quick`` a smaller run.
"""

from __future__ import annotations

import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import cache_dir, figure, figures_dir, parser, save_figure, save_json, stage  # noqa: E402

import singleloc as sl  # noqa: E402

RULE = ["theory.route=rule", "theory.points=4096"]


def cfg(preset: str, *overrides: str) -> sl.Config:
    return sl.load_config(preset, list(overrides))


def bayes(config: sl.Config) -> float:
    return float(sl.bayes_risk(config.problem.build_prior(), config.problem.L).value)


#: bsoftmax's unspecialized plateau sits near risk 0.35 and its specialized state near 0.21 (Bayes 0.20):
#: the escape time is the first saved time at which the risk is below the level between them.
ESCAPE_LEVEL = 0.28


def escape(tau, risk, level: float = ESCAPE_LEVEL) -> float:
    below = np.flatnonzero(np.asarray(risk) <= level)
    return float(tau[below[0]]) if len(below) else float("nan")


# ------------------------------------------------------------------------------------------- 1


#: (theory horizon T of B = 1, seeds, simulated D, simulated horizon) of the full and quick runs.
BATCH_PLAN = {False: (100, 3, 400, 90), True: (60, 2, 300, 60)}


def batch_stage(quick: bool) -> dict:
    T, seeds, D_sim, T_sim = BATCH_PLAN[quick]
    out = {}
    for B in (1, 2, 4, 8):
        c = cfg("bsoftmax", *RULE, f"sgd.batch={B}", f"sgd.tau_max={B * T}", "sgd.spacing=log", "sgd.n_save=201",
                f"simulation.seeds={seeds}")
        th = sl.integrate(c, sl.initial_conditions(c), progress=False)
        out[f"th{B}_tau"], out[f"th{B}_risk"] = th.tau, th.risk
    for B, lr in ((1, 0.5), (4, 0.5), (4, 2.0)):
        c = cfg("bsoftmax", f"sgd.batch={B}", f"sgd.lr={lr}", f"sgd.tau_max={T_sim}", "sgd.n_save=31",
                f"simulation.D={D_sim}", f"simulation.seeds={seeds}", "simulation.test_samples=2048")
        sim = sl.simulate(c, progress=False)
        out[f"sim{B}_{lr}_tau"], out[f"sim{B}_{lr}_risk"] = sim.tau, sim.risk_limit
    return out


def batch_answer(data: dict, bayes_risk: float) -> dict:
    rows = {}
    T = data["th1_tau"][-1]
    for B in (1, 2, 4, 8):
        tau, risk = data[f"th{B}_tau"], data[f"th{B}_risk"]
        at_T = np.array([np.interp(T, tau, r) for r in risk])
        rows[B] = {"gap_at_fixed_samples_tau_T": float(at_T.mean() - bayes_risk),
                   "floor": float(np.mean(risk[:, -1]) - bayes_risk),
                   "escape": float(np.nanmean([escape(tau, r) for r in risk])), "tau_end": float(tau[-1])}
    sims = {}
    for key in ("1_0.5", "4_0.5", "4_2.0"):
        r = data[f"sim{key}_risk"]
        se = float(r[:, -1].std(ddof=1) / np.sqrt(len(r))) if len(r) > 1 else 0.0
        sims[key] = {"risk_end": float(r[:, -1].mean()), "se": se,
                     "escape": float(np.nanmean([escape(data[f"sim{key}_tau"], x) for x in r]))}
    return {"theory": rows, "simulation": sims}


def batch_figure(data: dict, bayes_risk: float, answer: dict, path, D_sim: int) -> None:
    fig = figure(figsize=(9, 3.4))
    a, b = fig.subplots(1, 2)
    for B in (1, 2, 4, 8):
        a.semilogx(data[f"th{B}_tau"][1:], data[f"th{B}_risk"].mean(0)[1:] - bayes_risk, label=f"ODE B={B}")
    for key, style in (("1_0.5", "ko"), ("4_0.5", "rs"), ("4_2.0", "b^")):
        t, r = data[f"sim{key}_tau"], data[f"sim{key}_risk"].mean(0)
        B, lr = key.split("_")
        a.semilogx(t[1:], r[1:] - bayes_risk, style, ms=3, label=f"sim D={D_sim} B={B} lr={lr}")
    a.set_xlabel("tau = sequences / D")
    a.set_ylabel("risk - Bayes")
    a.set_yscale("log")
    a.legend(fontsize=6)
    Bs = np.array([1, 2, 4, 8])
    T = int(round(data["th1_tau"][-1]))
    b.loglog(Bs, [answer["theory"][B]["floor"] for B in Bs], "o-", label=f"risk - Bayes at tau = {T} B")
    b.loglog(Bs, [answer["theory"][B]["gap_at_fixed_samples_tau_T"] for B in Bs], "v-", label=f"risk - Bayes at tau = {T}")
    b.loglog(Bs, [answer["theory"][B]["escape"] / 1000 for B in Bs], "s-", label=f"escape time / 1000 (risk < {ESCAPE_LEVEL})")
    b.set_xlabel("batch B (lr = 0.5)")
    b.legend(fontsize=7)
    fig.suptitle("bsoftmax H=2: a batch of B at lr is one sequence at lr/B", fontsize=9)
    fig.tight_layout()
    save_figure(path, fig)


# ------------------------------------------------------------------------------------------- 2

DECAYS = (0.0, 0.01, 0.05)


def decay_stage(quick: bool) -> dict:
    T = 100 if quick else 400
    out = {}
    for act in ("softmax1", "bsoftmax"):
        for wd in DECAYS:
            c = cfg("default", "theory.route=rule", "theory.points=2048", f"model.activation={act}", "model.heads=4",
                    "model.train_bias=true", f"sgd.weight_decay={wd}", f"sgd.tau_max={T}", "sgd.spacing=log", "sgd.n_save=101",
                    "simulation.seeds=1")
            th = sl.integrate(c, sl.initial_conditions(c), progress=False)
            ode = sl.OrderParameterODE.from_setup(sl.build(c))
            M, Q, b = th.M[0, -1], th.Q[0, -1], th.b[0, -1]
            key = f"{act}_{wd}"
            out[key + "_tau"], out[key + "_risk"] = th.tau, th.risk[0]
            out[key + "_w"] = sl.attention_mass(ode, M, Q, b)
            out[key + "_M"], out[key + "_Q"], out[key + "_b"] = M, Q, b
    return out


def decay_answer(data: dict, bayes_risk: float) -> dict:
    ans = {}
    for act in ("softmax1", "bsoftmax"):
        for wd in DECAYS:
            k = f"{act}_{wd}"
            M, Q = data[k + "_M"], data[k + "_Q"]
            norms = np.linalg.norm(M, axis=1)
            cos = (M @ M.T) / np.maximum(np.outer(norms, norms), 1e-12)
            ans[k] = {"risk": float(data[k + "_risk"][-1]), "gap": float(data[k + "_risk"][-1] - bayes_risk),
                      "w": np.round(data[k + "_w"], 3).tolist(), "M_norm": np.round(norms, 3).tolist(),
                      "r_orth": np.round(np.diag(Q - M @ M.T), 4).tolist(), "b": np.round(data[k + "_b"], 2).tolist(),
                      "max_cos_between_heads": float(np.max(cos - 2 * np.eye(len(M))))}
    return ans


def decay_figure(data: dict, answer: dict, path) -> None:
    fig = figure(figsize=(9, 3.4))
    axes = fig.subplots(1, 2)
    for ax, act in zip(axes, ("softmax1", "bsoftmax")):
        width = 0.25
        for j, wd in enumerate(DECAYS):
            k = f"{act}_{wd}"
            order = np.argsort(data[k + "_w"])[::-1]  # heads by attention mass
            norms = np.linalg.norm(data[k + "_M"], axis=1)[order]
            w = data[k + "_w"][order]
            bars = ax.bar(np.arange(4) + (j - 1) * width, norms, width, label=f"wd={wd}: risk {answer[k]['risk']:.4f}")
            for bar, wh in zip(bars, w):
                ax.text(bar.get_x() + width / 2, bar.get_height(), f"{wh:.2f}", ha="center", va="bottom", fontsize=5)
        ax.set_xticks(range(4), [f"head {i + 1}" for i in range(4)])
        ax.set_ylabel("|M_h| (label: attention mass w_h)")
        ax.set_title(f"{act}, H=4, F=2, tau=400", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(path, fig)


# ------------------------------------------------------------------------------------------- 3

SCHEDULES = {"constant": [], "inverse": ["sgd.schedule=inverse", "sgd.schedule_tau=20"],
             "cosine": ["sgd.schedule=cosine", "sgd.decay_factor=0.01"]}


def schedule_stage(quick: bool) -> dict:
    """The dynamics on the Sobol rule (8192 points; the exact route compiles each schedule's solve
    for minutes on 2 cores), the risk of every saved state on the exact route (one program per
    activation)."""
    T = 300 if quick else 1000
    out = {}
    for act in ("bsoftmax", "softmax"):
        exact = None
        for name, extra in SCHEDULES.items():
            more = [f"sgd.schedule_tau={T}"] if name == "cosine" else []
            c = cfg("default", f"model.activation={act}", "model.train_bias=true", "theory.route=rule", "theory.points=8192",
                    *extra, *more, f"sgd.tau_max={T}", "sgd.spacing=log", "sgd.n_save=121", "simulation.seeds=1")
            th = sl.integrate(c, sl.initial_conditions(c), progress=False)
            if exact is None:
                exact = jax.jit(jax.vmap(sl.OrderParameterODE.from_setup(sl.build(c.replace(theory={"route": "exact"}))).risk))
            out[f"{act}_{name}_tau"] = th.tau
            out[f"{act}_{name}_risk"] = np.asarray(exact(th.M[0], th.Q[0], th.b[0]))
    return out


def schedule_answer(data: dict, bayes_risk: float) -> dict:
    ans = {}
    for act in ("bsoftmax", "softmax"):
        for name in SCHEDULES:
            tau, r = data[f"{act}_{name}_tau"], data[f"{act}_{name}_risk"] - bayes_risk
            late = tau >= tau[-1] / 10
            slope = np.polyfit(np.log(tau[late]), np.log(np.maximum(r[late], 1e-12)), 1)[0]
            ans[f"{act}_{name}"] = {"gap_end": float(r[-1]), "gap_at_tau_end_over_10": float(r[np.argmax(late)]),
                                    "late_slope_dlog_gap_dlog_tau": float(slope)}
    return ans


def schedule_figure(data: dict, bayes_risk: float, path) -> None:
    fig = figure(figsize=(5.5, 3.6))
    ax = fig.subplots()
    for act, ls in (("bsoftmax", "-"), ("softmax", "--")):
        for name, color in zip(SCHEDULES, ("k", "b", "r")):
            tau, r = data[f"{act}_{name}_tau"], data[f"{act}_{name}_risk"]
            ax.loglog(tau[1:], np.maximum(r[1:] - bayes_risk, 1e-6), ls, color=color, label=f"{act} {name}")
    ax.set_xlabel("tau")
    ax.set_ylabel("risk - Bayes risk")
    ax.legend(fontsize=7)
    ax.set_title("annealed learning rates (H=2, lr=0.5; exact risk of each state)", fontsize=9)
    fig.tight_layout()
    save_figure(path, fig)


# ------------------------------------------------------------------------------------------- 4

RATES = (0.5, 0.2, 0.05)


def flow_stage(quick: bool) -> dict:
    S = 30 if quick else 60
    s = np.concatenate([[0.0], np.geomspace(S / 1000, S, 120)])
    base = cfg("bsoftmax", *RULE, "simulation.seeds=1")
    y0 = sl.initial_conditions(base)
    out = {"s": s}
    gf = sl.integrate(base.replace(sgd={"lr": 1.0, "gradient_flow": True}), y0, ts=s, progress=False)
    out["flow_risk"], out["flow_M"] = gf.risk[0], gf.M[0]
    for lr in RATES:
        th = sl.integrate(base.replace(sgd={"lr": lr}), y0, ts=s / lr, progress=False)
        out[f"sgd{lr}_risk"], out[f"sgd{lr}_M"] = th.risk[0], th.M[0]
    return out


def flow_answer(data: dict, bayes_risk: float) -> dict:
    ans = {"flow_risk_end": float(data["flow_risk"][-1]), "flow_gap_end": float(data["flow_risk"][-1] - bayes_risk),
           "flow_escape_lr_tau": escape(data["s"], data["flow_risk"])}  # in the time lr tau
    for lr in RATES:
        r = data[f"sgd{lr}_risk"]
        ans[f"lr{lr}"] = {"risk_end": float(r[-1]), "max_risk_diff_to_flow": float(np.max(np.abs(r - data["flow_risk"]))),
                          "escape_lr_tau": escape(data["s"], r)}
    return ans


def flow_figure(data: dict, bayes_risk: float, path) -> None:
    fig = figure(figsize=(5.5, 3.6))
    ax = fig.subplots()
    ax.loglog(data["s"][1:], data["flow_risk"][1:] - bayes_risk, "k-", lw=2, label="gradient flow")
    for lr in RATES:
        ax.loglog(data["s"][1:], data[f"sgd{lr}_risk"][1:] - bayes_risk, label=f"SGD ODE lr={lr}")
    ax.set_xlabel("lr tau")
    ax.set_ylabel("risk - Bayes risk")
    ax.legend(fontsize=7)
    ax.set_title("bsoftmax H=2: gradient flow is SGD's small-rate limit", fontsize=9)
    fig.tight_layout()
    save_figure(path, fig)


def main() -> None:
    args = parser(__doc__).parse_args()
    cache, out = cache_dir(args, "training_variants"), figures_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    bayes_risk = bayes(cfg("bsoftmax"))
    times, answers = {}, {"bayes_risk": bayes_risk}
    for name, run in (("batch", batch_stage), ("decay", decay_stage), ("schedule", schedule_stage), ("flow", flow_stage)):
        t0 = time.perf_counter()
        data = stage(cache, name, lambda run=run: run(args.quick))
        times[name] = round(time.perf_counter() - t0, 1)
        if name == "batch":
            answers[name] = batch_answer(data, bayes_risk)
            batch_figure(data, bayes_risk, answers[name], out / "training_batch.png", BATCH_PLAN[args.quick][2])
        elif name == "decay":
            answers[name] = decay_answer(data, bayes_risk)
            decay_figure(data, answers[name], out / "training_decay.png")
        elif name == "schedule":
            answers[name] = schedule_answer(data, bayes_risk)
            schedule_figure(data, bayes_risk, out / "training_schedule.png")
        else:
            answers[name] = flow_answer(data, bayes_risk)
            flow_figure(data, bayes_risk, out / "training_flow.png")
        print(name, times[name], "s", answers[name], flush=True)
    answers["seconds"] = times
    save_json(out / "training_variants.json", answers)


if __name__ == "__main__":
    main()
