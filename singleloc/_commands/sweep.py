"""``singleloc sweep CONFIG --grid section.key=v1,v2 ... --out DIR``: cached parameter sweeps."""

from __future__ import annotations

from pathlib import Path

from ._common import add_config_arguments, add_out_argument, config_from_args


def register(sub) -> None:
    p = sub.add_parser(
        "sweep",
        help="run the theory (and optionally simulations) over a grid of config values, with a cache",
        description="Integrate the ODE (one batched solve over the simulation.seeds initial "
        "conditions) at every point of the product of the --grid lists, analyse the phases "
        "(final risk, specialized heads, redundant pairs, escape time) and write DIR/sweep.csv "
        "and DIR/phase_<activation>.png (phase diagrams over heads H and spikes F). Every point "
        "is cached under a hash of its resolved config and the package version, so a repeated "
        "sweep recomputes nothing and a changed value recomputes only the affected points.",
    )
    add_config_arguments(p)
    p.add_argument("--grid", action="append", default=[], required=True, metavar="SECTION.KEY=V1,V2,...",
                   help="values of one config key (repeatable; the sweep is the product), "
                   "e.g. --grid model.heads=1,2,4 --grid problem.F=1,2")
    p.add_argument("--simulate", action="store_true", help="also run the finite-D simulation at every point")
    add_out_argument(p)
    p.add_argument("--cache", type=Path, default=None, metavar="DIR", help="cache folder (default DIR/cache)")
    p.set_defaults(func=run)


def run(args) -> int:
    from .._sweep import parse_grid, sweep

    config = config_from_args(args)
    grids = [parse_grid(g) for g in args.grid]
    rows, stats = sweep(config, grids, args.out, simulate=args.simulate, cache_dir=args.cache, progress=args.progress)
    failed = f", {stats.failed} failed" if stats.failed else ""
    print(f"swept {len(rows)} points ({stats.computed} computed, {stats.cached} from the cache{failed}) "
          f"in {stats.seconds:.1f} s; wrote {args.out / 'sweep.csv'}")
    return 0
