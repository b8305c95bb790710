"""Files and folders written whole, and output places checked before a run starts.

This module uses the standard library only, so that the command line can check ``--out``
while it parses the arguments, before any numerical library is loaded.

Atomic files. :func:`atomic_write` writes a hidden temporary file in the target's folder (mode
``0o666`` less the umask, as ``open`` gives) and moves it into place with ``os.replace``: a reader
sees the old file or the new one, never a part; :func:`written_together` moves a set of them at once.

Run folders. A run (``integrate``, ``simulate``, ``compare``) is one folder whose files belong together.
:func:`write_folder` fills a hidden sibling ``.NAME.new-PID-XXXX`` (mode ``0o777`` less the umask) and swaps it
with ``NAME`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``; elsewhere the old folder is renamed aside, the new
one into place, and the old one removed). A failure, Ctrl-C or ``kill -9`` before the swap leaves the previous run
as it was; the orphaned sibling of a killed process is removed by the next write to the same folder. A run folder
holds only regular files with the names in :data:`RUN_FILES` (and ``config.json`` carries ``singleloc_version``): a
folder holding anything else is never replaced (:func:`check_run_folder` refuses it), so that no file of the user's
is ever deleted. ``plot --out`` and ``attention`` refuse a folder of another run unless told, never replacing its
files (:func:`check_other_run`).
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import errno
import json
import os
import re
import secrets
import shutil
import zipfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

#: The files a run folder may hold: those written by ``integrate``, ``simulate``, ``compare``
#: ``prune`` (which adds its outputs to the run it pruned) and ``plot`` (which adds its figures).
RUN_FILES = ("config.json", "theory.npz", "simulation.npz", "theory_seeds.npz", "compare.png", "theory.png", "simulation.png",
             "phases.png", "prune.npz", "prune.png")


def _create(path: Path, mode: int) -> int:
    """A new file opened for reading and writing, created like ``open(path, 'xb')`` (``mode`` less the umask)."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), mode)


def _hidden_sibling(path: Path, tag: str) -> Path:
    """``PARENT/.NAME.TAG-PID-XXXXXXXX``: a fresh hidden name next to ``path``."""
    return path.parent / f".{path.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}"


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> Path:
    """Write a file by ``write(fh)`` (``fh`` open for writing and reading) into a temporary
    sibling, then move it onto ``path``.

    The folder is created if missing. On any failure (and on Ctrl-C) the temporary file is
    removed and ``path`` is unchanged; a failure to write (a full disk, a read-only folder) is
    an ``OSError`` whose message names ``path``. Inside :func:`written_together` for the
    folder of ``path``, the file is only staged: it takes its place with the others of the set."""
    path = Path(path)
    staging = _STAGING.get()
    staged = staging is not None and staging.holds(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _hidden_sibling(path, "tmp")
        fd = _create(tmp, 0o666)
    except OSError as err:
        raise _named(err, path) from err
    try:
        with os.fdopen(fd, "w+b") as fh:
            write(fh)
        if staged:
            staging.files.append((tmp, path))
        else:
            os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and not isinstance(err, _Named):
            raise _named(err, path) from err
        raise
    return path


class _Named(OSError):
    """An ``OSError`` whose message already names the file it is about; ``reason``: the
    system's words alone (``No space left on device``)."""

    def __init__(self, code, message: str, reason: str):
        super().__init__(code, message)
        self.reason = reason


def _reason(err: OSError) -> str:
    return err.reason if isinstance(err, _Named) else str(err.strerror or err)


def _named(err: OSError, path: Path) -> OSError:
    """``err`` as one line naming ``path``: ``could not write PATH: No space left on device``."""
    if isinstance(err, _Named):
        return err
    return _Named(err.errno, f"could not write {str(path)!r}: {_reason(err)}", _reason(err))


class _Staging:
    """The files of one :func:`written_together` block: temporary files written whole, moved
    into place together when the block ends without error."""

    def __init__(self, folder: Path):
        self.folder = Path(os.path.abspath(folder))
        self.files: list[tuple[Path, Path]] = []  # (temporary file, target)

    def holds(self, path: Path) -> bool:
        return Path(os.path.abspath(path)).parent == self.folder

    def discard(self) -> None:
        for tmp, _ in self.files:
            tmp.unlink(missing_ok=True)
        self.files.clear()


_STAGING: contextvars.ContextVar[_Staging | None] = contextvars.ContextVar("singleloc_staging", default=None)


@contextlib.contextmanager
def written_together(folder: str | Path, stale: Callable[[set[Path]], Iterable[Path]] | None = None) -> Iterator[list[Path]]:
    """The files written into ``folder`` in this block (by :func:`atomic_write`) are one unit: each is written
    whole into a hidden temporary file, and only when the block ends without error do they all take their places
    (renames within one folder, which need no free space). On any failure every temporary file is removed and
    ``folder`` holds what it held before; the ``OSError`` says so in one line. ``stale(written)``: the files of an
    earlier output of the same command that this one did not write (e.g. a figure it no longer makes), removed once
    the new files are in place. Yields the list of the paths put in place (filled when the block ends)."""
    folder = Path(folder)
    staging = _Staging(folder)
    token = _STAGING.set(staging)
    placed: list[Path] = []
    try:
        yield placed
    except OSError as err:
        staging.discard()
        raise _Named(err.errno, f"{err.strerror or err}; nothing was written to {str(folder)!r}, which is unchanged",
                     _reason(err)) from err
    except BaseException:
        staging.discard()
        raise
    finally:
        _STAGING.reset(token)
    written = {path for _, path in staging.files}
    try:
        for tmp, path in staging.files:
            os.replace(tmp, path)
            placed.append(path)
    except OSError as err:
        staging.discard()
        raise _Named(err.errno, f"could not move the outputs into {str(folder)!r}: {_reason(err)}", _reason(err)) from err
    for path in stale(written) if stale is not None else ():
        if path not in written:
            Path(path).unlink(missing_ok=True)


#: The PNG text entry by which a command marks the figures it writes outside run folders
#: (``sweep``, ``diagnose``), so that it removes only its own figures when a later output no longer has them.
OUTPUT_KEY = "singleloc output"


def png_text(path: str | Path, key: str) -> str | None:
    """The text entry ``key`` of the PNG file ``path`` (as :func:`singleloc.save_figure` writes its
    ``metadata``: a ``tEXt`` chunk), or ``None`` (no such entry, not a PNG file, unreadable)."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    pos, wanted = 8, key.encode("latin-1") + b"\x00"
    while data.startswith(b"\x89PNG\r\n\x1a\n") and pos + 8 <= len(data):
        size, kind = int.from_bytes(data[pos:pos + 4], "big"), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + size]
        if kind == b"tEXt" and body.startswith(wanted):
            return body[len(wanted):].decode("latin-1")
        if kind == b"IEND":
            break
        pos += 12 + size
    return None


def png_has_text(path: str | Path, key: str, value: str) -> bool:
    """Whether the PNG file ``path`` carries the text entry ``key`` = ``value`` (:func:`png_text`): how
    a command recognises a figure of its own before it removes it."""
    return png_text(path, key) == value


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None) if os.name == "posix" else None


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically; ``False`` where the system cannot."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _swap_into_place(new: Path, target: Path) -> None:
    if not target.exists():
        os.rename(new, target)
        return
    if _exchange(new, target):
        shutil.rmtree(new)  # now the previous run
        return
    old = _hidden_sibling(target, "old")
    os.rename(target, old)
    os.rename(new, target)
    shutil.rmtree(old)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_orphans(target: Path) -> None:
    """Remove the siblings ``.NAME.new-PID-*``/``.NAME.old-PID-*`` left by killed processes."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(new|old)-(\d+)-[0-9a-f]{{8}}")
    for entry in target.parent.iterdir() if target.parent.is_dir() else ():
        match = pattern.fullmatch(entry.name)
        if match and not _alive(int(match.group(2))):
            shutil.rmtree(entry, ignore_errors=True)


def write_folder(target: str | Path, fill: Callable[[Path], object], keep: bool = False) -> Path:
    """Replace the folder ``target`` by the files ``fill(folder)`` writes into a fresh hidden sibling, in one step
    (module docstring); with ``keep``, the files of ``target`` that ``fill`` does not write are carried over. On any
    failure the sibling is removed and ``target`` is unchanged; a ``target`` that :func:`check_run_folder` refuses
    raises before anything is written. Returns ``target``."""
    check_run_folder(target)
    given = Path(target)
    target = Path(os.path.realpath(target))  # a symbolic link keeps pointing to the (new) run
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_orphans(target)
    new = _hidden_sibling(target, "new")
    os.mkdir(new, 0o777)
    try:
        fill(new)
        if keep and target.is_dir():
            written = {p.name for p in new.iterdir()}
            for src in target.iterdir():
                if src.name not in written and src.is_file():
                    try:
                        os.link(src, new / src.name)
                    except OSError:  # a copy where links fail
                        shutil.copy2(src, new / src.name)
        _swap_into_place(new, target)
    except OSError as err:
        shutil.rmtree(new, ignore_errors=True)
        unchanged = f"{str(given)!r} is unchanged" if target.exists() else f"nothing was written to {str(given)!r}"
        raise _Named(err.errno, f"could not write the run folder: {_reason(err)}; {unchanged}", _reason(err)) from err
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    return given


def describe_path(path: Path) -> str:
    """What ``path`` is, in a few words: ``"a folder"``, ``"a character device"``, ..."""
    if path.is_symlink() and not path.exists():
        return "a broken symbolic link"
    kinds = ((Path.is_dir, "a folder"), (Path.is_file, "a regular file"), (Path.is_char_device, "a character device"),
             (Path.is_block_device, "a block device"), (Path.is_fifo, "a named pipe"), (Path.is_socket, "a socket"))
    return next((words for test, words in kinds if test(path)), "missing" if not path.exists() else "a special file")


def _nearest_existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable(folder: str | Path) -> None:
    """Raise ``OSError`` (one line) unless a file can be created (and is, and removed again) in ``folder``, or in its
    nearest existing ancestor when it does not exist yet."""
    place = _nearest_existing(Path(folder))
    if not place.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{str(place)!r} is {describe_path(place)}, not a folder")
    probe = _hidden_sibling(place / "probe", "tmp")
    try:
        os.close(_create(probe, 0o600))
        probe.unlink()
    except OSError as err:
        raise OSError(err.errno, f"cannot create files in {str(place)!r} ({err.strerror})") from None


def run_folder_owner(folder: Path) -> str | None:
    """``None`` if ``folder`` may be replaced by a run (missing, empty, or a run folder as
    described in the module docstring); else the reason why not, in words."""
    if not folder.exists():
        return None
    if not folder.is_dir():
        return f"it is {describe_path(folder)}, not a folder"
    entries = sorted(folder.iterdir())
    if not entries:
        return None
    foreign = [p.name for p in entries if p.name not in RUN_FILES or not p.is_file() or p.is_symlink()]
    if foreign:
        listed = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        return f"it holds {listed}, which {'is' if len(foreign) == 1 else 'are'} not part of a singleloc run"
    return None if _written_config(folder / "config.json") else "it has no config.json written by singleloc"


def _written_config(path: Path) -> dict | None:
    """The ``config.json`` at ``path`` if singleloc wrote it (it has ``singleloc_version``), else ``None``."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and "singleloc_version" in data else None


def check_run_folder(folder: str | Path) -> bool:
    """Check, before a run, that ``folder`` can receive a run: not the current folder or one containing it (which
    the swap would move away), holding nothing but a previous run, in a writable parent. Returns whether a previous
    run is there (and will be replaced). Raises ``ValueError`` or ``OSError`` with one line naming the folder."""
    if not str(folder).strip():
        raise ValueError("expected a folder, got an empty name")
    folder = Path(folder)
    absolute = Path(os.path.realpath(folder))
    if Path.cwd() == absolute or absolute in Path.cwd().parents:
        raise ValueError(f"{str(folder)!r} is or contains the current folder, and writing a run replaces its folder as a "
                         "whole: run singleloc from outside it")
    reason = run_folder_owner(absolute)
    if reason is not None:
        raise ValueError(f"{str(folder)!r} cannot hold a run: {reason}; writing a run replaces its folder as a whole, "
                         "so choose a new or empty folder")
    check_writable(absolute.parent)
    return absolute.is_dir() and any(absolute.iterdir())


#: The PNG text entry that carries a run's config hash, and the start of its ``.npz`` files' zip comment.
RUN_STAMP, NPZ_STAMP = "singleloc config_hash", "singleloc config_hash "
#: The command-line flag that lets a command write beside the files of another run (:func:`check_other_run`).
BESIDE_FLAG = "--beside-run"


def npz_stamp(path: str | Path) -> str | None:
    """The config hash an ``.npz`` file of a run carries (its zip comment), or ``None`` (``zipfile``'s
    errors for a damaged file)."""
    with zipfile.ZipFile(path) as z:
        comment = z.comment.decode(errors="replace")
    return comment[len(NPZ_STAMP):] if comment.startswith(NPZ_STAMP) else None


def run_stamp(path: Path) -> str | None:
    """The config hash that the file ``path`` of a run carries: ``config.json``'s ``config_hash``, a
    figure's :data:`RUN_STAMP` entry, an ``.npz`` file's zip comment; ``None`` if it carries none."""
    if path.name == "config.json":
        return (_written_config(path) or {}).get("config_hash")
    if path.suffix == ".png":
        return png_text(path, RUN_STAMP)
    try:
        return npz_stamp(path)
    except (OSError, zipfile.BadZipFile):
        return None


def held_run(folder: Path) -> tuple[str, list[str]] | None:
    """The run whose files ``folder`` holds: the config hash of its ``config.json`` (or, without one, of
    its stamped figures, as ``plot --out`` writes them) and the names of the files of :data:`RUN_FILES`
    there; ``None`` when it holds no run."""
    names = [n for n in RUN_FILES if (folder / n).is_file()]
    stamps = [run_stamp(folder / n) for n in names]
    stamp = next((s for s in stamps if s is not None), None)
    return None if stamp is None else (stamp, names)


def check_other_run(folder: Path, mine: str | None, writer: str, names: Iterable[str], beside: bool) -> None:
    """Refuse (``ValueError``, one line) to write the files ``names`` of ``writer`` (what is written, in words) into
    ``folder`` when it holds another run than the one of config hash ``mine`` (``None``: the files are no run's): unless
    ``beside`` (:data:`BESIDE_FLAG`), and always when one of ``names`` is a file of the other run (never replaced)."""
    held = held_run(folder)
    if held is None and (sweep := [n for n in ("sweep.csv", "sweep.nc") if (Path(folder) / n).is_file()]):
        raise ValueError(f"{str(folder)!r} holds a sweep ({', '.join(sweep)}), not {writer}: choose another --out folder")
    if held is None or held[0] == mine:
        return
    other = f"{str(folder)!r} holds the run of config hash {held[0]} ({', '.join(held[1])})"
    clash = [n for n in names if n in held[1] and run_stamp(folder / n) != mine]
    if clash:
        raise ValueError(f"{other}, and {writer} would replace its {', '.join(clash)}: a file of another run is never "
                         "replaced; choose another --out folder")
    if not beside:
        raise ValueError(f"{other}, not {writer}: writing there would mix two runs in one folder; choose another --out "
                         f"folder, or pass {BESIDE_FLAG} to add the files beside that run's (none of them is replaced)")


def check_output_folder(folder: str | Path) -> None:
    """Check, before a run, that files can be written into ``folder`` (created if missing): it is not an existing
    non-folder and a file can be created in it (or its nearest ancestor); ``ValueError`` or ``OSError`` otherwise."""
    if not str(folder).strip():
        raise ValueError("expected a folder, got an empty name")
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{str(folder)!r} is {describe_path(folder)}, not a folder")
    check_writable(folder)
