"""``singleloc prune RESULT_DIR``: head pruning of a trained layer (docs/model.md section 7)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from ..ground._atomic_files import check_run_folder
from ..ground._choices import PRUNING_DRAWS_MAX, PRUNING_ORDERS, ROUTE_WORDS
from ._common import PROGRESS_HELP, add_out_argument, describe, int_at_least, note_replaced

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
        "the config's theory quadrature; with theory.replicates = R > 1 it is the mean over R "
        "independently scrambled rules and comes with its quadrature standard error (in the "
        "table, in prune.npz as <source>_stderr, and for the first harmful removal in the summary "
        "line). simulation.npz stores order parameters only (not the "
        "keys), so each simulation seed is pruned through its final order parameters with this "
        "theory risk, not on fresh finite-D data; to prune finite-D weights on fresh data use "
        "singleloc.prune_weights in Python. Prints a table of risk against heads removed and "
        "writes DIR/prune.png (the curves) and DIR/prune.npz (n_removed, and for "
        "each source <source>_risks (draws or seeds x H) and <source>_removed (rows x H-1, 0-based head indices; the "
        "table and the figures number heads from 1)), "
        "stamped with the config hash of RESULT_DIR: into RESULT_DIR they are added to the run (its "
        "other files kept); another DIR becomes a run folder of its own with RESULT_DIR's config.json. "
        "A RESULT_DIR whose files carry different config hashes (files of different runs) is refused.",
    )
    p.add_argument("result_dir", metavar="RESULT_DIR", type=Path,
                   help="output folder of `singleloc integrate`, `simulate` or `compare`")
    p.add_argument("--order", default="greedy", choices=PRUNING_ORDERS,
                   help="order of removal: greedy (drop the head whose removal raises the risk least), "
                   "alignment (drop the smallest spike-overlap norm |M_h| first) or random (--draws random orders); "
                   "default greedy")
    p.add_argument("--draws", type=int_at_least(1, PRUNING_DRAWS_MAX), default=20, metavar="N",
                   help="number of random orders for --order random (mean and spread are reported); default 20")
    p.add_argument("--seed", type=int_at_least(0), default=0, metavar="S", help="seed of the random orders; default 0")
    p.add_argument("--source", default="auto", choices=SOURCES,
                   help="which stored layer to prune: theory (theory.npz), simulation (simulation.npz, "
                   "every seed) or auto (every one present); default auto")
    p.add_argument("--tol", type=float, default=0.01, metavar="DR",
                   help="risk rise that counts as harmful: the summary line reports how many heads can be "
                   "removed before the risk exceeds the unpruned risk by more than DR; default 0.01")
    p.add_argument("--no-progress", dest="progress", action="store_false", help=PROGRESS_HELP)
    add_out_argument(p, default="RESULT_DIR", run=True)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..io._run_folders import RUN_KINDS, add_to_run, load_run, save_run
    from ..preflight._build import build
    from ..pruning._pruning import prune_layers, pruning_setup

    if not math.isfinite(args.tol) or args.tol < 0:
        raise ValueError(f"--tol must be a non-negative number, got {args.tol}")
    loaded = load_run(args.result_dir, RUN_KINDS if args.source == "auto" else (args.source,))
    if not loaded.data:  # a folder of pruning results only (prune --out DIR)
        kinds = " or ".join(f"{kind}.npz" for kind in (RUN_KINDS if args.source == "auto" else (args.source,)))
        raise FileNotFoundError(f"no {kinds} in {args.result_dir}: nothing to prune")
    in_place = args.out is None or args.out.resolve() == args.result_dir.resolve()
    if in_place:
        try:
            check_run_folder(args.result_dir)
        except ValueError as err:
            raise ValueError(f"RESULT_DIR {err}; or write elsewhere with --out") from None
    config = loaded.config
    setup = pruning_setup(build(config))  # checked and "auto" resolved, before the note (the run folder keeps its config)
    if not in_place:
        note_replaced(args.command, args.out)
    results = prune_layers(setup, loaded.data, args.order, draws=args.draws, seed=args.seed)  # its route decided once

    H, F = config.model.heads, config.problem.F
    route = setup.route.route_class
    _print_table(results, args, H, F, route)
    arrays = {"n_removed": np.arange(H), "route": np.asarray(route.route), "order": np.asarray(args.order),
              "tol": np.asarray(args.tol)}
    for source, res in results.items():
        arrays[f"{source}_risks"] = np.concatenate([r.risks for r in res])
        arrays[f"{source}_removed"] = np.concatenate([r.removed for r in res])
        if res[0].stderr is not None:
            arrays[f"{source}_stderr"] = np.concatenate([r.stderr for r in res])
    fig = pruning_figure({source: _merge(res) for source, res in results.items()}, config, args.tol)
    files = {"prune.npz": arrays, "prune.png": fig}
    out = add_to_run(loaded, files) if in_place else save_run(args.out, config, files)
    print(f"wrote {out / 'prune.png'} and {out / 'prune.npz'}")
    return 0


def pruning_figure(results: dict, config, tol: float = 0.01):
    """``prune.png``: the curves of ``{source: PruningResult}`` (a simulation's rows: its seeds, or its
    seeds' random draws) for the run of ``config`` (:func:`singleloc.plots.plot_pruning`)."""
    from ..plots import plot_pruning

    order = next(iter(results.values())).order
    seeds = config.simulation.seeds
    labels = {"theory": "theory (ODE final state)", "simulation": f"simulation order parameters, {seeds} seed(s), theory risk"}
    curves = {labels[source]: result for source, result in results.items()}
    return plot_pruning(curves, F=config.problem.F, tol=tol, title=f"{order} pruning: {describe(config)}")


def _merge(res: list):
    """One :class:`~singleloc.PruningResult` from several (seeds): the rows of all of them."""
    if len(res) == 1:
        return res[0]
    return dataclasses.replace(res[0], removed=np.concatenate([r.removed for r in res]),
                               risks=np.concatenate([r.risks for r in res]))


def _print_table(results: dict[str, list], args, H: int, F: int, route: type) -> None:
    spread = args.order == "random"
    error = "stated error" if route.refined_error else "quadrature SE"  # the finer rule's difference, or replicates'
    head = f"{'removed':>7} {'kept':>4}"
    for source, res in results.items():
        n = len(res)
        name = source if source == "theory" else f"simulation ({n} seed{'s' * (n > 1)}, order parameters)"
        name += " mean +- sd" if spread or n > 1 else (f" +- {error}" if res[0].stderr is not None else "")
        head += f"  {name:>28}"
        if args.order != "random":
            head += f"  {'dropped':>{max(7, 4 * n)}}"
    how = (f"the {ROUTE_WORDS[route.route]} route; " + ("its stated error is the difference to a finer exact rule"
           if route.refined_error else "its error is the replicates' standard error, with theory.replicates > 1"))
    print(f"{args.order} pruning, H = {H}, F = {F}: risk against heads removed "
          f"(population risk of the kept order parameters, on {how}; heads numbered 1..{H} as in the figures)")
    print(head)
    for k in range(H):
        row = f"{k:>7} {H - k:>4}"
        for res in results.values():
            rows = np.concatenate([r.risks[:, k] for r in res])
            if len(rows) > 1:
                cell = f"{rows.mean():.4f} +- {rows.std(ddof=1):.4f}"
            else:
                cell = f"{rows[0]:.4f}" + (f" +- {_error(res[0].stderr[0, k])}" if res[0].stderr is not None else "")
            row += f"  {cell:>28}"
            if args.order != "random":
                dropped = ",".join(str(int(r.removed[0, k - 1]) + 1) for r in res) if k else "-"
                row += f"  {dropped:>{max(7, 4 * len(res))}}"
        print(row)
    for source, res in results.items():
        counts = [r.removable(args.tol) for r in res]
        what = f"{counts[0]}" if len(counts) == 1 else f"{min(counts)}..{max(counts)} over seeds"
        print(f"{source}: {what} head(s) can be removed before the risk rises by more than {args.tol:g} (H - F = {H - F})"
              + (_margin(res[0], counts[0], error) if len(res) == 1 else ""))


def _error(value: float) -> str:
    """An error beside a risk printed to four decimals: in the same digits, or in powers of ten when
    it is below them (the exact route's stated errors, 1e-13, rather than ``0.0000``)."""
    return f"{value:.4f}" if value >= 5e-5 else f"{value:.1e}"


def _margin(result, k: int, error: str) -> str:
    """The rise of the risk at the first harmful removal, with its quadrature error (a count
    near the threshold is only as sure as that error)."""
    if result.stderr is None or result.risks.shape[0] > 1 or k + 1 >= result.heads:
        return ""
    risk, se = result.risks[0], result.stderr[0]
    return (f"; removing {k + 1} raises it by {risk[k + 1] - risk[0]:.4f} +- {_error(np.hypot(se[k + 1], se[0]))} "
            f"({error})")
