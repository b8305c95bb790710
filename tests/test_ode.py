"""Integration of the order-parameter ODE: starts, symmetry, errors, files, and agreement
with a finite-D simulation."""

import json

import numpy as np
import pytest

import singleloc as sl
from singleloc.cli import main

TINY = ["sgd.tau_max=2", "sgd.n_save=5", "theory.points=256"]


def test_initial_conditions_are_the_simulators_initial_overlaps():
    cfg = sl.load_config("default", ["simulation.D=64", "simulation.seeds=3", "sgd.tau_max=0.1", "sgd.n_save=2",
                                     "simulation.test_samples=16"])
    sim = sl.simulate(cfg, progress=False)
    y0 = sl.initial_conditions(cfg)
    # the same float32 weights; only the rounding of the overlap matmul may differ
    np.testing.assert_allclose(np.asarray(y0.M), sim.M[:, 0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(y0.Q), sim.Q[:, 0], rtol=1e-6, atol=1e-7)
    # M(0) = O(1/sqrt(D)), Q(0) ~ init_scale^2 I
    assert np.all(np.abs(sim.M[:, 0]) < 5 * 0.5 / np.sqrt(64))


def test_integrate_shapes_and_a_decreasing_risk():
    cfg = sl.load_config("default", TINY)
    res = sl.integrate(cfg, sl.initial_conditions(cfg, 2), progress=False)
    assert res.M.shape == (2, 5, 2, 2) and res.Q.shape == (2, 5, 2, 2) and res.b.shape == (2, 5, 2) and res.risk.shape == (2, 5)
    np.testing.assert_allclose(res.tau, np.linspace(0, 2, 5))
    assert np.all(np.diff(res.risk, axis=1) < 0)
    # R_orth stays PSD along the solution
    R = res.Q - res.M @ np.swapaxes(res.M, -1, -2)
    assert np.linalg.eigvalsh(R).min() > -1e-8


def test_one_start_solves_as_in_a_batch():
    # a batch of one is solved unvmapped (_ode._batched); its trajectory must be the batched one's
    cfg = sl.load_config("default", TINY)
    starts = sl.initial_conditions(cfg, 2)
    alone = sl.integrate(cfg, type(starts)(*(x[:1] for x in starts)), progress=False)
    batch = sl.integrate(cfg, starts, progress=False)
    for name in ("M", "Q", "b", "risk"):
        np.testing.assert_allclose(getattr(alone, name)[0], getattr(batch, name)[0], rtol=1e-9, atol=1e-12)


def test_identical_heads_stay_identical_along_the_solution():
    cfg = sl.load_config("bsoftmax", TINY)
    M0 = np.array([[0.01, 0.02], [0.01, 0.02]])
    Q0 = np.full((2, 2), 0.25)
    res = sl.integrate(cfg, (M0, Q0, np.zeros(2)), progress=False)
    np.testing.assert_allclose(res.M[0, :, 0], res.M[0, :, 1], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(res.Q[0, :, 0, 0], res.Q[0, :, 0, 1], rtol=1e-10)


def test_bad_initial_conditions_are_named():
    cfg = sl.load_config("default", TINY)
    with pytest.raises(ValueError, match="M0 must have shape"):
        sl.integrate(cfg, (np.zeros((3, 2)), np.eye(3), np.zeros(3)), progress=False)
    with pytest.raises(ValueError, match="positive semi-definite"):
        sl.integrate(cfg, (np.ones((2, 2)), 0.1 * np.eye(2), np.zeros(2)), progress=False)
    with pytest.raises(ValueError, match="Q0 must be symmetric"):
        sl.integrate(cfg, (np.zeros((2, 2)), np.array([[1.0, 0.5], [0.0, 1.0]]), np.zeros(2)), progress=False)
    with pytest.raises(ValueError, match="M0 must be finite"):
        sl.integrate(cfg, (np.full((2, 2), np.nan), np.eye(2), np.zeros(2)), progress=False)


def test_diverging_learning_rate_stops_with_a_clear_error():
    cfg = sl.load_config("default", ["sgd.lr=1e5", "sgd.tau_max=30", "sgd.n_save=4", "theory.points=256"])
    with pytest.raises(FloatingPointError, match=r"stopped at tau = .*sgd\.lr"):
        sl.integrate(cfg, progress=False)


def test_integrate_cli_writes_documented_files(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["integrate", "default", "--out", str(out), "--no-progress", *sum((["--set", s] for s in TINY), [])]) == 0
    with np.load(out / "theory.npz") as f:
        assert set(f.files) == {"tau", "M", "Q", "b", "risk", "risk_se", "drift_error", "points", "replicates", "route",
                                "risk_error", "gram_error", "exact_drift_error", "gram_route"}
        assert f["M"].shape == (5, 2, 2) and f["Q"].shape == (5, 2, 2) and f["b"].shape == (5, 2) and f["risk"].shape == (5,)
        assert f["risk_se"].shape == (5,) and int(f["points"]) == 256 and int(f["replicates"]) == 1
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["singleloc_version"] == sl.__version__ and cfg["theory"]["points"] == 256
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary files left
    assert main(["integrate", "default", "--out", str(out), "--set", "sgd.lr=-1"]) == 2
    err = capsys.readouterr().err
    assert "sgd.lr" in err and "Traceback" not in err


def test_theory_tracks_a_large_D_simulation():
    """Early dynamics (tau <= 3) at D = 4000: the theory of each seed's own start against its
    simulation, within 4 Monte Carlo errors of the test risk plus the O(1/sqrt(D)) spread
    allowance of docs/model.md's agreement target (0.01)."""
    cfg = sl.load_config("softmax1", ["simulation.D=4000", "simulation.seeds=2", "sgd.tau_max=3", "sgd.n_save=4",
                                      "theory.points=1024"])
    sim = sl.simulate(cfg, progress=False)
    th = sl.integrate(cfg, sl.initial_conditions(cfg), ts=sim.tau, progress=False)
    se = 1.0 / np.sqrt(cfg.simulation.test_samples)  # the per-sample loss lies in [0, 2]: sd <= 1
    assert np.max(np.abs(sim.risk - th.risk)) < 4 * se + 0.01
    assert np.max(np.abs(sim.M - th.M)) < 0.05
