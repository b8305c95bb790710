"""Does a learned head mixing lift softmax1's cap on the isotropic Gaussian prior? Final risk
against the number of heads H with uniform and with trained head weights (issue 24 item 5,
docs/model.md section 11.5; ``figures/head_mixing.png`` and ``.json``).

The setting of ``bayes_heads.py --prior gaussian`` (docs/bayes.md): ``theta ~ N(0, 3^2 I_2)``,
``L = 4``, lr = 0.5, keys initialised with scale 0.5, the ODE from the overlaps of a ``D = 1000``
start (seed 0); softmax trains no bias (it cancels), softmax1 and bsoftmax train theirs. Each
layer is trained twice: with the head average ``a_l = (1/H) sum_h A_hl`` (``model.head_weights
= "uniform"``) and with ``a_l = sum_h v_h A_hl``, ``v`` learned from ``1/H``
(``"trained"``).

Dynamics on the Sobol rule (``theory.route = "rule"``, ``POINTS`` points, as in
``bayes_heads.py``: the exact route's drift costs seconds per evaluation at ``H = 8`` and the
solve needs thousands); the final state is re-evaluated exactly (the Laplace route, softmax and
softmax1, with its error against a finer rule) or, for bsoftmax (whose weighted head mixture
has no exact route), on 4 independent rules of 8192 points with their standard error. Printed
for every layer: the final risk and its gap to the Bayes risk, the relative change of the ODE's
risk over the last 10% of tau (open markers: above 1e-3, still moving), the head weights ``v``,
their sum, and what the heads do, ``E[a_eps]`` (the weight on the relevant token) and
``E[sum_l a_l]`` (the layer's total weight), both on a 8192-point rule.

Run: ``python experiments/head_mixing.py [--cache DIR] [--quick]``; ``--quick``: H in {1, 2},
tau_max = 50, 256 points.
"""

from __future__ import annotations

import sys
import time
from functools import partial

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import cache_dir, figure, figures_dir, parser, save_json, stage  # noqa: E402

import singleloc as sl  # noqa: E402

L, F, STRENGTH = 4, 2, 3.0
HEADS = (1, 2, 4, 8)
TAU_MAX, POINTS = 20000.0, 1024
ACTIVATIONS = ("softmax", "softmax1", "bsoftmax")
MIXINGS = ("uniform", "trained")
LR, INIT_SCALE, D_THEORY = 0.5, 0.5, 1000
EVAL = {"points": 8192, "seed": 1000, "replicates": 4}
CONVERGED = 1e-3
COLORS = {"softmax": "C0", "softmax1": "C1", "bsoftmax": "C2"}
QUICK = {"heads": (1, 2), "tau_max": 50.0, "points": 256}


def config(activation: str, heads: int, mixing: str, tau_max: float, points: int) -> sl.Config:
    return sl.load_config({
        "problem": {"L": L, "F": F, "prior": "gaussian", "strength": STRENGTH},
        "model": {"heads": heads, "activation": activation, "train_bias": activation != "softmax",
                  "head_weights": mixing},
        "sgd": {"lr": LR, "init_scale": INIT_SCALE, "tau_max": tau_max, "spacing": "log", "n_save": 41},
        "simulation": {"D": D_THEORY, "seeds": 1},
        "theory": {"points": points, "route": "rule"},
    })


def weights_used(cfg: sl.Config, M, Q, b, v) -> tuple[float, float]:
    """``E[a_eps]`` and ``E[sum_l a_l]`` of the layer (token 0 relevant) on an 8192-point rule."""
    rule = sl.LocalFields.make(cfg.problem.L, cfg.model.heads, cfg.problem.build_prior(), EVAL["points"], EVAL["seed"],
                               symmetric=True)
    act = sl.get_activation(cfg.model.activation)
    b, v = jnp.asarray(b), jnp.asarray(v)
    a = lambda g: sl.token_weights(act, g.T + b[:, None], v)
    out = rule.expect(lambda g, theta: jnp.stack([a(g)[0], jnp.sum(a(g))]), jnp.asarray(M), jnp.asarray(Q))
    return float(out[0]), float(out[1])


def trained(cfg: sl.Config, ts: np.ndarray) -> dict[str, np.ndarray]:
    """The ODE from the seed-0 start on ``ts``; the final state re-evaluated (module docstring)."""
    H = cfg.model.heads
    try:
        res = sl.integrate(cfg, sl.initial_conditions(cfg, 1), ts=ts)
    except FloatingPointError as err:
        print(f"  {cfg.model.activation} H = {H} {cfg.model.head_weights}: integration failed: {err}")
        nan = lambda *shape: np.full(shape, np.nan)
        return {"risk": nan(len(ts)), "final": np.nan, "error": np.nan, "M": nan(H, F), "Q": nan(H, H), "b": nan(H),
                "v": nan(H), "a_eps": np.nan, "a_sum": np.nan}
    M, Q, b = res.M[0, -1], res.Q[0, -1], res.b[0, -1]
    v = np.full(H, 1.0 / H) if res.v is None else res.v[0, -1]
    fin = sl.population_risk(cfg.problem.build_prior(), L, cfg.model.activation, M, Q, b, v=v, **EVAL)
    a_eps, a_sum = weights_used(cfg, M, Q, b, v)
    return {"risk": res.risk[0], "final": fin.value, "error": fin.error, "M": M, "Q": Q, "b": b, "v": v,
            "a_eps": a_eps, "a_sum": a_sum}


def main() -> int:
    args = parser(__doc__).parse_args()
    heads, tau_max, points = HEADS, TAU_MAX, POINTS
    if args.quick:
        heads, tau_max, points = QUICK["heads"], QUICK["tau_max"], QUICK["points"]
    cache = cache_dir(args, "head_mixing")
    t_start = time.time()
    prior = sl.gaussian([0.0] * F, STRENGTH**2)
    bayes = sl.bayes_risk(prior, L, points=4096, replicates=8)
    print(f"L = {L}, isotropic Gaussian prior N(0, {STRENGTH:g}^2 I_{F}), lr = {LR}, tau_max = {tau_max:g}, "
          f"dynamics on {points} Sobol points")
    print(f"Bayes risk {bayes.value:.5f} +- {bayes.error:.1e}")
    ts = np.unique(np.concatenate([[0.0], np.geomspace(1e-2, tau_max, 48), [0.9 * tau_max]]))
    i90 = int(np.argmin(np.abs(ts - 0.9 * tau_max)))
    shape = (len(ACTIVATIONS), len(MIXINGS), len(heads))
    final, error, change, a_eps, a_sum, v_sum = (np.full(shape, np.nan) for _ in range(6))
    v_final: dict[str, list] = {}
    for i, act in enumerate(ACTIVATIONS):
        for k, mixing in enumerate(MIXINGS):
            for j, H in enumerate(heads):
                t0 = time.time()
                run = stage(cache, f"{act}_{mixing}_H{H}", partial(trained, config(act, H, mixing, tau_max, points), ts))
                r = run["risk"]
                final[i, k, j], error[i, k, j] = float(run["final"]), float(run["error"])
                change[i, k, j] = abs(r[-1] - r[i90]) / r[-1]
                a_eps[i, k, j], a_sum[i, k, j] = float(run["a_eps"]), float(run["a_sum"])
                v_sum[i, k, j] = float(np.sum(run["v"]))
                v_final[f"{act}_{mixing}_H{H}"] = np.asarray(run["v"]).round(4).tolist()
                print(f"  {act:9s} {mixing:8s} H = {H}: final risk {final[i, k, j]:.5f} +- {error[i, k, j]:.1e} (gap to "
                      f"Bayes {final[i, k, j] - bayes.value:+.5f}; ODE's own {r[-1]:.5f}), rel. change over the last 10% "
                      f"{change[i, k, j]:.1e}; E[a_eps] = {a_eps[i, k, j]:.3f}, E[sum_l a_l] = {a_sum[i, k, j]:.3f}, "
                      f"v = {np.round(run['v'], 3).tolist()} (sum {v_sum[i, k, j]:.3f})  [{time.time() - t0:.0f} s]",
                      flush=True)

    print(f"\nrisk - Bayes at tau = {tau_max:g} (uniform -> trained head weights); * = still moving (rel. change > 1e-3)")
    print(f"{'H':>3s}" + "".join(f"{a:>30s}" for a in ACTIVATIONS))
    for j, H in enumerate(heads):
        cells = []
        for i in range(len(ACTIVATIONS)):
            u, t = (final[i, k, j] - bayes.value for k in range(2))
            mark = ["*" if not change[i, k, j] <= CONVERGED else " " for k in range(2)]
            cells.append(f"{u:+.4f}{mark[0]} -> {t:+.4f}{mark[1]}")
        print(f"{H:3d}" + "".join(f"{c:>30s}" for c in cells))
    print(f"largest error of a final risk: {np.nanmax(error):.1e}")

    fig = figure(figsize=(9.6, 3.8), layout="constrained")
    gap, weight = fig.subplots(1, 2)
    for i, act in enumerate(ACTIVATIONS):
        for k, (mixing, ls) in enumerate(zip(MIXINGS, ("-", "--"))):
            conv = change[i, k] <= CONVERGED
            for ax, y in ((gap, final[i, k] - bayes.value), (weight, a_eps[i, k])):
                ax.plot(heads, y, ls, color=COLORS[act], lw=1.2, label=f"{act}, {mixing} weights")
                ax.plot(np.array(heads)[conv], y[conv], "o", color=COLORS[act], ms=5)
                ax.plot(np.array(heads)[~conv], y[~conv], "o", mfc="none", color=COLORS[act], ms=6)
    for ax in (gap, weight):
        ax.set_xscale("log", base=2)
        ax.set_xticks(heads, [str(h) for h in heads])
        ax.set_xlabel("number of heads H")
        ax.grid(alpha=0.3)
    gap.set_yscale("log")
    gap.set_ylabel(f"risk - Bayes risk at tau = {tau_max:g}")
    weight.set_ylabel("weight on the relevant token E[a_eps]")
    weight.legend(frameon=False, fontsize=7)
    fig.suptitle(f"isotropic Gaussian prior N(0, {STRENGTH:g}$^2$ I$_{F}$), L = {L}: solid uniform head average, dashed "
                 f"trained head weights; open markers still moving", fontsize=10)
    out = figures_dir(args)
    path = sl.save_figure(out / "head_mixing.png", fig)
    save_json(out / "head_mixing.json", {
        "settings": {"L": L, "F": F, "strength": STRENGTH, "lr": LR, "init_scale": INIT_SCALE, "D_start": D_THEORY,
                     "tau_max": tau_max, "points": points, "heads": list(heads), "evaluation": EVAL},
        "bayes": {"value": bayes.value, "error": bayes.error},
        **{f"{act}_{mixing}": {"final": final[i, k].tolist(), "error": error[i, k].tolist(),
                               "rel_change_last_10pct": change[i, k].tolist(), "a_eps": a_eps[i, k].tolist(),
                               "a_sum": a_sum[i, k].tolist(), "v_sum": v_sum[i, k].tolist()}
           for i, act in enumerate(ACTIVATIONS) for k, mixing in enumerate(MIXINGS)},
        "v": v_final})
    print(f"wrote {path}; total runtime {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
