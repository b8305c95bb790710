"""What a sweep (:mod:`singleloc.sweeps._sweep`) will take, said before it starts, point by point.

Each point's entries missing from the cache are estimated on their own (:mod:`singleloc.runtime._estimates`):
its escape prediction (:func:`prediction_estimate`), its theory to its horizon (one solve of its seeds' starts,
its compilation counted once per :func:`~singleloc.runtime._compilation.compile_group`) and its simulation.
:func:`sweep_costs` says the total and the most expensive points, refuses a point above the point limit of
:func:`~singleloc.runtime._progress.reporting` (the command line's hour, unless ``--yes``) naming what would
make it cheaper, and returns every entry's estimate, by which the sweep's bar weighs its points (its time left
is the estimate of the points that remain, at the pace so far: a sweep's points can differ a hundredfold).
Before the escape predictions, a point's ``horizon = "auto"`` is taken as the prediction's fallback (300), and
said so; the sweep announces again with the predicted horizons.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..configuration._config import Config
from ..runtime._compilation import compile_group
from ..runtime._estimates import REFERENCE, TheorySolve, _digest, _label, cost_class, estimate, first_run, theory_work, timings
from ..runtime._progress import Estimate, announce, clock, duration, say, settings
from ..simulation._simulation_estimate import simulation_estimate

#: The points named as the most expensive before a sweep starts.
SHOWN = 3


def _prediction_model(config: Config) -> tuple[str, str, float, float]:
    """The kind, key, work and reference seconds of an escape prediction: its programs, the symmetric path and
    the Jacobians of its 16 rates (of ``H F + H^2 + H`` columns each)."""
    route, work, H, F = cost_class(config)[0], theory_work(config, 1), config.model.heads, config.problem.F
    size = REFERENCE["prediction"][route] + (REFERENCE["prediction_drifts"] + 16 * (H * F + H * H + H)) * work
    return f"prediction:{route}", f"prediction:{_digest(compile_group('prediction', config.to_dict()))}", work, size


def prediction_estimate(config: Config) -> Estimate:
    """The time of a point's escape prediction (:func:`~singleloc.runtime._estimates.estimate`)."""
    return first_run(estimate(*_prediction_model(config)))


@contextlib.contextmanager
def recorded(kind: str, config: Config) -> Iterator[None]:
    """Record the time of an escape prediction (``kind == "prediction"``) computed in the block; other kinds
    record themselves."""
    t0 = clock()
    yield
    if kind == "prediction":
        kind, key, work, size = _prediction_model(config)
        timings().record(key, kind, f"prediction, {_label(config)}", work, (clock() - t0) / size)


def _assumed(config: Config, horizon: str | float) -> Config:
    """The configuration a point integrates before its prediction: ``horizon = "auto"`` at its fallback."""
    from ..analysis._predictions import HORIZON_FALLBACK
    from ._sweep import HORIZON_N_SAVE

    if horizon == "config":
        return config
    tau = HORIZON_FALLBACK if horizon == "auto" else float(horizon)
    return config.replace(sgd={"tau_max": tau, "spacing": "log", "n_save": max(config.sgd.n_save, HORIZON_N_SAVE)})


def _horizon(cfg: Config, cache: Path, horizon: str | float) -> Config | None:
    """A point's configuration at the horizon its cached prediction sets (``None``: none cached, or damaged)."""
    from ..analysis._predictions import EscapePrediction
    from ._sweep import resolve_horizon, with_chosen_points
    from ._sweep_cache import _entry_path, _read_entry

    path = _entry_path(cache, cfg, "prediction")
    if not path.is_file():
        return None
    with warnings.catch_warnings():  # a damaged entry: the sweep says so when it reads it
        warnings.simplefilter("ignore")
        entry = _read_entry(path, "prediction")
    return None if entry is None else resolve_horizon(with_chosen_points(cfg, entry), EscapePrediction.from_arrays(entry),
                                                      horizon)


def sweep_costs(points: Sequence[tuple[Mapping[str, Any], Config]], run_cfgs: Mapping[int, Config] | None,
                kinds: Sequence[str], cache: Path, horizon: str | float, *, stage: str = "", quiet: bool = False
                ) -> dict[str, float]:
    """Estimate the missing entries of a sweep's next round, say the total and the most expensive points
    (``stage``: what the line calls this round; ``quiet``: refuse, but say nothing), refuse a point above the
    point limit, and return the estimated seconds of each entry to compute (by its cache file's name). Before
    the predictions (``run_cfgs`` is ``None``): each point's prediction, and its theory and simulation at the
    horizon its cached prediction sets or else at an assumed one; after them, the theory and simulation of the
    resolved configurations ``run_cfgs``."""
    from ._sweep_cache import _entry_path

    costs: dict[str, float] = {}
    per_point, groups, assumed = [], set(), False
    for i, (_, cfg) in enumerate(points):
        if run_cfgs is None:
            run_cfg = _horizon(cfg, cache, horizon)
            assumed |= run_cfg is None and horizon == "auto"
            todo = [(cfg, "prediction")] + [(run_cfg or _assumed(cfg, horizon), kind) for kind in kinds]
        else:
            todo = [(run_cfgs[i], kind) for kind in kinds] if i in run_cfgs else []
        seconds, parts, bases = 0.0, [], []
        for config, kind in todo:
            name = _entry_path(cache, config, kind).name
            if name in costs or (cache / name).is_file():
                continue
            if kind == "theory":
                est = TheorySolve("integrate", config, config.simulation.seeds, config.sgd.n_save, config.sgd.tau_max).estimate
                group = compile_group("theory", config.to_dict())
                est = est if group not in groups else Estimate(est.parts[-1][1], est.basis)  # compiled once a group
                groups.add(group)
            else:
                est = prediction_estimate(config) if kind == "prediction" else simulation_estimate(config)
            costs[name], seconds = est.seconds, seconds + est.seconds
            parts.append(f"{'escape prediction' if kind == 'prediction' else kind} about {duration(est.seconds)}")
            bases.append(est.basis)
        if parts:
            per_point.append((seconds, i, parts, bases))
    if not per_point:
        return costs
    here, worst, limit = timings().here, sorted(per_point, reverse=True), settings().point_limit
    if limit is not None and worst[0][0] > limit:
        seconds, i, parts, bases = worst[0]
        more = sum(p[0] > limit for p in worst[1:])
        also = f" and {more} more point{'s' * (more > 1)} over the limit" if more else ""
        announce(f"the point {_point(points[i][0])} ({'; '.join(parts)}; {bases[0]}){also}", Estimate(seconds, ""),
                 _cheaper(points[i][1]), limit="point")
    if quiet:
        return costs
    measured = sum(b.startswith("measured") for p in per_point for b in p[3])
    every, n = sum(len(p[3]) for p in per_point), len(per_point)
    others = f"from their nearest shape family measured on {here} or from its speed"
    basis = (f"measured on {here}" if measured == every else f"first runs of these shape families: {others}" if not measured
             else f"measured on {here} for {measured} of {every} computations, the others {others}")
    basis += "; horizons 'auto' taken as 300 until the escape predictions have set them" if assumed else ""
    counted = f"{n} point{'s' * (n > 1)}"
    what = f"{stage} of {counted}" if stage else f"{counted} to compute ({len(points) - n} from the cache)"
    announce(what, Estimate(sum(p[0] for p in per_point), basis))
    if n > 1:
        say("the most expensive: " + "; ".join(f"{_point(points[i][0])}: about {duration(s)} ({', '.join(parts)})"
                                               for s, i, parts, _ in worst[:SHOWN]))
    return costs


def _cheaper(config: Config) -> str:
    """What would make a point cheaper (the refusal's advice)."""
    ways = ["--set theory.route=rule (its theory is on the exact route)"] if cost_class(config)[0] == "exact" else []
    ways += ["fewer model.heads"] if config.model.heads > 1 else []
    return "make it cheaper: " + ", ".join(ways + ["a shorter horizon (--horizon TAU, or sgd.tau_max with --horizon config)"])


def _point(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items()) or "the base configuration"
