"""``singleloc prune RESULT_DIR``: head pruning of a trained layer (MODEL.md section 7)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .._config import load_config
from .._io import load_npz, save_figure, save_npz
from .._pruning import ORDERS, PruningResult, plot_pruning, prune_theory

SOURCES = ("auto", "theory", "simulation")


def register(sub) -> None:
    p = sub.add_parser(
        "prune",
        help="prune the heads of a trained layer and tabulate the risk against heads removed",
        description="Read RESULT_DIR (the output folder of `integrate`, `simulate` or `compare`): "
        "config.json and the final state of theory.npz and/or simulation.npz. Remove heads one at "
        "a time along --order and evaluate the pruned layer, whose aggregation is renormalised "
        "over the kept heads (a = (1/H') sum_kept A_h; bsoftmax's factor H becomes H'). "
        "The risk is the population risk of the kept rows/columns of (M, Q, b), computed with "
        "the config's theory quadrature. simulation.npz stores order parameters only (not the "
        "keys), so each simulation seed is pruned through its final order parameters with this "
        "theory risk, not on fresh finite-D data; to prune finite-D weights on fresh data use "
        "singleloc.prune_weights in Python. Prints a table of risk against heads removed and "
        "writes RESULT_DIR/prune.png (the curves) and RESULT_DIR/prune.npz (n_removed, and for "
        "each source <source>_risks (draws or seeds x H) and <source>_removed (rows x H-1)).",
    )
    p.add_argument("result_dir", metavar="RESULT_DIR", type=Path,
                   help="output folder of `singleloc integrate`, `simulate` or `compare`")
    p.add_argument("--order", default="greedy", metavar="ORDER",
                   help="order of removal: greedy (drop the head whose removal raises the risk least), "
                   "alignment (drop the smallest |M_h| first) or random (--draws random orders); default greedy")
    p.add_argument("--draws", type=int, default=20, metavar="N",
                   help="number of random orders for --order random (mean and spread are reported); default 20")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the random orders; default 0")
    p.add_argument("--source", default="auto", metavar="SOURCE",
                   help="which stored layer to prune: theory (theory.npz), simulation (simulation.npz, "
                   "every seed) or auto (every one present); default auto")
    p.add_argument("--tol", type=float, default=0.01, metavar="DR",
                   help="risk rise that counts as harmful: the summary line reports how many heads can be "
                   "removed before the risk exceeds the unpruned risk by more than DR; default 0.01")
    p.set_defaults(func=run)


def _read_config(directory: Path):
    path = directory / "config.json"
    if not directory.is_dir():
        raise FileNotFoundError(f"RESULT_DIR {str(directory)!r} is not a folder")
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: RESULT_DIR must be the output folder of integrate, simulate or compare")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    data.pop("singleloc_version", None)
    return load_config(data)


def run(args) -> int:
    if args.order not in ORDERS:
        raise ValueError(f"--order must be one of {', '.join(ORDERS)}, got {args.order!r}")
    if args.source not in SOURCES:
        raise ValueError(f"--source must be one of {', '.join(SOURCES)}, got {args.source!r}")
    if args.draws < 1:
        raise ValueError(f"--draws must be >= 1, got {args.draws}")
    if not np.isfinite(args.tol) or args.tol < 0:
        raise ValueError(f"--tol must be a non-negative number, got {args.tol}")
    directory = args.result_dir
    config = _read_config(directory)
    wanted = ("theory", "simulation") if args.source == "auto" else (args.source,)
    files = {s: directory / f"{s}.npz" for s in wanted if (directory / f"{s}.npz").is_file()}
    if not files:
        names = " or ".join(f"{s}.npz" for s in wanted)
        raise FileNotFoundError(f"no {names} in {directory}")

    kw = dict(draws=args.draws, seed=args.seed)
    results: dict[str, list[PruningResult]] = {}
    if "theory" in files:
        d = load_npz(files["theory"])
        results["theory"] = [prune_theory(config, d["M"][-1], d["Q"][-1], d["b"][-1], args.order, **kw)]
    if "simulation" in files:
        d = load_npz(files["simulation"])
        results["simulation"] = [prune_theory(config, d["M"][s, -1].astype(float), d["Q"][s, -1].astype(float),
                                              d["b"][s, -1].astype(float), args.order, **kw) for s in range(d["M"].shape[0])]

    H, F = config.model.heads, config.problem.F
    _print_table(results, args, H, F)
    arrays = {"n_removed": np.arange(H)}
    curves = {}
    for source, res in results.items():
        arrays[f"{source}_risks"] = np.concatenate([r.risks for r in res])
        arrays[f"{source}_removed"] = np.concatenate([r.removed for r in res])
        label = "theory (ODE final state)" if source == "theory" else f"simulation order parameters, {len(res)} seed(s), theory risk"
        curves[label] = _merge(res)
    save_npz(directory / "prune.npz", arrays)
    pb, m = config.problem, config.model
    prior = pb.prior if isinstance(pb.prior, str) else pb.prior.name
    fig = plot_pruning(curves, F=F, tol=args.tol,
                       title=f"{args.order} pruning: {m.activation}, H={H}, L={pb.L}, F={F}, {prior} prior")
    save_figure(directory / "prune.png", fig)
    import matplotlib.pyplot as plt

    plt.close(fig)
    print(f"wrote {directory / 'prune.png'} and {directory / 'prune.npz'}")
    return 0


def _merge(res: list[PruningResult]) -> PruningResult:
    """One curve from several (seeds): the rows of all of them."""
    if len(res) == 1:
        return res[0]
    return PruningResult(res[0].order, np.concatenate([r.removed for r in res]), np.concatenate([r.risks for r in res]))


def _print_table(results: dict[str, list[PruningResult]], args, H: int, F: int) -> None:
    spread = args.order == "random"
    head = f"{'removed':>7} {'kept':>4}"
    for source, res in results.items():
        n = len(res)
        name = source if source == "theory" else f"simulation ({n} seed{'s' * (n > 1)}, order parameters)"
        head += f"  {name + (' mean +- sd' if spread or n > 1 else ''):>28}"
        if args.order != "random":
            head += f"  {'dropped':>{max(7, 4 * n)}}"
    print(f"{args.order} pruning, H = {H}, F = {F}: risk against heads removed "
          f"(population risk of the kept order parameters)")
    print(head)
    for k in range(H):
        row = f"{k:>7} {H - k:>4}"
        for source, res in results.items():
            rows = np.concatenate([r.risks[:, k] for r in res])
            cell = f"{rows.mean():.4f}" + (f" +- {rows.std(ddof=1):.4f}" if len(rows) > 1 else "")
            row += f"  {cell:>28}"
            if args.order != "random":
                dropped = ",".join(str(int(r.removed[0, k - 1])) for r in res) if k else "-"
                row += f"  {dropped:>{max(7, 4 * len(res))}}"
        print(row)
    for source, res in results.items():
        counts = [r.removable(args.tol) for r in res]
        what = f"{counts[0]}" if len(counts) == 1 else f"{min(counts)}..{max(counts)} over seeds"
        print(f"{source}: {what} head(s) can be removed before the risk rises by more than {args.tol:g} (H - F = {H - F})")
