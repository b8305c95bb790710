"""The numerical API takes specification objects (issue 23 item 3): ``integrate``, ``simulate``,
the ODE, the pruning risks and the other entry points run on ``problem=``, ``model=``, ``sgd=``,
``theory=``, ``simulation=`` objects as they run on a :class:`Config` holding the same ones;
the two forms are never mixed; and library calls leave the caller's process-global JAX state
(float64 mode, compiled programs) as they found it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import equinox as eqx
import numpy as np
import pytest
from _tiny import tiny

import singleloc as sl
from singleloc.preflight._build import build

# the canonical tiny problem (tests/_tiny.py), as specifications: its solves are the session's (compiled once)
PROBLEM = sl.Problem(L=3, F=1)
MODEL = sl.Model(heads=2)
SGD = sl.SGD(tau_max=2.0, n_save=3)
THEORY = sl.Theory(points=64)
SIMULATION = sl.Simulation(D=64, seeds=2, test_samples=256)
CONFIG = sl.Config(problem=PROBLEM, model=MODEL, sgd=SGD, theory=THEORY, simulation=SIMULATION)


def test_the_specifications_are_the_canonical_tiny_problem():
    assert CONFIG == tiny()


def test_integrate_from_specs_is_integrate_from_their_config(tiny_theory):
    by_config = tiny_theory  # sl.integrate(tiny()), the session's
    by_specs = sl.integrate(problem=PROBLEM, model=MODEL, sgd=SGD, theory=THEORY, simulation=SIMULATION)
    for name in ("tau", "M", "Q", "b", "risk"):
        np.testing.assert_array_equal(getattr(by_specs, name), getattr(by_config, name), err_msg=name)


def test_a_spec_not_given_takes_its_defaults(tiny_theory):
    """``simulation`` is read only for the default start: given the start, it does not matter."""
    y0 = sl.initial_conditions(CONFIG, 1)  # the default start of sl.integrate(CONFIG), the session's tiny_theory
    with_default = sl.integrate(y0=y0, problem=PROBLEM, model=MODEL, sgd=SGD, theory=THEORY)
    np.testing.assert_array_equal(with_default.risk, tiny_theory.risk)
    assert sl.integrate(problem=PROBLEM, model=MODEL, sgd=SGD, theory=THEORY).M.shape == with_default.M.shape


def test_simulate_from_specs_is_simulate_from_their_config(tiny_simulation):
    by_config = tiny_simulation  # sl.simulate(tiny()), the session's
    by_specs = sl.simulate(problem=PROBLEM, model=MODEL, sgd=SGD, simulation=SIMULATION, progress=False)
    np.testing.assert_array_equal(by_specs.risk, by_config.risk)
    np.testing.assert_array_equal(by_specs.Q, by_config.Q)


def test_ode_and_pruning_from_specs(tiny_theory, tiny_pruning):
    ode = sl.OrderParameterODE.from_specs(PROBLEM, MODEL, SGD, THEORY)
    reference = sl.OrderParameterODE.from_setup(sl.build(CONFIG))
    assert eqx.tree_equal(ode, reference)  # the same route, rule and numbers: the same risk and drift everywhere
    M, Q, b = (x[0, -1] for x in (tiny_theory.M, tiny_theory.Q, tiny_theory.b))  # tiny_pruning's layer
    by_specs = sl.prune_theory(M=M, Q=Q, b=b, problem=PROBLEM, model=MODEL, theory=THEORY)
    by_config = tiny_pruning  # sl.prune_theory(CONFIG, M, Q, b), the session's
    np.testing.assert_array_equal(by_specs.risk, by_config.risk)


def test_config_and_specs_are_not_mixed():
    with pytest.raises(TypeError, match=r"integrate: pass either a config or the specifications \(model\)"):
        sl.integrate(CONFIG, model=MODEL)
    with pytest.raises(TypeError, match=r"simulate: pass either a config or the specifications \(problem, sgd\)"):
        sl.simulate(CONFIG, problem=PROBLEM, sgd=SGD)


@pytest.mark.parametrize("call", [
    lambda: sl.integrate(model={"heads": 2}),
    lambda: sl.simulate(model={"heads": 2}),
    lambda: sl.OrderParameterODE.from_specs(model={"heads": 2}),
    lambda: sl.predicted_escape(model={"heads": 2}),
])
def test_a_spec_of_the_wrong_kind_is_named_with_the_remedy(call):
    with pytest.raises(TypeError, match=r"model must be a singleloc\.Model, got dict .*pass singleloc\.Model\(\*\*"):
        call()


def test_a_preset_name_in_place_of_a_config_is_named():
    with pytest.raises(TypeError, match=r"integrate: config must be a singleloc\.Config, got str .*load_config"):
        sl.integrate("default")


@pytest.mark.parametrize("call, missing", [
    (lambda: sl.prune_theory(problem=PROBLEM), r"prune_theory: missing M \(a real array of shape \(H, F\)\)"),
    (lambda: sl.TheoryRisk(build(CONFIG), M=np.zeros((2, 1))), "TheoryRisk: missing Q"),
    (lambda: sl.WeightsRisk(build(CONFIG, theory=False)), "WeightsRisk: missing K"),
])
def test_the_data_of_a_call_are_required(call, missing):
    with pytest.raises(TypeError, match=f"^{missing}"):
        call()


def test_config_replace_validates_only_the_sections_it_changes():
    changed = CONFIG.replace(model={"heads": 3})
    assert changed.model == dataclasses.replace(MODEL, heads=3)
    assert changed.problem is CONFIG.problem and changed.theory is CONFIG.theory  # not rebuilt
    with pytest.raises(ValueError, match="model.heads"):
        CONFIG.replace(model={"heads": 0})
    with pytest.raises(ValueError, match=r"unknown key\(s\) model.head"):
        CONFIG.replace(model={"head": 3})
    prior = sl.spikes(1, 2.5)
    restored = CONFIG.replace(problem={"prior": dataclasses.asdict(prior)})  # a Prior as config.json writes it
    assert restored.problem.build_prior() == prior


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)


def test_library_calls_leave_the_float64_mode_and_matplotlib_alone(tmp_path):
    """A serial sweep in a float32 process is refused with the remedy (it does not switch the
    mode), a sweep point computed in the caller's process leaves the mode as it was, and
    importing the sweep does not import matplotlib. In the same float32 process, a script that forgot JAX's float64
    mode gets one clear error from the theory, not float32 NaNs (the exact route's powers) or a crash (the rule route
    ran out of steps and segfaulted in float32)."""
    code = f"""
import os, sys, jax
jax.config.update("jax_compilation_cache_dir", os.environ["SINGLELOC_CACHE_DIR"])  # the suite's kept programs
import singleloc as sl
from singleloc.sweeps._sweep_compute import compute_points
assert 'matplotlib' not in sys.modules
cfg = sl.load_config("default").replace(simulation={{"D": 100, "seeds": 1, "test_samples": 64}},
                                        sgd={{"tau_max": 1.0, "n_save": 2}})
(result,) = compute_points("simulation", cfg.to_dict())
assert isinstance(result, dict), result
assert not jax.config.jax_enable_x64, "compute_points switched the float64 mode"
try:
    sl.sweep(cfg, [sl.parse_grid("model.heads=1,2")], {str(tmp_path / 'sweep')!r}, progress=False)
except RuntimeError as err:
    print("refused:", err)
assert not jax.config.jax_enable_x64
try:
    sl.integrate(sl.load_config("default"))
except Exception as err:
    print("theory refused:", type(err).__name__, err)
"""
    done = _run(code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refused: singleloc.sweep with workers = 1" in done.stdout and "jax_enable_x64" in done.stdout
    refused = done.stdout.split("theory refused: ")[1]
    assert "needs JAX's float64 mode" in refused and "jax_enable_x64" in refused


def test_only_a_process_singleloc_owns_has_its_programs_freed(monkeypatch):
    """A serial sweep point bounds the compiled programs it holds (``hold_programs``) in the
    command line's process (and on Dask workers), never in a Python caller's."""
    from singleloc.runtime import _compilation
    from singleloc.sweeps import _sweep_compute

    held = []
    monkeypatch.setattr(_sweep_compute, "hold_programs", held.append)
    cfg = CONFIG.replace(sgd={"tau_max": 1.0, "n_save": 2})
    monkeypatch.setattr(_compilation, "_OWNED", [False])
    _sweep_compute.compute_points("simulation", cfg.to_dict())
    assert held == []
    _compilation.own_process()  # what the command line does
    _sweep_compute.compute_points("simulation", cfg.to_dict())
    assert held == [_sweep_compute.compile_group("simulation", cfg.to_dict())]
