"""Shared test setup (docs/development.md, "Tests"): double precision (the finite-D simulator keeps its own
single precision), no phase lines (tests/test_progress.py turns them on), a compilation cache kept between runs
on one machine (:func:`_kept_cache`; JAX keys each executable by its program's text and the package's stored
programs carry its source digest, so an edit is never served a stale program), a ceiling on the programs the
default suite makes (:data:`CEILING`) with a summary line and ``--compilations N`` (the N tests that made the
most), the memory-map guard (the only thing that frees the session's programs: :func:`_programs_kept`), and
tests/_tiny.py's session fixtures of the canonical tiny problem.
"""

from __future__ import annotations

import atexit
import gc
import glob
import os
import shutil
import tempfile
import threading
from collections import Counter

#: Every program of the suite compiled with XLA's loop emitters on a CPU, as the package's solves are
#: (singleloc.runtime._compilation.CPU_OPTIONS): a cold suite in 0.76x the time, a warm one 1.04x (docs/development.md).
XLA_OPTION = "--xla_cpu_use_fusion_emitters=false"
#: Added once: pytest-xdist's workers inherit the controller's environment, and JAX keys a stored program by the flags as
#: written, so a repeated flag kept the workers' programs apart from a single process's.
os.environ["XLA_FLAGS"] = " ".join(dict.fromkeys([*os.environ.get("XLA_FLAGS", "").split(), XLA_OPTION]))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
os.environ["SINGLELOC_PROGRESS"] = "off"  # the commands' phase lines, as for a Python caller; test_progress turns them on


def _kept_cache() -> str:
    """``$SINGLELOC_TEST_CACHE``, a throw-away folder if that is empty (one for the session: pytest-xdist's workers
    inherit it, as they share the kept one), else ``$XDG_CACHE_HOME/singleloc/tests/`` (``~/.cache`` by default) in a
    folder named by the versions of JAX, jaxlib and singleloc and by :data:`XLA_OPTION` (other folders are removed)."""
    from importlib.metadata import version

    chosen = os.environ.get("SINGLELOC_TEST_CACHE")
    if chosen == "":
        chosen = os.environ["SINGLELOC_TEST_CACHE"] = tempfile.mkdtemp(prefix="singleloc-test-jax-cache-")
        atexit.register(shutil.rmtree, chosen, ignore_errors=True)
    elif chosen is None:
        base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "singleloc", "tests")
        names = "-".join([*(f"{name}{version(name)}" for name in ("jax", "jaxlib", "singleloc")), "loop-emitters"])
        for other in glob.glob(os.path.join(base, "*")):
            if os.path.basename(other) != names:
                shutil.rmtree(other, ignore_errors=True)
        chosen = os.path.join(base, names)
    os.makedirs(chosen, exist_ok=True)
    return chosen


_CACHE_DIR = _kept_cache()
jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
os.environ["SINGLELOC_CACHE_DIR"] = _CACHE_DIR

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest_plugins = ("_tiny",)  # its session fixtures

#: The most XLA programs the default suite (``python -m pytest``: every file, ``-m 'not slow'``, no ``-k``) may
#: make, compiled or loaded from the kept cache (so one count on a cold and a warm cache). Measured: 4615 on
#: 2026-12-06 (c6a48e8, 1011 tests; 4515 to 4645 in the four full runs of 2026-12-05/06), plus 15 % for the
#: tests of a round; less 28 on 2026-12-07 (programs cut in four test files, measured per file: docs/development.md).
#: Past it the session fails: share the programs (tests/_tiny.py) or mark the test slow; move the ceiling only with a
#: new measurement and its date.
CEILING = 5272


class _Compilations:
    """The programs JAX made, per test, from its monitoring events: every program records
    ``backend_compile_duration``; one served by the kept cache records ``cache_hits`` just before it. A
    session fixture's programs are those of the first test that asks for it."""

    BACKEND = "/jax/core/compile/backend_compile_duration"
    PHASES = {"/jax/core/compile/jaxpr_trace_duration": "tracing",
              "/jax/core/compile/jaxpr_to_mlir_module_duration": "lowering", BACKEND: "compiling"}

    def __init__(self):
        self.seconds, self.compiled, self.loaded = Counter(), Counter(), Counter()
        self.making = {phase: Counter() for phase in self.PHASES.values()}  # {phase: {test: seconds}}
        self.freed = Counter()  # {"times": how often the programs were freed for the memory maps (MAPPINGS_HIGH)}
        self.test, self._hit, self.watchers = "(outside tests)", threading.local(), []

    def event(self, event: str, **kwargs) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            self._hit.value = True

    def duration(self, event: str, seconds: float, **kwargs) -> None:
        if event in self.PHASES:
            self.seconds[self.PHASES[event]] += seconds
            self.making[self.PHASES[event]][self.test] += seconds
        if event == self.BACKEND:
            loaded = getattr(self._hit, "value", False)
            (self.loaded if loaded else self.compiled)[self.test] += 1
            for watcher in self.watchers:
                watcher.append((kwargs.get("fun_name"), loaded))
            self._hit.value = False

    def made(self) -> int:
        return (self.compiled + self.loaded).total()


_COMPILATIONS = _Compilations()
jax.monitoring.register_event_listener(_COMPILATIONS.event)
jax.monitoring.register_event_duration_secs_listener(_COMPILATIONS.duration)


def pytest_addoption(parser):
    parser.addoption("--compilations", type=int, metavar="N", default=0,
                     help="list the N tests that made the most XLA programs (compiled or loaded), with their seconds "
                          "tracing, lowering and compiling or loading")
    parser.addoption("--compilations-by", choices=("test", "file"), default="test",
                     help="what --compilations lists: tests (the default) or test files")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _COMPILATIONS.test = item.nodeid
    try:
        return (yield)
    finally:
        _COMPILATIONS.test = "(outside tests)"


def _over_ceiling(config) -> bool:
    default = (config.args_source == pytest.Config.ArgsSource.TESTPATHS and config.option.markexpr == "not slow"
               and not config.option.keyword)
    return default and _COMPILATIONS.made() > CEILING


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # a pytest-xdist worker: its counts go to the controller
        c = _COMPILATIONS
        session.config.workeroutput["compilations"] = (dict(c.compiled), dict(c.loaded), dict(c.seconds), dict(c.freed),
                                                       *(dict(c.making[phase]) for phase in c.making))
    elif _over_ceiling(session.config) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller: a worker's programs and seconds added to the session's."""
    c = _COMPILATIONS
    for counter, part in zip((c.compiled, c.loaded, c.seconds, c.freed, *c.making.values()),
                             node.workeroutput.get("compilations", ())):
        counter.update(part)


def pytest_terminal_summary(terminalreporter, config):
    c, t, write = _COMPILATIONS, _COMPILATIONS.seconds, terminalreporter.write_line
    write(f"compilation: {c.compiled.total()} programs compiled, {c.loaded.total()} loaded from the kept cache "
          f"({_CACHE_DIR}); {t['tracing']:.0f} s tracing, {t['lowering']:.0f} s lowering, {t['compiling']:.0f} s "
          f"compiling or loading; freed {c.freed['times']} times at {MAPPINGS_HIGH} memory maps (tests/conftest.py)")
    def by(counter: Counter) -> Counter:  # per test, or summed per file
        return counter if config.getoption("--compilations-by") == "test" else Counter(
            {name: sum(v for test, v in counter.items() if test.split("::")[0] == name)
             for name in {test.split("::")[0] for test in counter}})

    compiled, making = by(c.compiled), {phase: by(counter) for phase, counter in c.making.items()}
    for name, n in (compiled + by(c.loaded)).most_common(config.getoption("--compilations")):
        write(f"{n:5d} programs ({compiled[name]} compiled; {making['tracing'][name]:5.1f} s tracing, "
              f"{making['lowering'][name]:5.1f} s lowering, {making['compiling'][name]:5.1f} s compiling)  {name}")
    if _over_ceiling(config):
        write(f"compilation ceiling: the default suite made {c.made()} programs, more than tests/conftest.py's CEILING "
              f"of {CEILING} (--compilations 25 lists the tests that made the most)", red=True)


@pytest.fixture(scope="session", autouse=True)
def _programs_kept():
    """The session's compiled programs are freed by the memory-map guard below only: a test's ``main([...])``
    declares the worker a process the command line owns (:func:`~singleloc.runtime._compilation.own_process`), after
    which every sweep point's :func:`~singleloc.runtime._compilation.hold_programs` would free them all at its
    seventeenth group (tests/test_compilation.py and test_specs_api.py test that bound on their own)."""
    from singleloc.sweeps import _sweep_compute

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_sweep_compute, "hold_programs", lambda shape: None)
        yield


@pytest.fixture
def programs():
    """The programs JAX makes from here on in the test, as they are made: ``(name, loaded)``, ``loaded`` when the
    kept cache served it (a program held in memory makes none)."""
    made = []
    _COMPILATIONS.watchers.append(made)
    yield made
    _COMPILATIONS.watchers.remove(made)


@pytest.fixture
def rng() -> np.random.Generator:
    """A fixed numpy generator: every test is deterministic."""
    return np.random.default_rng(20240607)


@pytest.fixture
def orthogonal_spikes():
    """``f(rng, F, D)``: ``F`` orthogonal spikes of squared norm ``D`` (F, D), built in numpy
    independently of :func:`singleloc.make_spikes`."""
    return lambda rng, F, D: np.sqrt(D) * np.linalg.qr(rng.standard_normal((D, F)))[0].T


#: Memory mappings above which the session frees its compiled programs between tests: every XLA executable holds
#: a few and Linux caps a process at ``vm.max_map_count`` (65530); past it the next compilation crashed the
#: interpreter (a segmentation fault in ``executable.serialize``). Freed programs come back from the kept cache.
#: About 13 maps a program (2026-12-07: 483 programs, 7247 maps): 40000 leaves room for some 1900 programs in one test,
#: and a worker of the default suite (about 1900 programs) is no longer freed (each free cost 3-6 s at load 3).
MAPPINGS_HIGH = 40000


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    if os.path.exists("/proc/self/maps"):  # (no such cap elsewhere)
        with open("/proc/self/maps", "rb") as fh:
            if sum(1 for _ in fh) > MAPPINGS_HIGH:
                jax.clear_caches()
                gc.collect()
                _COMPILATIONS.freed["times"] += 1
