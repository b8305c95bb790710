"""Atomic output files and run directories.

Every file is written to a temporary name in the target folder and moved into place with
``os.replace``, so a reader never sees a half-written file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from . import __version__


def _atomic_write(path: Path, write) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def save_npz(path: str | Path, arrays: Mapping[str, Any]) -> Path:
    """Write ``arrays`` to ``path`` (``.npz``) atomically."""
    return _atomic_write(Path(path), lambda fh: np.savez(fh, **{k: np.asarray(v) for k, v in arrays.items()}))


def save_json(path: str | Path, data: Any) -> Path:
    """Write ``data`` as indented JSON atomically."""
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    return _atomic_write(Path(path), lambda fh: fh.write(text.encode()))


def save_figure(path: str | Path, fig) -> Path:
    """Save a matplotlib figure as PNG atomically."""
    return _atomic_write(Path(path), lambda fh: fig.savefig(fh, format="png", dpi=110, bbox_inches="tight"))


def save_config(directory: str | Path, config) -> Path:
    """``DIR/config.json``: the resolved config and the package version."""
    return save_json(Path(directory) / "config.json", {"singleloc_version": __version__, **config.to_dict()})


def load_npz(path: str | Path) -> dict[str, np.ndarray]:
    """All arrays of an ``.npz`` file as a dict."""
    with np.load(path) as data:
        return {k: data[k] for k in data.files}
