"""bsoftmax with many heads on the rank-aware rule: the head-count rows the exact route cannot reach.

A joint layer (bsoftmax) stays on the exact route only while its rule is affordable (up to four
heads with one or two spikes, three with three or four: ``singleloc.preflight._resources.JOINT_EXACT_MAX``).
Its head-count rows beyond that -- ``H`` = 4 (from three spikes), 6 and 8, where trained heads are
redundant or switched off -- were computed on the rule route with the head-shift rule
(``theory.axes = "heads"``), whose error at near-copy heads is of the size of the differences the
head count rests on. This script recomputes them on the rank-aware rule (``theory.axes =
"principal"``, docs/model.md section 4.4; 7-64 times less risk error at near-copy heads,
``benchmarks/07_rank_aware_rule.py``), side by side with the head-shift rule, and checks the
rank-aware rule against the exact route where both exist (``figures/exact_recheck*.json``).

Setting: the spikes prior with F in {1, 2, 3} directions at strength 2.5, L = 4, bsoftmax with trained
biases, H in {3, 4, 6, 8}, lr = 0.5, one start (the overlaps of simulation seed 0 at D = 1000), each
to the horizon its head-count point was judged at (``figures/head_count.json``: 300 for one spike,
160 to 440 otherwise); 4096 points, the risk on an independent scrambling (the head-count setting).
For each run: the final risk on both rules, and the risk of each final state by
:func:`singleloc.population_risk` (the rank-aware rule, 8 scramblings of 4096 points, with its
standard error; the exact route where affordable). The head count (the smallest H within 0.01 of
H = 8) is recomputed from the rank-aware runs (H = 1, 2 from the exact route's recheck where it has
them, ``H = 1`` solved on the exact route where it has none).

Writes figures/rank_aware_recheck.png (final risk against H per F: both rules, the exact route where it
exists) and figures/rank_aware_recheck.json (every number printed). ``--spikes 1,2``: only those F.
``--cache DIR`` keeps each run (and each final state's risk);
``--quick``: F = 1, H in {3, 4}, tau 20. Runtime: its last line.
"""

from __future__ import annotations

import json
import time
from functools import partial

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import FIGURES, cache_dir, figure, figures_dir, parser, save_json, stage  # noqa: E402

import singleloc as sl  # noqa: E402

F_VALUES, HEADS, STRENGTH, WITHIN = (1, 2, 3), (3, 4, 6, 8), 2.5, 0.01
AXES = ("heads", "principal")
QUICK = {"F": (1,), "heads": (3, 4), "tau": 20.0}


def config(F: int, H: int, tau: float, axes: str) -> sl.Config:
    return sl.load_config("bsoftmax", [f"problem.F={F}", f"problem.strength={STRENGTH}", f"model.heads={H}",
                                       f"sgd.tau_max={tau:g}", "theory.route=rule", f"theory.axes={axes}"])


def solve(cfg: sl.Config) -> dict[str, np.ndarray]:
    t0 = time.time()
    r = sl.integrate(cfg)
    return {"tau": r.tau, "risk": r.risk[0], "M": r.M[0, -1], "Q": r.Q[0, -1], "b": r.b[0, -1],
            "seconds": time.time() - t0}


def state_risk(cfg: sl.Config, out: dict) -> dict[str, float]:
    """The risk of a final state by :func:`singleloc.population_risk` (exact where affordable, else the
    rank-aware rule on 8 scramblings), with its error and the time it took."""
    t0 = time.time()
    r = sl.population_risk(cfg.problem.build_prior(), cfg.problem.L, "bsoftmax", out["M"], out["Q"], out["b"])
    return {"value": r.value, "error": r.error, "seconds": time.time() - t0}


def one_head(F: int) -> float:
    """The final risk of one bsoftmax head on the exact route (for the head count, where the exact route's
    recheck has no ``H = 1``), to the head-count horizon."""
    cfg = config(F, 1, horizon(F, 1), "heads").replace(theory={"route": "exact"})
    return float(sl.integrate(cfg).risk[0, -1])


def exact_values(F: int) -> dict[int, float]:
    """The exact route's final bsoftmax risks of ``F`` spikes at strength 2.5 (``figures/exact_recheck*.json``)."""
    path = FIGURES / ("exact_recheck.json" if F == 1 else f"exact_recheck_F{F}.json")
    if not path.is_file():
        return {}
    table = json.loads(path.read_text())[f"head_count_F{F}"]
    return {int(k.split("H=")[1]): float(v["exact"]) for k, v in table.items() if k.startswith("bsoftmax,")}


def horizon(F: int, H: int) -> float:
    points = json.loads((FIGURES / "head_count.json").read_text())["points"]
    return float(points[f"bsoftmax,strength={STRENGTH:g},F={F},H={H}"]["horizon"])


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--spikes", default=",".join(map(str, F_VALUES)), help="the values of F, comma-separated (default 1,2,3)")
    args = p.parse_args()
    cache = cache_dir(args, "rank_aware_recheck")
    try:
        spikes = tuple(int(f) for f in args.spikes.split(","))
    except ValueError:
        p.error(f"--spikes: integers separated by commas, got {args.spikes!r}")
    if not set(spikes) <= set(F_VALUES):
        p.error(f"--spikes: values among {F_VALUES} (the head-count rows with exact rechecks), got {args.spikes!r}")
    Fs, heads = (QUICK["F"], QUICK["heads"]) if args.quick else (spikes, HEADS)
    t_start = time.time()
    table: dict = {}
    counts: dict = {}
    print("bsoftmax, strength 2.5, L = 4: final risk on the head-shift rule | on the rank-aware rule (each final state's "
          "risk by population_risk, +- its standard error) | exact route where it exists")
    for F in Fs:
        exact = exact_values(F)
        rows = {}
        for H in heads:
            tau = QUICK["tau"] if args.quick else horizon(F, H)
            row = {"tau": tau, "exact": exact.get(H) if not args.quick else None}
            for axes in AXES:
                cfg = config(F, H, tau, axes)
                out = stage(cache, f"F{F}_H{H}_{axes}", partial(solve, cfg))
                estimate = stage(cache, f"F{F}_H{H}_{axes}_state", partial(state_risk, cfg, out))
                row[axes] = {"final_risk": float(out["risk"][-1]), "state_risk": float(estimate["value"]),
                             "state_risk_error": float(estimate["error"]), "seconds": float(out["seconds"]),
                             "state_risk_seconds": float(estimate["seconds"])}
            rows[H] = row
            exact_text = f"{row['exact']:.5f}" if row["exact"] is not None else "-"
            print(f"  F = {F}, H = {H} (tau {tau:g}): {row['heads']['final_risk']:.5f} ({row['heads']['state_risk']:.5f} +- "
                  f"{row['heads']['state_risk_error']:.1e}) | {row['principal']['final_risk']:.5f} "
                  f"({row['principal']['state_risk']:.5f} +- {row['principal']['state_risk_error']:.1e}) | {exact_text}   "
                  f"[{row['heads']['seconds']:.0f} s / {row['principal']['seconds']:.0f} s]", flush=True)
        table[F] = rows
        if not args.quick:
            if 1 not in exact:
                exact[1] = float(stage(cache, f"F{F}_H1_exact", lambda F=F: {"risk": one_head(F)})["risk"])
            risks = {**{H: v for H, v in exact.items() if H < min(heads)},
                     **{H: rows[H]["principal"]["final_risk"] for H in heads}}
            large = risks[max(heads)]
            counts[F] = min(H for H, r in risks.items() if r - large <= WITHIN)
            print(f"  F = {F}: heads needed within {WITHIN} of H = {max(heads)} on the rank-aware rule (H < {min(heads)} "
                  f"exact): {counts[F]}", flush=True)

    fig = figure(figsize=(4.0 * len(Fs), 3.2), layout="constrained")
    panels = fig.subplots(1, len(Fs), squeeze=False)[0]
    for ax, F in zip(panels, Fs):
        rows = table[F]
        for axes, style, label in (("heads", "o--", "head-shift rule"), ("principal", "s-", "rank-aware rule")):
            ax.plot(heads, [rows[H][axes]["final_risk"] for H in heads], style, label=label)
        have = [H for H in heads if rows[H]["exact"] is not None]
        if have:
            ax.plot(have, [rows[H]["exact"] for H in have], "k*", ms=9, label="exact route")
        ax.set(title=f"bsoftmax, F = {F}, strength {STRENGTH:g}", xlabel="heads H", ylabel="final risk (its horizon)")
    panels[0].legend(fontsize=7)
    sl.save_figure(figures_dir(args) / "rank_aware_recheck.png", fig)
    save_json(figures_dir(args) / "rank_aware_recheck.json", {"strength": STRENGTH, "within": WITHIN, "rows": table,
                                                  "heads_needed": counts, "seconds": time.time() - t_start})
    print(f"runtime {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
