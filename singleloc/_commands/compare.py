"""``singleloc compare CONFIG --out DIR``: simulation against its per-seed theory."""

from __future__ import annotations

import sys

import numpy as np

from ._common import add_config_arguments, add_force_argument, add_out_argument, continued_run, describe, joined, prepare_run


def register(sub) -> None:
    p = sub.add_parser(
        "compare",
        help="simulation against theory: one ODE curve per seed, from that seed's initial overlaps",
        description="Run the finite-D simulation of CONFIG and integrate the ODE once per "
        "simulation seed, started from that seed's initial overlaps. Writes "
        "DIR/simulation.npz (as `simulate`), DIR/theory.npz (seed 0, as `integrate`), "
        "DIR/theory_seeds.npz (every seed: M (S,T,H,F), Q (S,T,H,H), b (S,T,H), risk and risk_se (S,T)), "
        "DIR/config.json and DIR/compare.png (risk and overlaps M_hf against tau). Every file carries "
        "the config hash, and DIR is replaced as a whole when all of them are written. --continue RUN_DIR "
        "--horizon TAU continues a stored compare: the theory of every seed from its stored state, the simulation "
        "rerun from tau = 0 (its weights are not stored).",
    )
    add_config_arguments(p, resume=True)
    p.add_argument("--horizon", type=float, metavar="TAU", help="with --continue: the new horizon, beyond the stored run's")
    add_force_argument(p)
    add_out_argument(p, run=True)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..analysis._head_classes import final_outcomes
    from ..analysis._settled import run_settledness
    from ..analysis._sweep_answers import error_text, final_risk_error
    from ..io._run_folders import save_run
    from ..plots import plot_compare
    from ..runtime._progress import announce
    from ..simulation._simulation import simulate
    from ..simulation._simulation_estimate import compare_estimate
    from ..theory._ode import integrate_setup
    from ..theory._starts import initial_conditions

    resume = continued_run(args, ("simulation", "theory_seeds"))
    if resume is None and args.horizon is not None:
        raise ValueError("--horizon is the new horizon of --continue RUN_DIR; without it, set sgd.tau_max")
    setup = prepare_run(args, simulation=True, theory="seeds", continued=resume)
    config = setup.config
    announce(f"the simulation and the theory of {config.simulation.seeds} seeds", compare_estimate(setup))
    if resume is None:
        sim = simulate(config, progress=args.progress)  # warns of dropped saved times and of a rising risk
        theory = integrate_setup(setup, initial_conditions(config), ts=sim.tau)
    else:  # the simulation's weights are not stored: it is rerun, saved at the stored times and the new ones
        old = resume.run.theory
        print(f"singleloc compare: continuing {str(args.resume)!r} to tau = {config.sgd.tau_max:g}: the simulation is rerun "
              f"from tau = 0 (its weights are not stored), the theory of every seed continues from tau = {resume.t0:g}",
              file=sys.stderr)
        sim = simulate(config, progress=args.progress, ts=np.concatenate([old.tau, resume.ts]))
        last = tuple(x[:, -1] for x in (old.M, old.Q, old.b, *(() if old.v is None else (old.v,))))
        theory = joined(old, integrate_setup(setup, last, ts=sim.tau[len(old.tau):], t0=resume.t0))
    setup = theory.resolved(setup)  # as solved: the points of "auto", the route of a switch (the settledness builds its ODE)
    config = setup.config
    title = f"{describe(config)}, D={config.simulation.D}, lr={config.sgd.lr}"
    settled = run_settledness(setup, theory.tau, theory.M, theory.Q, theory.b, theory.risk)
    outcomes = final_outcomes(setup, theory, sim, units=("starts", "seeds"))
    save_run(args.out, config, {
        "simulation.npz": sim.arrays(), "theory.npz": theory.arrays(0) | settled.arrays(0),
        "theory_seeds.npz": {"tau": theory.tau, "M": theory.M, "Q": theory.Q, "b": theory.b, "risk": theory.risk,
                             "risk_se": theory.risk_se} | settled.arrays(),
        "compare.png": plot_compare(theory, sim, title=title, mean=config.problem.build_prior().mean(), outcomes=outcomes)})
    dev = np.abs(sim.risk - theory.risk)
    error = error_text(final_risk_error({"route": theory.route, "risk_error": theory.risk_error, "risk_se": theory.risk_se}))
    print(f"wrote {args.out}/compare.png: simulation risk {sim.risk.mean(0)[0]:.4f} -> {sim.risk.mean(0)[-1]:.4f}, "
          f"theory {theory.risk.mean(0)[0]:.4f} -> {theory.risk.mean(0)[-1]:.4f}{error}, "
          f"max |sim - theory| per seed = {dev.max():.4f}")
    print(f"theory {theory.quadrature()}")
    print(settled.text(f"the theory of {config.simulation.seeds} seeds"))
    print(f"heads at tau = {theory.tau[-1]:g}: theory {outcomes[0]}; simulation {outcomes[1]}")
    return 0
