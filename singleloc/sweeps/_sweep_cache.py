"""The on-disk cache of a sweep (:mod:`singleloc.sweeps._sweep`): the computation of the missing
entries (:func:`fill_cache`, on this process or a Dask cluster); the entries themselves, their keys and
the proof of what each holds are :mod:`singleloc.sweeps._sweep_entries`'s."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..configuration._config import Config
from ..runtime._distributed import Cluster, open_cluster, run_points
from ..runtime._progress import reporting
from ._sweep_compute import BATCH_KINDS, compile_group, compute, compute_points
from ._sweep_entries import _entry_path, _read_entry, _store


@dataclasses.dataclass
class SweepStats:
    """Counts of points of one sweep: computed (some theory or simulation entry computed or failed), loaded
    entirely from the cache, failed (the theory or the simulation; counted among the computed); wall time.
    :func:`~singleloc.sweeps._sweep_cache.cached_run` counts entries in the same fields."""

    computed: int = 0
    cached: int = 0
    failed: int = 0
    seconds: float = 0.0


def cached_run(config: Config, kind: str, cache_dir: Path, stats: SweepStats | None = None) -> dict[str, np.ndarray]:
    """Load ``kind`` for ``config`` from the cache, or compute and store it (also in place of a
    damaged or foreign entry)."""
    path = _entry_path(Path(cache_dir), config, kind)
    data = _read_entry(path, kind) if path.is_file() else None
    fresh = data is None
    if fresh:
        data = compute(config, kind)
        _store(path, kind, data)
    if stats:
        stats.computed += fresh
        stats.cached += not fresh
    return data


def fill_cache(entries: Sequence[tuple[Config, str]], cache: Path, *, cluster: Cluster | None = None,
               progress: bool = True, desc: str = "points", batch: bool = True, costs: Mapping[str, float] | None = None
               ) -> tuple[set[str], dict[str, BaseException]]:
    """Compute the ``(config, kind)`` entries missing from (or damaged in) the cache, with
    :func:`~singleloc.runtime._distributed.run_points` on ``cluster`` (``None``: in this process). With
    ``batch``, the entries of a kind in :data:`~singleloc.sweeps._sweep_compute.BATCH_KINDS` are one task per
    :func:`~singleloc.runtime._compilation.compile_group` (a large group cut by :func:`split_groups`);
    otherwise one task per entry. Only this process writes the cache. ``costs``: the estimated seconds of entries
    by name (the bar's time left). No run limit (``--force``): the sweep's own check of its points accepted them
    (:func:`~singleloc.sweeps._sweep_estimate.sweep_costs`). Returns the names of the entries computed and the
    failures (entry name -> exception)."""
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
                _store(cache / name, tasks[name][0], result)
                done.add(name)

    with contextlib.ExitStack() as stack:
        stack.enter_context(reporting(run_limit=None))
        cluster = cluster or stack.enter_context(open_cluster())
        threads = cluster.threads if tasks else 1  # an external cluster is connected only when there is work
        work = [(tuple(names), (tasks[names[0]][0], *(tasks[name][1] for name in names)))
                for names in split_groups(list(groups.values()), threads)]
        report = run_points(work, compute_points, store, cluster=cluster, progress=progress, desc=desc,
                            group=compile_group, size=lambda kind, *configs: len(configs),
                            costs={names: sum((costs or {}).get(n, 0.0) for n in names) for names, _ in work})
    for names, err in report.errors.items():  # the whole task failed (e.g. its worker died too often)
        errors.update(dict.fromkeys(names, err))
    return done, errors


def split_groups(groups: list[list[str]], workers: int) -> list[list[str]]:
    """The tasks of batched groups on a cluster that runs ``workers`` tasks at once: a group of
    more than ``ceil(points / workers)`` points (all groups together) is cut into near-equal parts
    (sizes within one: at most two programs per group), so that one large group keeps every worker busy."""
    limit = math.ceil(sum(map(len, groups)) / workers)
    parts = []
    for names in groups:
        n = math.ceil(len(names) / limit)
        parts.extend(names[i * len(names) // n:(i + 1) * len(names) // n] for i in range(n))
    return parts
