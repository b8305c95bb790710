"""``singleloc simulate CONFIG --out DIR``: finite-D online SGD for every seed."""

from __future__ import annotations

from ._common import add_config_arguments, add_force_argument, add_out_argument, prepare_run


def register(sub) -> None:
    p = sub.add_parser(
        "simulate",
        help="run finite-D online SGD and save the order parameters and risks",
        description="Run one-pass SGD of the multi-head attention layer at dimension "
        "simulation.D for simulation.seeds seeds (batched), saving at the sgd time grid. "
        "Writes DIR/simulation.npz with tau (T), M (S,T,H,F), Q (S,T,H,H), b (S,T,H), "
        "risk (S,T) (empirical test risk) and risk_limit (S,T) (limit loss on the same test "
        "sequences), and DIR/config.json (the resolved config, its hash and the package version); "
        "every file carries the config hash, and DIR is replaced as a whole.",
    )
    add_config_arguments(p)
    add_force_argument(p)
    add_out_argument(p, run=True)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..io._run_folders import save_simulation
    from ..simulation._simulation import simulate

    config = prepare_run(args, simulation=True).config
    result = simulate(config, progress=args.progress)  # warns of dropped saved times and of a rising risk
    path = save_simulation(args.out, config, result)
    r = result.risk.mean(axis=0)
    print(f"wrote {path}: tau 0..{result.tau[-1]:g}, risk {r[0]:.4f} -> {r[-1]:.4f} (mean over {result.risk.shape[0]} seeds)")
    return 0
