"""What a sweep (:mod:`singleloc.sweeps._sweep`) will take, said before it starts, point by point: each point's entries
missing from the cache (its escape prediction, its theory to its horizon, compiled once per
:func:`~singleloc.runtime._compilation.compile_group`, and its simulation) estimated on their own
(:mod:`singleloc.preflight._estimates`); before the predictions, ``horizon = "auto"`` is a cached prediction's, else
taken as their fallback (300).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..configuration._config import Config
from ..preflight._build import build
from ..preflight._estimates import TheorySolve, prediction_estimate, timings
from ..runtime._compilation import compile_group
from ..runtime._progress import Estimate, announce, duration, say, settings
from ..simulation._simulation_estimate import simulation_estimate

#: The points named as the most expensive before a sweep starts.
SHOWN = 3


def _entry(config: Config, kind: str, groups: set[str]) -> Estimate:
    """The estimate of one entry; a theory's compilation once per group of points that share it."""
    if kind == "simulation":
        return simulation_estimate(build(config, theory=False))
    setup = build(config)
    if kind == "prediction":
        return prediction_estimate(setup)
    est = TheorySolve("integrate", setup, config.simulation.seeds, config.sgd.n_save, config.sgd.tau_max).estimate
    group = compile_group("theory", config.to_dict())
    if group in groups:
        return Estimate(est.parts[-1][1], est.basis)  # the solving only
    groups.add(group)
    return est


def sweep_costs(points: Sequence[tuple[Mapping[str, Any], Config]], run_cfgs: Mapping[int, Config] | None,
                kinds: Sequence[str], cache: Path, horizon: str | float, *, stage: str = "", quiet: bool = False
                ) -> dict[str, float]:
    """Estimate the missing entries of a sweep's round, say the total and the :data:`SHOWN` most expensive points
    (``stage``: what the line calls the round; ``quiet``: refuse, but say nothing), refuse a point above the point limit
    (``--yes`` lifts it) naming what would make it cheaper, and return the estimated seconds of each entry to compute by
    its cache file's name (the sweep's bar weighs its points by them). Before the predictions (``run_cfgs is None``):
    each point's prediction (with ``horizon = "auto"`` or ``theory.points = "auto"``: a fixed horizon's are made after
    the runs, where needed), and its theory and simulation at its horizon; after them, those of ``run_cfgs``."""
    from ..analysis._predictions import HORIZON_FALLBACK, resolve_horizon
    from ._sweep_entries import _entry_path, _read_entry

    costs, per_point, groups, guessed = {}, [], set(), False
    for i, (_, cfg) in enumerate(points):
        if run_cfgs is None:  # a prediction in the cache sets its runs' horizon, "auto" is else at the fallback horizon
            path = _entry_path(cache, cfg, "prediction")
            with warnings.catch_warnings(action="ignore"):  # a damaged entry is said when the sweep reads it
                stored = _read_entry(path, "prediction") if path.is_file() else None
            guessed |= stored is None
            run_cfg = resolve_horizon(cfg, stored or {"horizon": HORIZON_FALLBACK}, horizon)
            predict = horizon == "auto" or cfg.theory.points == "auto"  # a fixed horizon's: after the runs (_sweep)
            todo = [(cfg, "prediction")] * predict + [(run_cfg, kind) for kind in kinds]
        else:
            todo = [(run_cfgs[i], kind) for kind in kinds] if i in run_cfgs else []
        seconds, entries = 0.0, []
        for config, kind in todo:
            path = _entry_path(cache, config, kind)
            if path.name not in costs and not path.is_file():
                est = _entry(config, kind, groups)
                costs[path.name], seconds = est.seconds, seconds + est.seconds
                entries.append((f"{'escape prediction' if kind == 'prediction' else kind} about {duration(est.seconds)}",
                                est.basis))
        if entries:
            per_point.append((seconds, i, entries))
    if not per_point:
        return costs
    worst, limit, here = sorted(per_point, reverse=True), settings().point_limit, timings().here
    if limit is not None and worst[0][0] > limit:
        more = sum(p[0] > limit for p in worst[1:])
        seconds, i, entries = worst[0]
        announce(f"the point {_point(points[i][0])} ({'; '.join(e[0] for e in entries)}; {entries[0][1]})"
                 + (f" and {more} more point{'s' * (more > 1)} over the limit" if more else ""), Estimate(seconds, ""),
                 _cheaper(points[i][1]), limit="point")
    if quiet:
        return costs
    bases = [e[1] for p in per_point for e in p[2]]
    measured = sum(b.startswith("measured") for b in bases)
    basis = (f"measured on {here}" if measured == len(bases) else f"{len(bases) - measured} of {len(bases)} computations "
             f"first runs of their shape family, from the nearest measured on {here} or its speed")
    if run_cfgs is None and horizon == "auto" and guessed:
        basis += "; horizons 'auto' taken as 300 until the escape predictions have set them"
    n = len(per_point)
    counted = f"{n} point{'s' * (n > 1)}"
    announce(f"{stage} of {counted}" if stage else f"{counted} to compute ({len(points) - n} from the cache)",
             Estimate(sum(p[0] for p in per_point), basis))
    if n > 1:
        say("the most expensive: " + "; ".join(f"{_point(points[i][0])}: about {duration(s)} ({', '.join(e[0] for e in es)})"
                                               for s, i, es in worst[:SHOWN]))
    return costs


def _cheaper(config: Config) -> str:
    """What would make a point cheaper (the refusal's advice)."""
    ways = [] if build(config).route.route_class.field_nodes else ["--set theory.route=rule (its theory is on the exact route)"]
    ways += ["fewer model.heads"] if config.model.heads > 1 else []
    return "make it cheaper: " + ", ".join(ways + ["a shorter horizon (--horizon TAU, or sgd.tau_max with --horizon config)"])


def _point(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items()) or "the base configuration"
