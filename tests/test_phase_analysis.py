"""Phase analysis of trajectories: the plateau/escape rule, specialization, redundancy and
shared profiles, on curves and overlaps built by hand."""

from __future__ import annotations

import numpy as np
import pytest

from singleloc import _phase_analysis as pa


def logistic(tau, t0, width, hi, lo):
    return lo + (hi - lo) / (1.0 + np.exp((tau - t0) / width))


# -- plateaus and escapes ------------------------------------------------------------------


def test_single_logistic_drop_escape_at_midpoint():
    tau = np.linspace(0.0, 60.0, 601)
    risk = logistic(tau, 20.0, 1.5, 0.7, 0.2)
    ps = pa.plateaus(tau, risk)
    assert len(ps) == 2
    assert ps[0].risk == pytest.approx(0.7, abs=1e-3) and ps[1].risk == pytest.approx(0.2, abs=1e-3)
    esc = pa.escape_times(tau, risk)
    assert esc.shape == (1,)
    assert esc[0] == pytest.approx(20.0, abs=0.02)


def test_two_drops_give_two_escapes_and_the_intermediate_plateau():
    tau = np.concatenate([[0.0], np.geomspace(0.01, 100.0, 800)])
    risk = 0.2 + (logistic(tau, 3.0, 0.3, 0.6, 0.3) - 0.3) + (logistic(tau, 30.0, 2.0, 0.3, 0.0))
    ps = pa.plateaus(tau, risk)
    assert [round(p.risk, 2) for p in ps] == [0.8, 0.5, 0.2]
    esc = pa.escape_times(tau, risk)
    np.testing.assert_allclose(esc, [3.0, 30.0], atol=0.05)


def test_halfway_time_interpolates_and_reports_nan():
    tau = np.array([0.0, 1.0, 2.0, 3.0])
    risk = np.array([1.0, 0.9, 0.3, 0.2])
    # from 1.0 to 0.2: target 0.6, crossed between tau 1 and 2 at 1.5
    assert pa.halfway_time(tau, risk, 0.0, 1.0, 0.2) == pytest.approx(1.5)
    assert np.isnan(pa.halfway_time(tau, risk, 0.0, 1.0, -2.0))


def test_flat_curve_is_one_plateau_and_no_escape():
    tau = np.linspace(0, 10, 50)
    ps = pa.plateaus(tau, np.full(50, 0.3))
    assert len(ps) == 1
    assert pa.escape_times(tau, np.full(50, 0.3)).size == 0


# -- specialization and redundancy ---------------------------------------------------------


def _state(M, R=None):
    M = np.asarray(M, float)
    R = 0.1 * np.eye(len(M)) if R is None else R
    return M, M @ M.T + R


def test_specialization_labels_on_constructed_overlaps():
    M, Q = _state([[2.0, 0.05], [0.1, 1.8], [1.0, 1.0], [0.01, 0.002]])
    labels = pa.specialization(M, Q, mean=[0.5, 0.5])
    # head 0 -> spike 0, head 1 -> spike 1, head 2 along the mean (unspecialized),
    # head 3 has almost no spike component (spike fraction below 0.3)
    assert labels.tolist() == [0, 1, -1, -1]
    # with a zero-mean prior a head along a spike, either sign, is specialized
    M2, Q2 = _state([[-1.5, 0.0], [0.0, 1.5]])
    assert pa.specialization(M2, Q2, mean=[0.0, 0.0]).tolist() == [0, 1]
    # custom directions: a head along (1, 1) is specialized to that direction
    assert pa.specialization(M, Q, directions=[[1.0, 1.0], [1.0, -1.0]]).tolist() == [-1, -1, 0, -1]


def test_head_profiles_of_constructed_keys():
    # keys in R^3 with spikes e_1, e_2 (scaled so that |k*_f|^2 = D = 3): the spike fraction is
    # the norm of the key's projection on the spike span over the key's norm
    kstar = np.sqrt(3.0) * np.eye(3)[:2]
    K = np.array([[3.0, 4.0, 0.0], [1.0, 0.0, 1.0], [0.0, 0.0, 2.0]])
    M, Q = K @ kstar.T / 3, K @ K.T / 3
    u, phi = pa.head_profiles(M, Q)
    np.testing.assert_allclose(u, [[0.6, 0.8], [1.0, 0.0], [0.0, 0.0]], atol=1e-15)
    np.testing.assert_allclose(phi, [1.0, 1 / np.sqrt(2), 0.0], atol=1e-15)
    # a zero key: no NaN, nothing specialized
    u0, phi0 = pa.head_profiles(np.zeros((1, 2)), np.zeros((1, 1)))
    assert np.all(u0 == 0) and phi0[0] == 0 and pa.specialization(np.zeros((1, 2)), np.zeros((1, 1)))[0] == -1


def test_head_spike_cosines_and_redundancy():
    M = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    Q = M @ M.T + np.diag([0.0, 1e-4, 0.5])
    cos = pa.head_spike_cosines(M, Q)
    assert cos[0, 0] == pytest.approx(1.0) and cos[2, 1] == pytest.approx(1 / np.sqrt(1.5))
    assert pa.head_cosines(Q)[0, 1] > 0.99
    assert int(pa.redundant_pairs(Q)) == 1
    assert int(pa.redundant_pairs(np.eye(3))) == 0
    # same spike profile, different orthogonal parts: not redundant keys, but a shared profile
    M2 = np.array([[1.0, 1.0], [1.0, 1.0], [2.0, 0.0], [0.01, 0.01]])
    Q2 = M2 @ M2.T + 0.3 * np.eye(4)
    assert int(pa.redundant_pairs(Q2)) == 0 and int(pa.shared_profiles(M2, Q2)) == 1


def test_specialization_times_and_rearrangements():
    tau = np.arange(6.0)
    labels = np.array([[-1, -1], [0, -1], [-1, -1], [0, 1], [0, 1], [1, 1]])
    t = pa.specialization_times(tau, labels)
    assert t.tolist() == [3.0, 3.0]
    ev = pa.rearrangements(tau, labels)
    assert (2.0, 0, 0, -1) in ev and (5.0, 0, 0, 1) in ev
    # a head that loses its label at the end has no specialization time
    assert np.isnan(pa.specialization_times(tau, np.array([[0], [0], [-1], [-1], [-1], [-1]]))[0])


def test_analyze_synthetic_trajectory():
    tau = np.linspace(0, 40, 161)
    s = 1.0 / (1.0 + np.exp(-(tau - 20.0)))  # specialization switch
    m = 1.0 + 0.0 * tau
    M = np.stack([np.stack([m * (1 + s), m * (1 - s)], -1), np.stack([m * (1 - s), m * (1 + s)], -1)], 1)  # (T, 2, 2)
    Q = M @ np.swapaxes(M, -1, -2) + 0.005 * np.eye(2)
    risk = logistic(tau, 20.0, 1.0, 0.4, 0.1)
    risk = np.where(tau < 2, 0.8 - 0.2 * tau, risk)  # a fast first drop onto the plateau
    a = pa.analyze(tau, M, Q, risk, mean=[0.5, 0.5])
    assert a.labels.shape == (1, 161, 2)
    assert a.n_specialized[0, 0] == 0 and a.n_specialized[0, -1] == 2
    assert a.n_directions[0, -1] == 2
    assert a.redundant[0, 0] == 1 and a.redundant[0, -1] == 0
    assert a.escape_time[0] == pytest.approx(20.0, abs=0.1)
    assert 19 <= a.first_specialization[0] < 21
    assert a.profiles[0, 0] == 1 and a.profiles[0, -1] == 0
    assert a.summary()["n_specialized"] == 2.0
    assert np.all((a.specialization_times[0] >= 19) & (a.specialization_times[0] < 25))
    np.testing.assert_array_equal(a.cos[0], pa.head_spike_cosines(M, Q))
    with pytest.raises(ValueError, match="analyze expects"):
        pa.analyze(tau, M[:, :, :1, None], Q, risk)
