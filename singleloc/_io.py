"""Atomic output files and run directories.

Every file is written to a temporary name in the target folder and moved into place with
``os.replace``, so a reader never sees a half-written file. :func:`load_run` reads an output
folder of ``integrate``, ``simulate`` or ``compare`` back.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._config import Config, load_config
from ._version import __version__

#: The data files of a run folder, ``<kind>.npz``, in the order :func:`load_run` reads them.
RUN_KINDS = ("theory", "simulation")


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


def save_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) atomically."""
    data = text.encode()
    return _atomic_write(Path(path), lambda fh: fh.write(data))


def save_json(path: str | Path, data: Any) -> Path:
    """Write ``data`` as indented JSON atomically."""
    return save_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def save_figure(path: str | Path, fig) -> Path:
    """Save a matplotlib figure as PNG atomically."""
    return _atomic_write(Path(path), lambda fh: fig.savefig(fh, format="png", dpi=110, bbox_inches="tight"))


def save_config(directory: str | Path, config: Config) -> Path:
    """``DIR/config.json``: the resolved config and the package version."""
    return save_json(Path(directory) / "config.json", {"singleloc_version": __version__, **config.to_dict()})


def load_npz(path: str | Path) -> dict[str, np.ndarray]:
    """All arrays of an ``.npz`` file as a dict."""
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def load_npy(path: str | Path, name: str) -> np.ndarray:
    """A real numeric ``.npy`` array, memory-mapped (rows are read when indexed).

    ``name`` names the file in the error messages (``FileNotFoundError`` for a missing file,
    ``ValueError`` for one that is not a real numeric ``.npy`` array)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{name} {str(path)!r} does not exist")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as err:  # numpy raises several types for a malformed file
        raise ValueError(f"{name} {str(path)!r} is not a readable .npy array ({_one_line(err)})") from None
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} {str(path)!r} must hold a real numeric array, got dtype {getattr(arr, 'dtype', '?')}")
    return arr


@dataclasses.dataclass(frozen=True)
class Run:
    """An output folder read back: its ``config`` and, for each ``<kind>.npz`` present
    (``kind`` in :data:`RUN_KINDS`), its arrays in ``data[kind]``."""

    directory: Path
    config: Config
    data: Mapping[str, dict[str, np.ndarray]]


def load_run(directory: str | Path, kinds: Sequence[str] = RUN_KINDS) -> Run:
    """Read the output folder of ``integrate``, ``simulate`` or ``compare``: ``config.json``
    and those of ``<kind>.npz`` (``kind`` in ``kinds``) that are present.

    Raises ``FileNotFoundError`` when the folder, its ``config.json`` or every wanted data file
    is missing, and ``ValueError`` when a file present cannot be read, naming the file.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"run folder {str(directory)!r} is not a folder")
    path = directory / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: a run folder is the output folder of integrate, simulate or compare")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON: {_one_line(err)}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a table of config sections, got a JSON {type(data).__name__}")
    data.pop("singleloc_version", None)
    try:
        config = load_config(data)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: {_one_line(err)}") from None
    files = {kind: directory / f"{kind}.npz" for kind in kinds if (directory / f"{kind}.npz").is_file()}
    if not files:
        raise FileNotFoundError(f"no {' or '.join(f'{kind}.npz' for kind in kinds)} in {directory}")
    arrays = {}
    for kind, file in files.items():
        try:
            arrays[kind] = load_npz(file)
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
            raise ValueError(f"{file} is not a readable .npz file ({_one_line(err)})") from None
    return Run(directory, config, arrays)
