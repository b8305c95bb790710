"""The entries of a sweep's on-disk cache (:mod:`singleloc.sweeps._sweep_cache`): their keys, their reading and writing.

Cache. Every computed entry is stored as ``CACHE/<kind>-<key>.npz``, ``key`` the SHA-256 (first 24 hex digits) of the
canonical JSON of the (resolved) configuration, the package version, :data:`CACHE_VERSION` and the kind, so that a
repeated sweep recomputes nothing and a changed value recomputes only the points it changes. An entry holds the arrays
:data:`ENTRY_KEYS` names (those of :class:`~singleloc.EscapePrediction`, :class:`~singleloc.TheoryResult`,
:class:`~singleloc.SimulationResult`); it is written atomically, and a failed point is not cached.

Proof of what an entry holds. Every entry records its key as its zip comment (as run folders record their config hash,
:func:`~singleloc.io._run_folders.npz_stamp`), and every read (:func:`_read_entry`) checks it against the key of the
configuration it is read for. A damaged entry (unreadable, truncated, without one of its arrays) or one recorded for
another configuration is reported in one warning line, recomputed and replaced: the cache is a memo the sweep can always
rebuild, so a wrong entry costs a recomputation, never a wrong row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from pathlib import Path

import numpy as np

from .._version import __version__
from ..analysis._predictions import EscapePrediction
from ..configuration._config import Config
from ..io._run_folders import NPZ_ERRORS, load_npz, npz_names, npz_stamp, save_npz

#: Layout and methods of the cache entries; part of every cache key, so that entries of an earlier layout or method are
#: never read (4: escape predictions on the Sobol rule whatever the run's route).
CACHE_VERSION = 4


def cache_key(config: Config, kind: str) -> str:
    """The key of an entry (module docstring)."""
    data = {"singleloc_version": __version__, "cache_version": CACHE_VERSION, "kind": kind, "config": config.to_dict()}
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


#: The arrays of a complete cache entry of each kind.
ENTRY_KEYS = {"prediction": tuple(f.name for f in dataclasses.fields(EscapePrediction)),
              "theory": ("tau", "M", "Q", "b", "risk"), "simulation": ("tau", "M", "Q", "b", "risk", "risk_limit"),
              "bayes": ("bayes_risk", "bayes_risk_error")}


def _read_entry(path: Path, kind: str, *, arrays: bool = True) -> dict[str, np.ndarray | None] | None:
    """The cache entry at ``path``, or ``None`` (after a one-line warning) when it is damaged: unreadable
    (truncated, bad CRC, not a zip file), without one of :data:`ENTRY_KEYS`, or recorded for another configuration
    than the one its name is the key of (module docstring). With ``arrays=False`` only the zip's directory is read
    (the names map to ``None``): a cheap check that finds a missing, truncated, incomplete or foreign entry; a
    damaged array inside a whole file is found when the entry is read."""
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


def _entry_path(cache: Path, config: Config, kind: str) -> Path:
    return cache / f"{kind}-{cache_key(config, kind)}.npz"


def _entry_key(path: Path, kind: str) -> str:
    """The key of an entry's configuration, from its name (:func:`_entry_path`)."""
    return path.name[len(kind) + 1:-len(".npz")]


def _store(path: Path, kind: str, data: dict[str, np.ndarray]) -> None:
    """Write an entry, recording its key (module docstring)."""
    save_npz(path, data, stamp=_entry_key(path, kind))
