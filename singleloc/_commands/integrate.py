"""``singleloc integrate CONFIG --out DIR``: the order-parameter ODE."""

from __future__ import annotations

import sys

from ._common import add_config_arguments, add_force_argument, add_out_argument, continued_run, describe, joined, prepare_run
from .sweep import horizon_type

#: Above this ``sgd.tau_max`` (the sweep's horizon cap), ``integrate`` says that the solve may be
#: long and shows diffrax's progress bar (whose host callback keeps the program out of the
#: persistent compilation cache, which a long solve does not miss).
LONG_TAU = 3000.0

#: Above this step between saved times on a linear grid, ``integrate`` suggests a log grid: the
#: first drop of the risk (over a few units of tau at the presets) would fall between saved times.
COARSE_STEP = 2.0


def register(sub) -> None:
    p = sub.add_parser(
        "integrate",
        help="integrate the order-parameter ODE (theory) and save the trajectory",
        description="Integrate the D -> infinity ODE of (M, Q, b) with diffrax, starting from "
        "the overlaps of the simulator's initial weights for seed 0 (simulation.seed, "
        "simulation.D), and save at the sgd time grid. Writes DIR/theory.npz with tau (T), "
        "M (T,H,F), Q (T,H,H), b (T,H), risk (T), DIR/theory.png (the risk and the overlaps M_hf against "
        "tau; `singleloc plot DIR` adds the phases) and DIR/config.json; every file carries the "
        "config hash, and DIR is replaced as a whole. --continue RUN_DIR --horizon TAU continues a stored run.",
    )
    add_config_arguments(p, resume=True)
    p.add_argument("--horizon", type=horizon_type, default="config", metavar="config|auto|TAU",
                   help="how far to integrate: config (default): sgd.tau_max on the config's grid; auto: 5 times "
                   "the predicted escape from the unspecialized plateau (tau_0 + log(D) / (2 lambda), as `sweep` "
                   "predicts it; rounded up to two digits, at most 3000, 300 without a predicted escape); TAU: that "
                   "time; both on a log grid of at least 201 saved times; with --continue: TAU, the new horizon")
    add_force_argument(p)
    add_out_argument(p, run=True)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..analysis._settled import run_settledness
    from ..analysis._sweep_answers import error_text, final_risk_error
    from ..io._run_folders import save_run
    from ..plots import plot_compare
    from ..theory._ode import MAX_STEPS, integrate_setup

    resume = continued_run(args, ("theory",))
    setup = prepare_run(args, theory="one" if args.horizon == "auto" else None, continued=resume)  # integrate checks its own run
    config = setup.config
    predicted = {}
    if resume is not None:
        predicted = {k: v for k, v in resume.run.data["theory"].items() if k == "predicted_escape"}
        print(f"singleloc integrate: continuing {str(args.resume)!r} from tau = {resume.t0:g} to {config.sgd.tau_max:g}",
              file=sys.stderr)
    elif args.horizon != "config":
        setup, predicted = _resolve_horizon(setup, args.horizon)  # the horizon's grid (and points)
        config = setup.config
    step = config.sgd.tau_max / max(config.sgd.n_save - 1, 1)
    if resume is None and config.sgd.spacing == "linear" and step > COARSE_STEP:
        print(f"singleloc integrate: note: a linear grid of {config.sgd.n_save} saved times is a step of {step:.3g} in tau, "
              "coarser than the first drop of the risk; --set sgd.spacing=log saves on a log grid (as --horizon TAU does)",
              file=sys.stderr)
    long = config.sgd.tau_max > LONG_TAU
    if long:  # the number of adaptive steps is not known before: say the bound, and show the solve
        points = config.theory.points  # the nodes of a rule route's drift (the exact route's rule is its own)
        nodes = "" if not setup.route.route_class.field_nodes else (
            f" over {2 * points if points != 'auto' else 'the'} quadrature nodes")
        print(f"singleloc integrate: note: sgd.tau_max = {config.sgd.tau_max:g} is a long solve: up to {MAX_STEPS} adaptive "
              f"steps (each 6 drift evaluations{nodes}), which can take many minutes"
              f"{'; its progress bar follows' if args.progress else ''}", file=sys.stderr)
    if resume is None:
        result = integrate_setup(setup, max_steps=MAX_STEPS, progress=long and args.progress)
    else:  # from the stored state at its last saved time: the stored run's shapes, so its compiled program
        old = resume.run.theory
        last = tuple(x[:, -1] for x in (old.M, old.Q, old.b, *(() if old.v is None else (old.v,))))
        new = integrate_setup(setup, last, ts=resume.ts, t0=resume.t0, max_steps=MAX_STEPS, progress=long and args.progress)
        result = joined(old, new)
    setup = result.resolved(setup)  # as solved: the points of "auto", the route of a switch (the settledness builds its ODE)
    config = setup.config
    sim = config.simulation
    title = f"{describe(config)}, theory from the D={sim.D} start of seed {sim.seed}, lr={config.sgd.lr}"
    settled = run_settledness(setup, result.tau, result.M, result.Q, result.b, result.risk)
    figure = plot_compare(result, title=title, mean=config.problem.build_prior().mean())
    path = save_run(args.out, config, {"theory.npz": result.arrays(0) | settled.arrays(0) | predicted,
                                       "theory.png": figure}) / "theory.npz"
    print(f"wrote {path} and theory.png: tau 0..{result.tau[-1]:g}, risk {result.risk[0, 0]:.4f} -> {result.risk[0, -1]:.4f}"
          f"{error_text(final_risk_error(result.arrays(0)))}")
    print(result.quadrature())
    print(settled.text("the run"))
    return 0


def _resolve_horizon(setup, horizon):
    """``setup`` integrated to ``horizon`` (``"auto"``: the predicted escape's horizon, as a sweep
    point; a number), on the sweep's log grid (:func:`singleloc.analysis._predictions.resolve_horizon`), and
    the prediction as ``theory.npz`` keeps it (``{"predicted_escape": tau}`` with ``"auto"``, for
    ``plot``'s phases.png; else empty)."""
    import numpy as np

    from ..analysis._predictions import EscapePrediction, compute_prediction, resolve_horizon
    from ..preflight._estimates import prediction_estimate, recorded
    from ..runtime._progress import announce

    entry, said, predicted = None, "horizon given", {}
    if horizon == "auto":
        announce("predicting the escape from the unspecialized plateau (the head-symmetric flow, then the start's "
                 "symmetry-breaking part carried by its linearisations)", prediction_estimate(setup), "give --horizon a number")
        with recorded(setup):  # its time, for the next estimate
            entry = compute_prediction(setup)  # on the route decided (no second decision)
        prediction = EscapePrediction.from_arrays(entry)
        said = (f"predicted escape at tau = {prediction.predicted_escape:.3g} (plateau from tau = {prediction.tau_plateau:.3g}, "
                f"escape rate lambda = {prediction.rate:.3g})" if prediction.escapes else "no escape predicted")
        predicted = {"predicted_escape": np.asarray(prediction.predicted_escape, float)}
    setup = resolve_horizon(setup, entry, horizon)
    print(f"singleloc integrate: {said}; integrating to tau = {setup.sgd.tau_max:g} on a log grid of {setup.sgd.n_save} "
          "saved times", file=sys.stderr)
    return setup, predicted
