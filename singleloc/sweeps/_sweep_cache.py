"""The on-disk cache of a sweep (:mod:`singleloc.sweeps._sweep`): the entries, their keys, and the
computation of the missing ones (:func:`fill_cache`, on this process or a Dask cluster).

Cache. Every computed point is stored as ``CACHE/<kind>-<key>.npz`` (kind ``theory`` or
``simulation``), where ``key`` is the SHA-256 (first 24 hex digits) of the canonical JSON of
the configuration (for a theory or simulation entry the resolved one, so the key includes the
horizon), the package version, :data:`CACHE_VERSION` and the kind. A repeated sweep therefore
recomputes nothing, and changing one value of the base configuration recomputes only the
points whose configuration changed. A prediction entry holds the fields of
:class:`~singleloc.EscapePrediction`; a theory entry ``tau``, ``M``, ``Q``, ``b`` and ``risk`` as
:class:`~singleloc.TheoryResult`; a simulation entry the same names as
:class:`~singleloc.SimulationResult` (``risk`` the empirical finite-D risk, ``risk_limit`` the
limit loss). Files are written atomically (:mod:`singleloc.io._run_folders`); a failed point (the ODE left
the valid set) is not cached, and a damaged entry (unreadable, truncated, or without one of
its arrays) is reported in one warning line, recomputed and replaced.

Proof of what an entry holds. Every entry records the key of the configuration it was computed
from, as run folders record their config hash (:func:`~singleloc.io._run_folders.npz_stamp`: the zip
comment ``singleloc config_hash KEY``), and every read (:func:`_read_entry`, also the cheap check of
:func:`fill_cache`) verifies it against the key of the configuration it is read for. An entry whose
record differs (a file copied or renamed over another point's entry, issue 54 item 6) or is
missing is reported in one warning line, recomputed and replaced, like a damaged one: the cache is
a memo the sweep can always rebuild from the configuration, so a wrong entry costs a recomputation,
never a wrong row, and refusing would only stop a long sweep for a file the user must then delete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from .._version import __version__
from ..analysis._predictions import EscapePrediction
from ..configuration._config import Config
from ..io._run_folders import NPZ_ERRORS, load_npz, npz_names, npz_stamp, save_npz
from ..runtime._distributed import Cluster, open_cluster, run_points
from ._sweep_compute import BATCH_KINDS, compile_group, compute, compute_points


@dataclasses.dataclass
class SweepStats:
    """Counts of points of one sweep: computed (some theory or simulation entry computed or
    failed), loaded entirely from the cache, failed (the theory or the simulation; counted
    among the computed); wall time. :func:`~singleloc.sweeps._sweep_cache.cached_run` counts entries
    in the same fields."""

    computed: int = 0
    cached: int = 0
    failed: int = 0
    seconds: float = 0.0


#: Layout of the cache entries; part of every cache key, so that entries of an earlier layout
#: are never read. 2: a simulation entry's ``risk`` is the empirical risk (1: the limit risk);
#: 3: every entry records its key (module docstring).
CACHE_VERSION = 3


def cache_key(config: Config, kind: str) -> str:
    """SHA-256 of the canonical JSON of the resolved config, the package version, the cache
    layout version and the kind."""
    data = {"singleloc_version": __version__, "cache_version": CACHE_VERSION, "kind": kind, "config": config.to_dict()}
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


#: The arrays of a complete cache entry of each kind.
ENTRY_KEYS = {"prediction": tuple(f.name for f in dataclasses.fields(EscapePrediction)),
              "theory": ("tau", "M", "Q", "b", "risk"), "simulation": ("tau", "M", "Q", "b", "risk", "risk_limit"),
              "bayes": ("bayes_risk", "bayes_risk_error")}


def _read_entry(path: Path, kind: str, *, arrays: bool = True) -> dict[str, np.ndarray | None] | None:
    """The cache entry at ``path``, or ``None`` (after a one-line warning) when it is damaged:
    unreadable (truncated, bad CRC, not a zip file), without one of :data:`ENTRY_KEYS`, or
    recorded for another configuration than the one its name is the key of (module docstring).
    With ``arrays=False`` only the zip's directory is read (the names map to ``None``): a cheap check
    that finds a missing, truncated, incomplete or foreign entry; a damaged array inside a whole
    file is found when the entry is read."""
    key = _entry_key(path, kind)
    try:
        data = load_npz(path) if arrays else dict.fromkeys(npz_names(path))
        stamp = npz_stamp(path)
    except NPZ_ERRORS as err:
        problem = f"{type(err).__name__}: {' '.join(str(err).split())}"
    else:
        missing = [k for k in ENTRY_KEYS[kind] if k not in data]
        if missing:
            problem = f"no array {', '.join(missing)}"
        elif stamp != key:
            warnings.warn(f"cache entry {path} holds the result of another configuration (it records the key "
                          f"{stamp or 'of none'}, not {key}); recomputing it", stacklevel=3)
            return None
        else:
            return data
    warnings.warn(f"cache entry {path} is damaged ({problem}); recomputing it", stacklevel=3)
    return None


def cached_run(config: Config, kind: str, cache_dir: Path, stats: SweepStats | None = None) -> dict[str, np.ndarray]:
    """Load ``kind`` for ``config`` from the cache, or compute and store it (also in place of a
    damaged or foreign entry)."""
    path = _entry_path(Path(cache_dir), config, kind)
    data = _read_entry(path, kind) if path.is_file() else None
    if data is not None:
        if stats:
            stats.cached += 1
        return data
    data = compute(config, kind)
    _store(path, kind, data)
    if stats:
        stats.computed += 1
    return data


def _entry_path(cache: Path, config: Config, kind: str) -> Path:
    return cache / f"{kind}-{cache_key(config, kind)}.npz"


def _entry_key(path: Path, kind: str) -> str:
    """The key of an entry's configuration, from its name (:func:`_entry_path`)."""
    return path.name[len(kind) + 1:-len(".npz")]


def _store(path: Path, kind: str, data: dict[str, np.ndarray]) -> None:
    """Write an entry, recording its key (module docstring)."""
    save_npz(path, data, stamp=_entry_key(path, kind))


def fill_cache(entries: Sequence[tuple[Config, str]], cache: Path, *, cluster: Cluster | None = None,
               progress: bool = True, desc: str = "points", batch: bool = True, costs: Mapping[str, float] | None = None
               ) -> tuple[set[str], dict[str, BaseException]]:
    """Compute the ``(config, kind)`` entries missing from (or damaged in) the cache, with
    :func:`~singleloc.runtime._distributed.run_points` on ``cluster`` (an open
    :class:`~singleloc.runtime._distributed.Cluster`; ``None``: in this process). With ``batch``, the
    entries of a kind in :data:`~singleloc.sweeps._sweep_compute.BATCH_KINDS` are one task per
    :func:`~singleloc.runtime._compilation.compile_group` (one batched solve,
    :func:`~singleloc.sweeps._sweep_compute.compute_points`; a large group cut for the cluster's
    :attr:`~singleloc.runtime._distributed.Cluster.threads` by :func:`split_groups`); otherwise one task
    per entry. Only this process writes the cache (atomically), as each result arrives. ``costs``:
    the estimated seconds of entries (by name, :mod:`singleloc.sweeps._sweep_estimate`), which the bar's
    time left is made of. Returns the names of the entries computed and the failures (entry name ->
    exception)."""
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
