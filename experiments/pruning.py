"""Head pruning after training (docs/model.md section 7): how many of H = 8 heads can go?

Setting: L = 4, spikes prior of strength 2.5 with F = 2 and F = 3 spikes, H = 8 heads, lr = 0.5,
init_scale = 0.5, activations softmax (no bias), softmax1 and bsoftmax (trained biases).

* Theory: the ODE from the initial overlaps of seed 0 at D = 2000 (``initial_conditions``),
  on a log time grid to ``--tau`` (default 10^4), ``rtol = 1e-4``, ``atol = 1e-6``; softmax and
  softmax1 on the exact route (``theory.route = "auto"``: risks and pruning steps exact, each
  with its stated error against the finer exact rule), bsoftmax on the Sobol rule
  (``theory.route = "rule"``, ``theory.points = 4096``: its exact route's joint token rule over
  8 fields costs about 20 s a drift, ``ROUTES``). Numerics of the rule checked before choosing them: 8192 points move
  the final risk (bsoftmax, F = 2, tau = 1000) by 7e-5; 1024 points are not usable at H = 8
  (the risk drifts up to 0.54 instead of 0.21); rtol 1e-4 instead of 1e-6 changes the
  softmax1 F = 2 trajectory to tau = 10^4 by < 1e-4 at 30 s instead of 43 s. Training is
  slow in log tau with H = 8: bsoftmax settles by tau ~ 500, but softmax and softmax1 sit on
  the unspecialized plateau (all heads alike) until tau ~ 10^3 and specialize slowly after
  that (softmax's risk still falls by ~1e-3 per decade at 10^5); the table prints the risk at
  tau/10 and tau. The layer at ``--tau`` is pruned greedily, by alignment ``|M_h|`` and in
  ``--draws`` random orders (mean +- sd).
* Finite-D check of the trained layer: keys at ``--D`` (default 2000) with exactly the
  trained overlaps (``K = M k* + C Z``), pruned greedily *by weights* on ``--samples`` fresh
  sequences (finite-D empirical loss; same sequences for every subset).
* SGD simulation: online SGD at ``--D``, ``--seeds`` (default 1) seed(s), to ``--tau-sim``
  (default 20). SGD at H = 8 costs ~1 ms a step on this shared 2-core machine, so training to
  tau = 10^4 (2 x 10^7 steps) is out of reach; the SGD-trained layer is pruned greedily by
  weights at tau-sim and compared with the theory pruned at the same tau (the theory of the
  same seed's initial overlaps). The table also gives the theory risk of the SGD layer's own
  order parameters along the same removals, which separates the evaluation of a pruned layer
  from the finite-D training noise.
* ``--finetune``: for every number ``k`` of removed heads at which the greedy-pruned trained
  layer has lost more than 0.01 (and only from ``k = H - F`` on, to bound the cost),
  continue the ODE of the ``H - k``-head layer from the pruned order parameters for
  ``--tau-finetune`` (default 200) and report the recovered risk.

Reported per activation and F: how many heads can be removed (greedy, alignment, random mean,
greedy by weights) before the risk rises by more than 0.01, against ``H - F``; the largest
``|theory - finite D|`` of the pruning curves.

Run: ``python experiments/pruning.py [--finetune]``; writes ``figures/pruning.png``. Measured
on the shared 2-core machine beside two other jobs: 34 min with ``--finetune`` (39 min of CPU; the
exact route's softmax and softmax1 solves at H = 8 take 3-5 min each; see the timing lines).
``--quick``: bsoftmax with F = 2 only, ``--tau 100 --tau-sim 2 --D 500 --samples 2000 --points 1024 --draws 4`` (or less).
"""

from __future__ import annotations

import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import figure, figures_dir, parser  # noqa: E402

import singleloc as sl  # noqa: E402
from singleloc.model._data import keys_with_overlaps  # noqa: E402

H = 8
ACTIVATIONS = ("softmax", "softmax1", "bsoftmax")
FS = (2, 3)
TOL = 0.01
REPLICATES = 4  # rules that give the greedy curve its quadrature error (Sobol rule route)
#: ``theory.route`` of each activation (module docstring).
ROUTES = {"softmax": "auto", "softmax1": "auto", "bsoftmax": "rule"}
QUICK = {"tau": 100.0, "tau_sim": 2.0, "D": 500, "samples": 2000, "points": 1024, "draws": 4}


def make_config(activation: str, F: int, args) -> sl.Config:
    return sl.load_config(None).replace(
        problem={"L": 4, "F": F, "prior": "spikes", "strength": 2.5},
        model={"heads": H, "activation": activation, "train_bias": activation != "softmax"},
        sgd={"lr": 0.5, "init_scale": 0.5, "tau_max": args.tau_sim, "n_save": 3, "spacing": "linear"},
        simulation={"D": args.D, "seeds": args.seeds, "seed": 0, "test_samples": 2048},
        theory={"points": args.points, "rtol": 1e-4, "atol": 1e-6, "route": ROUTES[activation]},
    )


def weights_with_overlaps(M, Q, D: int, seed: int):
    """Finite-D keys K (H, D) and spikes k* (F, D) with K k*^T / D = M and K K^T / D = Q
    (``singleloc.model._data.keys_with_overlaps``), spikes and Z from one random orthonormal basis."""
    rng = np.random.default_rng(seed)
    Hh, F = M.shape
    basis, _ = np.linalg.qr(rng.standard_normal((D, F + Hh)))
    kstar, Z = np.sqrt(D) * basis[:, :F].T, np.sqrt(D) * basis[:, F:].T
    return keys_with_overlaps(M, Q, kstar, Z), kstar


def run_one(activation: str, F: int, args) -> dict:
    cfg = make_config(activation, F, args)
    t0 = time.perf_counter()
    ts = np.unique(np.concatenate([[0.0], np.geomspace(0.1, args.tau, 40), [args.tau_sim]]))
    i_sim = int(np.searchsorted(ts, args.tau_sim))
    th = sl.integrate(cfg, sl.initial_conditions(cfg, 1), ts=ts, progress=False)
    t_int = time.perf_counter() - t0
    M, Q, b = th.M[0, -1], th.Q[0, -1], th.b[0, -1]
    out = {"cfg": cfg, "risk_traj": th.risk[0], "tau": ts, "t_integrate": t_int, "quadrature": th.quadrature(),
           "exact": sl.choose_route(cfg.problem, cfg.model, cfg.theory).route == "exact"}
    out["risk_decade"] = float(th.risk[0, np.searchsorted(ts, args.tau / 10)])
    out["greedy"] = sl.prune_theory(cfg, M, Q, b, "greedy")
    # the same order on REPLICATES other scramblings: the quadrature error of every step (the exact
    # route: the same exact risks, each with its error against the finer rule)
    out["greedy_replicated"] = sl.prune_theory(cfg.replace(theory={"replicates": REPLICATES}), M, Q, b,
                                               list(out["greedy"].removed[0]))
    # the trained theory layer realised by finite-D keys, pruned greedily by weights on fresh data
    Kt, kst = weights_with_overlaps(np.asarray(M), np.asarray(Q), args.D, seed=7)
    out["trained_weights"] = sl.prune_weights(cfg, Kt, b, kst, "greedy", samples=args.samples, key=500)
    out["trained_weights_same"] = sl.prune_weights(cfg, Kt, b, kst, list(out["greedy"].removed[0]), samples=args.samples, key=500)
    out["alignment"] = sl.prune_theory(cfg, M, Q, b, "alignment")
    out["random"] = sl.prune_theory(cfg, M, Q, b, "random", draws=args.draws, seed=1)
    out["M_final"] = M
    # theory at the simulation time, per seed (each seed's own initial overlaps)
    t1 = time.perf_counter()
    sim = sl.simulate(cfg, progress=False)
    out["t_simulate"] = time.perf_counter() - t1
    ths = sl.integrate(cfg, sl.initial_conditions(cfg), ts=sim.tau, progress=False) if args.seeds > 1 else None
    out["theory_at_sim"], out["sim_weights"], out["sim_op"] = [], [], []
    for s in range(args.seeds):
        if ths is None:
            Ms, Qs, bs = th.M[0, i_sim], th.Q[0, i_sim], th.b[0, i_sim]
        else:
            Ms, Qs, bs = ths.M[s, -1], ths.Q[s, -1], ths.b[s, -1]
        out["theory_at_sim"].append(sl.prune_theory(cfg, Ms, Qs, bs, "greedy"))
        K, bk, kstar = sim.K[s], sim.b[s, -1], sim.kstar[s]
        w = sl.prune_weights(cfg, K, bk, kstar, "greedy", samples=args.samples, key=1000 + s)
        out["sim_weights"].append(w)
        Mk, Qk = (np.asarray(x, dtype=float) for x in sl.overlaps(K.astype(np.float64), kstar.astype(np.float64)))
        out["sim_op"].append(sl.prune_theory(cfg, Mk, Qk, bk.astype(float), list(w.removed[0])))
    out["sim_risk_trained"] = sim.risk[:, -1]
    out["t_prune"] = time.perf_counter() - t1 - out["t_simulate"]
    if args.finetune:
        t2 = time.perf_counter()
        g = out["greedy"]
        n_ok = g.removable(TOL)
        ft = {}
        for k in range(max(n_ok + 1, H - F), H):
            kept = [h for h in range(H) if h not in set(g.removed[0, :k])]
            ts_ft = np.concatenate([[0.0], np.geomspace(0.1, args.tau_finetune, 12)])
            res = sl.finetune(cfg, M, Q, b, kept, ts_ft, progress=False)
            ft[k] = float(res.risk[0, -1])
        out["finetune"] = ft
        out["t_finetune"] = time.perf_counter() - t2
    return out


def check_words(r: dict) -> str:
    """What the replicated greedy curve is: the exact risks with their stated errors, or the mean of
    ``REPLICATES`` other Sobol rules with its standard error."""
    return "exact route, error against the finer rule" if r["exact"] else f"same order on {REPLICATES} other rules"


def report(results: dict, args) -> list[str]:
    lines = []
    for (act, F), r in results.items():
        g, a, rnd = r["greedy"], r["alignment"], r["random"]
        lines.append(f"\n{act}, F = {F}, H = {H} (H - F = {H - F}): trained theory risk {g.risk[0]:.4f} at tau = {args.tau:g} "
                     f"({r['risk_decade']:.4f} at tau = {args.tau / 10:g})")
        lines.append(f"  {r['quadrature']}")
        lines.append(f"  |M_h| of the trained heads: {np.round(np.linalg.norm(r['M_final'], axis=1), 2).tolist()}")
        hdr = f"  {'removed':>7} {'greedy':>8} {'dropped':>7} {'align':>8} {'random':>16} {'wts(trained)':>16}"
        hdr += f" | tau={args.tau_sim:g}: {'theory':>8} {'sim(wts)':>16} {'th(sim OP)':>10}"
        if "finetune" in r:
            hdr += f" | {'finetuned':>9}"
        lines.append(hdr)
        for k in range(H):
            row = f"  {k:>7} {g.risk[k]:>8.4f} {(str(g.removed[0, k - 1]) if k else '-'):>7} {a.risk[k]:>8.4f} "
            row += f"{rnd.risk[k]:>8.4f}+-{rnd.risk_std[k]:.4f}"
            tw = r["trained_weights"]
            row += f" {tw.risk[k]:>8.4f}+-{tw.stderr[0, k]:.4f}"
            tsim = np.mean([x.risk[k] for x in r["theory_at_sim"]])
            sw = np.mean([x.risk[k] for x in r["sim_weights"]])
            se = np.sqrt(np.sum([x.stderr[0, k] ** 2 for x in r["sim_weights"]])) / len(r["sim_weights"])
            sop = np.mean([x.risk[k] for x in r["sim_op"]])
            row += f" |          {tsim:>8.4f} {sw:>8.4f}+-{se:.4f} {sop:>10.4f}"
            if "finetune" in r:
                row += f" | {r['finetune'][k]:>9.4f}" if k in r["finetune"] else f" | {'':>9}"
            lines.append(row)
        dev = max(np.max(np.abs(x.risk - y.risk)) for x, y in zip(r["theory_at_sim"], r["sim_weights"]))
        dev_op = max(np.max(np.abs(x.risk - y.risk)) for x, y in zip(r["sim_op"], r["sim_weights"]))
        ns = [sl.removable_heads(x.risk, TOL) for x in r["sim_weights"]]
        tw = r["trained_weights"]
        lines.append(f"  removable before the risk rises > {TOL}: greedy {g.removable(TOL)} ({check_words(r)}: "
                     f"{r['greedy_replicated'].removable(TOL)}), alignment {a.removable(TOL)}, "
                     f"random (mean curve) {rnd.removable(TOL)}, greedy by weights (trained overlaps, D = {args.D}) "
                     f"{tw.removable(TOL)}; H - F = {H - F}")
        rep = r["greedy_replicated"]
        k = g.removable(TOL) + 1
        if k < H:
            err = ".1e" if r["exact"] else ".4f"  # the exact route's errors are ~1e-11
            lines.append(f"  quadrature error ({check_words(r)}): removing {k} raises the risk by "
                         f"{rep.risk[k] - rep.risk[0]:.4f} +- {np.hypot(rep.stderr[0, k], rep.stderr[0, 0]):{err}} "
                         f"(this rule: {g.risk[k] - g.risk[0]:.4f}); largest SE of a step {rep.stderr.max():{err}}")
        same = r["trained_weights_same"]
        lines.append(f"  trained layer at D = {args.D}: max |theory greedy - greedy by weights| = "
                     f"{np.max(np.abs(g.risk - tw.risk)):.4f}; "
                     f"along the theory's greedy order: max |theory - weights| = {np.max(np.abs(g.risk - same.risk)):.4f}, "
                     f"max |theory - weights| / stderr = {np.max(np.abs(g.risk - same.risk) / same.stderr[0]):.2f}")
        lines.append(f"  at tau = {args.tau_sim:g}: max |theory - simulation(weights)| = {dev:.4f}; "
                     f"max |theory of the simulated order parameters - simulation(weights)| = {dev_op:.4f}; "
                     f"simulation removable (greedy) = {ns}")
        lines.append(f"  times: integrate {r['t_integrate']:.0f} s, simulate {r['t_simulate']:.0f} s, prune {r['t_prune']:.0f} s"
                     + (f", finetune {r['t_finetune']:.0f} s" if "t_finetune" in r else ""))
    return lines


def draw(results: dict, args):
    fig = figure(figsize=(4.3 * len(ACTIVATIONS), 3.6 * len(FS)), layout="constrained")
    axes = fig.subplots(len(FS), len(ACTIVATIONS), squeeze=False)
    x = np.arange(H)
    for (act, F), r in results.items():
        ax = axes[FS.index(F), ACTIVATIONS.index(act)]
        g, a, rnd = r["greedy"], r["alignment"], r["random"]
        ax.plot(x, g.risk, "-", color="k", lw=1.6, label=rf"theory greedy, $\tau$={args.tau:g}")
        rep = r["greedy_replicated"]
        ax.errorbar(x + 0.15, rep.risk, yerr=rep.stderr[0], fmt="none", ecolor="k", elinewidth=0.8, capsize=2,
                    label=f"{check_words(r)} (error bars)")
        ax.plot(x, a.risk, "--", color="C1", lw=1.2, label="theory by alignment")
        ax.plot(x, rnd.risk, "-", color="C2", lw=1.0, label=f"theory random ({rnd.risks.shape[0]} orders)")
        ax.fill_between(x, rnd.risk - rnd.risk_std, rnd.risk + rnd.risk_std, color="C2", alpha=0.2, lw=0)
        tw = r["trained_weights"]
        ax.errorbar(x, tw.risk, yerr=tw.stderr[0], fmt="s", ms=3.5, mfc="none", color="k", capsize=2,
                    label=rf"finite-D keys with these overlaps (D={args.D}), greedy by weights")
        tsim = np.mean([y.risk for y in r["theory_at_sim"]], axis=0)
        ax.plot(x, tsim, "-", color="C0", lw=1.0, alpha=0.8, label=rf"theory greedy, $\tau$={args.tau_sim:g}")
        sw = np.mean([y.risk for y in r["sim_weights"]], axis=0)
        se = np.sqrt(np.sum([y.stderr[0] ** 2 for y in r["sim_weights"]], axis=0)) / len(r["sim_weights"])
        ax.errorbar(x, sw, yerr=se, fmt="o", ms=4, color="C0", capsize=2,
                    label=rf"SGD simulation D={args.D}, $\tau$={args.tau_sim:g}, greedy by weights")
        if "finetune" in r and r["finetune"]:
            k = sorted(r["finetune"])
            ax.plot(k, [r["finetune"][j] for j in k], "*", ms=9, color="C3",
                    label=rf"greedy + finetune $\Delta\tau$={args.tau_finetune:g}")
        ax.axvline(H - F, color="grey", ls=":", lw=1)
        ax.axhline(g.risk[0] + TOL, color="grey", ls="--", lw=0.7)
        ax.set_xticks(x)
        how = "exact route" if r["exact"] else f"Sobol rule, {REPLICATES} rules; one rule: {g.removable(TOL)}"
        ax.set_title(f"{act}, F = {F}: {rep.removable(TOL)} heads removable ({how}; H - F = {H - F})", fontsize=8)
        ax.set_xlabel("heads removed")
        ax.set_ylabel("risk")
        if (act, F) == next(iter(results)):
            ax.legend(frameon=False, fontsize=6.5)
    fig.suptitle(f"pruning H = {H} trained heads (L = 4, spikes prior, strength 2.5); dotted: H - F, dashed: unpruned + {TOL}",
                 fontsize=10)
    return fig


def main() -> None:
    p = parser(__doc__, cache=False)
    p.add_argument("--tau", type=float, default=1e4, help="theory training time (default 10000)")
    p.add_argument("--tau-sim", type=float, default=20.0, help="simulation training time (default 20)")
    p.add_argument("--D", type=int, default=2000, help="simulation dimension (default 2000)")
    p.add_argument("--seeds", type=int, default=1, help="simulation seeds (default 1)")
    p.add_argument("--samples", type=int, default=20_000, help="fresh sequences for pruning by weights (default 20000)")
    p.add_argument("--points", type=int, default=4096, help="theory.points (default 4096)")
    p.add_argument("--draws", type=int, default=20, help="random orders (default 20)")
    p.add_argument("--finetune", action="store_true", help="continue the ODE from the pruned layers")
    p.add_argument("--tau-finetune", type=float, default=200.0, help="finetuning time (default 200)")
    p.add_argument("--only", default=None, help="run one case, e.g. bsoftmax:2")
    p.add_argument("--out", type=Path, default=None, help="figure path (default figures/pruning.png)")
    args = p.parse_args()
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, min(getattr(args, name), value))
        args.only = args.only or "bsoftmax:2"
    out = args.out or figures_dir(args) / "pruning.png"
    start = time.perf_counter()
    cases = [(a, F) for F in FS for a in ACTIVATIONS]
    if args.only:
        act, F = args.only.split(":")
        cases = [(act, int(F))]
    results = {}
    for act, F in cases:
        results[(act, F)] = run_one(act, F, args)
        print("\n".join(report({(act, F): results[(act, F)]}, args)), flush=True)
    path = sl.save_figure(out, draw(results, args))
    print(f"\nwrote {path}; total {time.perf_counter() - start:.0f} s wall, {time.process_time():.0f} s CPU of this process")


if __name__ == "__main__":
    main()
