"""The suite's canonical tiny problems, one per route, and canned results for tests of mechanics.

* :data:`EXACT_TINY`: the users' default route (``theory.route = "auto"``: the exact route, for
  softmax) on the smallest problem that has every part of a run: ``L = 3`` tokens, ``H = 2`` heads,
  ``F = 1`` spike, three saved times up to ``tau = 2``, ``D = 64``, two seeds. :data:`RULE_TINY`:
  the same problem on the Sobol rule (``theory.route = "rule"``, 64 points), for tests whose
  subject is the rule.
* A test overrides only what its subject needs, and values rather than shapes where it can: the
  learning rate, the strength, the seeds and the start are values that the compiled programs
  receive, so every test that keeps the shapes shares the session's programs (``L``, ``H``, ``F``,
  the points, the saved times and the activation are shapes or static: each new one compiles).
* :func:`canned_theory` and :func:`canned_simulation`: results of the shapes of a config, made
  without computing (a risk that falls, overlaps of a valid layer), for tests whose subject is a
  command, a file or a message; :func:`stub_solves` puts them in place of the solves.

Session fixtures of the shared solves of :func:`tiny` (``tiny_theory``, ``tiny_theory_seeds``, ``tiny_simulation``,
``tiny_run``, ``tiny_pruning``) are at the end.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import singleloc as sl
from singleloc import Config, load_config
from singleloc.io._run_folders import save_run
from singleloc.simulation._simulation_result import SimulationResult
from singleloc.theory._theory_result import TheoryResult

#: The canonical tiny problem on the users' default route (overrides of the ``default`` preset).
EXACT_TINY = ("problem.L=3", "problem.F=1", "model.heads=2", "sgd.tau_max=2", "sgd.n_save=3", "simulation.D=64",
              "simulation.seeds=2", "simulation.test_samples=256", "theory.points=64")
#: The same problem on the Sobol rule route.
RULE_TINY = (*EXACT_TINY, "theory.route=rule")


def tiny(*overrides: str, rule: bool = False, preset: str = "default") -> Config:
    """The canonical tiny config (:data:`EXACT_TINY`, or :data:`RULE_TINY` with ``rule``) with
    ``overrides`` (``section.key=value``) applied after it."""
    return load_config(preset, [*(RULE_TINY if rule else EXACT_TINY), *overrides])


def cli_sets(*overrides: str, rule: bool = False) -> list[str]:
    """The command-line arguments of :func:`tiny`'s overrides: ``--set KEY=VALUE`` each, then
    ``--no-progress``."""
    return [*(a for s in (*(RULE_TINY if rule else EXACT_TINY), *overrides) for a in ("--set", s)), "--no-progress"]


def _layer(config: Config, seeds: int, T: int, fall: float = 1.0):
    """Overlaps of ``seeds`` trajectories of a valid layer (``Q - M M^T`` positive definite) whose
    spike overlaps grow along ``T`` saved times, and a risk that falls from 0.8."""
    H, F = config.model.heads, config.problem.F
    grow = np.linspace(0.0, 1.0, T)[None, :, None, None] * (1.0 + np.arange(seeds))[:, None, None, None] / seeds
    M = grow * np.eye(H, F)[None, None]
    Q = M @ np.swapaxes(M, -1, -2) + 0.25 * np.eye(H)
    b = np.zeros((seeds, T, H))
    risk = np.tile(0.8 - 0.3 * fall * np.linspace(0.0, 1.0, T), (seeds, 1))
    return M, Q, b, risk


def route_of(config: Config):
    """:func:`~singleloc.choose_route` of a configuration's ``problem``, ``model`` and ``theory``."""
    return sl.choose_route(config.problem, config.model, config.theory)


def canned_theory(config: Config, starts: int = 1, ts=None) -> TheoryResult:
    """A :class:`~singleloc.TheoryResult` of ``config``'s shapes at its saved times (or ``ts``),
    made without solving, stated as the route the config takes would state it."""
    tau = np.asarray(config.sgd.save_times() if ts is None else ts, float)
    M, Q, b, risk = _layer(config, starts, len(tau))
    choice = route_of(config)
    exact = choice.route_class.refined_error
    points = config.theory.points if config.theory.points != "auto" else 64
    return TheoryResult(tau, M, Q, b, risk, points=int(points), route=choice.route,
                        risk_error=1e-12 if exact else float("nan"), gram_error=1e-3 if exact else float("nan"))


def canned_simulation(config: Config) -> SimulationResult:
    """A :class:`~singleloc.SimulationResult` of ``config``'s shapes (its seeds, its saved times),
    made without simulating; float32 as the simulator writes it, no keys."""
    tau = config.sgd.save_times()
    M, Q, b, risk = _layer(config, config.simulation.seeds, len(tau), fall=0.9)
    f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
    return SimulationResult(tau, f32(M), f32(Q), f32(b), f32(risk + 0.01), f32(risk), None, None)


def stub_solves(monkeypatch) -> list:
    """Put :func:`canned_theory` and :func:`canned_simulation` in place of ``singleloc.theory._ode.integrate_setup``
    and ``singleloc.simulation._simulation.simulate`` (what the commands call); returns the list of the
    ``(kind, config)`` of the calls."""
    import singleloc.simulation._simulation
    import singleloc.theory._ode

    calls = []

    def integrate(setup, y0=None, *, ts=None, **kwargs):
        calls.append(("theory", setup.config))
        starts = 1 if y0 is None or np.ndim(y0[0]) != 3 else int(np.shape(y0[0])[0])
        return canned_theory(setup.config, starts, ts)

    def simulate(config, *args, **kwargs):
        calls.append(("simulation", config))
        return canned_simulation(config)

    monkeypatch.setattr(singleloc.theory._ode, "integrate_setup", integrate)
    monkeypatch.setattr(singleloc.simulation._simulation, "simulate", simulate)
    return calls


# The session's shared solves of the canonical tiny problem, read by tests, never changed: a test that keeps their
# shapes shares their programs (a plugin of tests/conftest.py).


@pytest.fixture(scope="session")
def tiny_theory():
    """:func:`~singleloc.integrate` of the tiny problem from its default start."""
    return sl.integrate(tiny())


@pytest.fixture(scope="session")
def tiny_theory_seeds():
    """:func:`~singleloc.integrate` of the tiny problem from its two seeds' starts (what ``compare`` solves)."""
    return sl.integrate(tiny(), sl.initial_conditions(tiny()))


@pytest.fixture(scope="session")
def tiny_simulation():
    """:func:`~singleloc.simulate` of the tiny problem (two seeds at D = 64)."""
    return sl.simulate(tiny(), progress=False)


@pytest.fixture(scope="session")
def _tiny_run_folder(tmp_path_factory, tiny_theory, tiny_simulation):
    return save_run(tmp_path_factory.mktemp("tiny") / "run", tiny_theory.resolved(tiny()),
                    {"theory.npz": tiny_theory.arrays(0), "simulation.npz": tiny_simulation.arrays()})


@pytest.fixture
def tiny_run(tmp_path, _tiny_run_folder):
    """The test's own copy of the tiny problem's run folder (config.json, theory.npz, simulation.npz)."""
    return shutil.copytree(_tiny_run_folder, tmp_path / "run", copy_function=shutil.copy2)


@pytest.fixture(scope="session")
def tiny_pruning(tiny_theory):
    """:func:`~singleloc.prune_theory` (greedy) of the tiny problem's final state."""
    return sl.prune_theory(tiny(), *(x[0, -1] for x in (tiny_theory.M, tiny_theory.Q, tiny_theory.b)))
