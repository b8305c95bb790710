"""The task functions tests/test_distributed.py runs on Dask workers, in a module of their own that imports numpy only:
a worker imports the module of its task by name, and the test module's imports (JAX, singleloc, Dask's client) cost
a started or restarted worker about 10 s on a loaded 2-core machine."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

STARTUP = 120  # seconds allowed for a cluster or a process to start or stop on a loaded machine


def square(x: int) -> dict[str, np.ndarray]:
    if x == 3:
        raise FloatingPointError("diverged by tau = 1; lower sgd.lr")
    return {"x": np.array([x * x]), "pid": np.array(os.getpid())}


def square_once_killed(x: int, flags: str) -> dict[str, np.ndarray]:
    """Marks each start as ``started-X-PID``; the first attempt of ``x == 0`` waits to be killed."""
    flags = Path(flags)
    first = not (flags / "killed").exists()
    (flags / f"started-{x}-{os.getpid()}").touch()
    if x == 0 and first:
        time.sleep(STARTUP)  # not killed: the test fails on the number of attempts
    return {"x": np.array([x * x]), "pid": np.array(os.getpid())}


def process_of(x: int) -> dict[str, np.ndarray]:
    """The worker's process and its persistent compilation cache (JAX configured from its environment)."""
    import jax

    return {"pid": np.array(os.getpid()), "cache": np.array(jax.config.jax_compilation_cache_dir or "")}
