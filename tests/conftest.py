"""Shared test setup.

* Double precision everywhere (the reference computations of the tests are in float64; the
  finite-D simulator keeps its own single precision by design).
* Every test runs on the users' default ``theory.route`` (``"auto"``: the exact route for a
  normalised exponential); a test whose subject is another route says so in its config
  (``theory.route=rule``). The canonical tiny problems and the session's shared solves are in
  ``tests/_tiny.py`` (fixtures below).
* No phase lines on stderr (``SINGLELOC_PROGRESS=off``) except in tests/test_progress.py.
* A persistent compilation cache kept between runs of the suite on one machine (:func:`_kept_cache`):
  XLA compilation dominates the suite on a small CPU, and a second run loads what the first compiled.
  Its folder is keyed by the versions of JAX, jaxlib and the package, so a change of any of them starts
  afresh; within it JAX keys each executable by its program's text and the stored programs of
  :func:`~singleloc.runtime._compilation.exported_call` by the package's source digest, so an edit to the
  code is never served a stale program. ``SINGLELOC_TEST_CACHE`` names another folder, or, empty, a
  throw-away one for the session (removed at exit). The command lines that tests start
  (``SINGLELOC_CACHE_DIR``) share it. The summary line says how much was compiled and how much loaded.
* A compilation budget (:class:`_Compilations`): a default test that compiles more new XLA programs
  than it declares with ``@pytest.mark.compiles(n)`` (default :data:`DEFAULT_PROGRAMS`) fails, naming
  them. Time is not a budget (machines are noisy): ``.ci/run`` prints the slowest tests.
"""

from __future__ import annotations

import atexit
import gc
import glob
import json
import os
import shutil
import sys
import tempfile
import threading
from collections import Counter

import jax

jax.config.update("jax_enable_x64", True)

# The commands' phase lines and estimates (singleloc.runtime._progress) are off, as for a Python caller under
# pytest, so that the tests of their other output read it alone; tests/test_progress.py turns them on.
os.environ["SINGLELOC_PROGRESS"] = "off"

def _kept_cache() -> str:
    """The suite's compilation cache folder (module docstring): ``$SINGLELOC_TEST_CACHE``, a temporary
    folder if that is empty, else ``$XDG_CACHE_HOME/singleloc/tests/`` (``~/.cache`` by default) in a
    folder named by the versions of JAX, jaxlib and singleloc."""
    from importlib.metadata import version

    chosen = os.environ.get("SINGLELOC_TEST_CACHE")
    if chosen == "":
        folder = tempfile.mkdtemp(prefix="singleloc-test-jax-cache-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        return folder
    if chosen is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        names = "-".join(f"{name}{version(name)}" for name in ("jax", "jaxlib", "singleloc"))
        chosen = os.path.join(base, "singleloc", "tests", names)
        for other in glob.glob(os.path.join(base, "singleloc", "tests", "*")):  # other versions' folders: stale
            if os.path.basename(other) != names:
                shutil.rmtree(other, ignore_errors=True)
    os.makedirs(chosen, exist_ok=True)
    return chosen


_CACHE_DIR = _kept_cache()
jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
os.environ["SINGLELOC_CACHE_DIR"] = _CACHE_DIR  # the command lines that tests start use the suite's cache

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from _tiny import tiny  # noqa: E402

import singleloc as sl  # noqa: E402
from singleloc.io._run_folders import save_run  # noqa: E402

#: New XLA programs a default test may compile unless it declares more with ``@pytest.mark.compiles(n)``.
#: A program is a jitted computation of singleloc or of the test (JAX's own operations run one by one,
#: which compile small programs per shape, are counted apart, :data:`DEFAULT_EAGER`); one loaded from
#: the session's persistent cache is not new. Compilations in the setup of a session- or module-scoped
#: fixture are the fixture's (shared), not the test's.
DEFAULT_PROGRAMS = 2
#: JAX operations a default test may compile one by one (``@pytest.mark.compiles(n, eager=m)``): a
#: computation run outside ``jit`` (an ODE's risk called eagerly) compiles hundreds.
DEFAULT_EAGER = 100


#: Modules of JAX's operations (``jax.numpy``, ``jax.lax``, ``jax.random``, ... and their ``jax._src`` code): a
#: jitted function of theirs run outside ``jit`` compiles as ``jit(name)``. (Not ``jax._src.export``: its
#: ``jit(call)`` is a stored program of singleloc's, :func:`~singleloc.runtime._compilation.exported_call`.)
_OPERATION_MODULES = {"numpy", "lax", "random", "prng", "nn", "scipy", "ops", "linalg", "fft", "image"}


class _Compilations:
    """XLA compilations of this process, from JAX's monitoring events: every compilation records
    ``/jax/core/compile/backend_compile_duration`` (with the function's name), and one served by
    the persistent cache records ``/jax/compilation_cache/cache_hits`` just before it."""

    BACKEND = "/jax/core/compile/backend_compile_duration"
    HIT = "/jax/compilation_cache/cache_hits"
    #: JAX's phases of making a program, whose seconds the session's summary adds up (tracing to a jaxpr,
    #: lowering it, XLA's compilation or the persistent cache's load)
    PHASES = {"/jax/core/compile/jaxpr_trace_duration": "tracing",
              "/jax/core/compile/jaxpr_to_mlir_module_duration": "lowering", BACKEND: "compiling"}

    def __init__(self):
        self.seconds: Counter = Counter()  # per phase (PHASES), the whole session
        self.programs: list[str] = []  # names of the new programs, in order
        self.eager = 0
        self.loaded = 0
        self._hit = threading.local()
        self._jax_names: set[str] = set()
        self._modules = 0

    def _library_operation(self, name: str) -> bool:
        """Whether ``jit(name)`` is one of JAX's own operations (a primitive or a jitted function of
        ``jax``), compiled when it runs outside ``jit``."""
        if len(sys.modules) != self._modules:  # JAX modules imported since: read their names again
            from jax.extend.core import Primitive

            self._modules = len(sys.modules)
            for module_name, module in list(sys.modules.items()):
                parts = module_name.split(".")
                if module is not None and parts[0] == "jax" and _OPERATION_MODULES & set(parts):
                    for attr, value in list(vars(module).items()):
                        self._jax_names.add(value.name if isinstance(value, Primitive) else attr)
        return name in self._jax_names

    def event(self, event: str, **kwargs) -> None:
        if event == self.HIT:
            self._hit.value = True

    def duration(self, event: str, seconds: float, **kwargs) -> None:
        if event in self.PHASES:
            self.seconds[self.PHASES[event]] += seconds
        if event != self.BACKEND:
            return
        if getattr(self._hit, "value", False):
            self._hit.value = False
            self.loaded += 1
            return
        name = str(kwargs.get("fun_name", "?"))
        inner = name[4:-1] if name.startswith("jit(") and name.endswith(")") else name
        if self._library_operation(inner):
            self.eager += 1
        else:
            self.programs.append(name)

    def mark(self) -> tuple[int, int]:
        return len(self.programs), self.eager


_COMPILATIONS = _Compilations()
jax.monitoring.register_event_listener(_COMPILATIONS.event)
jax.monitoring.register_event_duration_secs_listener(_COMPILATIONS.duration)
_SHARED = Counter()  # compilations of shared (session/module) fixtures during the current test's setup
_REPORT: dict[str, dict] = {}


def pytest_addoption(parser):
    parser.addoption("--compilations", metavar="PATH", default=None,
                     help="write the XLA compilations of every test (programs, eager operations) to a JSON file")


class _SharedFixtures:
    """Counts the compilations of session- and module-scoped fixtures apart (registered as a plugin:
    a conftest's own hooks do not see the fixtures of the session's scope)."""

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        if fixturedef.scope == "function" or _SHARED["depth"]:  # (a shared fixture's own fixtures are counted with it)
            return (yield)
        programs, eager = _COMPILATIONS.mark()
        _SHARED["depth"] += 1
        try:
            return (yield)
        finally:
            _SHARED["depth"] -= 1
            _SHARED["programs"] += len(_COMPILATIONS.programs) - programs
            _SHARED["eager"] += _COMPILATIONS.eager - eager


def pytest_configure(config):
    config.pluginmanager.register(_SharedFixtures(), "singleloc-shared-fixtures")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    _SHARED.clear()
    item._compilations_start = _COMPILATIONS.mark()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield  # a failing test fails with its own error
    start_programs, start_eager = item._compilations_start
    programs = _COMPILATIONS.programs[start_programs:]
    new = len(programs) - _SHARED["programs"]
    eager = _COMPILATIONS.eager - start_eager - _SHARED["eager"]
    _REPORT[item.nodeid] = {"programs": new, "eager": eager, "shared": _SHARED["programs"], "names": programs}
    marker = item.get_closest_marker("compiles")
    budget = marker.args[0] if marker and marker.args else DEFAULT_PROGRAMS
    eager_budget = marker.kwargs.get("eager", DEFAULT_EAGER) if marker else DEFAULT_EAGER
    if item.get_closest_marker("slow") is None and (new > budget or eager > eager_budget):
        names = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in Counter(programs).items())
        pytest.fail(f"compilation budget: this test compiled {new} new XLA programs ({names or 'none'}) and {eager} JAX "
                    f"operations outside jit; it declares at most {budget} and {eager_budget} "
                    f"(@pytest.mark.compiles({budget}, eager={eager_budget})). Share the program (tests/_tiny.py's "
                    "problems and fixtures), stub the computation, or declare the cost.", pytrace=False)
    return result


def pytest_terminal_summary(terminalreporter):
    """Where the session's time went: the seconds JAX spent making programs (tracing, lowering, XLA's
    compilation) and the programs it made, beside the wall time that pytest prints."""
    t = _COMPILATIONS.seconds
    terminalreporter.write_line(
        f"compilation: {len(_COMPILATIONS.programs)} programs and {_COMPILATIONS.eager} eager operations compiled, "
        f"{_COMPILATIONS.loaded} loaded from the kept cache ({_CACHE_DIR}); {t['tracing']:.0f} s tracing, "
        f"{t['lowering']:.0f} s lowering, {t['compiling']:.0f} s compiling or loading (tests/conftest.py)")


def pytest_sessionfinish(session):
    path = session.config.getoption("--compilations")
    if path:
        with open(path, "w") as fh:
            json.dump({"loaded": _COMPILATIONS.loaded, "tests": _REPORT}, fh, indent=1)


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


# ----------------------------------------------------------------------------- the session's shared solves
# (tests/_tiny.py: the canonical problems; a test that keeps their shapes shares their compiled programs)


@pytest.fixture(scope="session")
def tiny_theory():
    """One :func:`~singleloc.integrate` of the canonical tiny problem on the default (exact) route,
    from its default start: a :class:`~singleloc.TheoryResult` that tests read, never change."""
    return sl.integrate(tiny())


@pytest.fixture(scope="session")
def tiny_theory_seeds():
    """One :func:`~singleloc.integrate` of the tiny problem from the starts of its two simulation seeds
    (:func:`~singleloc.initial_conditions`, a batch of two: what ``compare`` and the sweeps solve)."""
    config = tiny()
    return sl.integrate(config, sl.initial_conditions(config))


@pytest.fixture(scope="session")
def tiny_simulation():
    """One :func:`~singleloc.simulate` of the canonical tiny problem (two seeds at D = 64)."""
    return sl.simulate(tiny(), progress=False)


@pytest.fixture(scope="session")
def _tiny_run_folder(tmp_path_factory, tiny_theory, tiny_simulation):
    return save_run(tmp_path_factory.mktemp("tiny") / "run", tiny_theory.resolved(tiny()),
                    {"theory.npz": tiny_theory.arrays(0), "simulation.npz": tiny_simulation.arrays()})


@pytest.fixture
def tiny_run(tmp_path, _tiny_run_folder):
    """A copy (the test's own) of the run folder of the tiny problem: ``config.json``, ``theory.npz``
    (:func:`tiny_theory`) and ``simulation.npz`` (:func:`tiny_simulation`), written once per session."""
    return shutil.copytree(_tiny_run_folder, tmp_path / "run", copy_function=shutil.copy2)


@pytest.fixture(scope="session")
def tiny_pruning(tiny_theory):
    """:func:`~singleloc.prune_theory` of the tiny problem's final state (greedy): its programs (the
    risks of two heads and of one on the default route) are compiled once, for every test that
    prunes the tiny problem."""
    final = (x[0, -1] for x in (tiny_theory.M, tiny_theory.Q, tiny_theory.b))
    return sl.prune_theory(tiny(), *final)


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
