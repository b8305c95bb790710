"""Integration of the order-parameter ODE: starts, symmetry, errors, files, and agreement
with a finite-D simulation. On the users' default route (the exact one for these layers), on the
canonical tiny problem (tests/_tiny.py) where the shapes do not matter."""

import json

import numpy as np
import pytest
from _tiny import cli_sets, tiny

import singleloc as sl
from singleloc.cli import main


def test_initial_conditions_are_the_simulators_initial_overlaps(tiny_simulation):
    cfg, sim = tiny(), tiny_simulation
    y0 = sl.initial_conditions(cfg)
    # the same float32 weights; only the rounding of the overlap matmul may differ
    np.testing.assert_allclose(np.asarray(y0.M), sim.M[:, 0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(y0.Q), sim.Q[:, 0], rtol=1e-6, atol=1e-7)
    # M(0) = O(1/sqrt(D)), Q(0) ~ init_scale^2 I
    assert np.all(np.abs(sim.M[:, 0]) < 5 * 0.5 / np.sqrt(64))


def test_integrate_shapes_and_a_decreasing_risk(tiny_theory_seeds):
    res = tiny_theory_seeds  # sl.integrate(tiny(), sl.initial_conditions(tiny(), 2))
    assert res.M.shape == (2, 3, 2, 1) and res.Q.shape == (2, 3, 2, 2) and res.b.shape == (2, 3, 2) and res.risk.shape == (2, 3)
    np.testing.assert_allclose(res.tau, np.linspace(0, 2, 3))
    assert np.all(np.diff(res.risk, axis=1) < 0)
    # R_orth stays PSD along the solution
    R = res.Q - res.M @ np.swapaxes(res.M, -1, -2)
    assert np.linalg.eigvalsh(R).min() > -1e-8


def test_one_start_solves_as_in_a_batch(tiny_theory, tiny_theory_seeds):
    # a batch of one is solved unvmapped (_ode._batched); its trajectory must be the batched one's
    cfg = tiny()
    starts = sl.initial_conditions(cfg, 2)
    alone = sl.integrate(cfg, type(starts)(*(x[:1] for x in starts)), progress=False)  # tiny_theory's program
    batch = tiny_theory_seeds  # sl.integrate(cfg, starts)
    for name in ("M", "Q", "b", "risk"):
        np.testing.assert_allclose(getattr(alone, name)[0], getattr(batch, name)[0], rtol=1e-9, atol=1e-12)


def test_identical_heads_stay_identical_along_the_solution():
    """On the Sobol rule, closed under the cyclic shifts of the heads (its subject: the exact route's
    symmetry is that of its quadrature, tests/test_laplace_gradients.py); the tiny problem's rule program."""
    M0 = np.array([[0.02], [0.02]])
    Q0 = np.full((2, 2), 0.25)
    res = sl.integrate(tiny("sgd.n_save=5", rule=True), (M0, Q0, np.zeros(2)), progress=False)
    np.testing.assert_allclose(res.M[0, :, 0], res.M[0, :, 1], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(res.Q[0, :, 0, 0], res.Q[0, :, 0, 1], rtol=1e-10)


def test_bad_initial_conditions_are_named():
    cfg = sl.load_config("default")  # refused before anything is built
    with pytest.raises(ValueError, match="M0 must have shape"):
        sl.integrate(cfg, (np.zeros((3, 2)), np.eye(3), np.zeros(3)), progress=False)
    with pytest.raises(ValueError, match="positive semi-definite"):
        sl.integrate(cfg, (np.ones((2, 2)), 0.1 * np.eye(2), np.zeros(2)), progress=False)
    with pytest.raises(ValueError, match="Q0 must be symmetric"):
        sl.integrate(cfg, (np.zeros((2, 2)), np.array([[1.0, 0.5], [0.0, 1.0]]), np.zeros(2)), progress=False)
    with pytest.raises(ValueError, match="M0 must be finite"):
        sl.integrate(cfg, (np.full((2, 2), np.nan), np.eye(2), np.zeros(2)), progress=False)


def test_a_learning_rate_far_past_stability_stops_within_seconds_and_names_sgd_lr(tiny_theory):
    """On the exact route the ODE at lr = 1e4 and 1e5 turns stiff while the keys grow slowly (steps of
    5e-8 to 2e-7 in tau: hours of steps before the runaway threshold); the solve stops at the step floor
    and says why. The learning rate is a value: the session's tiny program solves it."""
    for lr in ("1e4", "1e5"):
        with pytest.raises(FloatingPointError, match=r"stopped near .*steps fell below 1e-07 .*too stiff.*sgd\.lr \(now"):
            sl.integrate(tiny(f"sgd.lr={lr}"))


def test_a_diverging_solve_on_the_rule_stops_with_a_clear_error():
    """On the Sobol rule of the tiny problem (its program: the learning rate is a value), lr = 1e5: the same
    stop, the same message."""
    cfg = tiny("sgd.lr=1e5", "sgd.tau_max=30", "sgd.n_save=4", rule=True)
    with pytest.raises(FloatingPointError, match=r"stopped near .*: its steps fell below .*sgd\.lr"):
        sl.integrate(cfg, progress=False)


def test_the_terminating_event_fires_on_exactly_the_invalid_states():
    """The event's three conditions, each on a state just past it and one just inside (eager, no solve)."""
    from singleloc.runtime._numerics import PSD_SOLVE, Q_RUNAWAY
    from singleloc.theory._ode import invalid_state
    from singleloc.theory._theory import OrderParameters

    M, b = np.array([[0.5], [0.0]]), np.zeros(2)
    fires = lambda M, Q: bool(invalid_state(0.0, OrderParameters(M, Q, b), None))  # noqa: E731
    valid = M @ M.T + np.eye(2)
    assert not fires(M, valid)
    assert fires(M, np.where(np.eye(2) > 0, np.nan, valid))  # non-finite
    assert fires(M, valid * 1.01 * Q_RUNAWAY) and not fires(M, valid * 0.99 * (Q_RUNAWAY - 1) / 1.25)
    scale = 1.0 + np.abs(valid).max()  # R_orth's smallest eigenvalue of -(1 +- 1 %) PSD_SOLVE * scale
    for f, expected in ((1.01, True), (0.99, False)):
        R = np.diag([1.0, -f * PSD_SOLVE * scale])
        assert fires(M, M @ M.T + R) is expected


def test_integrate_cli_writes_documented_files(tmp_path, capsys, tiny_theory):
    out = tmp_path / "run"
    assert main(["integrate", "default", "--out", str(out), *cli_sets()]) == 0
    gram_points = tiny().theory.gram_rule_points(3, 2, 64)  # the exact route's one Sobol rule is its Gram term's
    with np.load(out / "theory.npz") as f:
        assert set(f.files) == {"tau", "M", "Q", "b", "risk", "risk_se", "drift_error", "points", "replicates", "route",
                                "risk_error", "gram_error", "exact_drift_error", "gram_route", "settled", "risk_change",
                                "class_change"}
        assert f["M"].shape == (3, 2, 1) and f["Q"].shape == (3, 2, 2) and f["b"].shape == (3, 2) and f["risk"].shape == (3,)
        assert f["risk_se"].shape == (3,) and int(f["points"]) == gram_points and int(f["replicates"]) == 1
        assert str(f["route"]) == "exact"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["singleloc_version"] == sl.__version__ and cfg["theory"]["points"] == 64
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary files left
    assert main(["integrate", "default", "--out", str(out), "--set", "sgd.lr=-1"]) == 2
    err = capsys.readouterr().err
    assert "sgd.lr" in err and "Traceback" not in err


def test_theory_tracks_a_large_D_simulation():
    """Early dynamics (tau <= 3) at D = 4000: the theory of each seed's own start against its
    simulation, within 4 Monte Carlo errors of the test risk plus the O(1/sqrt(D)) spread
    allowance of docs/model.md's agreement target (0.01). The tiny problem (its two seeds' solve program:
    the horizon is a value) with the default preset's 4096 test samples."""
    cfg = tiny("simulation.D=4000", "simulation.test_samples=4096", "sgd.tau_max=3", "sgd.n_save=4")
    sim = sl.simulate(cfg, progress=False)
    th = sl.integrate(cfg, sl.initial_conditions(cfg), ts=sim.tau, progress=False)
    se = 1.0 / np.sqrt(cfg.simulation.test_samples)  # the per-sample loss lies in [0, 2]: sd <= 1
    assert np.max(np.abs(sim.risk - th.risk)) < 4 * se + 0.01
    assert np.max(np.abs(sim.M - th.M)) < 0.05


def test_saved_time_counts_within_a_power_of_two_share_one_program():
    """The saved times are padded to ``saved_slots`` (a power of two, at least 16): counts 3 and 5 give arguments
    of the same shapes (one program), 17 another; the padding repeats the last time."""
    from singleloc.preflight._build import build
    from singleloc.theory._ode import _problem, _shape_key, saved_slots

    assert [saved_slots(n) for n in (1, 3, 16, 17, 33, 64, 65)] == [16, 16, 16, 32, 64, 64, 128]
    keys = {n: _shape_key(_problem(build(tiny().replace(sgd={"n_save": n})), None, None).args) for n in (3, 5, 17)}
    assert keys[3] == keys[5] != keys[17]
    ts = _problem(build(tiny().replace(sgd={"n_save": 5})), None, None).args[3]
    assert ts.shape == (16,) and bool(np.all(ts[4:] == ts[4]))


@pytest.mark.parametrize("rate, stops", [(1.0, False), (3e4, False), (1e5, True), (1e7, True)])
def test_the_step_budget_stops_a_solve_whose_pace_exceeds_it_and_leaves_the_others_bit_for_bit(rate, stops):
    """``y' = -rate y`` on ``[0, 1]`` with Tsit5: an explicit method's steps are bounded by its stability
    region (``|rate dt| <~ 3.5``), so the solve needs about ``rate / 3.5`` steps (independent of the wrapper).
    With a budget of 20000 steps: rates 1 and 3e4 (about 9000 steps) finish, bit for bit the plain
    controller's solve; 1e5 (about 29000) stops within the budget; 1e7 (3e6 steps) stops after the warm-up's
    256 steps, having covered 1e-4 of its span."""
    import diffrax
    import jax.numpy as jnp

    from singleloc.theory._step_budget import WARMUP, StepBudget

    def solve(controller):
        return diffrax.diffeqsolve(diffrax.ODETerm(lambda t, y, a: -rate * y), diffrax.Tsit5(), 0.0, 1.0, 1e-3, jnp.ones(()),
                                   stepsize_controller=controller, max_steps=100_000, throw=False)

    pid = diffrax.PIDController(rtol=1e-6, atol=1e-9)
    budgeted = solve(StepBudget(pid, jnp.asarray(20_000)))
    steps = int(budgeted.stats["num_steps"])
    if not stops:
        plain = solve(pid)
        assert budgeted.result == diffrax.RESULTS.successful
        assert steps == int(plain.stats["num_steps"]) and float(budgeted.ys[-1]) == float(plain.ys[-1])
    else:
        assert budgeted.result == diffrax.RESULTS.max_steps_reached
        assert steps <= 20_000
        if rate >= 1e7:
            assert steps == WARMUP


@pytest.mark.slow
def test_integrate_cli_with_automatic_points_keeps_the_points_it_used(tmp_path):
    """``theory.points = "auto"``: the command's settledness builds an ODE after the solve, and failed there ("a
    number is needed here", exit 2); the run folder's config holds the points integrate chose."""
    out = tmp_path / "run"
    assert main(["integrate", "default", "--out", str(out), *cli_sets("theory.points=auto", rule=True)]) == 0
    with np.load(out / "theory.npz") as f:
        assert json.loads((out / "config.json").read_text())["theory"]["points"] == int(f["points"]) >= 64


@pytest.mark.slow
def test_the_issue_s_solve_at_lr_1e4_changes_route_and_says_the_route_it_ran_on(capsys, tmp_path):
    """The hostile pass's case (issue 62): ``integrate default --set sgd.lr=1e4`` on the exact route took steps just
    above the step floor and was still solving after 300 s. Since the width check (issue 59 item 4) the exact route's
    fields outgrow its rule at the start and the run goes on on the Sobol rule, which trains (in seconds): a warning
    names sgd.lr, and the folder says the route it ran on (its settledness once built the exact route's ODE and
    stopped on NaN attention weights of fields the rule there does not resolve)."""
    out = tmp_path / "run"
    assert main(["integrate", "default", "--set", "sgd.lr=1e4", "--no-progress", "--out", str(out)]) == 0
    err = capsys.readouterr().err  # both said without progress lines
    assert "warning: the exact route stopped near tau" in err and "solving on the Sobol rule instead" in err
    assert "sgd.lr = 10000 may be too large" in err
    with np.load(out / "theory.npz") as f:
        assert str(f["route"]) == json.loads((out / "config.json").read_text())["theory"]["route"] == "rule"
