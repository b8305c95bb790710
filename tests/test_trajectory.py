"""The one trajectory record (singleloc.Trajectory) that the ODE, the simulation and the SDE return."""

import dataclasses

import numpy as np

import singleloc as sl


def test_every_solver_returns_a_trajectory_with_its_fields_first():
    names = ["tau", "M", "Q", "b", "risk"]
    for kind in (sl.TheoryResult, sl.SimulationResult, sl.SDEResult):
        assert issubclass(kind, sl.Trajectory)
        assert [f.name for f in dataclasses.fields(kind)][:5] == names  # positional construction unchanged


def test_r_orth_is_the_keys_gram_matrix_off_the_spikes(rng):
    """``Q - M M^T`` from the overlaps against the keys projected off the spikes directly:
    orthonormal spikes of norm sqrt(D), ``M = K k*^T / D``, ``Q = K K^T / D``."""
    S, T, H, F, D = 2, 3, 3, 2, 50
    basis, _ = np.linalg.qr(rng.standard_normal((D, F)))
    kstar = np.sqrt(D) * basis.T  # (F, D)
    K = rng.standard_normal((S, T, H, D))
    M = K @ kstar.T / D
    Q = K @ np.swapaxes(K, -1, -2) / D
    off = K - (K @ basis) @ basis.T  # the keys' components orthogonal to the spikes
    record = sl.SimulationResult(np.arange(T, dtype=float), M, Q, np.zeros((S, T, H)), np.ones((S, T)), np.ones((S, T)),
                                 None, None)
    np.testing.assert_allclose(record.r_orth(), off @ np.swapaxes(off, -1, -2) / D, rtol=1e-12, atol=1e-12)
    assert record.starts == S
    Ms, Qs, bs = record.state(1, 0)
    np.testing.assert_array_equal(Ms, M[1, 0])
    np.testing.assert_array_equal(Qs, Q[1, 0])
    assert bs.shape == (H,)


def test_a_result_resolves_its_setup_to_the_points_and_the_route_it_ran_on():
    """``TheoryResult.resolved``: ``theory.points = "auto"`` becomes the points used; a solve that left the exact route
    for the Sobol rule (fields wider than its rule resolves) gives the Setup built for the rule, as the command line
    then builds its settledness and writes its config.json (``integrate default --set sgd.lr=1e4`` stopped there on
    the exact route's NaN attention weights)."""
    from singleloc.preflight._build import build

    zeros = np.zeros((1, 2, 2, 2)), np.zeros((1, 2, 2, 2)), np.zeros((1, 2, 2)), np.ones((1, 2))
    exact = build(sl.load_config("default"))
    assert exact.route.route == "exact"
    result = lambda route: sl.TheoryResult(np.arange(2.0), *zeros, points=512, route=route)  # noqa: E731
    assert result("exact").resolved(exact) is exact  # no switch, points given: as decided
    switched = result("rule").resolved(exact)
    assert switched.route.route == switched.config.theory.route == "rule" and switched.theory.points == 512
    auto = build(sl.load_config("default").replace(theory={"route": "rule", "points": "auto"}))
    assert result("rule").resolved(auto).theory.points == 512 == result("rule").resolved(auto.config).theory.points
