"""Long-time phase diagrams over heads H and spikes F: how many heads does each activation need?

Setting: the spikes prior with F in {1, 2, 3, 4} directions, strengths 2.5 and 3.5, L = 4 tokens;
H in {1, 2, 3, 4, 6, 8} heads; softmax (no bias: it cancels), softmax1 and bsoftmax (trained
biases), i.e. the three shipped presets with ``problem.F``, ``problem.strength`` and
``model.heads`` on a grid. Every point is one ``singleloc sweep`` point at the default horizon
(``--horizon auto``: 2.5 times the predicted escape from the unspecialized plateau, at most
3000; 300 where no escape is predicted), integrated from the initial overlaps of ``SEEDS`` real
D = 1000 initialisations (``simulation.seed`` 0, 1, ...) with the default quadrature (4096
points, the risk on an independent scrambling). The sweeps run on a Dask ``LocalCluster`` with
``--workers`` processes (default 1: in this process).

For each point the script reports the final risk (mean over the seeds) minus the Bayes risk of
its prior (:func:`singleloc.bayes_risk`: exactly, bsoftmax at the Bayes point on the exact route), the number of distinct
directions the heads learned and the counts of each head class (``aligned``, ``leaning``,
``combination``, ``redundant``, ``off``, ``unspecialized``; docs/model.md section 9 and
:func:`singleloc.classify_heads`), all at the last saved time. The head count asked for is

    H*(activation, strength, F) = the smallest H of the grid whose final risk is within
    ``WITHIN`` = 0.01 of the activation's own large-H risk (its risk at H = 8),

judged at each point's horizon: a point that has not escaped by then ("not yet") keeps the
plateau's risk, which is what a run of that length gives (the table marks it).

Writes ``figures/head_count.png`` (final risk minus Bayes against H, one line per F, a panel per
activation and strength; open markers: some seed had not escaped), ``figures/head_count_classes.png``
(the head classes at each (H, F)), ``figures/head_count.json`` (every number printed) and the sweep
folders (``sweep.csv``, phase diagrams, cache) under ``--out`` (default ``runs/head_count``).

Run: ``python experiments/head_count.py [--workers 2] [--strengths 2.5,3.5] [--out DIR]``; runtime: its last line.
``--quick``: H in {1, 2}, F in {1, 2}, strength 2.5, one seed, horizon 20.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import figure, figures_dir, parser, save_json  # noqa: E402

import singleloc as sl  # noqa: E402
from singleloc.analysis._head_classes import CLASS_LETTERS, class_counts_text  # noqa: E402

ACTIVATIONS = ("softmax", "softmax1", "bsoftmax")  # the presets of the same names ("default" for softmax)
HEADS, FS, STRENGTHS = (1, 2, 3, 4, 6, 8), (1, 2, 3, 4), (2.5, 3.5)
SEEDS, L, WITHIN, SAME = 2, 4, 0.01, 0.98
CLASS_COLORS = ("C2", "C1", "C4", "C7", "k", "C3")
QUICK = {"heads": (1, 2), "fs": (1, 2), "strengths": (2.5,), "seeds": 1, "horizon": 20.0}


def run_sweeps(args, heads, fs, strengths, seeds, horizon) -> dict[str, list[dict]]:
    """One sweep per activation over (H, F, strength); rows of sweep.csv as dicts."""
    rows = {}
    grids = [sl.parse_grid("model.heads=" + ",".join(map(str, heads))), sl.parse_grid("problem.F=" + ",".join(map(str, fs))),
             sl.parse_grid("problem.strength=" + ",".join(map(str, strengths)))]
    for act in ACTIVATIONS:
        base = sl.load_config("default" if act == "softmax" else act, [f"simulation.seeds={seeds}"])
        t0 = time.time()
        rows[act], stats = sl.sweep(base, grids, args.out / act, horizon=horizon, workers=args.workers,
                                    cache_dir=args.out / "cache", progress=True)
        jax.clear_caches()  # free the compiled programs of this activation (one process compiling ~100 ran out of mappings)
        print(f"{act}: {len(rows[act])} points ({stats.computed} computed, {stats.cached} from the cache, {stats.failed} "
              f"failed) in {time.time() - t0:.0f} s", flush=True)
    return rows


def distinct_profiles(M: np.ndarray) -> float:
    """Number of distinct directions the heads learned, mean over seeds: ``M`` (seeds, H, F) at the
    last saved time (NaN-padded heads are ignored); heads whose spike part ``|M_h|`` is below 5% of
    the largest learned none; the profiles ``M_h / |M_h|`` of the others are grouped greedily,
    two profiles being the same direction when their cosine is at least ``SAME`` (about 11 degrees)."""
    counts = []
    for Ms in M:
        Ms = Ms[np.all(np.isfinite(Ms), axis=-1)]
        norm = np.linalg.norm(Ms, axis=-1)
        u = Ms[norm >= 0.05 * norm.max()] / norm[norm >= 0.05 * norm.max(), None]
        centres: list[np.ndarray] = []
        for v in u:
            if not any(v @ c >= SAME for c in centres):
                centres.append(v)
        counts.append(len(centres))
    return float(np.mean(counts))


def head_count(final: dict[int, float], heads) -> int | None:
    """The smallest H whose final risk is within WITHIN of the risk at the largest H."""
    ref = final[heads[-1]]
    return next((H for H in heads if np.isfinite(final[H]) and final[H] - ref <= WITHIN), None)


def main() -> int:
    p = parser(__doc__, cache=False)
    p.add_argument("--workers", type=int, default=1, help="Dask worker processes for the sweeps (default 1)")
    p.add_argument("--strengths", type=lambda t: tuple(float(x) for x in t.split(",")), default=STRENGTHS,
                   help="comma-separated strengths (default 2.5,3.5)")
    p.add_argument("--out", type=Path, default=Path("runs/head_count"), help="folder of the sweeps (default runs/head_count)")
    args = p.parse_args()
    q = args.quick
    heads, fs = (QUICK["heads"], QUICK["fs"]) if q else (HEADS, FS)
    strengths, seeds, horizon = (QUICK["strengths"], QUICK["seeds"], QUICK["horizon"]) if q else (args.strengths, SEEDS, "auto")
    if q:
        args.out = args.out / "quick"
    t_start = time.time()
    sl.enable_compilation_cache()  # the programs of each (H, F) are compiled once, also across reruns
    rows = run_sweeps(args, heads, fs, strengths, seeds, horizon)

    bayes = {}
    for F in fs:
        for s in strengths:
            prior = sl.load_config("default", [f"problem.F={F}", f"problem.strength={s}"]).problem.build_prior()
            bayes[F, s] = sl.bayes_risk(prior, L, points=4096, replicates=8)
    print(f"Bayes risks: largest standard error {max(b.error for b in bayes.values()):.1e}")

    table: dict = {}
    for act in ACTIVATIONS:
        final_M = sl.load_sweep(args.out / act).M.isel(step=-1)  # (heads, F, strength, seed, head, direction)
        for r in rows[act]:
            key = (act, float(r["problem.strength"]), int(r["F"]), int(r["heads"]))
            point = final_M.sel(model_heads=key[3], problem_F=key[2], problem_strength=key[1]).values
            table[key] = {"gap": r["final_risk"] - bayes[key[2], key[1]].value, "final_risk": r["final_risk"],
                          "escaped": r["escaped"], "not_yet": str(r["status"]).startswith("not yet"), "status": r["status"],
                          "horizon": r["horizon"],
                          "predicted_escape": r["predicted_escape"], "n_directions": r["n_directions"],
                          "distinct_profiles": distinct_profiles(point[..., :key[3], :key[2]]),
                          **{c: r[f"n_{c}"] for c in CLASS_LETTERS}}

    answer = {}
    print(f"\nfinal risk - Bayes at each point's horizon (mean over {seeds} seeds); "
          "'~' = not yet: some seed had not left the plateau by its horizon")
    for s in strengths:
        for act in ACTIVATIONS:
            print(f"\n{act}, strength {s}:  " + "".join(f"{'F=' + str(F):>12s}" for F in fs))
            for H in heads:
                cells = [f"{table[act, s, F, H]['gap']:+.4f}{'~' if table[act, s, F, H]['not_yet'] else ' '}"
                         for F in fs]
                print(f"  H = {H}:".ljust(18) + "".join(f"{c:>12s}" for c in cells))
            for F in fs:
                answer[act, s, F] = head_count({H: table[act, s, F, H]["final_risk"] for H in heads}, heads)
    print("\nheads at the horizon (mean counts over the seeds: A aligned, L leaning, C combination, R redundant, O off, "
          "U unspecialized) | distinct directions learned")
    for s in strengths:
        for act in ACTIVATIONS:
            print(f"\n{act}, strength {s}:  " + "".join(f"{'F=' + str(F):>22s}" for F in fs))
            for H in heads:
                cells = [f"{class_counts_text(table[act, s, F, H])} | {table[act, s, F, H]['distinct_profiles']:g}" for F in fs]
                print(f"  H = {H}:".ljust(18) + "".join(f"{c:>22s}" for c in cells))
    print(f"\nheads needed to come within {WITHIN} of the activation's own risk at H = {heads[-1]} (rows F)")
    for s in strengths:
        print(f"strength {s}: " + "".join(f"{a:>10s}" for a in ACTIVATIONS))
        for F in fs:
            print(f"  F = {F}".ljust(14) + "".join(f"{answer[a, s, F]!s:>10s}" for a in ACTIVATIONS))

    out = figures_dir(args)
    # Figure 1: final risk - Bayes against H, one line per F.
    fig = figure(figsize=(3.2 * len(ACTIVATIONS), 2.8 * len(strengths)), layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(strengths), len(ACTIVATIONS), sharex=True, sharey=True, squeeze=False))
    for i, s in enumerate(strengths):
        for j, act in enumerate(ACTIVATIONS):
            ax = axes[i, j]
            for k, F in enumerate(fs):
                gap = np.array([table[act, s, F, H]["gap"] for H in heads])
                done = np.array([not table[act, s, F, H]["not_yet"] for H in heads])
                ax.plot(heads, np.maximum(gap, 1e-4), "-", color=f"C{k}", lw=1.2, label=f"F = {F}")
                ax.plot(np.array(heads)[done], np.maximum(gap[done], 1e-4), "o", color=f"C{k}", ms=4)
                ax.plot(np.array(heads)[~done], np.maximum(gap[~done], 1e-4), "o", mfc="none", color=f"C{k}", ms=5)
                if answer[act, s, F] is not None:
                    ax.axvline(answer[act, s, F], color=f"C{k}", ls=":", lw=0.8)
            ax.set_yscale("log")
            ax.set_title(f"{act}, strength {s:g}", fontsize=9)
            ax.grid(alpha=0.3)
            if i == len(strengths) - 1:
                ax.set_xlabel("heads H")
            if j == 0:
                ax.set_ylabel("final risk - Bayes risk")
    axes[0, 0].legend(frameon=False, fontsize=7)
    fig.suptitle("spikes prior, L = 4, auto horizon; dotted: heads needed (within 0.01 of H = 8); open: not yet escaped",
                 fontsize=8)
    sl.save_figure(out / "head_count.png", fig)

    # Figure 2: the head classes at each (H, F): stacked bars, one panel per activation and strength.
    fig = figure(figsize=(3.2 * len(ACTIVATIONS), 2.6 * len(strengths)), layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(strengths), len(ACTIVATIONS), sharey=True, squeeze=False))
    labels = [f"{H}/{F}" for F in fs for H in heads]
    for i, s in enumerate(strengths):
        for j, act in enumerate(ACTIVATIONS):
            ax, bottom = axes[i, j], np.zeros(len(labels))
            for c, color in zip(CLASS_LETTERS, CLASS_COLORS):
                frac = np.array([table[act, s, F, H][c] / H for F in fs for H in heads])
                ax.bar(np.arange(len(labels)), frac, bottom=bottom, color=color, width=0.85, label=c)
                bottom += frac
            ax.set_xticks(np.arange(len(labels)), labels, rotation=90, fontsize=5)
            ax.set_title(f"{act}, strength {s:g}", fontsize=9)
            if j == 0:
                ax.set_ylabel("fraction of heads")
    axes[0, -1].legend(frameon=False, fontsize=6, loc="upper right", bbox_to_anchor=(1.45, 1))
    fig.suptitle("head classes at the horizon (x: H/F)", fontsize=8)
    sl.save_figure(out / "head_count_classes.png", fig)

    save_json(out / "head_count.json", {
        "within": WITHIN, "seeds": seeds, "heads": list(heads), "F": list(fs), "strengths": list(strengths),
        "bayes": {f"F={F},strength={s}": [b.value, b.error] for (F, s), b in bayes.items()},
        "points": {f"{a},strength={s},F={F},H={H}": v for (a, s, F, H), v in table.items()},
        "heads_needed": {f"{a},strength={s},F={F}": h for (a, s, F), h in answer.items()},
    })
    print(f"wrote {out / 'head_count.png'}, {out / 'head_count_classes.png'}, {out / 'head_count.json'}; "
          f"total runtime {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
