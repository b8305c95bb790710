"""Output files, written atomically (:func:`singleloc.ground._atomic_files.atomic_write`), and run folders.

Run folders. The outputs of one ``integrate``, ``simulate`` or ``compare`` form one unit, a
folder written by :func:`save_run`:

* every file carries the **config hash** of the run (:func:`~singleloc.config_hash`: SHA-256 of the
  canonical JSON of the resolved config): ``config.json`` holds it as ``config_hash`` next to
  the config and ``singleloc_version``; each ``.npz`` as its zip comment
  ``singleloc config_hash HASH`` (:func:`npz_stamp`; the arrays are unchanged); each ``.png``
  as the text entry ``singleloc config_hash``;
* the folder is replaced as a whole (:func:`singleloc.ground._atomic_files.write_folder`): the files are
  written into a hidden sibling that then takes the folder's place, so a failure or a kill
  leaves the previous run intact and no file of an earlier run survives beside the new ones.

:func:`add_to_run` adds files to a run (``prune``'s, stamped with its hash) in the same way; :func:`load_run`
reads a run back and refuses a folder whose files disagree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import zipfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from ..configuration._config import Config, config_hash, load_config
from ..ground._atomic_files import (
    NPZ_STAMP,
    RUN_FILES,
    RUN_STAMP,
    atomic_write,
    describe_path,
    npz_stamp,
    run_stamp,
    write_folder,
)
from ..pruning._pruning_result import PruningResult
from ..simulation._simulation_result import SimulationResult
from ..theory._theory_result import TheoryResult, theory_from_arrays

#: The data files of a run folder, ``<kind>.npz``, in the order :func:`load_run` reads them.
RUN_KINDS = ("theory", "simulation")

#: Name of the hash entry in ``config.json`` (and, prefixed by ``singleloc``, in the other files).
HASH_KEY = "config_hash"

#: The errors NumPy and zipfile raise for a damaged or truncated ``.npz`` file.
NPZ_ERRORS = (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error)


def save_npz(path: str | Path, arrays: Mapping[str, Any], stamp: str | None = None) -> Path:
    """Write ``arrays`` to ``path`` (``.npz``) atomically; ``stamp``: a config hash, stored as
    the zip comment ``singleloc config_hash STAMP`` (see :func:`npz_stamp`)."""

    def write(fh) -> None:
        np.savez(fh, **{k: np.asarray(v) for k, v in arrays.items()})
        if stamp is not None:
            fh.seek(0)
            with zipfile.ZipFile(fh, "a") as z:
                z.comment = (NPZ_STAMP + stamp).encode()

    return atomic_write(Path(path), write)


def save_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) atomically."""
    return atomic_write(Path(path), lambda fh: fh.write(text.encode()))


def save_json(path: str | Path, data: Any) -> Path:
    """Write ``data`` as indented JSON atomically."""
    return save_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def save_figure(path: str | Path, fig, metadata: Mapping[str, str] | None = None) -> Path:
    """Save a matplotlib figure as PNG atomically (``metadata``: PNG text entries)."""
    return atomic_write(Path(path), lambda fh: fig.savefig(fh, format="png", dpi=110, bbox_inches="tight",
                                                           metadata=dict(metadata or {})))


def _write_stamped(folder: Path, files: Mapping[str, Any], stamp: str) -> None:
    for name, content in files.items():
        if name.endswith(".npz"):
            save_npz(folder / name, content, stamp)
        elif name.endswith(".png"):
            save_figure(folder / name, content, {RUN_STAMP: stamp})
        else:
            raise ValueError(f"a run holds .npz and .png files, got {name!r}")


def save_run(directory: str | Path, config: Config, files: Mapping[str, Any]) -> Path:
    """Write a run folder: ``config.json`` and ``files`` (name -> arrays for ``.npz``, a
    matplotlib figure for ``.png``), all stamped with the config hash, replacing ``directory``
    as a whole (see the module docstring). Returns ``directory``."""
    stamp = config_hash(config)

    def fill(folder: Path) -> None:
        save_json(folder / "config.json", {"singleloc_version": __version__, HASH_KEY: stamp, **config.to_dict()})
        _write_stamped(folder, files, stamp)

    return write_folder(directory, fill)


def save_theory(directory: str | Path, config: Config, result: TheoryResult, index: int = 0) -> Path:
    """Write the run folder ``DIR`` of an integration: ``theory.npz`` (trajectory ``index`` of ``result``)
    and ``config.json`` (with the number of points chosen when ``theory.points = "auto"``), replacing
    ``DIR`` as a whole (:func:`save_run`); returns ``DIR/theory.npz``."""
    return save_run(directory, result.resolved(config), {"theory.npz": result.arrays(index)}) / "theory.npz"


def save_simulation(directory: str | Path, config: Config, result: SimulationResult) -> Path:
    """Write the run folder ``DIR`` of a simulation: ``simulation.npz`` and ``config.json``, replacing
    ``DIR`` as a whole (:func:`save_run`); returns ``DIR/simulation.npz``."""
    return save_run(directory, config, {"simulation.npz": result.arrays()}) / "simulation.npz"


def add_to_run(run: Run, files: Mapping[str, Any]) -> Path:
    """Add ``files`` (as for :func:`save_run`) to the folder of ``run``, stamped with its hash;
    its other files are kept, and the folder is again replaced as a whole."""
    return write_folder(run.directory, lambda folder: _write_stamped(folder, files, run.config_hash), keep=True)


@contextlib.contextmanager
def _open_npz(path: str | Path) -> Iterator[Any]:
    """``np.load`` of an ``.npz`` file (``ValueError`` for a file that is not a zip archive,
    rather than NumPy's attempt to read it as a pickle)."""
    if not zipfile.is_zipfile(path):
        raise ValueError("not a zip archive")
    with np.load(path, allow_pickle=False) as data:
        yield data


def load_npz(path: str | Path) -> dict[str, np.ndarray]:
    """All arrays of an ``.npz`` file as a dict (errors as :func:`_open_npz`)."""
    with _open_npz(path) as data:
        return {k: data[k] for k in data.files}


def npz_names(path: str | Path) -> list[str]:
    """The names of the arrays of an ``.npz`` file, from its zip directory only (no array is
    read; errors as :func:`load_npz`)."""
    with _open_npz(path) as data:
        return list(data.files)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def load_npy(path: str | Path, name: str) -> np.ndarray:
    """A real numeric ``.npy`` array, memory-mapped (rows are read when indexed).

    ``name`` names the file in the error messages (``FileNotFoundError`` for a missing file,
    ``ValueError`` for one that is not a real numeric ``.npy`` array)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{name} {str(path)!r} does not exist")
    if not path.is_file():
        raise ValueError(f"{name} {str(path)!r} is {describe_path(path)}; expected a .npy file")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as err:  # numpy raises several types for a malformed file
        raise ValueError(f"{name} {str(path)!r} is not a readable .npy array ({_one_line(err)})") from None
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} {str(path)!r} must hold a real numeric array, got dtype {getattr(arr, 'dtype', '?')}")
    return arr


#: Further stamped data files a run folder may hold, read by :func:`load_run` when present:
#: ``theory_seeds.npz`` (``compare``: the theory of every seed) and ``prune.npz`` (``prune``).
EXTRA_KINDS = ("theory_seeds", "prune")


@dataclasses.dataclass(frozen=True)
class Run:
    """An output folder read back: its ``config``, the ``config_hash`` every file carries and, for each ``<kind>.npz``
    present (``kind`` in :data:`RUN_KINDS`), its arrays in ``data[kind]``; the arrays of the further files of
    :data:`EXTRA_KINDS` present in ``extra[kind]``; as results (:attr:`theory`, :attr:`simulation`, :attr:`pruning`), so
    that ``plots.plot_compare(run.theory, run.simulation)`` draws a run read back."""

    directory: Path
    config: Config
    data: Mapping[str, dict[str, np.ndarray]]
    config_hash: str
    extra: Mapping[str, dict[str, np.ndarray]] = dataclasses.field(default_factory=dict)

    @property
    def theory(self):
        """The theory as a :class:`~singleloc.TheoryResult` (trajectories with a leading start axis):
        every seed's of ``theory_seeds.npz`` (``compare``) when present, else the one trajectory of
        ``theory.npz``; the route and stated errors from ``theory.npz``. ``None`` without either."""
        known = "theory" in self.data or "theory_seeds" in self.extra
        return theory_from_arrays(self.data.get("theory"), self.extra.get("theory_seeds")) if known else None

    @property
    def simulation(self):
        """``simulation.npz`` as a :class:`~singleloc.SimulationResult` (without the final keys and
        spikes, which the file does not hold: ``K`` and ``kstar`` are ``None``), or ``None``."""
        d = self.data.get("simulation")
        return None if d is None else SimulationResult(d["tau"], d["M"], d["Q"], d["b"], d["risk"], d["risk_limit"],
                                                       None, None, d.get("v"))

    @property
    def pruning(self):
        """``prune.npz`` as ``{source: PruningResult}`` (``"theory"``, ``"simulation"``: the rows of
        every seed or random draw), or ``None``."""
        d = self.extra.get("prune")
        if d is None:
            return None
        order = str(d["order"]) if "order" in d else "given"
        return {source: PruningResult(order, d[f"{source}_removed"], d[f"{source}_risks"], d.get(f"{source}_stderr"))
                for source in RUN_KINDS if f"{source}_risks" in d}


def _check_arrays(file: Path, arrays: Mapping[str, np.ndarray], H: int, F: int, kind: str) -> None:
    """The arrays of ``<kind>.npz`` of a layer of ``H`` heads and ``F`` spikes: present, of their shapes (``"T"`` and
    ``"S"`` stand for any length) and finite; ``ValueError`` naming the file otherwise."""
    seeds = () if kind == "theory" else ("S",)
    shapes = {"tau": ("T",), "M": (*seeds, "T", H, F), "Q": (*seeds, "T", H, H), "b": (*seeds, "T", H), "risk": (*seeds, "T")}
    sizes: dict[str, int] = {}
    for key, shape in (shapes if kind == "theory" else {**shapes, "risk_limit": ("S", "T")}).items():
        if key not in arrays:
            raise ValueError(f"{file} has no array {key!r}: the file is incomplete")
        got = arrays[key].shape
        ok = len(got) == len(shape) and all(sizes.setdefault(s, n) == n if isinstance(s, str) else s == n
                                            for s, n in zip(shape, got))
        if not ok:
            want = "(" + ", ".join(map(str, shape)) + ")"
            raise ValueError(f"{file}: {key} has shape {got}, expected {want} for model.heads = {H}, problem.F = {F}")
        bad = [t for t, row in enumerate(np.moveaxis(arrays[key], shape.index("T"), 0)) if not np.isfinite(row).all()]
        if bad:  # the package never saves such a run (its solves and simulations refuse them): a damaged file
            raise ValueError(f"{file}: {key} is NaN or infinite at saved time {bad[0]} of {got[shape.index('T')]} (tau = "
                             f"{arrays['tau'][bad[0]]:.4g}): the file is damaged; rerun the command that made it")


def _check_stamp(file: Path, got: str | None, stamp: str) -> None:
    if got != stamp:
        made = "carries no config hash" if got is None else f"was made by another config (hash {got})"
        raise ValueError(f"{file} {made}, not by the config.json beside it (hash {stamp}): the folder mixes files "
                         "of different runs; rerun the command that made it")


def load_run(directory: str | Path, kinds: Sequence[str] = RUN_KINDS) -> Run:
    """Read the output folder of ``integrate``, ``simulate``, ``compare`` or ``prune``: ``config.json``,
    those of ``<kind>.npz`` (``kind`` in ``kinds``) that are present and the further files of
    :data:`EXTRA_KINDS` present (``theory_seeds.npz``, ``prune.npz``), as a :class:`Run`.

    Raises ``FileNotFoundError`` when the folder, its ``config.json`` or every wanted data file
    is missing, and ``ValueError`` when a file present cannot be read, is incomplete, or does
    not carry the config hash of ``config.json`` (the folder mixes runs: also a figure of another run), or holds
    NaN or infinite trajectories (damaged), naming the file.
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
    version = data.pop("singleloc_version", "unknown")
    stamp = data.pop(HASH_KEY, None)  # Config.from_dict would ignore both; the hash is of the rest
    try:
        config = load_config(data)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: {_one_line(err)}") from None
    if stamp is None:
        raise ValueError(f"{path} carries no config hash (written by singleloc {version}, before runs were stamped), "
                         "so its files cannot be checked to belong together: rerun the command that made it")
    if config_hash(data) != stamp:
        raise ValueError(f"{path} was edited after the run: its contents no longer give its config hash {stamp}, "
                         "so the data files were made by another config; rerun the command instead of editing the file")
    files = {kind: directory / f"{kind}.npz" for kind in (*kinds, *EXTRA_KINDS) if (directory / f"{kind}.npz").is_file()}
    if not files:
        raise FileNotFoundError(f"no {' or '.join(f'{kind}.npz' for kind in kinds)} in {directory}")
    arrays = {}
    for kind, file in files.items():
        try:
            arrays[kind] = load_npz(file)
            got = npz_stamp(file)
        except NPZ_ERRORS as err:
            raise ValueError(f"{file} is not a readable .npz file ({_one_line(err)})") from None
        _check_stamp(file, got, stamp)
        if kind in RUN_KINDS:
            _check_arrays(file, arrays[kind], config.model.heads, config.problem.F, kind)
    for figure in (directory / name for name in RUN_FILES if name.endswith(".png")):
        if figure.is_file():
            _check_stamp(figure, run_stamp(figure), stamp)
    extra = {kind: arrays.pop(kind) for kind in EXTRA_KINDS if kind in arrays}
    return Run(directory, config, arrays, stamp, extra)
