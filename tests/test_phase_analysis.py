"""Phase analysis of trajectories: the plateau/escape rule, specialization, the head classes,
redundancy and shared profiles, on curves and overlaps built by hand; the heads' attention
weights against Monte Carlo."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import brentq

from singleloc import OrderParameterODE, build, load_config
from singleloc.analysis import _head_classes as hc
from singleloc.analysis import _phase_analysis as pa
from singleloc.analysis import _plateaus as pl
from singleloc.analysis._attention_mass import attention_mass, classifying_weights
from singleloc.preflight._resources import auto_points


def logistic(tau, t0, width, hi, lo):
    return lo + (hi - lo) / (1.0 + np.exp((tau - t0) / width))


# -- plateaus and escapes ------------------------------------------------------------------


def test_single_logistic_drop_escape_at_midpoint():
    tau = np.linspace(0.0, 60.0, 601)
    risk = logistic(tau, 20.0, 1.5, 0.7, 0.2)
    ps = pl.plateaus(tau, risk)
    assert len(ps) == 2
    assert ps[0].risk == pytest.approx(0.7, abs=1e-3) and ps[1].risk == pytest.approx(0.2, abs=1e-3)
    esc = pl.escape_times(tau, risk)
    assert esc.shape == (1,)
    assert esc[0] == pytest.approx(20.0, abs=0.02)


def test_two_drops_give_two_escapes_and_the_intermediate_plateau():
    tau = np.concatenate([[0.0], np.geomspace(0.01, 100.0, 800)])
    risk = 0.2 + (logistic(tau, 3.0, 0.3, 0.6, 0.3) - 0.3) + (logistic(tau, 30.0, 2.0, 0.3, 0.0))
    ps = pl.plateaus(tau, risk)
    assert [round(p.risk, 2) for p in ps] == [0.8, 0.5, 0.2]
    esc = pl.escape_times(tau, risk)
    np.testing.assert_allclose(esc, [3.0, 30.0], atol=0.05)


def test_halfway_time_interpolates_and_reports_nan():
    tau = np.array([0.0, 1.0, 2.0, 3.0])
    risk = np.array([1.0, 0.9, 0.3, 0.2])
    # from 1.0 to 0.2: target 0.6, crossed between tau 1 and 2 at 1.5
    assert pl.halfway_time(tau, risk, 0.0, 1.0, 0.2) == pytest.approx(1.5)
    assert np.isnan(pl.halfway_time(tau, risk, 0.0, 1.0, -2.0))


def test_flat_curve_is_one_plateau_and_no_escape():
    tau = np.linspace(0, 10, 50)
    ps = pl.plateaus(tau, np.full(50, 0.3))
    assert len(ps) == 1
    assert pl.escape_times(tau, np.full(50, 0.3)).size == 0


# -- specialization and redundancy ---------------------------------------------------------


def _state(M, R=None):
    M = np.asarray(M, float)
    R = 0.1 * np.eye(len(M)) if R is None else R
    return M, M @ M.T + R


def test_specialization_labels_on_constructed_overlaps():
    M, Q = _state([[2.0, 0.05], [0.1, 1.8], [1.0, 1.0], [0.01, 0.002]])
    labels = hc.specialization(M, Q, mean=[0.5, 0.5])
    # head 0 -> spike 0, head 1 -> spike 1, head 2 along the mean (unspecialized),
    # head 3 has almost no spike component (spike fraction below 0.3)
    assert labels.tolist() == [0, 1, -1, -1]
    # with a zero-mean prior a head along a spike, either sign, is specialized
    M2, Q2 = _state([[-1.5, 0.0], [0.0, 1.5]])
    assert hc.specialization(M2, Q2, mean=[0.0, 0.0]).tolist() == [0, 1]
    # custom directions: a head along (1, 1) is specialized to that direction
    assert hc.specialization(M, Q, directions=[[1.0, 1.0], [1.0, -1.0]]).tolist() == [-1, -1, 0, -1]


def test_head_profiles_of_constructed_keys():
    # keys in R^3 with spikes e_1, e_2 (scaled so that |k*_f|^2 = D = 3): the spike fraction is
    # the norm of the key's projection on the spike span over the key's norm
    kstar = np.sqrt(3.0) * np.eye(3)[:2]
    K = np.array([[3.0, 4.0, 0.0], [1.0, 0.0, 1.0], [0.0, 0.0, 2.0]])
    M, Q = K @ kstar.T / 3, K @ K.T / 3
    u, phi = hc.head_profiles(M, Q)
    np.testing.assert_allclose(u, [[0.6, 0.8], [1.0, 0.0], [0.0, 0.0]], atol=1e-15)
    np.testing.assert_allclose(phi, [1.0, 1 / np.sqrt(2), 0.0], atol=1e-15)
    # a zero key: no NaN, nothing specialized
    u0, phi0 = hc.head_profiles(np.zeros((1, 2)), np.zeros((1, 1)))
    assert np.all(u0 == 0) and phi0[0] == 0 and hc.specialization(np.zeros((1, 2)), np.zeros((1, 1)))[0] == -1


def test_head_spike_cosines_and_redundancy():
    M = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    Q = M @ M.T + np.diag([0.0, 1e-4, 0.5])
    cos = hc.head_spike_cosines(M, Q)
    assert cos[0, 0] == pytest.approx(1.0) and cos[2, 1] == pytest.approx(1 / np.sqrt(1.5))
    assert hc.head_cosines(Q)[0, 1] > 0.99
    assert int(hc.redundant_pairs(Q)) == 1
    assert int(hc.redundant_pairs(np.eye(3))) == 0
    # same spike profile, different orthogonal parts: not redundant keys, but a shared profile
    M2 = np.array([[1.0, 1.0], [1.0, 1.0], [2.0, 0.0], [0.01, 0.01]])
    Q2 = M2 @ M2.T + 0.3 * np.eye(4)
    assert int(hc.redundant_pairs(Q2)) == 0 and int(hc.shared_profiles(M2, Q2)) == 1


def test_specialization_times_and_rearrangements():
    tau = np.arange(6.0)
    labels = np.array([[-1, -1], [0, -1], [-1, -1], [0, 1], [0, 1], [1, 1]])
    t = hc.specialization_times(tau, labels)
    assert t.tolist() == [3.0, 3.0]
    ev = hc.rearrangements(tau, labels)
    assert (2.0, 0, 0, -1) in ev and (5.0, 0, 0, 1) in ev
    # a head that loses its label at the end has no specialization time
    assert np.isnan(hc.specialization_times(tau, np.array([[0], [0], [-1], [-1], [-1], [-1]]))[0])


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
    assert a.summary()["n_aligned"] == 2.0 and a.summary()["escaped"] == 1.0
    # the heads leave the mean profile when psi = sqrt(2) s / sqrt(2 + 2 s^2 + 0.005) reaches
    # 0.1, i.e. s = 0.1005 (tau = 20 - log(0.9 / 0.1005) = 17.81); the next saved time is 18
    assert a.first_learned[0] == 18.0
    assert np.all((a.specialization_times[0] >= 19) & (a.specialization_times[0] < 25))
    np.testing.assert_array_equal(a.cos[0], hc.head_spike_cosines(M, Q))
    with pytest.raises(ValueError, match="analyze expects"):
        pa.analyze(tau, M[:, :, :1, None], Q, risk)


# -- head classes ---------------------------------------------------------------------------


def _keys_state(M, orth):
    """Overlaps of keys ``(M_h, orth_h)``: the spike part and an explicit orthogonal part."""
    K = np.concatenate([np.asarray(M, float), np.asarray(orth, float)], axis=1)
    return K[:, : len(M[0])], K @ K.T


def test_one_hand_made_head_per_class():
    """Spikes prior (mean along (1, 1)), F = 2: one head of each class, in the order of the rules."""
    M = [[2.0, 0.1],      # aligned with e_1: cos 0.999
         [2.04, 1.14],    # leaning: the final softmax head of the default problem
         [1.5, -1.5],     # combination e_1 - e_2
         [1.4, 1.4],      # unspecialized: the mean-direction profile
         [2.0, 0.1],      # redundant: the same key as head 0
         [0.1, 2.0]]      # off (by its weight), although aligned with e_2
    orth = 0.3 * np.eye(6)
    orth[4] = orth[0]
    M, Q = _keys_state(M, orth)
    weights = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.01])
    c = hc.classify_heads(M, Q, mean=[1.25, 1.25], weights=weights)
    assert c.names().tolist() == ["aligned", "leaning", "combination", "unspecialized", "redundant", "off"]
    assert {k: int(v) for k, v in c.counts().items()} == dict.fromkeys(hc.HEAD_CLASSES, 1)
    assert c.learned().tolist() == [True, True, True, False, False, False]
    assert set(hc.CLASS_LETTERS) == set(hc.HEAD_CLASSES) and tuple(hc.CLASS_LETTERS)[:3] == hc.LEARNED_CLASSES
    assert hc.class_counts_text({**c.counts(), "leaning": 0.5, "off": 0}) == "1A 0.5L 1C 1R 1U"
    # the angles of the leaning head: atan(1.14 / 2.04) from e_1, 45 degrees minus that from the mean
    a1 = np.degrees(np.arctan2(1.14, 2.04))
    assert c.spike[1] == 0 and c.angle_spike[1] == pytest.approx(a1, abs=1e-12)
    assert c.angle_mean[1] == pytest.approx(45.0 - a1, abs=1e-12)
    assert c.angle_mean[3] == pytest.approx(0.0, abs=1e-6) and c.angle_mean[2] == pytest.approx(90.0)
    # without weights nothing is off: the last head is aligned with e_2
    assert hc.classify_heads(M, Q, mean=[1.25, 1.25]).names()[5] == "aligned"
    # a redundant copy of an off head is not redundant (it is classified by its own profile)
    w_off0 = np.array([0.01, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert hc.classify_heads(M, Q, mean=[1.25, 1.25], weights=w_off0).names()[[0, 4]].tolist() == ["off", "aligned"]


def test_head_outcomes_count_the_heads_on_each_spike_per_trajectory():
    """The showcase's question, per start: how many heads on each spike (a copy of an aligned head counted on its
    spike), and the rest by class; the outcomes counted over the starts, the most common first."""
    def state(last):  # heads on e_1, a copy of it, on e_2, and ``last``
        orth = 0.3 * np.eye(4)
        orth[1] = orth[0]
        return _keys_state([[2.0, 0.1], [2.0, 0.1], [0.1, 2.0], last], orth)

    (Ma, Qa), (Mb, Qb) = state([0.05, 2.1]), state([0.05, 0.0])
    M, Q = np.stack([Ma, Ma, Mb, Ma]), np.stack([Qa, Qa, Qb, Qa])
    words = hc.head_outcomes(hc.classify_heads(M, Q))
    assert words == ["2 on e1, 2 on e2"] * 2 + ["2 on e1, 1 on e2, 1 unspecialized", "2 on e1, 2 on e2"]
    assert hc.outcomes_text(words, "starts") == "3 of 4 starts: 2 on e1, 2 on e2; 1 of 4: 2 on e1, 1 on e2, 1 unspecialized"
    off = hc.head_outcomes(hc.classify_heads(Ma, Qa, weights=np.array([1.0, 1.0, 1.0, 0.01])))
    assert off == ["2 on e1, 1 on e2, 1 off"]


def test_class_boundaries():
    """The thresholds of the rules, on heads placed just inside and outside them (F = 2, spikes
    prior; each head alone, orthogonal part 0 unless stated, so the spike fraction is 1)."""
    mean = [1.0, 1.0]

    def names(M, orth=0.0):
        return [hc.classify_heads(*_keys_state([m], [[orth]]), mean=mean).names()[0] for m in M]

    # psi = |M - (M . mu) mu| / |M| = sin(angle to the mean): 0.1 at 5.74 degrees
    t = np.radians(45.0 - np.degrees(np.arcsin(0.1)))
    assert names([[np.cos(t - 1e-3), np.sin(t - 1e-3)], [np.cos(t + 1e-3), np.sin(t + 1e-3)]]) == ["leaning", "unspecialized"]
    # aligned needs |cos| >= 0.9 and a cosine 0.05 above the mean's: between the mean and e_1 the
    # second condition binds, at the angle a from e_1 where cos(a) = cos(45 - a) + 0.05
    a = brentq(lambda x: np.cos(np.radians(x)) - np.cos(np.radians(45.0 - x)) - 0.05, 10.0, 30.0)

    def at(deg):
        return [np.cos(np.radians(deg)), np.sin(np.radians(deg))]

    assert names([at(a - 0.01), at(a + 0.01)]) == ["aligned", "leaning"]
    # beyond the spike, away from the mean: aligned while |cos| >= 0.9 (25.84 degrees), then a combination
    b = np.degrees(np.arccos(0.9))
    assert names([at(-b + 0.01), at(-b - 0.01)]) == ["aligned", "combination"]
    # a small spike part: unspecialized whatever its direction (spike fraction 0.2 < 0.3)
    assert names([[0.2, 0.0]], orth=np.sqrt(1 - 0.04)) == ["unspecialized"]
    # F = 3: out of the plane of the mean and e_1 by more than plane_tol = 0.2 is a combination
    M3 = np.array([[0.9, 0.3, 0.3], [0.8, 0.55, 0.1]])
    M3 = M3 / np.linalg.norm(M3, axis=1, keepdims=True)
    assert [hc.classify_heads(*_keys_state([m], [[0.0]]), mean=[1.0, 1.0, 1.0]).names()[0] for m in M3] \
        == ["leaning", "combination"]


def test_classes_without_a_mean_direction_and_with_one_spike():
    # zero-mean prior (flipped): e_1 + e_2 is a combination, -e_1 aligned, a tiny key unspecialized
    M, Q = _keys_state([[1.5, 1.5], [-2.0, 0.1], [0.01, 0.0]], 0.3 * np.eye(3))
    for mean in (None, [0.0, 0.0]):
        assert hc.classify_heads(M, Q, mean=mean).names().tolist() == ["combination", "aligned", "unspecialized"]
    # F = 1 with a mean: the only spike is the mean direction
    M1, Q1 = _keys_state([[2.0], [-1.0]], 0.3 * np.eye(2))
    assert hc.classify_heads(M1, Q1, mean=[2.5]).names().tolist() == ["unspecialized", "unspecialized"]


def test_escape_from_a_plateau_that_runs_to_the_end():
    """A late escape whose risk drop (0.005) is too small for the rate criterion: the plateau's
    extent runs to the end of the curve, and the escape is still read at the halfway time."""
    tau = np.concatenate([[0.0], np.geomspace(0.5, 800.0, 400)])
    risk = 0.33 + 0.45 * np.exp(-tau / 5.0) - 0.005 / (1 + np.exp(-(tau - 300.0) / 20.0))
    s = 1.0 / (1 + np.exp(-(tau - 300.0) / 20.0))
    m = 1.4 * (1 - np.exp(-tau / 5.0)) + 1e-3
    M = np.stack([np.stack([m * (1 + 0.4 * s), m * (1 - 0.4 * s)], -1), np.stack([m * (1 - 0.4 * s), m * (1 + 0.4 * s)], -1)], 1)
    Q = M @ np.swapaxes(M, -1, -2) + 0.2 * np.eye(2)
    a = pa.analyze(tau, M, Q, risk, mean=[1.0, 1.0])
    assert a.plateaus[0][-1].end == tau[-1]
    assert a.escaped[0] and a.classes.names()[0, -1].tolist() == ["leaning", "leaning"]
    assert 250 < a.first_learned[0] < 300
    # halfway between the plateau value and the final risk: at tau = 300 up to the creep of the
    # plateau value (the risk at its centre) and the logistic's tail at the end
    assert a.escape_time[0] == pytest.approx(300.0, abs=5.0)
    assert np.isnan(a.first_specialization[0])


def test_attention_mass_against_monte_carlo():
    """w_h = E[sum_l A_hl] by the ODE's route (the exact one): 1 for softmax, summing to H for bsoftmax, and
    for softmax1 against plain Monte Carlo over the fields (a head with a bias of -12 is off)."""
    M = np.array([[1.0, 0.2], [0.3, 0.8]])
    Q = M @ M.T + np.array([[0.4, 0.1], [0.1, 0.3]])
    b = np.array([0.5, -12.0])
    cfg = load_config("default", ["theory.points=1024", "problem.L=4"])
    w_soft = attention_mass(OrderParameterODE.from_setup(build(cfg)), M, Q, b)
    np.testing.assert_allclose(w_soft, 1.0, atol=1e-12)
    joint = OrderParameterODE.from_setup(build(cfg.replace(model={"activation": "bsoftmax"})))
    w_b = attention_mass(joint, M[None], Q[None], b[None])
    # a joint layer's masses sum to H exactly on a rule; on the exact route to its profiles' interpolation
    # error (below 1e-10, singleloc.expectations._laplace_profiles; 1.4e-11 here)
    assert w_b.shape == (1, 2) and w_b.sum() == pytest.approx(2.0, abs=1e-10)
    # the head classes of a run and of a sweep's summary take a joint layer's weights on the Sobol rule at its auto
    # points (the exact ones cost its whole rule at every saved time): within the rule's error of the exact ones
    # (3.5e-8 here, 1024 points), far below the 0.05 under which a head is off, the weights' one use there
    joint = build(cfg.replace(model={"activation": "bsoftmax"}))
    on_rule = attention_mass(OrderParameterODE.from_setup(joint.on_rule_route(auto_points(4, 2, joint.prior))), M[None],
                             Q[None], b[None])
    np.testing.assert_array_equal(classifying_weights(joint, M[None], Q[None], b[None]), on_rule)
    np.testing.assert_allclose(on_rule, w_b, atol=1e-6)
    w1 = attention_mass(OrderParameterODE.from_setup(build(cfg.replace(model={"activation": "softmax1"}))), M, Q, b)
    # Monte Carlo: token 0 carries M theta, theta = 2.5 e_f with f uniform; 4e5 samples
    rng = np.random.default_rng(0)
    n, L = 400_000, 4
    g = rng.standard_normal((n, L, 2)) @ np.linalg.cholesky(Q).T
    theta = 2.5 * np.eye(2)[rng.integers(0, 2, n)]
    g[:, 0] += theta @ M.T
    e = np.exp(g + b)
    ref = (e.sum(1) / (1 + e.sum(1))).mean(0)
    se = (e.sum(1) / (1 + e.sum(1))).std(0) / np.sqrt(n)
    np.testing.assert_allclose(w1, ref, atol=5 * se.max() + 2e-3)
    assert w1[1] < 1e-3
    c = hc.classify_heads(M, Q, mean=[1.25, 1.25], weights=w1)
    assert c.names()[1] == "off"


def test_a_run_has_settled_only_when_its_risk_and_classes_held_over_the_window():
    """The criterion of singleloc.analysis._settled on hand-made trajectories: 11 saved times on
    [0, 10], so the window (the last 20 %) is tau = 8, 9, 10."""
    from singleloc.analysis._settled import RTOL, settledness

    tau = np.linspace(0.0, 10.0, 11)
    flat = np.r_[np.linspace(0.8, 0.2, 8), [0.2, 0.2, 0.2]]
    codes = np.zeros((11, 2), int)
    s = settledness(tau, flat, codes)
    assert s.settled.tolist() == [True] and s.window_start == 8.0 and s.times == 3 and np.isnan(s.class_change[0])
    dip = flat.copy()
    dip[9] = 0.2 * (1 + 3 * RTOL)  # a dip that climbs back: the two ends agree, the window does not
    assert settledness(tau, dip, codes).settled.tolist() == [False]
    near = flat.copy()
    near[9] = 0.2 * (1 + 0.5 * RTOL)
    assert settledness(tau, near, codes).settled.tolist() == [True]
    late = codes.copy()
    late[10, 1] = 2  # head 1 changes class at the last saved time
    s = settledness(tau, flat, late)
    assert s.settled.tolist() == [False] and s.class_change[0] == 10.0 and s.changed_heads[0] == 1
    assert "NOT settled" in s.text() and "1 head(s) changed class (last at tau = 10)" in s.text()
    early = codes.copy()
    early[8:, 1] = 2  # changed before the window (between tau = 7 and 8): held over it
    assert settledness(tau, flat, early).settled.tolist() == [True]
    both = settledness(tau, np.stack([flat, flat]), np.stack([codes, late]))  # a run settles when each trajectory has
    assert both.settled.tolist() == [True, False] and "(1 of 2 trajectories)" in both.text()
    short = settledness(tau[:2], flat[:2], codes[:2])  # fewer saved times than the window needs: the last two
    assert short.times == 2 and short.settled.tolist() == [False]
