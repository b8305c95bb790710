"""Times measured on this device, kept between runs: what the estimates of :mod:`singleloc.preflight._estimates` are made of.

Every long computation (a theory solve, a simulation, a pruning) records, after it ran, what it
took on the device that ran it: the time to compile its program or to load it from the
compilation cache, and its running time against its amount of work (``tau`` solved, SGD steps,
risks evaluated). The records are kept per device (:func:`device`: the platform and its kind,
for a CPU its model and count) and per *shape family*: the computations that share one compiled
program (the configuration without the values that a program receives as arguments, e.g. the
learning rate or ``tau_max``: :func:`~singleloc.runtime._compilation.compile_group`). The next run of
the family is estimated from them; a family not seen on this device is scaled from the records
of its kind on this device, or, on a device without records, from :func:`benchmark`: a short
calibration of the device (a small compiled kernel, and a host loop for the speed of XLA's
compiler), measured once per device, against the same calibration on the 2-core CPU where the
cost models of :mod:`singleloc.preflight._estimates` were fitted.

File. ``timings.json`` in the compilation cache folder (JAX's folder when the persistent cache
is on, else :func:`~singleloc.runtime._compilation.cache_dir`; none when the cache is turned off with
``SINGLELOC_CACHE_DIR=""``: the records then live in this process only)::

    {"version": 1, "devices": {DEVICE: {"benchmark": {"run": s, "host": s},
                                       "families": {KEY: {"kind": ..., "label": ..., "features": {...},
                                                          "compile": s, "load": s, "env": ...,
                                                          "runs": [[work, seconds], ...]}}}}}

It is rewritten whole (atomically) after every record, so that estimates improve with every run;
deleting it resets them (the next run of each family is again a first run). A damaged file is
ignored (and replaced by the next record). ``clock`` is the module's clock (tests replace it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..ground._atomic_files import atomic_write

#: The clock of every measurement (seconds; replaced by tests).
clock = time.perf_counter

FILE_NAME = "timings.json"
VERSION = 1

#: Runs kept per family (the latest): the fit of :func:`predict` reads them.
RUNS_KEPT = 8


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity mask where the system has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def device() -> str:
    """The device that runs the computations: ``"gpu: NVIDIA H200"``, ``"cpu: AMD EPYC x 2"``
    (JAX's first device; a CPU named by its model and the CPUs this process may use)."""
    import jax

    d = jax.devices()[0]
    if d.platform != "cpu":
        return f"{d.platform}: {d.device_kind}"
    model = "cpu"
    with contextlib.suppress(OSError):
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
        model = found.group(1).strip() if found else model
    return f"cpu: {model} x {cpu_count()}"


def device_label(name: str | None = None) -> str:
    """``"this CPU"``, ``"this GPU (NVIDIA H200)"``: the device in a sentence."""
    name = device() if name is None else name
    platform, _, kind = name.partition(": ")
    return "this CPU" if platform == "cpu" else f"this {platform.upper()} ({kind})"


def timings_path() -> Path | None:
    """Where the records are kept (module docstring); ``None``: in this process only."""
    import jax

    from ._compilation import cache_dir

    folder = jax.config.jax_compilation_cache_dir or cache_dir()
    return None if not folder else Path(folder) / FILE_NAME


def duration(seconds: float) -> str:
    """``"0.4 s"``, ``"40 s"``, ``"12 min"``, ``"6.4 h"``, ``"3.1 days"`` (an unknown time: NaN or infinite)."""
    if not math.isfinite(seconds):
        return "an unknown time"
    if seconds < 90:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.2g} min"
    return f"{seconds / 3600:.2g} h" if seconds < 72 * 3600 else f"{seconds / 86400:.2g} days"


@dataclasses.dataclass(frozen=True)
class Estimate:
    """What a computation is expected to take: ``seconds`` in all, its ``parts`` (``(what,
    seconds)``, e.g. compiling and solving) and its ``basis``, what the number comes from
    (``"measured on this CPU for this shape family"``, ``"first run of this shape family, from
    this device's speed"``)."""

    seconds: float
    basis: str
    parts: tuple[tuple[str, float], ...] = ()

    def describe(self) -> str:
        """``"about 40 s (compiling about 30 s, solving about 10 s; measured on this CPU for this shape family)"``."""
        parts = ", ".join(f"{what} about {duration(s)}" for what, s in self.parts if s > 0.05 * self.seconds)
        inside = "; ".join(filter(None, (parts if len([p for p in self.parts if p[1] > 0.05 * self.seconds]) > 1 else "",
                                         self.basis)))
        return f"about {duration(self.seconds)}" + (f" ({inside})" if inside else "")

    def __add__(self, other: Estimate) -> Estimate:
        basis = self.basis if self.basis == other.basis else "; ".join(filter(None, (self.basis, other.basis)))
        return Estimate(self.seconds + other.seconds, basis, self.parts + other.parts)


def predict(runs: Sequence[Sequence[float]], amount: float, size: Callable[[float], float] = float) -> float:
    """Seconds for ``amount`` of work (``tau`` solved, risks evaluated) from the measured ``runs``
    ``[(amount_i, seconds_i), ...]``: the median rate ``seconds_i / size(amount_i)`` of the latest
    three runs times ``size(amount)``, with ``size`` a cost model (e.g. fixed costs per saved time
    plus a cost per ``tau``; default: proportional). NaN without runs."""
    rates = sorted(s / size(w) for w, s in list(runs)[-3:] if size(w) > 0 and s >= 0)
    return rates[len(rates) // 2] * size(amount) if rates else math.nan


class Timings:
    """The records of one device (module docstring), read from ``path`` (``None``: none kept)."""

    def __init__(self, path: Path | None, device_name: str):
        self.path, self.device = path, device_name
        self._data = self._read()

    def _read(self) -> dict[str, Any]:
        empty = {"version": VERSION, "devices": {}}
        if self.path is None:
            return empty
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):  # none yet, or damaged: replaced by the next record
            return empty
        if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("devices"), dict):
            return empty
        return data

    def _mine(self) -> dict[str, Any]:
        return self._data["devices"].setdefault(self.device, {"families": {}})

    def family(self, key: str) -> dict[str, Any] | None:
        """The record of a shape family on this device, or ``None``."""
        return self._mine()["families"].get(key)

    def families(self, kind: str) -> list[dict[str, Any]]:
        """The records of every family of ``kind`` (e.g. ``"integrate"``) on this device."""
        return [f for f in self._mine()["families"].values() if f.get("kind") == kind]

    def record(self, key: str, kind: str, *, label: str = "", features: Mapping[str, Any] | None = None,
               run: tuple[float, float] | None = None, **fields: Any) -> None:
        """Add to the record of family ``key``: ``fields`` (e.g. ``compile=12.3``, ``env=...``)
        replace the stored ones, ``run`` ``(work, seconds)`` joins the latest :data:`RUNS_KEPT`
        runs; then the file is rewritten (re-read first, so that records of other processes are
        kept). A file that cannot be written is left as it is (the records are kept in this
        process)."""
        self._data = self._read() if self.path is not None else self._data
        entry = self._mine()["families"].setdefault(key, {"kind": kind, "runs": []})
        entry.update(kind=kind, label=label or entry.get("label", ""), features=dict(features or entry.get("features", {})),
                     **{k: v for k, v in fields.items() if v is not None})
        if run is not None:
            entry["runs"] = (entry.get("runs", []) + [[float(run[0]), float(run[1])]])[-RUNS_KEPT:]
        self._write()

    def benchmark(self) -> dict[str, float]:
        """This device's calibration (:func:`measure_benchmark`), measured on the first call on
        a device and kept in the records."""
        mine = self._mine()
        if "benchmark" not in mine:
            mine["benchmark"] = measure_benchmark()
            self._write()
        return mine["benchmark"]

    def _write(self) -> None:
        if self.path is None:
            return
        text = json.dumps(self._data, indent=1, sort_keys=True).encode()
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, lambda fh: fh.write(text))


_CURRENT: list[Timings] = []


def timings() -> Timings:
    """The records of this device at :func:`timings_path` (one object per path and device in a process)."""
    path, name = timings_path(), device()
    if not _CURRENT or _CURRENT[0].path != path or _CURRENT[0].device != name:
        _CURRENT[:] = [Timings(path, name)]
    return _CURRENT[0]


#: The calibration's kernel: ``ROWS x WIDTH`` float32 fields through a matrix product, an
#: exponential and a sum, ``REPEAT`` times in one program (the kind of work of a quadrature).
ROWS, WIDTH, REPEAT = 4096, 32, 20


def measure_benchmark() -> dict[str, float]:
    """Seconds of one run of the calibration kernel on JAX's first device (the best of five,
    compiled before), and of a fixed pure-Python loop on the host (what XLA's compiler runs on:
    the best of three)."""
    import jax
    import jax.numpy as jnp

    def kernel(x, w):
        def body(_, y):
            return jnp.tanh(y @ w) + x

        return jnp.sum(jnp.exp(-jax.lax.fori_loop(0, REPEAT, body, x) ** 2))

    x = jnp.linspace(-1.0, 1.0, ROWS * WIDTH, dtype=jnp.float32).reshape(ROWS, WIDTH)
    w = jnp.eye(WIDTH, dtype=jnp.float32) * 0.5
    run = jax.jit(kernel)
    run(x, w).block_until_ready()
    best = math.inf
    for _ in range(5):
        t0 = clock()
        run(x, w).block_until_ready()
        best = min(best, clock() - t0)
    host = math.inf
    for _ in range(3):
        t0 = clock()
        sum(i * i % 7 for i in range(200_000))
        host = min(host, clock() - t0)
    return {"run": best, "host": host}
