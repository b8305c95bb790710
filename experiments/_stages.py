"""Shared by the experiment scripts: stages of a computation cached with ``--cache DIR``, so a
figure can be redrawn without recomputing."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from singleloc._io import load_npz, save_npz


def cache_dir(subfolder: str = "") -> Path | None:
    """The folder given by ``--cache DIR`` on the command line (plus ``subfolder``), or None."""
    if "--cache" not in sys.argv:
        return None
    return Path(sys.argv[sys.argv.index("--cache") + 1]) / subfolder


def stage(cache: Path | None, name: str, fn):
    """Run ``fn() -> dict of arrays``, or load it from ``cache/name.npz`` when present."""
    path = cache / f"{name}.npz" if cache else None
    if path is not None and path.is_file():
        return load_npz(path)
    data = {k: np.asarray(v) for k, v in fn().items()}
    if path is not None:
        save_npz(path, data)
    return data
