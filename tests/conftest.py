"""Shared test setup.

* Double precision everywhere (the reference computations of the tests are in float64; the
  finite-D simulator keeps its own single precision by design).
* ``theory.route`` defaults to the Sobol rule (``SINGLELOC_THEORY_ROUTE=rule``) except in tests
  marked ``exact_route``, which run on the users' default (the exact route where it applies).
* No phase lines on stderr (``SINGLELOC_PROGRESS=off``) except in tests/test_progress.py.
* A throw-away persistent compilation cache for the session: every ``simulate`` call builds
  fresh closures and therefore retraces, and on a small CPU machine XLA compilation dominates
  the run time of the tiny simulations. Identical programs (same config) are then compiled
  once per session. The cache lives in a temporary folder removed at exit, so nothing leaks
  between sessions and no stale executable can be picked up.
"""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import tempfile

import jax

jax.config.update("jax_enable_x64", True)

# The suite's mechanics (commands, files, sweeps, pruning, phases) run on the Sobol route, which
# compiles in a fraction of the time; the exact route (theory.route = "auto", the users' default)
# is tested by the tests marked ``exact_route`` (tests/test_laplace.py and the end-to-end runs),
# which restore the default. Subprocesses (the command line) inherit the variable.
os.environ["SINGLELOC_THEORY_ROUTE"] = "rule"

# The commands' phase lines and estimates (singleloc.runtime._progress) are off, as for a Python caller under
# pytest, so that the tests of their other output read it alone; tests/test_progress.py turns them on.
os.environ["SINGLELOC_PROGRESS"] = "off"

_CACHE_DIR = tempfile.mkdtemp(prefix="singleloc-test-jax-cache-")
atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)
jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def rng() -> np.random.Generator:
    """A fixed numpy generator: every test is deterministic."""
    return np.random.default_rng(20240607)


def _orthogonal_spikes(rng: np.random.Generator, F: int, D: int) -> np.ndarray:
    q, _ = np.linalg.qr(rng.standard_normal((D, F)))
    return np.sqrt(D) * q.T


@pytest.fixture
def orthogonal_spikes():
    """``f(rng, F, D)``: ``F`` orthogonal spikes of squared norm ``D`` (F, D), built in numpy
    independently of :func:`singleloc.make_spikes`."""
    return _orthogonal_spikes


@pytest.fixture(autouse=True)
def _route(request, monkeypatch):
    """Tests marked ``exact_route`` run on the default route of a user's session."""
    if request.node.get_closest_marker("exact_route"):
        monkeypatch.setenv("SINGLELOC_THEORY_ROUTE", "auto")


#: Memory mappings above which the session frees its compiled programs between tests. Every XLA
#: executable holds a few mappings and Linux caps a process at ``vm.max_map_count`` (65530 by
#: default); the whole suite in one process compiles past it, and the next compilation crashed the
#: interpreter (a segmentation fault in ``executable.serialize``, CI at 85 %). Freed programs come
#: back from the session's persistent cache when a later test needs them.
MAPPINGS_HIGH = 20000


def _mappings() -> int:
    try:
        with open("/proc/self/maps", "rb") as fh:
            return sum(1 for _ in fh)
    except OSError:  # not Linux: no such cap to stay under
        return 0


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    if _mappings() > MAPPINGS_HIGH:
        jax.clear_caches()
        gc.collect()
