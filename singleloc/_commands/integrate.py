"""``singleloc integrate CONFIG --out DIR``: the order-parameter ODE."""

from __future__ import annotations

from ._common import add_config_arguments, add_out_argument, prepare_run, warn_if_risk_rose


def register(sub) -> None:
    p = sub.add_parser(
        "integrate",
        help="integrate the order-parameter ODE (theory) and save the trajectory",
        description="Integrate the D -> infinity ODE of (M, Q, b) with diffrax, starting from "
        "the overlaps of the simulator's initial weights for seed 0 (simulation.seed, "
        "simulation.D), and save at the sgd time grid. Writes DIR/theory.npz with tau (T), "
        "M (T,H,F), Q (T,H,H), b (T,H), risk (T), and DIR/config.json; every file carries the "
        "config hash, and DIR is replaced as a whole.",
    )
    add_config_arguments(p)
    add_out_argument(p, run=True)
    p.set_defaults(func=run)


def run(args) -> int:
    from .._ode import integrate

    config = prepare_run(args, theory="one")
    result = integrate(config)
    warn_if_risk_rose(config, theory=result)
    path = result.save(args.out, config)
    se = f" +- {result.risk_se[0, -1]:.1e}" if result.replicates > 1 else ""
    print(f"wrote {path}: tau 0..{result.tau[-1]:g}, risk {result.risk[0, 0]:.4f} -> {result.risk[0, -1]:.4f}{se}")
    print(result.quadrature())
    return 0
