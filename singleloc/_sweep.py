"""Parameter sweeps with an on-disk cache: ``singleloc sweep CONFIG --grid section.key=v1,v2``.

A sweep takes a base configuration and one or more grids ``section.key = v1, v2, ...``; the
points are their Cartesian product. At each point it

1. predicts the escape from the unspecialized plateau and the horizon
   (:func:`singleloc._predictions.predicted_escape`: ``tau_0 + log(D) / (2 lambda)`` from the
   linearisation along the symmetric flow; horizon 2.5 times that, rounded up to two digits,
   at most 3000; 300 when no escape is predicted); with ``theory.points = "auto"`` it first
   chooses the point's number of points (:func:`~singleloc.resolve_points` at the starts of
   step 3), stored with the prediction and used by every later step of the point;
2. resolves the configuration it integrates (:func:`resolve_horizon`): with ``horizon="auto"``
   (the default) ``sgd.tau_max`` is the point's horizon, with a number it is that number,
   and both save ``max(sgd.n_save, 201)`` times on a log grid (``sgd.spacing = "log"``:
   ``tau = 0`` and log-spaced from ``tau_max / 1000``), which resolves the plateau and an
   escape at any of these horizons; ``horizon="config"`` keeps the configuration as it is;
3. integrates the ODE from the simulator's initial overlaps of every seed
   (``simulation.seeds`` starts, one batched, vmapped solve) and, optionally, runs the
   finite-D simulation, both on the resolved configuration;
4. analyses the phases (:func:`singleloc._phase_analysis.analyze`) of the limit risk (the
   theory's ``risk``, the simulation's ``risk_limit``) with the heads' attention weights
   (:func:`singleloc._predictions.head_weights`), which classify every head (``aligned``,
   ``leaning``, ``combination``, ``redundant``, ``off``, ``unspecialized``).

Each step is a pure function of its configuration (:func:`compute` with the kinds
``prediction``, ``theory``, ``simulation``; :func:`resolve_horizon`), so the points can be
computed anywhere.

Batching. Theory points that differ only in the :data:`VALUE_KEYS` (``problem.strength``,
``sgd.lr``, ``sgd.init_scale``, ``sgd.tau_max``, so also the horizon of ``horizon="auto"``,
``simulation.seed``, ``simulation.D``, ``theory.qmc_seed``, ``theory.rtol``, ``theory.atol``) have
arrays of the same shapes: with ``batch=True`` (the default) they are one task, one vmapped solve
of all their seeds' starts with one compilation (:func:`~singleloc._ode.integrate_points`; a group
is one Dask task with ``workers`` or ``scheduler``, cut into near-equal parts when it holds more
than ``1 / T`` of the points, with ``T`` the tasks the cluster runs at once,
:func:`split_groups`). Every trajectory keeps its own adaptive steps, so a point's entry equals
its own solve to the solver's tolerance (not bitwise: the batched program rounds differently; the
cache key does not say which, and either entry serves). Any other key (``model.heads``,
``problem.F``, ``problem.L``, the prior, ``model.activation``, ``theory.points``,
``theory.replicates``, ``simulation.seeds``, ``sgd.n_save``, ...) starts another group.
Escape predictions and simulations run one point after the other.

Cache. Every computed point is stored as ``CACHE/<kind>-<key>.npz`` (kind ``theory`` or
``simulation``), where ``key`` is the SHA-256 (first 24 hex digits) of the canonical JSON of
the configuration (for a theory or simulation entry the resolved one, so the key includes the
horizon), the package version, :data:`CACHE_VERSION` and the kind. A repeated sweep therefore
recomputes nothing, and changing one value of the base configuration recomputes only the
points whose configuration changed. A prediction entry holds the fields of
:class:`~singleloc.EscapePrediction`; a theory entry ``tau``, ``M``, ``Q``, ``b`` and ``risk`` as
:class:`~singleloc.TheoryResult`; a simulation entry the same names as
:class:`~singleloc.SimulationResult` (``risk`` the empirical finite-D risk, ``risk_limit`` the
limit loss). Files are written atomically (:mod:`singleloc._io`); a failed point (the ODE left
the valid set) is not cached, and a damaged entry (unreadable, truncated, or without one of
its arrays) is reported in one warning line, recomputed and replaced.

Output: ``DIR/sweep.csv`` with one row per point: the grid values, ``activation``, ``heads``,
``F``, ``status``, the prediction (``lambda``, ``tau_plateau``, ``predicted_escape``,
``horizon``), the phase summary of the theory (means over the seeds of
:meth:`PhaseAnalysis.summary`: ``final_risk``, ``escaped`` (fraction of seeds),
``escape_time``, ``first_learned``, ``first_specialization``, ``n_<class>`` for every head class,
``leaning_angle_spike``, ``leaning_angle_mean``, ``n_directions``, ``shared_profiles``), the
same for the simulation with a ``sim_`` prefix, and the cache ``key``. ``status`` is ``ok``,
``not yet (predicted escape at tau = X)`` for a point with a predicted escape where some seed
has not escaped by the horizon, or the failure. One phase diagram over ``(H, F)`` per
activation (and per value of the other grid keys): ``DIR/phase_<activation>[_<key>=<value>...].png``.
The trajectories of every point with the columns of the CSV, as labelled arrays over the grid
keys, the seeds and the saved times, go to ``DIR/sweep.nc`` (:mod:`singleloc._sweep_dataset`),
read back by :func:`~singleloc.load_sweep`.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import hashlib
import io
import json
import math
import re
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ._compilation import hold_programs
from ._config import Config, load_config, require_config
from ._distributed import Cluster, open_cluster, run_points
from ._files import OUTPUT_KEY, png_has_text, written_together
from ._grid import Grid, grid_points
from ._head_classes import HEAD_CLASSES
from ._io import NPZ_ERRORS, load_npz, npz_names, save_figure, save_npz, save_text
from ._ode import initial_conditions, integrate, integrate_points, resolve_points
from ._phase_analysis import analyze
from ._predictions import EscapePrediction, head_weights, predicted_escape
from ._simulation import simulate as simulate_sgd
from ._sweep_dataset import write_sweep
from ._theory import OrderParameterODE
from ._version import __version__
from .plots import plot_phase_diagram

#: Layout of the cache entries; part of every cache key, so that entries of an earlier layout
#: are never read. 2: a simulation entry's ``risk`` is the empirical risk (1: the limit risk).
CACHE_VERSION = 2

#: Least number of saved times of a point integrated to a predicted or given horizon.
HORIZON_N_SAVE = 201

#: The kinds of cache entries, in the order a point needs them.
KINDS = ("prediction", "theory", "simulation")

#: The risk the phase analysis reads in an entry of each kind: the limit risk in both.
PHASE_RISK = {"theory": "risk", "simulation": "risk_limit"}


def cache_key(config: Config, kind: str) -> str:
    """SHA-256 of the canonical JSON of the resolved config, the package version, the cache
    layout version and the kind."""
    data = {"singleloc_version": __version__, "cache_version": CACHE_VERSION, "kind": kind, "config": config.to_dict()}
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _check_horizon(horizon) -> None:
    if horizon in ("auto", "config"):
        return
    if isinstance(horizon, bool) or not isinstance(horizon, (int, float)) or not math.isfinite(horizon) or horizon <= 0:
        raise ValueError(f"horizon must be 'auto', 'config' or a positive number, got {horizon!r}")


def resolve_horizon(config: Config, prediction: EscapePrediction, horizon: str | float = "auto") -> Config:
    """The configuration a point is integrated with (module docstring): ``"auto"``: up to the
    prediction's horizon; a number: up to it; both on a log grid of
    ``max(sgd.n_save, HORIZON_N_SAVE)`` times. ``"config"``: ``config`` unchanged."""
    _check_horizon(horizon)
    if horizon == "config":
        return config
    tau_max = prediction.horizon if horizon == "auto" else float(horizon)
    return config.replace(sgd={"tau_max": tau_max, "spacing": "log", "n_save": max(config.sgd.n_save, HORIZON_N_SAVE)})


# The expensive steps; module-level so that tests can count or replace them.
def compute_prediction(config: Config) -> dict[str, np.ndarray]:
    """The predicted escape and horizon (:func:`~singleloc._predictions.predicted_escape`) as arrays.
    With ``theory.points = "auto"`` the number of points is chosen here, once for the point, at the
    starts its theory integrates from (:func:`~singleloc.resolve_points` at the initial overlaps of
    every seed), and stored in the entry as ``points``: the prediction, the theory and the phase
    summaries of the point all use it (:func:`with_chosen_points`)."""
    if config.theory.points != "auto":
        return predicted_escape(config).arrays()
    resolved = resolve_points(config, initial_conditions(config))
    return predicted_escape(resolved).arrays() | {"points": np.asarray(resolved.theory.points)}


def with_chosen_points(config: Config, prediction: Mapping[str, np.ndarray]) -> Config:
    """``config`` with ``theory.points = "auto"`` replaced by the number its prediction entry
    chose (:func:`compute_prediction`); ``config`` itself otherwise."""
    if config.theory.points != "auto" or "points" not in prediction:
        return config
    return config.replace(theory={"points": int(prediction["points"])})


def compute_theory(config: Config) -> dict[str, np.ndarray]:
    """ODE trajectories from the initial overlaps of every seed (one batched solve)."""
    r = integrate(config, initial_conditions(config), progress=False)
    return {"tau": r.tau, "M": r.M, "Q": r.Q, "b": r.b, "risk": r.risk}


def compute_simulation(config: Config) -> dict[str, np.ndarray]:
    """Finite-D SGD for every seed: ``risk`` (empirical) and ``risk_limit`` as in :class:`~singleloc.SimulationResult`."""
    r = simulate_sgd(config, progress=False)
    return {"tau": r.tau, "M": r.M, "Q": r.Q, "b": r.b, "risk": r.risk, "risk_limit": r.risk_limit}


def compute(config: Config, kind: str) -> dict[str, np.ndarray]:
    """The entry of ``kind`` (``"prediction"``, ``"theory"`` or ``"simulation"``) for
    ``config``, computed (for a theory or simulation entry ``config`` is the resolved one,
    :func:`resolve_horizon`)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")
    return {"prediction": compute_prediction, "theory": compute_theory, "simulation": compute_simulation}[kind](config)


def compute_theories(configs: Sequence[Config]) -> list[dict[str, np.ndarray] | FloatingPointError]:
    """:func:`compute_theory` of several points as one vmapped solve per shape
    (:func:`~singleloc._ode.integrate_points`): the arrays of each point, or the error its
    solve stopped with."""
    results = integrate_points([(config, initial_conditions(config)) for config in configs])
    return [r if isinstance(r, FloatingPointError) else {"tau": r.tau, "M": r.M, "Q": r.Q, "b": r.b, "risk": r.risk}
            for r in results]


#: Keys that change only the values the compiled theory programs receive, not the programs:
#: theory points that differ in them alone have arrays of the same shapes (``sgd.tau_max``
#: changes the saved times, not their number), share their compilations (:func:`compile_group`)
#: and, batched, are solved together (:func:`compute_points`).
VALUE_KEYS = {"problem": ("strength",), "sgd": ("lr", "init_scale", "tau_max"), "simulation": ("seed", "D"),
              "theory": ("qmc_seed", "rtol", "atol")}

#: The kinds of entries whose points are batched (the others run one point after the other).
BATCH_KINDS = ("theory",)


#: The kinds whose compiled programs depend on the arrays' shapes and static values only, not on
#: the :data:`VALUE_KEYS` (traced); the simulator's programs hold the configuration's values.
SHAPE_KINDS = ("prediction", "theory")


def compile_group(kind: str, config: Mapping[str, Mapping[str, Any]], *more: Mapping[str, Mapping[str, Any]]) -> str:
    """The compiled programs a sweep point needs, as a hashable name: ``kind`` and ``config``
    without :data:`VALUE_KEYS` for a kind in :data:`SHAPE_KINDS`, the whole ``config`` otherwise
    (a ``group`` for :func:`~singleloc._distributed.run_points` with :func:`compute_point` or
    :func:`compute_points`, whose further configs ``more`` are of the same group)."""
    drop = VALUE_KEYS if kind in SHAPE_KINDS else {}
    rest = {s: {k: v for k, v in sec.items() if k not in drop.get(s, ())} for s, sec in config.items()}
    return json.dumps([kind, rest], sort_keys=True)


def compute_points(kind: str, *configs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, np.ndarray] | BaseException]:
    """The work of sweep points of one :func:`compile_group`, run on a worker: the entries of
    ``kind`` (e.g. ``"theory"``) for the resolved configurations ``configs``
    (:meth:`Config.to_dict`), as NumPy arrays, or the exception a point raised (the others go
    on). Several theory points are one batched solve (:func:`compute_theories`); other kinds,
    and a single point, :func:`compute` one after the other.

    Enables double precision in the process that runs it, as the command line does: the ODE is
    solved in float64 (the simulator keeps its own float32), also on a worker started by hand.
    The process holds the compiled programs of a bounded number of shapes
    (:func:`~singleloc._compilation.hold_programs`), so that a long sweep over many shapes does
    not exhaust its memory mappings.
    """
    jax.config.update("jax_enable_x64", True)
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
    """The work of one sweep point, run on a worker: :func:`singleloc._sweep.compute` of ``kind``
    (an entry kind of the sweep cache, e.g. ``"theory"``) for the resolved configuration
    ``config`` (a :meth:`Config.to_dict`), as NumPy arrays (:func:`compute_points` of one point;
    its exception is raised)."""
    (result,) = compute_points(kind, config)
    if isinstance(result, BaseException):
        raise result
    return result


@dataclasses.dataclass
class SweepStats:
    """Counts of points of one sweep: computed (some theory or simulation entry computed or
    failed), loaded entirely from the cache, failed (the theory or the simulation; counted
    among the computed); wall time. :func:`cached_run` counts entries in the same fields."""

    computed: int = 0
    cached: int = 0
    failed: int = 0
    seconds: float = 0.0


#: The arrays of a complete cache entry of each kind.
ENTRY_KEYS = {"prediction": tuple(f.name for f in dataclasses.fields(EscapePrediction)),
              "theory": ("tau", "M", "Q", "b", "risk"), "simulation": ("tau", "M", "Q", "b", "risk", "risk_limit")}


def _read_entry(path: Path, kind: str, *, arrays: bool = True) -> dict[str, np.ndarray | None] | None:
    """The cache entry at ``path``, or ``None`` (after a one-line warning) when it is damaged:
    unreadable (truncated, bad CRC, not a zip file) or without one of :data:`ENTRY_KEYS`. With
    ``arrays=False`` only the zip's directory is read (the names map to ``None``): a cheap check
    that finds a missing, truncated or incomplete entry; a damaged array inside a whole file is
    found when the entry is read."""
    try:
        data = load_npz(path) if arrays else dict.fromkeys(npz_names(path))
    except NPZ_ERRORS as err:
        problem = f"{type(err).__name__}: {' '.join(str(err).split())}"
    else:
        missing = [k for k in ENTRY_KEYS[kind] if k not in data]
        if not missing:
            return data
        problem = f"no array {', '.join(missing)}"
    warnings.warn(f"cache entry {path} is damaged ({problem}); recomputing it", stacklevel=3)
    return None


def cached_run(config: Config, kind: str, cache_dir: Path, stats: SweepStats | None = None) -> dict[str, np.ndarray]:
    """Load ``kind`` for ``config`` from the cache, or compute and store it (also in place of a
    damaged entry)."""
    path = _entry_path(Path(cache_dir), config, kind)
    data = _read_entry(path, kind) if path.is_file() else None
    if data is not None:
        if stats:
            stats.cached += 1
        return data
    data = compute(config, kind)
    save_npz(path, data)
    if stats:
        stats.computed += 1
    return data


def summarize(config: Config, data: dict[str, np.ndarray], kind: str) -> dict[str, float]:
    """:meth:`PhaseAnalysis.summary` of an entry, with the heads' attention weights."""
    weights = head_weights(OrderParameterODE.from_config(config), data["M"], data["Q"], data["b"])
    a = analyze(data["tau"], data["M"], data["Q"], data[PHASE_RISK[kind]], mean=config.problem.build_prior().mean(),
                weights=weights)
    return a.summary()


#: The columns of a phase summary, in the order of the CSV.
SUMMARY_KEYS = ("final_risk", "escaped", "escape_time", "first_learned", "first_specialization",
                *(f"n_{c}" for c in HEAD_CLASSES), "leaning_angle_spike", "leaning_angle_mean", "n_directions", "shared_profiles")


def _entry_path(cache: Path, config: Config, kind: str) -> Path:
    return cache / f"{kind}-{cache_key(config, kind)}.npz"


def fill_cache(entries: Sequence[tuple[Config, str]], cache: Path, *, cluster: Cluster | None = None,
               progress: bool = True, desc: str = "points", batch: bool = True) -> tuple[set[str], dict[str, BaseException]]:
    """Compute the ``(config, kind)`` entries missing from (or damaged in) the cache, with
    :func:`~singleloc._distributed.run_points` on ``cluster`` (an open
    :class:`~singleloc._distributed.Cluster`; ``None``: in this process). With ``batch``, the
    entries of a kind in :data:`BATCH_KINDS` are one task per :func:`compile_group` (one batched
    solve, :func:`compute_points`; a large group cut for the cluster's
    :attr:`~singleloc._distributed.Cluster.threads` by :func:`split_groups`); otherwise one task
    per entry. Only this process writes the cache (atomically), as each result arrives. Returns
    the names of the entries computed and the failures (entry name -> exception)."""
    tasks = {}
    for config, kind in entries:
        path = _entry_path(cache, config, kind)
        if path.name not in tasks and (not path.is_file() or _read_entry(path, kind, arrays=False) is None):
            tasks[path.name] = (kind, config.to_dict())
    groups: dict[str, list[str]] = {}
    for name, (kind, config) in tasks.items():
        groups.setdefault(compile_group(kind, config) if batch and kind in BATCH_KINDS else name, []).append(name)
    done: set[str] = set()
    errors: dict[str, BaseException] = {}

    def store(names, results):
        for name, result in zip(names, results):
            if isinstance(result, BaseException):
                errors[name] = result
            else:
                save_npz(cache / name, result)
                done.add(name)

    with contextlib.ExitStack() as stack:
        cluster = cluster or stack.enter_context(open_cluster())
        threads = cluster.threads if tasks else 1  # an external cluster is connected only when there is work
        work = [(tuple(names), (tasks[names[0]][0], *(tasks[name][1] for name in names)))
                for names in split_groups(list(groups.values()), threads)]
        report = run_points(work, compute_points, store, cluster=cluster, progress=progress, desc=desc,
                            group=compile_group, size=lambda kind, *configs: len(configs))
    for names, err in report.errors.items():  # the whole task failed (e.g. its worker died too often)
        errors.update(dict.fromkeys(names, err))
    return done, errors


def split_groups(groups: list[list[str]], workers: int) -> list[list[str]]:
    """The tasks of batched groups on a cluster that runs ``workers`` tasks at once: a group of
    more than ``ceil(points / workers)`` points (``points`` of all groups together) is cut into
    that many near-equal parts (sizes that differ by one at most, so at most two programs per
    group), so that one large group still keeps every worker busy. ``workers = 1``: the groups
    as they are."""
    limit = math.ceil(sum(map(len, groups)) / workers)
    parts = []
    for names in groups:
        n = math.ceil(len(names) / limit)
        parts.extend(names[i * len(names) // n:(i + 1) * len(names) // n] for i in range(n))
    return parts


def _failure(kind: str, err: BaseException) -> str:
    text = str(err).split(";")[0] if isinstance(err, FloatingPointError) else f"{type(err).__name__}: {err}"
    return f"{kind} failed: {' '.join(text.split())}"


def sweep(base: Config, grids: Sequence[Grid], out: str | Path, *, horizon: str | float = "auto", simulate: bool = False,
          cache_dir: str | Path | None = None, progress: bool = True, figures: bool = True, workers: int = 1,
          scheduler: str | None = None, batch: bool = True) -> tuple[list[dict[str, Any]], SweepStats]:
    """Run (or load) every grid point, write ``OUT/sweep.csv`` and the phase diagrams.

    ``horizon``: ``"auto"`` (each point to its predicted horizon), ``"config"``
    (``sgd.tau_max``) or a number (module docstring). The entries missing from the cache are
    computed in two rounds (the escape predictions, then the theory and simulation runs to
    their horizons) by :func:`fill_cache`: in this process (``workers = 1``, no ``scheduler``),
    on a local Dask cluster of ``workers`` processes, or on the Dask cluster at ``scheduler``
    (or ``DASK_SCHEDULER_ADDRESS``), one cluster for both rounds (started only when some entry
    is missing); a point that fails is reported in its row and does not
    stop the others. ``batch``: the theory points of one :func:`compile_group` are one batched
    solve (one task). Returns the CSV rows (dicts) and the :class:`SweepStats`.
    """
    require_config(base, "sweep")
    _check_horizon(horizon)
    t0 = time.perf_counter()
    out = Path(out)
    cache = out / "cache" if cache_dir is None else Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    points = grid_points(base, grids)
    kinds = ["theory"] + (["simulation"] if simulate else [])
    recomputed = SweepStats()

    def read(config: Config, kind: str) -> dict[str, np.ndarray]:
        """An entry that :func:`fill_cache` left in the cache; one found damaged inside is recomputed here."""
        before = recomputed.computed
        data = cached_run(config, kind, cache, recomputed)
        if recomputed.computed > before:
            computed.add(_entry_path(cache, config, kind).name)
        return data

    with open_cluster(workers, scheduler) as cluster:  # one cluster for both rounds, started only if needed
        run = dict(cluster=cluster, progress=progress, batch=batch)
        computed, errors = fill_cache([(cfg, "prediction") for _, cfg in points], cache, desc="escape predictions", **run)
        predictions, run_cfgs = {}, {}
        for i, (_, cfg) in enumerate(points):
            path = _entry_path(cache, cfg, "prediction")
            if path.name not in errors:
                entry = read(cfg, "prediction")
                predictions[i] = EscapePrediction.from_arrays(entry)
                run_cfgs[i] = resolve_horizon(with_chosen_points(cfg, entry), predictions[i], horizon)
        done, run_errors = fill_cache([(run_cfgs[i], kind) for i in run_cfgs for kind in kinds], cache, desc="sweep", **run)
    computed |= done
    errors.update(run_errors)
    stats = SweepStats()
    rows = []
    loaded: list[dict[str, dict[str, np.ndarray]]] = []  # per point, its theory/simulation entries, read once
    for i, (values, cfg) in enumerate(points):
        loaded.append({})
        row: dict[str, Any] = dict(values)
        row.update(activation=cfg.model.activation, heads=cfg.model.heads, F=cfg.problem.F, status="ok")
        names = [_entry_path(cache, cfg, "prediction").name]
        failures = []
        if i not in predictions:
            failures.append(_failure("prediction", errors[names[0]]))
            row.update({k: math.nan for k in ("horizon", "lambda", "tau_plateau", "predicted_escape")})
        else:
            pred, run_cfg = predictions[i], run_cfgs[i]
            row.update(horizon=run_cfg.sgd.tau_max, **{"lambda": pred.rate}, tau_plateau=pred.tau_plateau,
                       predicted_escape=pred.predicted_escape)
        for kind in kinds:
            prefix = "" if kind == "theory" else "sim_"
            summ = {k: math.nan for k in SUMMARY_KEYS}
            if i in predictions:
                name = _entry_path(cache, run_cfgs[i], kind).name
                names.append(name)
                if name in errors:
                    failures.append(_failure(kind, errors[name]))
                else:
                    loaded[i][kind] = read(run_cfgs[i], kind)
                    summ = summarize(run_cfgs[i], loaded[i][kind], kind)
            row.update({prefix + k: summ[k] for k in SUMMARY_KEYS})
        if failures:  # every failure of the point: prediction, theory and simulation
            row["status"] = "; ".join(failures)
            stats.failed += 1
        if failures or computed.intersection(names):
            stats.computed += 1
        else:
            stats.cached += 1
        if row["status"] == "ok" and predictions[i].escapes and row["escaped"] < 1:
            row["status"] = f"not yet (predicted escape at tau = {predictions[i].predicted_escape:.3g})"
        row["key"] = cache_key(run_cfgs[i], "theory") if i in run_cfgs else ""
        rows.append(row)
    mark = {OUTPUT_KEY: "sweep"}

    def own_figures(written):  # phase diagrams of an earlier sweep into OUT that this one does not draw
        return [p for p in out.glob("phase_*.png") if p not in written and png_has_text(p, OUTPUT_KEY, "sweep")]

    with written_together(out, stale=own_figures):  # the CSV, the Dataset and the figures: all of them, or none
        write_csv(out / "sweep.csv", rows)
        write_sweep(out, base, grids, rows, loaded)
        if figures:
            other = [g.name for g in grids if g.name not in ("model.heads", "problem.F", "model.activation")]
            groups: dict[tuple, list] = {}
            for r in rows:
                groups.setdefault((r["activation"],) + tuple(r[k] for k in other), []).append(r)
            for gkey, grows in groups.items():
                tag = "".join(f"_{k.split('.')[-1]}={_slug(v)}" for k, v in zip(other, gkey[1:]))
                title = f"{gkey[0]}" + "".join(f", {k}={v}" for k, v in zip(other, gkey[1:]))
                fig = plot_phase_diagram(grows, title=title, simulate=simulate)
                save_figure(out / f"phase_{_slug(gkey[0])}{tag}.png", fig, mark)
    stats.seconds = time.perf_counter() - t0
    return rows, stats


def _slug(v: Any) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", str(v)).strip("-") or "x"


def write_csv(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    """Write rows (dicts with the same keys) as CSV atomically."""
    if not rows:
        raise ValueError("no rows to write")
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0].keys()), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: f"{v:.6g}" if isinstance(v, float) else json.dumps(v) if isinstance(v, (list, dict)) else v
                    for k, v in r.items()})
    return save_text(path, buf.getvalue())
