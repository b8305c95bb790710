"""What the numbered benchmarks share: the ``--save PATH`` option, the machine's description, the atomic write.

``python benchmarks/NN_name.py ... --save results.json`` prints what it always printed and also
writes the measured numbers as JSON::

    {"benchmark": "04_sweep_cache", "date": "2026-12-02T10:11:12+00:00", "command": "python benchmarks/...",
     "options": {...}, "machine": {"platform": ..., "cpu_count": ..., "jax": ..., "device_kind": ...}, "results": {...}}

The file is written atomically by the package's own writer (:func:`singleloc.save_json`: a temporary
file in the same folder, then :func:`os.replace`), so a reader sees the previous file or the new one,
never half of one, and a failed write leaves no file behind. The machine is described when the file
is written, after the measurements: this module does not start JAX's backend before a benchmark runs
(a GPU's memory stays the benchmark's).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def add_save_option(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds ``--save PATH`` (default: nothing is written) to a benchmark's parser."""
    parser.add_argument("--save", metavar="PATH", default=None,
                        help="also write the measured numbers, the machine, the date and the command line as JSON to PATH")
    return parser


def _commit() -> str | None:
    """The checkout's commit (``+dirty`` with uncommitted changes), or None outside git."""
    try:
        run = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True).stdout
        commit = run("rev-parse", "HEAD").strip()
        dirty = bool(run("status", "--porcelain", "--untracked-files=no").strip())
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def machine() -> dict:
    """Platform, processor, cores, load, Python, JAX and its devices (this starts JAX's backend)."""
    import jax

    jax.config.update("jax_enable_x64", True)  # as every benchmark does; the description does not depend on it
    devices = jax.devices()
    info = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
    }
    with contextlib.suppress(Exception):
        import jaxlib

        info["jaxlib"] = jaxlib.__version__
    with contextlib.suppress(Exception):
        import numpy

        info["numpy"] = numpy.__version__
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        info["singleloc"] = version("singleloc")
    info["commit"] = _commit()
    return info


def _plain(value):
    """``value`` with numpy scalars and arrays, tuples and paths made JSON's own types; a NaN or an
    infinity becomes None (JSON has neither)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy scalars and arrays
        return _plain(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def timed(fn, *args, repeats: int = 3):
    """``(out, ms)``: ``fn(*args)`` after a first call (which compiles) and the median milliseconds of
    ``repeats`` more calls, each waited for (``jax.block_until_ready``)."""
    import time

    import jax

    out = jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return out, 1e3 * sorted(times)[len(times) // 2]


def write_json(path: str | os.PathLike, data) -> Path:
    """Writes ``data`` as JSON to ``path`` atomically, with :func:`singleloc.save_json` (a temporary
    file in the same folder, then :func:`os.replace`; on any failure the temporary file is removed
    and an existing ``path`` is left as it was). The text is made before the file is created, so an
    unserialisable value fails before any file is touched."""
    from singleloc import save_json

    return save_json(path, _plain(data))


def record(benchmark: str, results, options: dict | None = None) -> dict:
    """The saved document: the benchmark's name, the date (UTC), the command line, its options
    (``--save`` left out), the machine and the results."""
    options = {k: v for k, v in (options or {}).items() if k != "save"}
    return {
        "benchmark": Path(benchmark).stem,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", *sys.argv]),
        "options": options,
        "machine": machine(),
        "results": results,
    }


def save(args: argparse.Namespace, benchmark: str, results) -> Path | None:
    """Writes :func:`record` to ``args.save`` when the option was given (None otherwise), and says so."""
    if getattr(args, "save", None) is None:
        return None
    path = write_json(args.save, record(benchmark, results, vars(args)))
    print(f"\nsaved the results to {path}")
    return path
