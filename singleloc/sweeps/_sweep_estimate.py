"""What a sweep (:mod:`singleloc.sweeps._sweep`) will take, said before it starts, point by point.

Each point's entries that are not in the cache are estimated on their own, from the records of
this device (:mod:`singleloc.preflight._estimates`, :mod:`singleloc.runtime._timings`): its escape prediction
(:func:`prediction_estimate`), its theory to its horizon (one solve of its seeds' starts,
:class:`~singleloc.preflight._estimates.TheorySolve`; a compilation counted once per group of points that
share their programs, :func:`~singleloc.runtime._compilation.compile_group`) and its simulation
(:func:`~singleloc.simulation._simulation_estimate.simulation_estimate`). :func:`announce_sweep` says the total, the
most expensive points, and how the numbers were made, and refuses a point estimated above the
point limit of :func:`~singleloc.runtime._progress.reporting` (the command line's hour, unless ``--yes``),
naming what would make it cheaper. It returns the estimate of every entry, which the sweep's
bar weighs its points by: its time left is the estimate of the points that remain, scaled by
the pace measured so far, not the mean time of the first points (a sweep's points can differ a
hundredfold).

Before the escape predictions are made, a point's horizon (``horizon = "auto"``) is not known:
it is taken as the prediction's fallback (300) there, and said so; the sweep announces again
with the predicted horizons before it integrates.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..configuration._config import Config
from ..preflight._estimates import REFERENCE, TheorySolve, _digest, _label, speed, theory_features, theory_work
from ..runtime import _timings
from ..runtime._progress import announce, say, settings
from ..runtime._timings import Estimate, device_label, duration, timings
from ..simulation._simulation_estimate import simulation_estimate

#: The points named as the most expensive before a sweep starts.
SHOWN = 3


def _prediction_family(config: Config) -> tuple[str, dict[str, Any]]:
    from ..runtime._compilation import compile_group

    return f"prediction:{_digest(compile_group('prediction', config.to_dict()))}", theory_features(config, 1)


def _prediction_size(features: dict[str, Any]) -> float:
    """Reference seconds of an escape prediction: its program, the symmetric path and the Jacobians
    of its rates (:data:`~singleloc.preflight._estimates.REFERENCE`)."""
    H, F = features["H"], features["F"]
    drifts = REFERENCE["prediction_drifts"] + 16 * (H * F + H * H + H)
    return REFERENCE["prediction"][features["route"]] + drifts * theory_work(features)


def prediction_estimate(config: Config) -> Estimate:
    """The time of a point's escape prediction: measured for its family on this device, else the
    nearest family measured here scaled by the model, else the model at this device's speed."""
    key, features = _prediction_family(config)
    here = device_label(timings().device)
    rec = timings().family(key)
    if rec and rec.get("runs"):
        return Estimate(_timings.predict(rec["runs"], 1.0), f"measured on {here} for this shape family")
    size = _prediction_size(features)
    others = [r for r in timings().families("prediction") if r.get("runs") and r["features"].get("route") == features["route"]]
    if others:
        near = min(others, key=lambda r: abs(math.log(_prediction_size(r["features"]) / size)))
        return Estimate(_timings.predict(near["runs"], 1.0) * size / _prediction_size(near["features"]),
                        f"first run of this shape family, scaled from {near.get('label', 'another')} on {here}")
    return Estimate(size * speed("run"), f"first run of this shape family, from {here}'s speed")


@contextlib.contextmanager
def recorded(kind: str, config: Config) -> Iterator[None]:
    """Record the time of an escape prediction (``kind == "prediction"``) computed in the block;
    other kinds record themselves (:mod:`singleloc.preflight._estimates`)."""
    if kind != "prediction":
        yield
        return
    t0 = _timings.clock()
    yield
    key, features = _prediction_family(config)
    timings().record(key, "prediction", label=f"prediction, {_label(config)}", features=features,
                     run=(1.0, _timings.clock() - t0))


def _assumed(config: Config, horizon: str | float) -> tuple[Config, bool]:
    """The configuration a point integrates, before its prediction: ``horizon = "auto"`` at the
    prediction's fallback (``True``: assumed)."""
    from ..analysis._predictions import HORIZON_FALLBACK, HORIZON_N_SAVE

    if horizon == "config":
        return config, False
    tau = HORIZON_FALLBACK if horizon == "auto" else float(horizon)
    sgd = {"tau_max": tau, "spacing": "log", "n_save": max(config.sgd.n_save, HORIZON_N_SAVE)}
    return config.replace(sgd=sgd), horizon == "auto"


def _cheaper(config: Config) -> str:
    """What would make a point cheaper (the refusal's advice)."""
    from ..expectations._routes import route_of

    ways = []
    if route_of(config).exact:
        ways.append("--set theory.route=rule (its theory is on the exact route)")
    if config.model.heads > 1:
        ways.append("fewer model.heads")
    ways.append("a shorter horizon (--horizon TAU, or sgd.tau_max with --horizon config)")
    return "make it cheaper: " + ", ".join(ways)


def announce_sweep(points: Sequence[tuple[Mapping[str, Any], Config]], entries: Mapping[int, Sequence[tuple[Config, str]]],
                   missing: Mapping[str, bool], names: Mapping[tuple[int, str], str], *, assumed: bool = False,
                   stage: str = "", quiet: bool = False) -> dict[str, float]:
    """Estimate the entries to compute of every point, say the total and the most expensive
    points (module docstring), refuse a point above the point limit, and return the estimated
    seconds of each entry to compute (by its cache name). ``points``: the grid values and
    configuration of each point; ``entries``: per point index, its ``(config, kind)`` entries;
    ``missing``: per cache name, whether it must be computed; ``names``: ``(index, kind)`` ->
    cache name; ``assumed``: horizons assumed (before the predictions); ``stage``: what the line
    calls this part (``""``: the whole sweep); ``quiet``: refuse, but say nothing (said before)."""
    costs: dict[str, float] = {}
    from ..runtime._compilation import compile_group

    per_point: list[tuple[float, int, list[str], list[str]]] = []
    groups_seen: set[str] = set()
    for i in range(len(points)):
        seconds, parts, bases = 0.0, [], []
        for config, kind in entries.get(i, ()):
            name = names[(i, kind)]
            if not missing.get(name):
                continue
            if kind == "prediction":
                est = prediction_estimate(config)
            elif kind == "theory":
                solve = TheorySolve("integrate", config, config.simulation.seeds, config.sgd.n_save, config.sgd.tau_max)
                group = compile_group("theory", config.to_dict())
                est = solve.estimate if group not in groups_seen else Estimate(
                    solve.estimate.parts[-1][1], solve.estimate.basis)
                groups_seen.add(group)
            else:
                est = simulation_estimate(config)
            costs[name] = est.seconds
            seconds += est.seconds
            parts.append(f"{'escape prediction' if kind == 'prediction' else kind} about {duration(est.seconds)}")
            bases.append(est.basis)
        if parts:
            per_point.append((seconds, i, parts, bases))
    if not per_point:
        return costs
    here = device_label(timings().device)
    total = sum(p[0] for p in per_point)
    measured = sum(b.startswith("measured") for p in per_point for b in p[3])
    every = sum(len(p[3]) for p in per_point)
    others = f"from their nearest shape family measured on {here} or from its speed"
    basis = (f"measured on {here}" if measured == every else f"first runs of these shape families: {others}" if not measured
             else f"measured on {here} for {measured} of {every} computations, the others {others}")
    if assumed:
        basis += "; horizons 'auto' taken as 300 until the escape predictions have set them"
    n = len(per_point)
    what = (f"{stage} of {n} point{'s' * (n > 1)}" if stage else
            f"{n} point{'s' * (n > 1)} to compute ({len(points) - n} from the cache)")
    worst = sorted(per_point, reverse=True)
    limit = settings().point_limit
    if limit is not None and worst[0][0] > limit:
        seconds, i, parts, bases = worst[0]
        more = sum(p[0] > limit for p in worst[1:])
        also = f" and {more} more point{'s' * (more > 1)} over the limit" if more else ""
        announce(f"the point {_point(points[i][0])} ({'; '.join(parts)}; {bases[0]}){also}", Estimate(seconds, ""),
                 _cheaper(points[i][1]), limit="point")
    if quiet:
        return costs
    announce(what, Estimate(total, basis))
    shown = [f"{_point(points[i][0])}: about {duration(s)} ({', '.join(parts)})" for s, i, parts, _ in worst[:SHOWN]]
    if len(per_point) > 1:
        say(f"the most expensive: {'; '.join(shown)}")
    return costs


def _point(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items()) or "the base configuration"


def sweep_costs(points: Sequence[tuple[Mapping[str, Any], Config]], run_cfgs: Mapping[int, Config] | None,
                kinds: Sequence[str], cache: Path, horizon: str | float, *, stage: str = "", quiet: bool = False
                ) -> dict[str, float]:
    """:func:`announce_sweep` of a sweep's next round: before the predictions (``run_cfgs`` is
    ``None``): each point's prediction, and its theory and simulation at its horizon, assumed for
    ``"auto"`` (or read from a cached prediction); after them: the theory and simulation of the
    points' resolved configurations ``run_cfgs``."""
    from ..analysis._predictions import EscapePrediction, resolve_horizon, with_chosen_points
    from ._sweep_entries import _entry_path, _read_entry

    entries: dict[int, list[tuple[Config, str]]] = {}
    names, missing = {}, {}
    assumed = False

    def add(i: int, config: Config, kind: str) -> None:
        path = _entry_path(cache, config, kind)
        entries.setdefault(i, []).append((config, kind))
        names[(i, kind)] = path.name
        missing.setdefault(path.name, not path.is_file())

    for i, (_, cfg) in enumerate(points):
        if run_cfgs is None:
            add(i, cfg, "prediction")
            run_cfg = None
            if not missing[names[(i, "prediction")]]:
                with warnings.catch_warnings():  # a damaged entry: the sweep says so when it reads it
                    warnings.simplefilter("ignore")
                    entry = _read_entry(_entry_path(cache, cfg, "prediction"), "prediction")
                if entry is not None:
                    run_cfg = resolve_horizon(with_chosen_points(cfg, entry), EscapePrediction.from_arrays(entry), horizon)
            if run_cfg is None:
                run_cfg, guessed = _assumed(cfg, horizon)
                assumed |= guessed
        elif i in run_cfgs:
            run_cfg = run_cfgs[i]
        else:
            continue
        for kind in kinds:
            add(i, run_cfg, kind)
    return announce_sweep(points, entries, missing, names, assumed=assumed, stage=stage, quiet=quiet)
