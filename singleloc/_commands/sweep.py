"""``singleloc sweep CONFIG --grid section.key=v1,v2 ... --out DIR``: cached parameter sweeps."""

from __future__ import annotations

import argparse

from ._common import add_config_arguments, add_force_argument, add_out_argument, config_from_args, int_at_least, output_folder


def register(sub) -> None:
    p = sub.add_parser(
        "sweep",
        help="run the theory (and optionally simulations) over a grid of config values, with a cache",
        description="At every point of the product of the --grid lists: predict the escape from the "
        "unspecialized plateau (tau_0 + log(D) / (2 lambda), lambda from the linearisation along the "
        "head-symmetric flow), integrate the ODE (one batched solve over the simulation.seeds initial "
        "conditions) up to the horizon, classify every head (aligned, leaning, combination, redundant, "
        "off, unspecialized) and analyse the phases; compute the Bayes risk of every problem (once per problem) and "
        "each point's gap_to_bayes = final_risk - bayes_risk, and for every activation and spike count the fewest "
        "heads that come within --gap of it (heads_needed, printed as a table); write DIR/sweep.csv (its columns: "
        "docs/commands/sweep.md), DIR/sweep.nc (the whole sweep as an xarray Dataset: singleloc.load_sweep(DIR)), "
        "DIR/phase_<activation>.png (phase diagrams over heads H and spikes F) and DIR/heads_needed.png (gap_to_bayes "
        "against H). A point that has not escaped by its horizon says "
        "'not yet (predicted escape at tau = X)'. Every point is cached under a hash of its resolved "
        "config (horizon included) and the package version, so a repeated sweep recomputes nothing "
        "and a changed value recomputes only the affected points.",
    )
    add_config_arguments(p)
    p.add_argument("--grid", action="append", default=[], required=True, metavar="SECTION.KEY=V1,V2,...",
                   help="values of one config key (repeatable; the sweep is the product), "
                   "e.g. --grid model.heads=1,2,4 --grid problem.F=1,2")
    p.add_argument("--horizon", type=horizon_type, default="auto", metavar="auto|config|TAU",
                   help="how far to integrate each point: auto (default): 5 times its predicted escape, "
                   "rounded up to two digits, at most 3000 (300 without a predicted escape); TAU: that time; "
                   "both on a log grid of at least 201 saved times; config: sgd.tau_max and the config's grid (with "
                   "TAU or config the escape is predicted only for the points that have not escaped by the horizon)")
    p.add_argument("--simulate", action="store_true", help="also run the finite-D simulation at every point")
    p.add_argument("--gap", type=float, default=0.01, metavar="GAP",
                   help="heads_needed counts a point as reaching the Bayes risk when its gap_to_bayes is at most GAP "
                   "(default 0.01)")
    p.add_argument("--workers", type=int_at_least(1), default=1, metavar="N",
                   help="compute the points on a local Dask cluster of N worker processes (default 1: in this "
                   "process, no Dask started); only this process writes the cache and the CSV")
    p.add_argument("--scheduler", default=None, metavar="tcp://HOST:PORT",
                   help="compute the points on an existing Dask cluster (default: the DASK_SCHEDULER_ADDRESS "
                   "environment variable when set); see docs/scale.md for clusters on Slurm/PBS")
    p.add_argument("--batch", action=argparse.BooleanOptionalAction, default=True,
                   help="solve the theory points that differ only in sgd.lr, sgd.tau_max (so the horizon), "
                   "sgd.init_scale, problem.strength, simulation.seed, simulation.D, theory.qmc_seed, theory.rtol or "
                   "theory.atol together, as one vmapped ODE solve with one compilation (default; equal to the "
                   "separate solves to the solver's tolerance); --no-batch solves every point on its own")
    p.add_argument("--yes", action="store_true",
                   help="start even when a point's estimated time passes an hour (without it the sweep refuses, before "
                   "anything runs, and names what would make the point cheaper)")
    add_force_argument(p)
    add_out_argument(p)
    p.add_argument("--cache", type=output_folder, default=None, metavar="DIR", help="cache folder (default DIR/cache)")
    p.set_defaults(func=run)


def horizon_type(text: str) -> str | float:
    """argparse type of --horizon (sweep, integrate): auto, config or a positive number (the library's check)."""
    from ..ground._choices import HORIZON_WORDS, check_horizon

    try:
        value = text if text in HORIZON_WORDS else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto, config or a positive number, got {text!r}") from None
    try:
        check_horizon(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("horizon ")) from None
    return value


def run(args) -> int:
    from ..analysis._sweep_answers import heads_needed_table
    from ..preflight._resources import check_workers
    from ..runtime._distributed import check_cluster
    from ..sweeps._grid import parse_grid
    from ..sweeps._sweep import check_gap, check_sweep, compute_sweep, quadrature_summary, settled_summary, write_sweep_outputs

    config = config_from_args(args)
    grids = [parse_grid(g) for g in args.grid]
    # every point can run (sweep checks them too, in milliseconds), then the workers, before any cluster starts
    try:
        check_gap(args.gap)
    except ValueError as err:
        raise ValueError(f"--gap: {str(err).removeprefix('gap ')}") from None
    check_sweep(config, grids, simulate=args.simulate, batch=args.batch)
    check_cluster(args.workers, args.scheduler, local="--workers N", external="--scheduler ADDRESS")
    check_workers(args.workers, "--workers", force=args.force)
    outcome = compute_sweep(config, grids, args.cache or args.out / "cache", horizon=args.horizon, simulate=args.simulate,
                            progress=args.progress, workers=args.workers, scheduler=args.scheduler, batch=args.batch,
                            gap=args.gap)
    write_sweep_outputs(args.out, outcome)
    rows, stats = outcome.rows, outcome.stats
    failed = f"; {stats.failed} failed, see the status column" if stats.failed else ""
    print(f"swept {len(rows)} points ({stats.computed} computed, {stats.cached} from the cache{failed}) "
          f"in {stats.seconds:.1f} s; wrote {args.out / 'sweep.csv'}, {args.out / 'sweep.nc'} and the figures")
    print(heads_needed_table(rows, [g.name for g in grids]))
    print(quadrature_summary(rows))
    if unsettled := settled_summary(rows):
        print(unsettled)
    return 0
