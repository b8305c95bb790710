"""``singleloc integrate CONFIG --out DIR``: the order-parameter ODE."""

from __future__ import annotations

from ._common import add_config_arguments, add_out_argument, config_from_args


def register(sub) -> None:
    p = sub.add_parser(
        "integrate",
        help="integrate the order-parameter ODE (theory) and save the trajectory",
        description="Integrate the D -> infinity ODE of (M, Q, b) with diffrax, starting from "
        "the overlaps of the simulator's initial weights for seed 0 (simulation.seed, "
        "simulation.D), and save at the sgd time grid. Writes DIR/theory.npz with tau (T), "
        "M (T,H,F), Q (T,H,H), b (T,H), risk (T), and DIR/config.json.",
    )
    add_config_arguments(p)
    add_out_argument(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from .._ode import integrate

    config = config_from_args(args)
    result = integrate(config, progress=args.progress)
    path = result.save(args.out, config)
    print(f"wrote {path}: tau 0..{result.tau[-1]:g}, risk {result.risk[0, 0]:.4f} -> {result.risk[0, -1]:.4f}")
    return 0
