"""The work of sweep points (:mod:`singleloc.sweeps._sweep`): the entries of a point, as pure functions
of its resolved configuration, and their batching.

A point needs entries of the kinds :data:`KINDS` (the escape prediction, :func:`compute_theory`,
:func:`compute_simulation`, :func:`compute_bayes` of its problem); :func:`compute` gives any of them.
:func:`compute_points` (and :func:`compute_point`, one point) is what a worker runs: it needs nothing but the
configurations, so the points can be computed anywhere.

Batching. Theory points that differ only in the :data:`~singleloc.runtime._compilation.VALUE_KEYS` (the horizon of
``horizon="auto"`` among them) have arrays of the same shapes: with ``batch=True`` (the default) they are one task,
one batched solve of all their seeds' starts with one compilation (:func:`~singleloc.theory._ode.integrate_points`).
Every trajectory keeps its own adaptive steps, so a point's entry equals its own solve (bit for bit on one CPU
device, where the points go in turn; to the solver's tolerance vmapped; the cache key does not say which, and either
entry serves). Escape predictions and simulations run one point after the other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from ..analysis._predictions import compute_prediction
from ..configuration._config import Config, load_config
from ..expectations._routes import route_class
from ..preflight._build import build
from ..preflight._estimates import recorded
from ..runtime._compilation import compile_group, hold_programs, own_process, process_owned
from ..runtime._progress import on_dask_worker
from ..simulation._simulation import simulate as simulate_sgd
from ..theory._ode import integrate, integrate_points
from ..theory._starts import initial_conditions

#: The kinds of cache entries, in the order a point needs them.
KINDS = ("prediction", "theory", "simulation", "bayes")

#: The ``[theory]`` keys the Bayes risk's Sobol rule depends on (:func:`bayes_config`; not its exact route's).
BAYES_THEORY_KEYS = ("points", "qmc_seed")

#: Sobol points of the Bayes risk's rule route where the point has ``theory.points = "auto"``.
BAYES_POINTS = 4096


# The expensive steps; module-level so that tests can count or replace them.
def compute_theory(config: Config) -> dict[str, np.ndarray]:
    """ODE trajectories from the initial overlaps of every seed (one batched solve), with the
    route and stated errors of the quadrature (:meth:`~singleloc.TheoryResult.statement`)."""
    return _theory_arrays(integrate(config, initial_conditions(config), progress=False))


def compute_simulation(config: Config) -> dict[str, np.ndarray]:
    """Finite-D SGD for every seed: ``risk`` (empirical) and ``risk_limit`` as in :class:`~singleloc.SimulationResult`."""
    r = simulate_sgd(config, progress=False)
    return _trajectory_arrays(r) | {"risk_limit": r.risk_limit}


def bayes_config(config: Config) -> Config:
    """The configuration of the Bayes risk of a point: its ``[problem]`` and, where the Bayes risk
    takes a route over the fields' nodes (:func:`~singleloc.bayes._bayes.bayes_route` with ``"auto"``), the
    ``[theory]`` keys of its Sobol rule (:data:`BAYES_THEORY_KEYS`), every other key (``theory.route`` included) at
    its default, so that the points of one problem share one cache entry (docs/model.md section 6)."""
    from ..bayes._bayes import bayes_route

    data = config.to_dict()
    rule = route_class(bayes_route(config.problem.build_prior(), "auto")).field_nodes
    return load_config({"problem": data["problem"], "theory": {k: data["theory"][k] for k in BAYES_THEORY_KEYS} if rule else {}})


def compute_bayes(config: Config) -> dict[str, np.ndarray]:
    """The Bayes risk of the problem (:func:`~singleloc.bayes_risk` on its ``"auto"`` route: exact
    for a discrete prior of up to four atoms, else on ``theory.points`` Sobol points (4096 for
    ``"auto"``) over 8 scramblings) as ``bayes_risk``, its error ``bayes_risk_error`` and ``bayes_route``."""
    from ..bayes._bayes import bayes_risk, bayes_route

    pb, th = config.problem, config.theory
    prior = pb.build_prior()
    route = bayes_route(prior, "auto")
    points = BAYES_POINTS if th.points == "auto" else th.points
    risk = bayes_risk(prior, pb.L, points=points, seed=th.qmc_seed, route=route)
    return {"bayes_risk": np.asarray(risk.value), "bayes_risk_error": np.asarray(risk.error), "bayes_route": np.asarray(route)}


def _theory_arrays(r) -> dict[str, np.ndarray]:
    """A theory entry: the trajectories, ``risk_se`` (NaN for one replicate) and the statement."""
    return _trajectory_arrays(r) | {"risk_se": r.risk_se} | r.statement()


def _trajectory_arrays(r) -> dict[str, np.ndarray]:
    """The arrays of a theory or simulation entry: ``tau``, ``M``, ``Q``, ``b``, ``risk``, and ``v``
    with trained head weights."""
    return {"tau": r.tau, "M": r.M, "Q": r.Q, "b": r.b, "risk": r.risk} | ({} if r.v is None else {"v": r.v})


def compute(config: Config, kind: str) -> dict[str, np.ndarray]:
    """The entry of ``kind`` (``"prediction"``, ``"theory"``, ``"simulation"`` or ``"bayes"``)
    for ``config``, computed (for a theory or simulation entry ``config`` is the resolved one,
    :func:`~singleloc.analysis._predictions.resolve_horizon`; for a Bayes entry :func:`bayes_config`)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")
    if kind != "prediction":
        return {"theory": compute_theory, "simulation": compute_simulation, "bayes": compute_bayes}[kind](config)
    setup = build(config)  # the route decided once, for the prediction and its recorded time
    with recorded(setup):  # a prediction's time, for the next sweep's estimate (singleloc.sweeps._sweep_estimate)
        return compute_prediction(setup)


def compute_theories(configs: Sequence[Config]) -> list[dict[str, np.ndarray] | FloatingPointError]:
    """:func:`compute_theory` of several points as one batched solve per shape (in turn on one CPU device)
    (:func:`~singleloc.theory._ode.integrate_points`): the arrays of each point, or the error its solve stopped with."""
    results = integrate_points([(config, initial_conditions(config)) for config in configs])
    return [r if isinstance(r, FloatingPointError) else _theory_arrays(r) for r in results]


#: The kinds of entries whose points are batched (the others run one point after the other).
BATCH_KINDS = ("theory",)


def compute_points(kind: str, *configs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, np.ndarray] | BaseException]:
    """The work of sweep points of one :func:`compile_group`, run on a worker: the entries of ``kind`` for the
    resolved configurations ``configs`` (:meth:`Config.to_dict`), as NumPy arrays, or the exception a point raised
    (the others go on); several theory points in one batched solve (:func:`compute_theories`). On a Dask worker it
    sets double precision; in a process the package owns it holds the programs of a bounded number of shapes
    (:func:`~singleloc.runtime._compilation.hold_programs`)."""
    if on_dask_worker():
        own_process()
        jax.config.update("jax_enable_x64", True)
    if process_owned():
        hold_programs(compile_group(kind, configs[0]))  # a bounded number of groups' programs per process
    resolved = [load_config(config) for config in configs]
    if kind in BATCH_KINDS and len(resolved) > 1:
        results: list = compute_theories(resolved)
    else:
        results = []
        for config in resolved:
            try:
                results.append(compute(config, kind))
            except Exception as err:  # reported for this point only
                results.append(err)
    return [r if isinstance(r, BaseException) else {name: np.asarray(value) for name, value in r.items()} for r in results]


def compute_point(kind: str, config: Mapping[str, Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """:func:`compute_points` of one point, run on a worker; its exception is raised."""
    (result,) = compute_points(kind, config)
    if isinstance(result, BaseException):
        raise result
    return result
