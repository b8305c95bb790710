"""``singleloc integrate CONFIG --out DIR``: the order-parameter ODE."""

from __future__ import annotations

import sys

from ._common import add_config_arguments, add_force_argument, add_out_argument, prepare_run

#: Above this ``sgd.tau_max`` (the sweep's horizon cap), ``integrate`` says that the solve may be
#: long and shows diffrax's progress bar (whose host callback keeps the program out of the
#: persistent compilation cache, which a long solve does not miss).
LONG_TAU = 3000.0


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
    add_force_argument(p)
    add_out_argument(p, run=True)
    p.set_defaults(func=run)


def run(args) -> int:
    from .._ode import MAX_STEPS, integrate

    config = prepare_run(args, theory="one")
    long = config.sgd.tau_max > LONG_TAU
    if long:  # the number of adaptive steps is not known before: say the bound, and show the solve
        print(f"singleloc integrate: note: sgd.tau_max = {config.sgd.tau_max:g} is a long solve: up to {MAX_STEPS} adaptive "
              f"steps (each 6 drift evaluations over {2 * config.theory.points if config.theory.points != 'auto' else 'the'} "
              f"quadrature nodes), which can take many minutes{'; its progress bar follows' if args.progress else ''}",
              file=sys.stderr)
    result = integrate(config, max_steps=MAX_STEPS, progress=long and args.progress)
    path = result.save(args.out, config)
    se = f" +- {result.risk_se[0, -1]:.1e}" if result.replicates > 1 else ""
    print(f"wrote {path}: tau 0..{result.tau[-1]:g}, risk {result.risk[0, 0]:.4f} -> {result.risk[0, -1]:.4f}{se}")
    print(result.quadrature())
    return 0
