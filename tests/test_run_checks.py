"""The checks that the command line runs around a computation live in the library (issue 23
item 6): calling the Python API gives the same warnings and errors, named by the config keys,
and the command line does not repeat them."""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pytest
from _tiny import route_of, tiny

import singleloc as sl
from singleloc.expectations import _routes
from singleloc.preflight import _resources, _run_checks
from singleloc.preflight._build import build
from singleloc.pruning import _pruning
from singleloc.sweeps import _sweep
from singleloc.sweeps._grid import parse_grid
from singleloc.theory import _accuracy
from singleloc.theory._accuracy import PointsChoice

jax.config.update("jax_enable_x64", True)

CONFIG = sl.load_config("default")
#: A simulation of a few steps (64 SGD steps, two seeds).
TINY_SIM = ("problem.L=4", "problem.F=2", "sgd.tau_max=1", "simulation.test_samples=64", "theory.points=256")  # of tiny()


def _messages(record) -> list[str]:
    return [str(w.message) for w in record]


# ----------------------------------------------------------------------------- the statistical checks


def test_dropped_saved_times_warn_with_the_counts():
    cfg = sl.load_config("default", ["simulation.D=64", "sgd.tau_max=1", "sgd.n_save=100"])
    with pytest.warns(UserWarning, match=r"sgd.n_save = 100 saved times fall on 65 distinct SGD steps .*simulation.D = 64"):
        _run_checks.warn_if_times_dropped(cfg.sgd.n_save, cfg.simulation.D, 65)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _run_checks.warn_if_times_dropped(cfg.sgd.n_save, cfg.simulation.D, 100)  # every saved time kept: silent


def test_simulate_warns_of_dropped_saved_times_once():
    cfg = tiny(*TINY_SIM, "sgd.n_save=100")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        result = sl.simulate(cfg, progress=False)
    dropped = [w for w in record if "distinct SGD steps" in str(w.message)]
    assert _messages(dropped) == ["sgd.n_save = 100 saved times fall on 65 distinct SGD steps (tau = t / D with "
                                  "simulation.D = 64); the simulation saves 65"]
    assert dropped[0].filename == __file__  # attributed to the caller of simulate
    assert result.tau.shape == (65,)


def test_a_rising_risk_warns_naming_the_learning_rate():
    setup = build(CONFIG, theory=False)

    def theory(risk):
        return sl.TheoryResult(np.arange(len(risk[0])), None, None, None, np.asarray(risk, float))

    with pytest.warns(UserWarning, match=r"the theory risk rose during training \(0.81 -> 1.04, .*sgd.lr = 0.5 may be too"):
        sl.warn_if_risk_rose(setup, theory=theory([[0.81, 0.9, 1.04]]))
    sim = type("Sim", (), {"risk_limit": np.array([[0.81, 1.04], [0.80, 1.05]])})
    with pytest.warns(UserWarning, match=r"the simulation's limit risk rose during training \(0.805 -> 1.045"):
        sl.warn_if_risk_rose(setup, simulation=sim)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sl.warn_if_risk_rose(setup, theory=theory([[0.81, 0.5, 0.3]]))  # a falling risk
        sl.warn_if_risk_rose(setup, theory=theory([[0.81, 0.5, 0.81 + 1e-7]]))  # within the solver's tolerance
        # within the noise of two test sets of 4096 sequences per seed
        sl.warn_if_risk_rose(setup, simulation=type("Sim", (), {"risk_limit": np.array([[0.80, 0.81], [0.80, 0.82]])}))


def test_simulate_warns_when_its_risk_rises(monkeypatch):
    """``simulate`` runs the check on its own result: a stand-in check records what it receives."""
    seen = []
    import singleloc.simulation._simulation

    monkeypatch.setattr(singleloc.simulation._simulation, "warn_if_risk_rose", lambda setup, **kw: seen.append((setup, kw)))
    cfg = tiny(*TINY_SIM)
    result = sl.simulate(cfg, progress=False)
    assert len(seen) == 1 and seen[0][0].config == cfg and seen[0][1]["simulation"] is result


# ----------------------------------------------------------------------------- the sweep's checks

#: On the rule route a point with L * H = 40 * 8 = 320 fields cannot be integrated with 256 points.
RULE_40 = ["theory.route=rule", "problem.L=40", "theory.points=256"]


def test_sweep_refuses_a_point_that_cannot_run_before_it_writes_anything(tmp_path):
    cfg = sl.load_config("default", RULE_40)
    with pytest.raises(ValueError, match=r"theory.points = 256 must be at least problem.L \* model.heads = 320"):
        sl.sweep(cfg, [parse_grid("model.heads=1,8")], tmp_path / "out", progress=False, figures=False)
    assert not (tmp_path / "out").exists()
    _sweep.check_sweep(cfg, [parse_grid("model.heads=1,6")], simulate=False)  # 240 fields: fits


def _theory_bytes(cfg, starts):
    """What check_run counts for the theory of ``starts`` ODE starts, with the overhead."""
    route, pb, H, th = route_of(cfg), cfg.problem, cfg.model.heads, cfg.theory
    return _resources.OVERHEAD + _resources.theory_bytes(pb.L, H, pb.build_prior(), th, route, starts * th.replicates) + \
        _resources.saved_bytes(pb.L, H, pb.F, th, cfg.sgd.n_save, route, starts)


def test_the_sweep_memory_check_counts_the_starts_of_a_batched_solve(monkeypatch):
    """The 20 points of ``sgd.lr`` are one batched solve of 20 x 4 starts: refused within a memory
    that one point's 4 starts fit, accepted point by point (``batch=False``)."""
    cfg = sl.load_config("default", ["theory.points=4096"])
    grids = [parse_grid("sgd.lr=" + ",".join(f"0.{i:02d}" for i in range(1, 21)))]
    seeds = cfg.simulation.seeds
    monkeypatch.setenv(_resources.MEMORY_ENV, str((_theory_bytes(cfg, seeds) + _theory_bytes(cfg, 20 * seeds)) // 2))
    _sweep.check_sweep(cfg, grids, batch=False)
    # the exact route's largest array is its Gram term's rule (theory.gram_points), the Sobol rule's its nodes
    with pytest.raises(MemoryError, match=rf"theory.(gram_)?points = \d+ .*{20 * seeds} start\(s\).*SINGLELOC_MEMORY_LIMIT"):
        _sweep.check_sweep(cfg, grids, batch=True)


def test_the_sweep_checks_simulations_only_when_it_simulates():
    cfg = sl.load_config("default", ["simulation.D=4"])  # D = H + F: the theory starts, a simulation cannot
    _sweep.check_sweep(cfg, [parse_grid("sgd.lr=0.1,0.2")])
    with pytest.raises(ValueError, match="simulation.D = 4 must exceed model.heads \\+ problem.F = 4"):
        _sweep.check_sweep(cfg, [parse_grid("sgd.lr=0.1,0.2")], simulate=True)


# ----------------------------------------------------------------------------- the Bayes quadrature checks


def test_bayes_risk_checks_its_rule():
    with pytest.raises(ValueError, match=r"theory.points = 256 must be at least problem.L \* problem.F = 400 .*"
                                         r"use theory.points = 512"):
        sl.bayes_risk(sl.spikes(2, 2.5), 200, points=256, route="rule")
    with pytest.raises(ValueError, match=r"problem.L \* problem.F \+ problem.F \(Gaussian prior\) = 264"):
        sl.bayes_risk(sl.gaussian([1.0, 0.0], 1.0), 131, points=256)
    with pytest.raises(TypeError, match=r"^bayes_risk: points must be an integer, got str 'auto'$"):  # at the door
        sl.bayes_risk(sl.spikes(2, 2.5), 4, points="auto", route="rule")


def test_bayes_risk_checks_its_memory(monkeypatch):
    monkeypatch.setenv(_resources.MEMORY_ENV, "1M")
    with pytest.raises(MemoryError, match=r"GB for the quadrature \(theory.points = 256\)\), more than the 0.00105 GB"):
        sl.bayes_risk(sl.spikes(2, 2.5), 4, points=256, route="rule")


def test_population_risk_checks_the_rule_it_builds():
    M, Q, b = 0.5 * np.ones((3, 1)), np.eye(3), np.zeros(3)
    with pytest.raises(ValueError, match=r"theory.points = 256 must be at least 2 \* problem.L \* model.heads \(the "
                                         r"rank-aware rule\) = 600 .*use theory.points = 1024"):
        sl.population_risk(sl.spikes(1, 2.5), 100, "softmax", M, Q, b, points=256, route="rule")


def test_check_bayes_checks_the_bayes_point_too():
    from singleloc.bayes._bayes import check_bayes

    prior = sl.flipped(2, 2.5)  # 4 atoms: the Bayes point has 4 heads, its risk a rank-aware rule of 2 L H coordinates
    check_bayes(prior, 32, 256)  # 2 x 32 x 4 = 256 coordinates
    sl.bayes_risk(prior, 80, points=256, replicates=2, route="rule")  # the Bayes risk's own rule has 80 x 2 = 160 fields
    with pytest.raises(ValueError, match=r"2 \* problem.L \* the number of atoms of the prior \(the rank-aware rule\) = 320"):
        check_bayes(prior, 40, 256)


# ----------------------------------------------------------------------------- pruning's run preparation


def _layer(H, F):
    M = 0.3 * np.ones((H, F))
    return M, M @ M.T + 0.2 * np.eye(H), np.zeros(H)


def test_pruning_checks_the_rule_before_it_builds_one():
    cfg = sl.load_config("default", [*RULE_40, "model.heads=8"])
    with pytest.raises(ValueError, match=r"theory.points = 256 must be at least problem.L \* model.heads = 320"):
        sl.prune_theory(cfg, *_layer(8, 2))
    with pytest.raises(ValueError, match=r"theory.points = 256 must be at least problem.L \* model.heads = 320"):
        sl.TheoryRisk(build(cfg.replace(model={"heads": 2})), *_layer(8, 2))  # the layer's heads count, not the config's


def test_pruning_checks_its_memory(monkeypatch):
    monkeypatch.setenv(_resources.MEMORY_ENV, "1M")
    with pytest.raises(MemoryError, match=r"for the theory's quadrature \(theory.points = 256\)"):
        sl.prune_theory(sl.load_config("default", ["theory.points=256"]), *_layer(2, 2))


def test_prune_run_prunes_the_final_state_of_every_stored_layer(monkeypatch):
    """The theory's final state and every seed's, on one checked rule: one route decision, one resolution of
    ``theory.points = "auto"`` (the layers' risks see the number), one evaluator whose rules the layers share."""
    cfg = sl.load_config("default", ["theory.points=auto"])
    T, S, H, F = 5, 3, cfg.model.heads, cfg.problem.F
    rng = np.random.default_rng(0)
    theory = {"tau": np.arange(T), "M": rng.normal(size=(T, H, F)), "Q": rng.normal(size=(T, H, H)), "b": rng.normal(size=(T, H))}
    sim = {k: rng.normal(size=(S, *v.shape)) for k, v in theory.items() if k != "tau"}
    run = sl.Run(None, cfg, {"theory": theory, "simulation": sim}, "hash")
    resolved, calls, decided = [], [], []
    monkeypatch.setattr(_routes, "decide", lambda *a, decide=_routes.decide, **k: decided.append(a) or decide(*a, **k))
    monkeypatch.setattr(_accuracy, "choose_points", lambda setup, y0: resolved.append(setup) or PointsChoice(512, 0.0, 1, ()))
    monkeypatch.setattr(_pruning, "_pruned", lambda risk, M, order, draws, seed: calls.append(
        (risk, risk.setup, risk.M, risk.Q, risk.b, order, {"draws": draws, "seed": seed})))
    results = sl.prune_run(run, "alignment", draws=3, seed=7)
    assert len(decided) == len(resolved) == 1 and list(results) == ["theory", "simulation"] and len(results["simulation"]) == S
    layers = [(theory["M"][-1], theory["Q"][-1], theory["b"][-1])] + [(sim["M"][s, -1], sim["Q"][s, -1], sim["b"][s, -1])
                                                                      for s in range(S)]
    assert len(calls) == 1 + S and all(risk._odes is calls[0][0]._odes for risk, *_ in calls)
    for (_, setup, M, Q, b, order, kw), layer in zip(calls, layers):
        assert setup.theory.points == 512 and order == "alignment" and kw == {"draws": 3, "seed": 7}
        for got, want in zip((M, Q, b), layer):
            np.testing.assert_array_equal(got, want)


def test_prune_run_refuses_trained_head_weights_by_name():
    cfg = sl.load_config("default", ["model.head_weights=trained"])
    H, F = cfg.model.heads, cfg.problem.F
    run = sl.Run(None, cfg, {"theory": {"M": np.zeros((2, H, F)), "Q": np.ones((2, H, H)), "b": np.zeros((2, H))}}, "hash")
    with pytest.raises(ValueError, match="pruning: model.head_weights = 'trained' is not supported here"):
        sl.prune_run(run)


def test_simulate_and_integrate_check_their_memory_before_they_run(monkeypatch, tiny_theory):
    """Called from Python, not only from the command line, a run that does not fit is refused
    before anything is built, naming what it needs (the limit: ``SINGLELOC_MEMORY_LIMIT``). The
    canonical tiny problem: the run that passes is tiny_theory's program."""
    monkeypatch.setenv(_resources.MEMORY_ENV, "1M")
    cfg = tiny()
    with pytest.raises(MemoryError, match=r"the simulation \(simulation\.seeds"):
        sl.simulate(cfg, progress=False)
    with pytest.raises(MemoryError, match=r"the exact route's Gram rule \(theory\.gram_points"):  # the users' route
        sl.integrate(cfg)
    monkeypatch.setenv(_resources.MEMORY_ENV, "none")
    assert sl.integrate(cfg).risk.shape == (1, cfg.sgd.n_save)  # the same run passes without the limit


# ----------------------------------------------------------------------------- a joint layer's exact rule


@pytest.mark.parametrize("heads, F, exact", [(3, 3, True), (4, 2, True), (4, 3, False), (5, 2, False), (8, 2, False)])
def test_auto_takes_a_joint_layers_exact_route_only_while_it_is_affordable(heads, F, exact):
    """bsoftmax's conditional product form grows like a power of H (``joint_rule_size``): "auto" takes
    the rule route beyond ``JOINT_EXACT_MAX`` (H = 4 with three spikes, H = 5 with two), "exact" any
    size, and a per-head layer is never limited."""
    from singleloc.expectations._laplace_joint import joint_rule_size
    from singleloc.expectations._routes import JOINT_EXACT_MAX

    cfg = sl.load_config("bsoftmax", [f"model.heads={heads}", f"problem.F={F}", "theory.route=auto"])
    size = joint_rule_size(heads, cfg.problem.build_prior())
    assert (size <= JOINT_EXACT_MAX) == exact
    assert (route_of(cfg).route == "exact") == exact
    assert (sl.OrderParameterODE.from_setup(sl.build(cfg), points=64).expectation.route == "exact") == exact
    assert route_of(cfg.replace(theory={"route": "exact"})).route == "exact"
    assert route_of(cfg.replace(model={"activation": "softmax"})).route == "exact"


def test_a_joint_exact_rule_that_does_not_fit_is_refused_by_name(monkeypatch):
    """Asked for on the exact route, 32 bsoftmax heads under four binary atoms need 220 GB: the
    run is refused before anything is built, naming the heads, the spikes and the atoms."""
    monkeypatch.setenv(_resources.MEMORY_ENV, "64G")
    cfg = sl.load_config("bsoftmax", ["model.heads=32", "problem.F=2", "problem.prior=binary", "theory.route=exact",
                                      "theory.points=4096"])
    with pytest.raises(MemoryError, match=r"for the exact route's rule of a joint layer \(model.heads = 32, problem.F = 2, "
                                          r"4 atoms of the prior\)"):
        _resources.check_run(build(cfg), theory_starts=1)
    _resources.check_run(build(cfg.replace(theory={"route": "auto"})), theory_starts=1)  # auto: the rule route, which fits
    with pytest.raises(MemoryError, match=r"the exact route's rule \(bsoftmax, 32 heads, 4 atoms of the prior\)"):
        sl.population_risk(cfg.problem.build_prior(), 4, "bsoftmax", np.zeros((32, 2)), np.eye(32), np.zeros(32),
                           route="exact")


def test_pruning_scores_every_sub_layer_on_the_full_layers_route():
    """Eight bsoftmax heads are beyond the joint exact rule of "auto": their sub-layers of four heads
    and fewer, which the exact route would take, are scored on the rule too, so that no pruning step
    compares two routes; eight softmax heads stay on the exact route."""
    cfg = sl.load_config("bsoftmax", ["model.heads=8", "theory.route=auto", "theory.points=1024"])
    assert _pruning.pruning_setup(build(cfg)).theory.route == "rule"
    assert _pruning.pruning_setup(build(cfg), heads=4).theory.route == "auto"  # a layer of four: its own exact route
    assert _pruning.pruning_setup(build(cfg.replace(model={"activation": "softmax"}))).theory.route == "auto"
    risk = _pruning.TheoryRisk(build(cfg), M=np.zeros((8, 2)), Q=np.eye(8), b=np.zeros(8))
    assert risk.odes(4)[0].expectation.route == "rule" and risk.odes(8)[0].expectation.route == "rule"
