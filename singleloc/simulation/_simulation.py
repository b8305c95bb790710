"""Finite-D one-pass SGD in the single-location model (docs/model.md section 5).

Step ``t`` draws ``B`` (``sgd.batch``, default 1) fresh sequences and takes the step of the configuration's SGD rule
(:meth:`~singleloc.OnlineSGD.step`, :func:`~singleloc.sgd_rule`) along the gradient of the mean of ``|x_eps - yhat|^2 /
D`` over them, differentiated by JAX, threading the rule's own state (a velocity with momentum). Time counts sequences,
``tau = t B / D``, so a saved time ``tau`` is the step ``round(tau D / B)``. Step ``t`` draws its sequence from
``fold_in(train, t)`` (``B`` of them from the ``B`` keys of ``split(fold_in(train, t), B)``). The run advances all seeds
at once (``vmap``, the seeds split over the local devices by :mod:`~singleloc.expectations._sharding`) inside one jitted
``fori_loop`` per saved interval, and at each saved time records the order parameters and two risks on ``test_samples``
fresh sequences: the empirical finite-D risk and the limit risk of docs/model.md section 3 on the same sequences, drawn
by :func:`~singleloc.model._heldout.draw_heldout` from ``fold_in(test, i)`` (exact in law at a cost independent of D).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Real

from ..configuration._config import Config, gather_specs
from ..configuration._specs import SGD, Model, Problem, Simulation
from ..expectations._sharding import shard_batch, unpad
from ..model._activations import get_activation
from ..model._data import init_keys, make_spikes, overlaps, sample_sequence, seed_keys
from ..model._heldout import draw_heldout, heldout_losses
from ..model._layer import finite_loss
from ..preflight._build import Setup, build
from ..preflight._resources import check_run, check_steps
from ..preflight._run_checks import warn_if_risk_rose, warn_if_times_dropped
from ..runtime._numerics import Q_RUNAWAY
from ..sgd._sgd_rule import LayerParameters
from ._simulation_estimate import simulation_clock
from ._simulation_result import SimulationResult


def save_steps(sgd: SGD, D: int, ts: np.ndarray | None = None) -> np.ndarray:
    """SGD step counts ``t`` at the saved times (``ts``, default those of ``sgd``) in dimension ``D``
    (``tau * D / sgd.batch`` rounded, strictly increasing); ``ValueError`` when there are more than
    :data:`~singleloc.preflight._resources.STEP_MAX` steps."""
    check_steps(sgd.tau_max, D)
    t = np.unique(np.round((sgd.save_times() if ts is None else np.asarray(ts, float)) * D / sgd.batch).astype(np.int64))
    if len(t) < 2:
        fit = max(1, int(sgd.tau_max * D) // max(2, sgd.n_save - 1))
        raise ValueError("sgd.tau_max * simulation.D / sgd.batch is too small: fewer than two distinct saved steps; "
                         f"e.g. sgd.batch = {fit}")
    return t


def _run_functions(setup: Setup):
    """Pure per-seed functions: the initial state, advance by steps, and measure. The state is
    ``(params, rule_state)``: the layer's :class:`~singleloc.sgd._sgd_rule.LayerParameters` and the SGD rule's own
    finite-D state (:meth:`~singleloc.OnlineSGD.init_state`), which the rule's step threads."""
    pb, mdl, sgd, sim, prior, rule = setup.problem, setup.model, setup.sgd, setup.simulation, setup.prior, setup.rule
    act = get_activation(mdl.activation)
    L, F, H, D = pb.L, pb.F, mdl.heads, sim.D
    B = rule.batch
    grad = jax.grad(lambda p, X, eps: finite_loss(act, p.K, p.b, X, eps, p.v))

    def init(index):
        keys = seed_keys(sim.seed, index)
        kstar = make_spikes(keys.spikes, F, D)
        K = init_keys(keys.init, H, D, sgd.init_scale)
        b = jnp.full((H,), mdl.bias_init, dtype=K.dtype)
        v = rule.weighting.layer_start(H, K.dtype)
        params = LayerParameters(K, b, v)
        return (params, rule.init_state(params)), (kstar, keys.train, keys.test)

    def advance(state, consts, t0, t1):
        kstar, train_key, _ = consts

        def gradient(params, key):  # of the mean loss of the step's sequences
            if B == 1:
                return grad(params, *sample_sequence(key, prior, kstar, L))
            grads = jax.vmap(lambda k: grad(params, *sample_sequence(k, prior, kstar, L)))(jax.random.split(key, B))
            return jax.tree.map(lambda g: jnp.mean(g, axis=0), grads)

        def body(t, state):
            params, rule_state = state
            grads = gradient(params, jax.random.fold_in(train_key, t))
            return rule.step(t * (B / D), params, grads, rule_state, D)

        return jax.lax.fori_loop(t0, t1, body, state)

    def measure(state, consts, i):
        params = state[0]
        kstar, _, test_key = consts
        seqs = draw_heldout(jax.random.fold_in(test_key, i), prior, params.K, kstar, sim.test_samples, L)
        emp, lim = heldout_losses(act, seqs, params.b, v=params.v)
        M, Q = overlaps(params.K, kstar)
        record = (M, Q, params.b, jnp.mean(emp), jnp.mean(lim))
        return record if params.v is None else (*record, params.v)

    return init, advance, measure


def simulate(config: Config | None = None, *, problem: Problem | None = None, model: Model | None = None,
             sgd: SGD | None = None, simulation: Simulation | None = None, progress: bool = True,
             ts: Real[ArrayLike, " T"] | Sequence[float] | None = None) -> SimulationResult:
    """Run online SGD for every seed and record the saved trajectory.

    ``sl.simulate(problem=sl.Problem(L=64), model=sl.Model(heads=4), simulation=sl.Simulation(D=1000))``
    or ``sl.simulate(sl.load_config("default"))``.

    Args:
        config: a configuration (see :func:`load_config`), or ``None`` to give the
            specifications by keyword instead (:func:`~singleloc.configuration._config.gather_specs`).
        problem: the data (default :class:`~singleloc.Problem` ``()``; so for every spec not given).
        model: the layer.
        sgd: the SGD rule and its saved times.
        simulation: the finite-D run (dimension, seeds, test samples).
        progress: show a progress bar over the saved times.
        ts: the saved times (default: the config's ``sgd`` grid), rounded to whole SGD steps.

    Raises:
        ValueError, MemoryError: the run cannot be built (:func:`~singleloc.preflight._resources.check_run`:
            dimension, steps, memory), naming the keys.
        FloatingPointError: the dynamics diverged (non-finite or exploding keys); the
            message gives the time and suggests a smaller ``sgd.lr``.

    Warns:
        UserWarning: fewer than ``sgd.n_save`` distinct SGD steps carry the saved times, or the
            limit risk rose during training (:func:`~singleloc.warn_if_risk_rose`).
    """
    config = gather_specs("simulate", config, problem=problem, model=model, sgd=sgd, simulation=simulation)
    setup = build(config, theory=False)  # the prior and the SGD rule, once
    check_run(setup, simulation=True)  # the dimension, the number of steps and the memory, before anything runs
    D = config.simulation.D
    init, advance, measure = _run_functions(setup)
    seeds, _, n = shard_batch(jnp.arange(config.simulation.seeds))
    state, consts = jax.jit(jax.vmap(init))(seeds)
    advance_all = jax.jit(jax.vmap(advance, in_axes=(0, 0, None, None)))
    measure_all = jax.jit(jax.vmap(measure, in_axes=(0, 0, None)))
    steps = save_steps(config.sgd, D, ts)
    warn_if_times_dropped(config.sgd.n_save if ts is None else len(ts), D, len(steps))
    records, t_prev = [], 0  # the clock compiles, times a few steps, says the estimate; its bar records the times
    with simulation_clock(setup, advance_all, measure_all, state, consts, steps, progress) as (advance_all, measure_all, bar):
        for i, t in enumerate(steps):
            if t > t_prev:
                state = advance_all(state, consts, t_prev, int(t))
                bar.update(int(t) - t_prev)
                t_prev = int(t)
            rec = unpad(jax.device_get(measure_all(state, consts, i)), n)
            if not all(np.all(np.isfinite(x)) for x in rec) or np.max(np.abs(rec[1])) > Q_RUNAWAY:  # runaway: a flat loss
                raise FloatingPointError(
                    f"the SGD dynamics diverged by tau = {t / D:.4g} (non-finite or exploding keys, max |Q| = "
                    f"{np.nanmax(np.abs(rec[1])):.3g}); lower {config.sgd.step_keys()} (e.g. sgd.lr = {config.sgd.lr / 4:g}), "
                    f"sgd.init_scale or problem.strength (now {config.problem.strength:g}; the steps grow with its square)")
            records.append(rec)
    M, Q, b, risk, risk_limit, *v = (np.stack([r[j] for r in records], axis=1) for j in range(len(records[0])))
    K, kstar = unpad(jax.device_get((state[0].K, consts[0])), n)
    result = SimulationResult(steps * config.sgd.batch / D, M, Q, b, risk, risk_limit, np.asarray(K), np.asarray(kstar), *v)
    warn_if_risk_rose(setup, simulation=result)
    return result
