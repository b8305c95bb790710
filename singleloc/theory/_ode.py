"""Integration of the order-parameter ODE with diffrax.

The state is ``(M, Q, b)``; the vector field is :meth:`OrderParameterODE.drift`. The solver is Tsit5 with a PID
step-size controller (``theory.rtol``, ``theory.atol``), saving on the config's time grid. A terminating event stops the
solve when the state stops being a valid set of overlaps: a non-finite entry, runaway keys (``max |Q| > 1e6``), or
``R_orth = Q - M M^T`` leaving the PSD cone; the solve also stops where it grows too stiff to follow (a learning rate
far past stability: :mod:`~singleloc.theory._step_budget`). :func:`integrate` then raises with the time at which it
happened.

Replicates and the error of the result. With ``theory.replicates = R``, the rules of ``R`` independent scramblings
(seeds ``qmc_seed + r``) each drive their own trajectory (one batched solve, :func:`_batched`). The result is the mean
over the replicates of ``M``, ``Q``, ``b`` and of the risk; ``risk_se`` is the standard error of that mean (the spread
over replicates over ``sqrt(R)``), so it holds both the quadrature error of the drift, carried along the trajectory, and
that of evaluating the risk. ``drift_error`` is the estimated relative error of the mean drift at the start
(:mod:`~singleloc.theory._accuracy`) and at the end. Whatever ``R``, a route with a scrambled rule states its error at
the first and last saved times from :data:`~singleloc.expectations._expectation.SCRAMBLINGS` further scramblings
(:func:`~singleloc.expectations._expectation.solve_report`): ``R = 1`` is one rule at the cost of one solve, with the
errors of evaluating the risk and the drift there, not the error the drift carried along the trajectory.

The risk of a trajectory is never evaluated on the nodes that drove it: a trained state fits its own rule's error, and
its risk on that rule is biased low (by up to 2e-3 in the Bayes work). Trajectory ``r`` is evaluated on a rule of yet
another scrambling, seed ``qmc_seed + R + r`` (:attr:`Theory.evaluation_seed` ``+ r``).

Compilation. The solve, the risk along it and the drift at the start are one program per shape: the rules, the starts,
the saved times, the tolerances and the learning rate are its arguments, so a new time grid, start or rate of the same
shapes runs without compiling again, and a later process loads it from the cache folder
(:func:`~singleloc.enable_compilation_cache`); on a CPU it is compiled with XLA's loop emitters
(:data:`~singleloc.runtime._compilation.CPU_OPTIONS`: 0.7x the compile time, the same speed). Diffrax runs with
``ForwardMode`` (the solve is never differentiated: no checkpointing, less to trace). :func:`integrate_points` solves
several points of the same shapes as one program.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Real

from ..configuration._config import Config, gather_specs
from ..configuration._specs import ON_THE_RULE, SGD, Model, Problem, Simulation, Theory
from ..expectations._expectation import relative_drift_error, solve_report
from ..expectations._sharding import shard_batch, unpad
from ..preflight._build import Setup, build
from ..preflight._estimates import TheorySolve
from ..preflight._resources import RISK_BATCH, check_run
from ..preflight._run_checks import warn_if_risk_rose
from ..runtime._compilation import checks_as_nan, exported_call, filter_jit
from ..runtime._numerics import PSD_SOLVE, Q_RUNAWAY
from ..sgd._sgd_rule import Starts, flat_drift
from ._accuracy import choose_points
from ._starts import batched_starts, check_starts, initial_conditions
from ._step_budget import MIN_STEP, UNRESOLVED, StepBudget, UnresolvedFields, step_budget, stop_code, stop_reason
from ._theory import OrderParameterODE, OrderParameters, r_orth
from ._theory_result import TheoryResult

#: First step of the adaptive solver (the controller adapts it at once): it spares diffrax's initial step-size
#: search, one more evaluation site of the drift in the compiled program.
DT0 = 1e-3

#: Fewest saved times a solve's program holds (:func:`saved_slots`).
MIN_SLOTS = 16


def saved_slots(n: int) -> int:
    """The saved times a solve of ``n`` saved times holds: the next power of two, at least :data:`MIN_SLOTS`. The
    times past ``n`` repeat the last one (diffrax saves the final state there; no step is added) and their risks
    are not evaluated, so ``sgd.n_save`` = 33 to 64, say, share one program."""
    return max(MIN_SLOTS, 1 << (int(n) - 1).bit_length())


#: Default cap on the adaptive solver's steps (:func:`integrate`, :func:`integrate_points`).
MAX_STEPS = 100_000

def invalid_state(t, y, args, **kwargs):
    """The solve's first event: a state with non-finite entries, runaway keys or ``R_orth`` not PSD."""
    M, Q = y.M, y.Q
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in y]))
    scale = 1.0 + jnp.max(jnp.abs(jnp.where(jnp.isfinite(Q), Q, 0.0)))
    min_eig = jnp.min(jnp.linalg.eigvalsh(jnp.where(finite, r_orth(M, Q), 0.0)))
    return (~finite) | (scale > Q_RUNAWAY) | (min_eig < -PSD_SOLVE * scale)


@eqx.filter_jit
def _vector_field(ode: OrderParameterODE, y: OrderParameters, t) -> OrderParameters:
    """The solve's vector field, a nested program: traced and lowered once, however often diffrax's loops trace
    their bodies (four times)."""
    return ode.state_drift(y, tau=t)


def _solve(ode: OrderParameterODE, y0: OrderParameters, ts: jax.Array, rtol, atol, budget, max_steps: int, progress: bool):
    term = diffrax.ODETerm(lambda t, y, args: _vector_field(ode, y, t))
    unresolved = lambda t, y, args, **kwargs: ~ode.expectation.resolves(y.M, y.Q, y.b)
    controller = StepBudget(diffrax.PIDController(rtol=rtol, atol=atol, dtmin=MIN_STEP, force_dtmin=False),
                            jnp.minimum(budget, max_steps))
    sol = diffrax.diffeqsolve(term, diffrax.Tsit5(), t0=ts[0], t1=ts[-1], dt0=DT0, y0=y0, saveat=diffrax.SaveAt(ts=ts),
                              stepsize_controller=controller, event=diffrax.Event((invalid_state, unresolved)),
                              max_steps=max_steps, throw=False, adjoint=diffrax.ForwardMode(),
                              progress_meter=diffrax.TqdmProgressMeter() if progress else diffrax.NoProgressMeter())
    return sol.ys, stop_code(sol)


def _trajectories(dynamics: OrderParameterODE, evaluation: OrderParameterODE, y0: OrderParameters, ts, rtol, atol, budget,
                  max_steps, progress):
    """Trajectories, their risks on the evaluation rules and the drifts at the start, for
    every start (leading axis of ``y0``) and replicate (leading axis of the ODE stacks)."""
    replicated = dynamics.expectation.replicates > 1  # the rules stack along a leading replicates axis

    def trajectory(dyn, ev, y):
        ys, code = _solve(dyn, y, ts, rtol, atol, budget, max_steps, progress)
        n = 1 + jnp.sum(jnp.diff(ts) > 0)  # the saved times past the n distinct ones repeat the last (saved_slots)
        risk = _risks(ev, ys, n)
        # the exact route's stated error: the risk at the start and at the end on a finer rule
        ends = jnp.stack([0, n - 1])
        at_ends = jax.tree.map(lambda x: x[ends], ys)
        checked = lambda s: jnp.where(jnp.isfinite(s.Q).all(), ev.risk_check(*s), jnp.nan)
        check = jax.lax.map(checked, at_ends)  # one at a time: the finer rule is the largest
        # the drift at the start serves the replicates' error estimate only (one replicate: zeros, not traced)
        drift0 = flat_drift(dyn.state_drift(y)) if replicated else jnp.zeros(sum(x.size for x in y), y.M.dtype)
        grams = jax.vmap(lambda s: dyn.expectation.gram_error(ev.expectation, *s))(at_ends)
        # a plain tuple of the state's fields: the stored program's outputs are built-in containers
        return tuple(ys), risk, code, drift0, jnp.abs(check - risk[ends]), grams

    # the replicates' rules are stacked, their SGD rule (the learning rate) is one for all
    rules = lambda ode: eqx.tree_at(lambda o: o.sgd, jax.tree.map(lambda _: 0, ode), None, is_leaf=lambda x: x is None)
    in_axes = (rules(dynamics), rules(evaluation), None)
    over_replicates = _batched(trajectory, in_axes, dynamics.expectation.replicates)
    return _batched(over_replicates, (None, None, 0), y0.M.shape[0])(dynamics, evaluation, y0)


def _risks(ev: OrderParameterODE, ys: OrderParameters, n: jax.Array) -> jax.Array:
    """The risks of the first ``n`` saved states ``ys`` (a traced count; the others NaN), :data:`RISK_BATCH` states
    at a time in a loop of ``ceil(n / RISK_BATCH)`` turns: one copy of the risk in the program, whatever the
    number of saved times."""
    T = ys.M.shape[0]
    slots = -(-T // RISK_BATCH) * RISK_BATCH
    states = jax.tree.map(lambda x: jnp.concatenate([x, jnp.repeat(x[-1:], slots - T, axis=0)])
                          .reshape(slots // RISK_BATCH, RISK_BATCH, *x.shape[1:]), ys)
    one = lambda s: jnp.where(jnp.isfinite(s.Q).all(), ev.state_risk(s), jnp.nan)

    def batch(i, risk):
        return risk.at[i].set(_batched(one, (0,), RISK_BATCH)(jax.tree.map(lambda x: x[i], states)))

    risk = jnp.full((slots // RISK_BATCH, RISK_BATCH), jnp.nan, ys.M.dtype)
    return jax.lax.fori_loop(0, (n + RISK_BATCH - 1) // RISK_BATCH, batch, risk).reshape(slots)[:T]


def _batched(fn, in_axes, size: int):
    """``jax.vmap(fn, in_axes)`` over a batch of ``size``, or the same values one member at a time (``lax.map``)
    on one CPU device, where a vmapped batch's arrays outgrow the caches (2.5 times as long vmapped, four starts) and
    each member's solve keeps its own steps; a batch of one is ``fn`` of its only element with the batch axis put
    back. A vmapped program also evaluates both branches of every ``lax.cond`` whose predicate depends on the batch
    (the exact route's smoothed-profile tables: :func:`~singleloc.expectations._laplace_profiles.smoothing_table`)."""
    if size != 1 and (jax.default_backend() != "cpu" or jax.local_device_count() > 1):
        return jax.vmap(fn, in_axes=in_axes)

    def member(args, i):
        take = lambda ax, sub: sub if ax is None else jax.tree.map(lambda x: jnp.take(x, i, axis=ax), sub)
        return fn(*jax.tree.map(take, in_axes, args, is_leaf=lambda ax: ax is None))

    if size == 1:
        return lambda *args: jax.tree.map(lambda x: x[None], member(args, 0))
    return lambda *args: jax.lax.map(lambda i: member(args, i), jnp.arange(size))


_run = filter_jit(_trajectories)  # XLA's options for the solve (singleloc.runtime._compilation)


@filter_jit
def _run_points(dynamics: OrderParameterODE, evaluation: OrderParameterODE, y0: OrderParameters, ts, rtol, atol, budget,
                max_steps):
    """:func:`_trajectories` of a batch of points: a leading points axis on every argument, the points in turn on
    one CPU device (:func:`_batched`: four showcase points 1.2-1.8 times as fast as vmapped), vmapped elsewhere."""
    args = (dynamics, evaluation, y0, ts, rtol, atol, budget)
    return _batched(lambda *a: _trajectories(*a, max_steps, False), (0,) * len(args), ts.shape[0])(*args)


@dataclasses.dataclass(frozen=True)
class _Problem:
    """What one point's solve receives: its ``setup``, the arguments of :func:`_trajectories` (``args``: the dynamics
    and evaluation ODE stacks, the starts, the saved times padded to :func:`saved_slots`, of which the first ``saved``
    are asked for, ``rtol``, ``atol``) and the rule it was built with (``points``; ``drift_error`` when ``"auto"``
    chose it)."""

    setup: Setup
    args: tuple
    points: int
    drift_error: float
    saved: int


def _problem(setup: Setup, y0: OrderParameters | None, ts: np.ndarray | None) -> _Problem:
    y0 = batched_starts(initial_conditions(setup.config, 1) if y0 is None else setup.model.weighting.state(y0))
    check_starts(setup.heads, setup.problem.F, y0)
    ts = jnp.asarray(setup.sgd.save_times() if ts is None else ts, dtype=y0.M.dtype)
    th = setup.theory
    R, points, drift_error = th.replicates, th.points, float("nan")
    if points == "auto":
        choice = choose_points(setup, y0)
        points, drift_error = choice.points, choice.error
    dynamics = OrderParameterODE.from_setup(setup, seeds=th.qmc_seed + np.arange(R), points=points)
    evaluation = OrderParameterODE.from_setup(setup, seeds=th.evaluation_seed + np.arange(R), points=points, check=True)
    tol = (jnp.asarray(th.rtol, ts.dtype), jnp.asarray(th.atol, ts.dtype))
    budget = jnp.asarray(step_budget(setup.rule, ts, MAX_STEPS), jnp.int32)  # at least 256 (:mod:`._step_budget`)
    saved = ts.shape[0]
    ts = jnp.concatenate([ts, jnp.full(saved_slots(saved) - saved, ts[-1], ts.dtype)])  # the last time repeated
    points = dynamics.expectation.stated_points(th, setup.problem.L, setup.heads, points)
    return _Problem(setup, (dynamics, evaluation, y0, ts, *tol, budget), int(points), drift_error, saved)


def integrate(config: Config | None = None, y0: Starts | None = None, *, problem: Problem | None = None,
              model: Model | None = None, sgd: SGD | None = None, theory: Theory | None = None,
              simulation: Simulation | None = None, ts: Real[ArrayLike, " T"] | Sequence[float] | None = None,
              max_steps: int = MAX_STEPS, progress: bool = False, t0: float = 0.0) -> TheoryResult:
    """Integrate the order-parameter ODE for one or several initial conditions.

    ``sl.integrate(problem=sl.Problem(L=64), model=sl.Model(heads=4), sgd=sl.SGD(tau_max=300))``
    or ``sl.integrate(sl.load_config("default"))``.

    Args:
        config: a configuration (a TOML file's or a preset's), or ``None`` to give the
            specifications by keyword instead (:func:`~singleloc.configuration._config.gather_specs`).
        y0: initial ``(M0, Q0, b0)``, each with a leading batch axis ``S`` (or none, for one
            start). Default: the overlaps of seed 0 of the simulator's initialisation
            (:func:`~singleloc.initial_conditions`, at ``simulation.D``).
        problem: the data (default :class:`~singleloc.Problem` ``()``; so for every spec not given).
        model: the layer.
        sgd: the SGD rule and its saved times.
        theory: the numerics; ``theory.points = "auto"`` is resolved here by
            :func:`~singleloc.choose_points` at the starts ``y0``.
        simulation: the finite-D initialisation of the default start (only read when ``y0`` is
            not given).
        ts: saved times (default: the config's ``sgd`` grid): finite, strictly increasing, none
            before ``t0``. A first time after ``t0`` is reached by solving from ``t0`` (the start
            itself is then not among the saved times).
        max_steps: cap on the number of solver steps.
        progress: show diffrax's progress bar (the program is then compiled in every process).
        t0: the time ``tau`` of the start ``y0`` (default 0).

    The starts are split over the local devices; one start (fewer starts than devices) has the
    nodes of its rules split instead (:mod:`~singleloc.expectations._sharding`).

    Raises:
        ValueError: invalid ``ts`` or ``t0`` (naming them), or an invalid start.
        ValueError, MemoryError: the solve cannot be built (:func:`~singleloc.preflight._resources.check_run`:
            dimension, quadrature, saved times, memory), naming the keys.
        FloatingPointError: the state left the set of valid overlaps (non-finite, runaway
            keys, or ``R_orth`` not PSD); the message gives the time and suggests a remedy.

    Warns when the risk rose during training (:func:`~singleloc.warn_if_risk_rose`).
    """
    config = gather_specs("integrate", config, problem=problem, model=model, sgd=sgd, theory=theory,
                          simulation=simulation)
    return integrate_setup(build(config), y0, ts=ts, max_steps=max_steps, progress=progress, t0=t0)


def integrate_setup(setup: Setup, y0: Starts | None = None, *, ts: Real[ArrayLike, " T"] | Sequence[float] | None = None,
                    max_steps: int = MAX_STEPS, progress: bool = False, t0: float = 0.0) -> TheoryResult:
    """:func:`integrate` of a config built as ``setup`` (:func:`~singleloc.preflight._build.build`: the prior, the SGD
    rule and the route, chosen once for the checks, the estimate and the solve; the commands pass the one they checked)."""
    start = y0
    try:
        times = np.asarray(setup.sgd.save_times() if ts is None else ts, dtype=np.float64)
        t0 = float(t0)
    except (TypeError, ValueError):
        raise ValueError(f"ts and t0 must be numbers (saved times tau), got ts = {ts!r:.80}, t0 = {t0!r:.40}") from None
    if times.ndim != 1 or times.size == 0:
        raise ValueError(f"ts must be a non-empty 1-D sequence of saved times, got shape {times.shape}")
    if not np.isfinite(t0):
        raise ValueError(f"t0 must be finite, got {t0}")
    if not np.all(np.isfinite(times)):
        i = int(np.argmin(np.isfinite(times)))
        raise ValueError(f"ts must be finite, got ts[{i}] = {times[i]}")
    if np.any(np.diff(times) <= 0):
        i = int(np.argmax(np.diff(times) <= 0))
        raise ValueError(f"ts must be strictly increasing (the solve runs forward in tau), got ts[{i}] = {times[i]:g} "
                         f"then ts[{i + 1}] = {times[i + 1]:g}")
    if times[0] < t0:
        raise ValueError(f"ts starts at {times[0]:g}, before the start y0 at t0 = {t0:g}: the saved times must be >= t0 "
                         "(pass t0 = the time of y0 to start elsewhere than tau = 0)")
    skip = bool(times[0] > t0)  # solve from the start at t0; do not return it
    starts = 1 if y0 is None or np.ndim(y0[0]) != 3 else int(np.shape(y0[0])[0])
    check_run(setup, theory_starts=starts)  # dimension, quadrature, saved times and memory
    solve = TheorySolve("integrate", setup, starts, times.size + skip, times[-1] - t0, cached=not progress)
    solve.announce()  # the estimate, before anything is built (singleloc.preflight._estimates)
    with solve.preparing():  # the rules and starts (said only if it lasts)
        problem = _problem(setup, y0, np.concatenate([[t0], times]) if skip else times)
    dynamics, evaluation, y0, *rest = problem.args
    y0, (dynamics, evaluation, *rest), n = shard_batch(y0, (dynamics, evaluation, *rest))
    args = (dynamics, evaluation, y0, *rest)
    result = _result(problem, _solved(solve, "integrate", _run, args, (max_steps, progress), n, progress), max_steps)
    if isinstance(result, UnresolvedFields) and setup.theory.route == "auto":  # auto's choice: on to the Sobol rule
        warnings.warn(f"{str(result).split(';')[0]}: solving on the Sobol rule instead (theory.route = 'rule')",
                      stacklevel=2)  # a warning, said also without progress lines: the run changes route
        return integrate_setup(build(setup.config.replace(theory=ON_THE_RULE)), start, ts=ts, max_steps=max_steps,
                               progress=progress, t0=t0)
    if isinstance(result, FloatingPointError):
        raise result
    if skip:  # the start at t0, solved from but not asked for
        later = lambda x: x[:, 1:]
        result = dataclasses.replace(result, tau=result.tau[1:], M=later(result.M), Q=later(result.Q), b=later(result.b),
                                     risk=later(result.risk), risk_se=later(result.risk_se),
                                     v=None if result.v is None else later(result.v))
    warn_if_risk_rose(setup, theory=result)
    return result


def integrate_points(problems: Sequence[tuple[Config, OrderParameters | None]], *, max_steps: int = MAX_STEPS
                     ) -> list[TheoryResult | FloatingPointError]:
    """:func:`integrate` of several points ``(config, y0)``: points whose arrays have the same shapes share one
    program, their ODE stacks, starts, saved times and tolerances stacked along a leading axis, split over the local
    devices, each trajectory with its own adaptive steps; the results equal :func:`integrate`'s (bit for bit on one
    CPU device, where the points are solved in turn; to the solver's tolerance vmapped). Returns one result per
    point, in order, or the :class:`FloatingPointError` :func:`integrate` would raise for it."""
    prepared = [_problem(build(config), y0, None) for config, y0 in problems]  # each point's route decided once
    groups: dict[tuple, list[int]] = {}
    for i, problem in enumerate(prepared):
        groups.setdefault(_shape_key(problem.args), []).append(i)
    results: list = [None] * len(prepared)
    for members in groups.values():
        stacked = jax.tree.map(lambda *x: jnp.stack(x), *(prepared[i].args for i in members))
        stacked, _, n = shard_batch(stacked)
        solve = TheorySolve.of_batch([prepared[i] for i in members])
        out = _solved(solve, "integrate_points", _run_points, stacked, (max_steps,), n)
        for j, i in enumerate(members):
            results[i] = _result(prepared[i], jax.tree.map(lambda x, j=j: x[j], out), max_steps)
    redo = [i for i, r in enumerate(results) if isinstance(r, UnresolvedFields) and problems[i][0].theory.route == "auto"]
    if redo:  # auto's choice, as integrate does: on to the Sobol rule
        warnings.warn(f"{len(redo)} of {len(results)} points (theory.route = 'auto') left what the exact route's rule "
                      "resolves: solving them on the Sobol rule instead (theory.route = 'rule')", stacklevel=2)
        rule = [(problems[i][0].replace(theory=ON_THE_RULE), problems[i][1]) for i in redo]
        for i, result in zip(redo, integrate_points(rule, max_steps=max_steps)):
            results[i] = result
    return results


def _solved(solve: TheorySolve, name: str, program, args: tuple, static: tuple, n: int, progress: bool = False):
    """``program(*args, *static)``'s outputs for the first ``n`` of the batch (:func:`exported_call`'s stored program
    unless ``progress``), its compiling or loading and solving said on stderr and recorded by ``solve``."""
    with solve.solving(), checks_as_nan():  # the progress bar's program is traced here (exported_call sets it itself)
        out = jax.device_get(program(*args, *static) if progress else exported_call(name, program, *args, static=static))
        solve.finished = bool(np.all(np.asarray(out[2]) == 0))  # a solve stopped early: no rate recorded
    return unpad(out, n)


def _shape_key(args) -> tuple:
    """What decides the program of :func:`_trajectories`: the structure and static values of the
    arguments and the shapes and dtypes of their arrays."""
    leaves, treedef = jax.tree.flatten(args)
    return str(treedef), tuple((x.shape, str(x.dtype)) for x in leaves)


def _result(problem: _Problem, out, max_steps: int) -> TheoryResult | FloatingPointError:
    """The :class:`TheoryResult` of one point's outputs of :func:`_trajectories`, or the error
    that says where its solve stopped and why."""
    setup, ts = problem.setup, problem.args[3][:problem.saved]
    R = setup.theory.replicates
    ys, risk, code, drift0, check, grams = out
    rule = setup.rule  # its State, and the layer's head weights v along it (None: the head average)
    ys, risk = rule.State(*(x[:, :, :problem.saved] for x in ys)), risk[:, :, :problem.saved]  # padding's repeats dropped
    M, Q, b, v = ys.M, ys.Q, ys.b, rule.weighting.weights(ys)
    valid, ok, unresolved = np.isfinite(risk), np.asarray(code) == 0, np.asarray(code) == UNRESOLVED
    if not np.all(ok) or not np.all(valid):
        first = np.argmax(unresolved) if unresolved.any() else np.argmin(np.all(valid, axis=2) & ok)
        i, r = np.unravel_index(first, ok.shape)
        k = int(np.argmin(valid[i, r])) if not np.all(valid[i, r]) else len(ts) - 1
        when = f"tau = {float(ts[k - 1]):.4g}..{float(ts[k]):.4g}" if k else f"its start, tau = {float(ts[0]):.4g}"
        code = int(code[i, r])  # smaller steps do not make a stiff solve (codes 2, 3) any less stiff
        if code == UNRESOLVED:  # only the exact route's rule has a width it resolves
            return UnresolvedFields.at(when, i, float(np.max(problem.args[0].expectation.rule.widest)), setup.theory.nodes)
        return FloatingPointError(
            f"the order-parameter ODE stopped near {when} (start {i}{f', replicate {r}' if R > 1 else ''}): "
            f"{stop_reason(code, min(max_steps, int(problem.args[6])))}; lower {setup.sgd.step_keys()}"
            + (" or tighten theory.rtol/theory.atol" if code in (0, 1) else ""))
    drift_error = problem.drift_error
    risk_se = risk.std(axis=1, ddof=1) / np.sqrt(R) if R > 1 else np.full(risk.shape[::2], np.nan)
    if R > 1:
        drift_error = float(np.max(relative_drift_error(drift0))) / np.sqrt(R)
    mean = lambda x: x.mean(axis=1)
    dynamics, evaluation = problem.args[0], problem.args[1]
    report = solve_report(setup, ys, risk, check, grams, risk_se, evaluation.expectation, evaluation.sgd, problem.points)
    stated = evaluation.expectation.statement(report)
    drift_error = float(np.fmax(drift_error, stated.drift_error))  # the start (replicates, "auto") and the ends
    return TheoryResult(np.asarray(ts), mean(M), mean(Q), mean(b), mean(risk), risk_se, drift_error, problem.points, R,
                        evaluation.expectation.route, stated.risk_error, stated.gram_error, stated.exact_drift_error,
                        None if v is None else mean(v), dynamics.expectation.gram_name, setup.theory.axes)
