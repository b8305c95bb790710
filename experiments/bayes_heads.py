"""Final risk after training against the number of heads H, for softmax, softmax1 and bsoftmax,
with the Bayes risk (docs/model.md section 6), for two priors (``--prior``).

Settings (L = 4 tokens):

* ``spikes`` (default; ``figures/bayes_heads.png``): spikes prior with F = 3 directions (support
  size K = 3), strength 2.5; H in {1, 2, 3, 4, 6}.
* ``gaussian`` (``figures/bayes_heads_gaussian.png``): the isotropic Gaussian prior
  ``theta ~ N(0, 3^2 I_2)`` (F = 2, strength 3); H in {1, 2, 4, 8, 16}. A continuous prior has
  no finite Bayes point: the question is whether the risk approaches the Bayes risk as heads
  are added (the posterior mean is a mixture over a continuum of directions, which softmax1 and
  bsoftmax can tile with more heads) or stalls (softmax: all heads' weights sum to one, so the
  layer cannot switch its output off when no direction fits).

softmax trains no bias (it cancels); softmax1 and bsoftmax train their biases. SGD: lr = 0.5,
keys initialised with scale 0.5. The ODE is integrated from the overlaps of a real D = 1000
initialisation (seed 0), up to ``tau_max`` on a log grid. Convergence: the relative change of the
ODE's risk over the last 10% of tau is printed for every point; points above 1e-3 are flagged
(``*``) and drawn open. For every trained layer the script also prints what its heads do: the mean
weight on the relevant token ``E[a_eps]`` (on a Sobol rule of 8192 points), the layer's total
attention weight ``E[sum_l a_l]`` (1 for softmax and bsoftmax; below 1 for softmax1, whose heads can
switch off), how many heads are off and the directions of the others in the spike plane.

Routes. Every point runs on the exact route (``theory.route = "exact"``, ``theory.nodes`` per prior:
``NODES``, 128 for the Gaussian prior, whose relevant token has the variance ``Q_hh + 9 |M_h|^2``; the risk
and the ``O(lr)`` drift to ~1e-8 or better whatever the heads do; the ``lr^2`` Gram term on the rank-aware Sobol rule of 16384
points, exactly for one head) and its final risk is the exact risk of the final state, with the
route's stated errors (risk against the refined rule, Gram term relative) -- except bsoftmax from
``H = 4`` on (``BSOFTMAX_EXACT_HEADS``): a joint layer's exact rule costs seconds per drift there (4.7 s
at ``H = 4``) and grows with ``H``, so those points are on the rule route, on its rank-aware rule
(``theory.axes = "principal"``: 1024 Sobol points over the ``L H`` fields along the well-defined principal
axes of ``Q``; at near-copy heads 7 to 64 times less risk error than the head-shift rule of the original
figures, whose error there was 1e-3 to 1e-2: ``benchmarks/07_rank_aware_rule.py``) and are drawn with a
different marker. Their final state is evaluated exactly where one state's exact rule is affordable
(``population_risk(route="auto")``: four bsoftmax heads on either prior), else on 4 independent rank-aware
rules of 8192 points (their standard error); the ODE's own final risk is printed beside it, and their
difference is the rule's error along the trajectory. ``--route rule``
runs every point on the rule route with the head-shift rule (the original figures).

Also printed: the Bayes risk (spikes: exactly, as the risk of bsoftmax at its Bayes point with H = K,
``M_h = theta^(h)``, ``Q = M M^T``, ``b_h = log pi_h - |theta^(h)|^2/2``, on the exact route, checked
against the closed-form posterior on 8 scramblings of 4096 Sobol points; Gaussian: that Sobol estimate,
with its standard error).

Run: ``python experiments/bayes_heads.py [--prior spikes|gaussian] [--route auto|rule] [--cache DIR]``; writes
the figure named above with its JSON (every number printed, the route and stated errors of each point) and prints
the numbers (runtime: its last line). ``--quick``: H in {1, 3}
(spikes) or {1, 2} (gaussian), tau_max = 100, 256 quadrature points.
"""

from __future__ import annotations

import sys
import time
from functools import partial
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import cache_dir, figure, figures_dir, parser, save_json, stage  # noqa: E402

import singleloc as sl  # noqa: E402

L = 4
#: prior -> (F, strength, heads, tau_max, dynamics points, figure name)
SETTINGS = {
    "spikes": (3, 2.5, (1, 2, 3, 4, 6), 20000.0, 1024, "bayes_heads.png"),
    "gaussian": (2, 3.0, (1, 2, 4, 8, 16), 20000.0, 1024, "bayes_heads_gaussian.png"),
}
ACTIVATIONS = ("softmax", "softmax1", "bsoftmax")
LR, INIT_SCALE, D_THEORY = 0.5, 0.5, 1000
EVAL = {"points": 8192, "seed": 1000, "replicates": 4}  # re-evaluation of the final risk
CONVERGED = 1e-3
COLORS = {"softmax": "C0", "softmax1": "C1", "bsoftmax": "C2"}
QUICK = {"spikes": (1, 3), "gaussian": (1, 2), "tau_max": 100.0, "points": 256}
#: bsoftmax with more heads than this stays on the rule route (module docstring: a joint layer's exact
#: rule costs 4.7 s per drift at H = 4 on the Gaussian prior, against 0.35 s for eight softmax1 heads).
#: Stricter than the package's ``theory.route = "auto"`` (singleloc.preflight._resources.JOINT_EXACT_MAX), which
#: takes four heads on the Gaussian prior: hours to tau = 2e4 here.
BSOFTMAX_EXACT_HEADS = 3
A_EPS_POINTS = 8192  # the Sobol rule of the E[a_eps] printed for each trained layer


def route(choice: str, activation: str, heads: int) -> str:
    """The route of one point: ``"rule"`` everywhere with ``--route rule``, else the exact route
    except for bsoftmax with more than :data:`BSOFTMAX_EXACT_HEADS` heads."""
    return "rule" if choice == "rule" or (activation == "bsoftmax" and heads > BSOFTMAX_EXACT_HEADS) else "exact"


#: ``theory.nodes`` of the exact route per prior: under the Gaussian prior the relevant token's fields have
#: variance ``Q_hh + 9 |M_h|^2`` (124 at softmax1's four trained heads), which the default 64 nodes resolve to
#: a risk error of 5.7e-5 and a gradient error of 1.1e-2 only; 128 nodes: 2.9e-8 and 2.7e-6.
NODES = {"spikes": 64, "gaussian": 128}


def config(prior: str, activation: str, heads: int, tau_max: float, points: int, route: str = "rule", axes: str = "heads"):
    F, strength = SETTINGS[prior][:2]
    return sl.load_config({
        "problem": {"L": L, "F": F, "prior": prior, "strength": strength},
        "model": {"heads": heads, "activation": activation, "train_bias": activation != "softmax"},
        "sgd": {"lr": LR, "init_scale": INIT_SCALE, "tau_max": tau_max, "spacing": "log", "n_save": 41},
        "simulation": {"D": D_THEORY, "seeds": 1},
        "theory": {"points": points, "route": route, "nodes": NODES[prior], "axes": axes},
    })


def trained(cfg, ts: np.ndarray) -> dict[str, np.ndarray]:
    """The ODE from the seed-0 start on ``ts``: its risk, final state, the route's stated errors of the
    solve (NaN on the rule route) and the wall time."""
    t0, H, F = time.time(), cfg.model.heads, cfg.problem.F
    try:
        res = sl.integrate(cfg, sl.initial_conditions(cfg, 1), ts=ts, progress=False)
    except FloatingPointError as err:
        print(f"  {cfg.model.activation} H = {H}: integration failed: {err}")
        return {"risk": np.full(len(ts), np.nan), "M": np.full((H, F), np.nan),
                "Q": np.full((H, H), np.nan), "b": np.full(H, np.nan), "risk_error": np.nan, "gram_error": np.nan,
                "seconds": time.time() - t0}
    return {"risk": res.risk[0], "M": res.M[0, -1], "Q": res.Q[0, -1], "b": res.b[0, -1],
            "risk_error": res.risk_error, "gram_error": res.gram_error, "seconds": time.time() - t0}


def final_risk(cfg, run) -> dict[str, np.ndarray]:
    """The risk of the run's final state: exact wherever one state's exact rule is affordable
    (``population_risk(route="auto")`` on the run's ``theory.nodes``, its error against the refined rule),
    else on independent rank-aware rules of ``EVAL`` (their standard error); ``exact``: which of the two."""
    if not np.all(np.isfinite(run["M"])):
        return {"final": np.nan, "error": np.nan, "exact": False}
    fin = sl.population_risk(cfg.problem.build_prior(), L, cfg.model.activation, run["M"], run["Q"], run["b"],
                             route="auto", nodes=cfg.theory.nodes, **EVAL)
    return {"final": fin.value, "error": fin.error, "exact": fin.points == 0}


def heads_used(cfg, run) -> str:
    """What the trained heads do: the mean weight on the relevant token ``E[a_eps]``, the layer's
    total weight ``E[sum_l a_l]`` (the mean over heads
    of ``w_h = E[sum_l A_hl]``, 1 for softmax and bsoftmax), the heads switched off (``w_h`` below
    5% of the largest) and the directions of the others in the spike plane (degrees)."""
    M, Q, b = run["M"], run["Q"], run["b"]
    if not np.all(np.isfinite(M)):
        return ""
    ode = sl.OrderParameterODE.from_setup(sl.build(cfg.replace(theory={"points": A_EPS_POINTS})))
    w = sl.attention_mass(ode, M, Q, b)
    # the relevant token is token 0 of the fields (docs/model.md section 4)
    first = lambda g, theta: jnp.mean(ode.activation(g.T + jnp.asarray(b)[:, None])[:, 0])  # noqa: E731
    rule = sl.LocalFields.make(cfg.problem.L, cfg.model.heads, cfg.problem.build_prior(), A_EPS_POINTS,
                               cfg.theory.qmc_seed, symmetric=True)  # the Sobol rule the ODE carried
    a_eps = float(rule.expect(first, M, Q))
    on = w >= 0.05 * w.max()
    angles = np.sort(np.degrees(np.arctan2(M[on, 1], M[on, 0])).round()) if M.shape[1] == 2 else []
    return (f"E[a_eps] = {a_eps:.3f}, E[sum_l a_l] = {w.mean():.3f}, {int((~on).sum())} of {len(w)} heads off"
            + (f", directions of the others: {', '.join(f'{a:.0f}' for a in angles)} deg" if len(angles) else ""))


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--prior", choices=tuple(SETTINGS), default="spikes", help="the setting (module docstring)")
    p.add_argument("--route", choices=("auto", "rule"), default="auto",
                   help="auto (default): the exact route, bsoftmax from H = 4 on the rule route; rule: every point on "
                        "the rule route (the original figures)")
    p.add_argument("--activations", type=lambda t: tuple(t.split(",")), default=ACTIVATIONS,
                   help="a comma-separated subset of softmax,softmax1,bsoftmax to compute (default all; with --cache, "
                        "processes for different subsets fill one cache in parallel, and a last run draws the figure)")
    args = p.parse_args()
    if not set(args.activations) <= set(ACTIVATIONS):
        p.error(f"--activations: choose from {','.join(ACTIVATIONS)}, got {','.join(args.activations)}")
    prior = args.prior
    F, strength, heads, tau_max, points, name = SETTINGS[prior]
    if args.quick:
        heads, tau_max, points = QUICK[prior], QUICK["tau_max"], QUICK["points"]
    cache = cache_dir(args, "bayes_heads", prior)
    t_start = time.time()
    bsoftmax = config(prior, "bsoftmax", F, tau_max, points)
    bayes = sl.bayes_risk(bsoftmax.problem.build_prior(), L, points=4096, replicates=8)
    print(f"L = {L}, {prior} prior F = {F}, strength {strength}, lr = {LR}, tau_max = {tau_max:g}, theory.points = {points}")
    how = "exact route: bsoftmax at the Bayes point" if bayes.points == 0 else "Sobol rule, 8 scramblings"
    print(f"Bayes risk {bayes.value:.5f} +- {bayes.error:.1e} ({how})")
    K = None
    if prior != "gaussian":
        M, Q, b = sl.bayes_point(bsoftmax.problem.build_prior())
        K = M.shape[0]
        check = sl.bayes_risk(bsoftmax.problem.build_prior(), L, points=4096, replicates=8, route="rule")
        print(f"check, the closed-form posterior on the Sobol rule: {check.value:.5f} +- {check.error:.1e}")

    ts = np.unique(np.concatenate([[0.0], np.geomspace(1e-2, tau_max, 48), [0.9 * tau_max]]))
    i90 = int(np.argmin(np.abs(ts - 0.9 * tau_max)))
    final = {a: np.full(len(heads), np.nan) for a in ACTIVATIONS}
    change = {a: np.full(len(heads), np.nan) for a in ACTIVATIONS}
    error = {a: np.full(len(heads), np.nan) for a in ACTIVATIONS}
    exact = {a: np.zeros(len(heads), bool) for a in ACTIVATIONS}
    rows = {}
    for act in args.activations:
        for j, H in enumerate(heads):
            t0 = time.time()
            way = route(args.route, act, H)
            axes = "principal" if way == "rule" and args.route != "rule" else "heads"  # module docstring
            cfg = config(prior, act, H, tau_max, points, way, axes)
            nodes = f"_n{NODES[prior]}" if way == "exact" and NODES[prior] != 64 else ""  # the stage's exact rule
            stage_name = f"{act}_H{H}_{way}{nodes}{'_principal' if axes == 'principal' else ''}"
            run = stage(cache, stage_name, partial(trained, cfg, ts))
            fin = stage(cache, f"{stage_name}_final", partial(final_risk, cfg, run))
            r = run["risk"]
            final[act][j], error[act][j], exact[act][j] = float(fin["final"]), float(fin["error"]), way == "exact"
            change[act][j] = abs(r[-1] - r[i90]) / r[-1]
            stated = (f"exact route: risk error {float(run['risk_error']):.1e}, Gram {float(run['gram_error']):.1e}"
                      if way == "exact" else f"rule route, {points} points; final risk " + (
                          "exact" if bool(fin["exact"]) else f"on {EVAL['replicates']} x {EVAL['points']} points"))
            print(f"  {act:9s} H = {H:2d}: final risk {final[act][j]:.5f} +- {error[act][j]:.1e} (ODE's own {r[-1]:.5f}; "
                  f"gap to Bayes {final[act][j] - bayes.value:+.5f}), rel. change over last 10% of tau {change[act][j]:.1e}; "
                  f"{stated}  [{float(run['seconds']):.0f} s to compute, {time.time() - t0:.0f} s now]", flush=True)
            used = heads_used(cfg, run)
            print(f"             {used}")
            rows[f"{act},H={H}"] = {"route": way, "final_exact": bool(fin["exact"]), "final": final[act][j],
                                    "error": error[act][j], "ode_final": float(r[-1]),
                                    "gap": final[act][j] - bayes.value, "change_last_10pct": change[act][j],
                                    "risk_error": float(run["risk_error"]), "gram_error": float(run["gram_error"]),
                                    "seconds": float(run["seconds"]), "heads": used}

    if set(args.activations) != set(ACTIVATIONS):
        print(f"computed {', '.join(args.activations)} only: no figure (run without --activations to draw it); "
              f"runtime {time.time() - t_start:.0f} s")
        return 0
    print("\nfinal risk at tau_max (gap to Bayes); * = rel. change over the last 10% of tau > 1e-3")
    print(f"{'H':>3s}" + "".join(f"{a:>22s}" for a in ACTIVATIONS))
    for j, H in enumerate(heads):
        cells = [f"{final[a][j]:10.5f} ({final[a][j] - bayes.value:+.4f}){'*' if not change[a][j] <= CONVERGED else ' '}"
                 for a in ACTIVATIONS]
        print(f"{H:3d}" + "".join(f"{c:>22s}" for c in cells))
    print(f"largest standard error of a final risk: {np.nanmax([error[a] for a in ACTIVATIONS]):.1e}")
    if K in heads:
        j = heads.index(K)
        print(f"at H = K = {K}: bsoftmax - Bayes = {final['bsoftmax'][j] - bayes.value:+.5f}")
    for act in ACTIVATIONS:
        print(f"{act}: min over H of risk - Bayes = {np.nanmin(final[act]) - bayes.value:+.5f}")

    fig = figure(figsize=(9.6, 3.8), layout="constrained")
    ax, gap = fig.subplots(1, 2)
    ax.axhline(bayes.value, color="k", lw=1.4, label="Bayes risk")
    for act in ACTIVATIONS:
        conv = change[act] <= CONVERGED
        for a, y in ((ax, final[act]), (gap, final[act] - bayes.value)):
            a.plot(heads, y, "-", color=COLORS[act], lw=1.2, label=act)
            for on_route, marker in ((exact[act], "o"), (~exact[act], "D")):
                a.plot(np.array(heads)[conv & on_route], y[conv & on_route], marker, color=COLORS[act], ms=5)
                a.plot(np.array(heads)[~conv & on_route], y[~conv & on_route], marker, mfc="none", color=COLORS[act],
                       ms=6)
    if not all(e.all() for e in exact.values()) and any(e.any() for e in exact.values()):
        ax.plot([], [], "o", color="grey", ms=5, label="exact route")
        ax.plot([], [], "D", color="grey", ms=5, label=f"rule route ({points} points)")
    for a in (ax, gap):
        if K in heads:
            a.axvline(K, color="grey", ls=":", lw=1)
        if prior == "gaussian":
            a.set_xscale("log", base=2)
        a.set_xticks(heads, [str(h) for h in heads])
        a.set_xlabel("number of heads H")
        a.grid(alpha=0.3)
    if K in heads:
        ax.text(K, ax.get_ylim()[1], " H = K", va="top", fontsize=8, color="grey")
    ax.set_ylabel(f"risk at tau = {tau_max:g} (theory)")
    gap.set_yscale("log")
    gap.set_ylabel("risk - Bayes risk")
    what = f"spikes prior, F = K = {F}" if prior == "spikes" else f"isotropic Gaussian prior N(0, {strength:g}$^2$ I$_{F}$)"
    fig.suptitle(f"{what}, L = {L}; open markers: still moving at tau = {tau_max:g}", fontsize=10)
    ax.legend(frameon=False, fontsize=8)
    path = sl.save_figure(figures_dir(args) / name, fig)
    save_json(figures_dir(args) / f"{Path(name).stem}.json",
              {"prior": prior, "F": F, "strength": strength, "L": L, "lr": LR, "tau_max": tau_max, "route": args.route,
               "rule_points": points, "bayes": {"value": bayes.value, "error": bayes.error}, "runs": rows,
               "seconds": time.time() - t_start})
    print(f"wrote {path}; total runtime {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
