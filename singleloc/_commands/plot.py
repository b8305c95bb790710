"""``singleloc plot RUN_DIR``: the figures of a run folder (``integrate``, ``simulate``, ``compare``, ``prune``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ._common import add_beside_argument, describe, output_folder

#: The figure of a run's trajectories, by what the folder holds.
TRAJECTORY_FIGURE = {(True, True): "compare.png", (True, False): "theory.png", (False, True): "simulation.png"}


def register(sub) -> None:
    p = sub.add_parser(
        "plot",
        help="draw the figures of a run folder (integrate, simulate, compare or prune output)",
        description="Read RUN_DIR (the output folder of `integrate`, `simulate`, `compare` or `prune`) and draw "
        "what it holds: its trajectories (risk and the overlaps M_hf of every head with every spike against "
        "tau; theory and simulation as means over seeds with their min-to-max spread, heads matched to the "
        "spike they learn) as compare.png (theory and simulation), theory.png or simulation.png; for a theory, "
        "phases.png (plateaus, escape, alignments and head classes of its first trajectory); with prune.npz, "
        "prune.png (risk against heads removed). The figures are added to RUN_DIR (stamped with its config "
        "hash, the run's other files kept), or written to --out DIR (stamped likewise; a DIR that holds another run is "
        "refused without --beside-run, and a figure of another run is never replaced).",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", type=Path,
                   help="output folder of `singleloc integrate`, `simulate`, `compare` or `prune`")
    p.add_argument("--out", type=output_folder, default=None, metavar="DIR",
                   help="write the figures into DIR (created if missing) instead of adding them to RUN_DIR")
    add_beside_argument(p)
    p.add_argument("--log-time", action=argparse.BooleanOptionalAction, default=None,
                   help="a log time axis (default: when the run saved its times on a log grid, sgd.spacing = log)")
    p.set_defaults(func=run)


def run_figures(run, log_time: bool | None = None) -> dict:
    """The figures of a :class:`~singleloc.Run` (``name.png -> Figure``), as ``singleloc plot`` draws them."""
    from ..analysis._attention_mass import attention_mass
    from ..analysis._head_classes import final_outcomes
    from ..analysis._phase_analysis import analyze
    from ..plots import plot_compare, plot_phases
    from ..preflight._build import build
    from ..runtime._progress import Phase
    from ..theory._theory import OrderParameterODE
    from .prune import pruning_figure

    config, theory, simulation = run.config, run.theory, run.simulation
    setup = build(config, theory=theory is not None)  # its route (for a theory), decided once
    title = f"{describe(config)}, D={config.simulation.D}, lr={config.sgd.lr}"
    figures = {}
    if theory is not None or simulation is not None:
        name = TRAJECTORY_FIGURE[theory is not None, simulation is not None]
        outcomes = None if theory is None or simulation is None else \
            final_outcomes(setup, theory, simulation, units=("starts", "seeds"))  # as compare draws it
        figures[name] = plot_compare(theory, simulation, title=title, log_time=log_time, mean=config.problem.build_prior().mean(),
                                     outcomes=outcomes)
    if theory is not None:
        ode = OrderParameterODE.from_setup(setup)
        with Phase((f"classifying the {config.model.heads} heads at {len(theory.tau)} saved times (their attention "
                    f"weights on the {ode.expectation.route} route) for phases.png", "classified the heads")):
            weights = attention_mass(ode, theory.M[:1], theory.Q[:1], theory.b[:1])
            analysis = analyze(theory.tau, theory.M[:1], theory.Q[:1], theory.risk[:1],
                               mean=config.problem.build_prior().mean(), weights=weights)
        predicted = run.data.get("theory", {}).get("predicted_escape")  # integrate --horizon auto keeps it
        figures["phases.png"] = plot_phases(analysis, theory.risk[:1], title=f"theory, {title}", log_time=log_time,
                                            predicted_escape=None if predicted is None else float(predicted))
    if run.pruning:
        figures["prune.png"] = pruning_figure(run.pruning, config, float(run.extra["prune"].get("tol", 0.01)))
    return figures


def run(args) -> int:
    from ..ground._atomic_files import RUN_STAMP, check_other_run
    from ..io._run_folders import add_to_run, load_run, save_figure

    if (args.run_dir / "sweep.nc").is_file() and not (args.run_dir / "config.json").is_file():
        raise ValueError(f"{args.run_dir} is the output folder of `singleloc sweep`, whose figures the sweep draws "
                         "(phase_*.png, heads_needed.png); read its data with singleloc.load_sweep")
    loaded = load_run(args.run_dir)
    theory = loaded.theory is not None
    names = [TRAJECTORY_FIGURE.get((theory, loaded.simulation is not None)), "phases.png" if theory else None,
             "prune.png" if loaded.pruning else None]
    if args.out is not None:  # before drawing: a folder of another run is refused
        check_other_run(args.out, loaded.config_hash, f"the figures of {str(args.run_dir)!r} (config hash "
                        f"{loaded.config_hash})", [n for n in names if n], args.beside_run)
    figures = run_figures(loaded, args.log_time)
    if args.out is None:
        add_to_run(loaded, figures)
        where = args.run_dir
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        for name, fig in figures.items():
            save_figure(args.out / name, fig, {RUN_STAMP: loaded.config_hash})
        where = args.out
    print(f"wrote {', '.join(str(where / name) for name in figures)}")
    return 0
