"""Phase analysis: plateau/escape rule, specialization and redundancy detection, and the
linearisation of the ODE at the unspecialized point."""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from singleloc import OrderParameterODE, load_config  # noqa: E402
from singleloc import _phases as ph  # noqa: E402


def logistic(tau, t0, width, hi, lo):
    return lo + (hi - lo) / (1.0 + np.exp((tau - t0) / width))


# -- plateaus and escapes ------------------------------------------------------------------


def test_single_logistic_drop_escape_at_midpoint():
    tau = np.linspace(0.0, 60.0, 601)
    risk = logistic(tau, 20.0, 1.5, 0.7, 0.2)
    ps = ph.plateaus(tau, risk)
    assert len(ps) == 2
    assert ps[0].risk == pytest.approx(0.7, abs=1e-3) and ps[1].risk == pytest.approx(0.2, abs=1e-3)
    esc = ph.escape_times(tau, risk)
    assert esc.shape == (1,)
    assert esc[0] == pytest.approx(20.0, abs=0.02)


def test_two_drops_give_two_escapes_and_the_intermediate_plateau():
    tau = np.concatenate([[0.0], np.geomspace(0.01, 100.0, 800)])
    risk = 0.2 + (logistic(tau, 3.0, 0.3, 0.6, 0.3) - 0.3) + (logistic(tau, 30.0, 2.0, 0.3, 0.0))
    ps = ph.plateaus(tau, risk)
    assert [round(p.risk, 2) for p in ps] == [0.8, 0.5, 0.2]
    esc = ph.escape_times(tau, risk)
    np.testing.assert_allclose(esc, [3.0, 30.0], atol=0.05)


def test_halfway_time_interpolates_and_reports_nan():
    tau = np.array([0.0, 1.0, 2.0, 3.0])
    risk = np.array([1.0, 0.9, 0.3, 0.2])
    # from 1.0 to 0.2: target 0.6, crossed between tau 1 and 2 at 1.5
    assert ph.halfway_time(tau, risk, 0.0, 1.0, 0.2) == pytest.approx(1.5)
    assert np.isnan(ph.halfway_time(tau, risk, 0.0, 1.0, -2.0))


def test_flat_curve_is_one_plateau_and_no_escape():
    tau = np.linspace(0, 10, 50)
    ps = ph.plateaus(tau, np.full(50, 0.3))
    assert len(ps) == 1
    assert ph.escape_times(tau, np.full(50, 0.3)).size == 0


# -- specialization and redundancy ---------------------------------------------------------


def _state(M, R=None):
    M = np.asarray(M, float)
    R = 0.1 * np.eye(len(M)) if R is None else R
    return M, M @ M.T + R


def test_specialization_labels_on_constructed_overlaps():
    M, Q = _state([[2.0, 0.05], [0.1, 1.8], [1.0, 1.0], [0.01, 0.002]])
    labels = ph.specialization(M, Q, mean=[0.5, 0.5])
    # head 0 -> spike 0, head 1 -> spike 1, head 2 along the mean (unspecialized),
    # head 3 has almost no spike component (spike fraction below 0.3)
    assert labels.tolist() == [0, 1, -1, -1]
    # with a zero-mean prior a head along a spike, either sign, is specialized
    M2, Q2 = _state([[-1.5, 0.0], [0.0, 1.5]])
    assert ph.specialization(M2, Q2, mean=[0.0, 0.0]).tolist() == [0, 1]
    # custom directions: a head along (1, 1) is specialized to that direction
    assert ph.specialization(M, Q, directions=[[1.0, 1.0], [1.0, -1.0]]).tolist() == [-1, -1, 0, -1]


def test_alignment_cosines_and_redundancy():
    M = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    Q = M @ M.T + np.diag([0.0, 1e-4, 0.5])
    cos = ph.alignment(M, Q)
    assert cos[0, 0] == pytest.approx(1.0) and cos[2, 1] == pytest.approx(1 / np.sqrt(1.5))
    assert ph.head_cosines(Q)[0, 1] > 0.99
    assert int(ph.redundant_pairs(Q)) == 1
    assert int(ph.redundant_pairs(np.eye(3))) == 0
    # same spike profile, different orthogonal parts: not redundant keys, but a shared profile
    M2 = np.array([[1.0, 1.0], [1.0, 1.0], [2.0, 0.0], [0.01, 0.01]])
    Q2 = M2 @ M2.T + 0.3 * np.eye(4)
    assert int(ph.redundant_pairs(Q2)) == 0 and int(ph.shared_profiles(M2, Q2)) == 1


def test_specialization_times_and_rearrangements():
    tau = np.arange(6.0)
    labels = np.array([[-1, -1], [0, -1], [-1, -1], [0, 1], [0, 1], [1, 1]])
    t = ph.specialization_times(tau, labels)
    assert t.tolist() == [3.0, 3.0]
    ev = ph.rearrangements(tau, labels)
    assert (2.0, 0, 0, -1) in ev and (5.0, 0, 0, 1) in ev
    # a head that loses its label at the end has no specialization time
    assert np.isnan(ph.specialization_times(tau, np.array([[0], [0], [-1], [-1], [-1], [-1]]))[0])


def test_analyze_synthetic_trajectory():
    tau = np.linspace(0, 40, 161)
    s = 1.0 / (1.0 + np.exp(-(tau - 20.0)))  # specialization switch
    m = 1.0 + 0.0 * tau
    M = np.stack([np.stack([m * (1 + s), m * (1 - s)], -1), np.stack([m * (1 - s), m * (1 + s)], -1)], 1)  # (T, 2, 2)
    Q = M @ np.swapaxes(M, -1, -2) + 0.005 * np.eye(2)
    risk = logistic(tau, 20.0, 1.0, 0.4, 0.1)
    risk = np.where(tau < 2, 0.8 - 0.2 * tau, risk)  # a fast first drop onto the plateau
    a = ph.analyze(tau, M, Q, risk, mean=[0.5, 0.5])
    assert a.labels.shape == (1, 161, 2)
    assert a.n_specialized[0, 0] == 0 and a.n_specialized[0, -1] == 2
    assert a.n_directions[0, -1] == 2
    assert a.redundant[0, 0] == 1 and a.redundant[0, -1] == 0
    assert a.escape_time[0] == pytest.approx(20.0, abs=0.1)
    assert 19 <= a.first_specialization[0] < 21
    assert a.profiles[0, 0] == 1 and a.profiles[0, -1] == 0
    assert a.summary()["n_specialized"] == 2.0
    assert np.all((a.specialization_times[0] >= 19) & (a.specialization_times[0] < 25))
    with pytest.raises(ValueError, match="analyze expects"):
        ph.analyze(tau, M[:, :, :1, None], Q, risk)


# -- linearisation -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_ode():
    cfg = load_config("bsoftmax", ["theory.points=64", "problem.L=3", "problem.strength=3.0", "sgd.lr=1.0"])
    return cfg, OrderParameterODE.from_config(cfg)


def test_jacobian_matches_finite_differences(tiny_ode):
    cfg, ode = tiny_ode
    rng = np.random.default_rng(0)
    M = np.array([[1.2, 0.9], [0.8, 1.1]]) + 0.05 * rng.standard_normal((2, 2))
    Q = M @ M.T + np.array([[0.4, -0.05], [-0.05, 0.35]])
    b = np.array([0.1, -0.1])
    J_ad, how = ph.drift_jacobian(ode, M, Q, b, method="autodiff")
    J_fd, _ = ph.drift_jacobian(ode, M, Q, b, method="finite-difference")
    assert how == "autodiff" and J_ad.shape == (2 * 2 + 3 + 2,) * 2
    np.testing.assert_allclose(J_ad, J_fd, rtol=1e-5, atol=1e-7)


def test_unstable_eigenvalue_at_the_unspecialized_point(tiny_ode):
    cfg, ode = tiny_ode
    mean = cfg.problem.build_prior().mean()
    fp = ph.unspecialized_point(ode, 2, 2, init_scale=cfg.sgd.init_scale, tau_flow=30.0, dt=0.2)
    assert fp.converged and fp.residual < 1e-10
    np.testing.assert_allclose(fp.M[0], fp.M[1])  # heads identical in M
    assert fp.M[0, 0] == pytest.approx(fp.M[0, 1])  # along the mean direction of the spikes
    lin_ad = ph.linearize(ode, fp.M, fp.Q, fp.b, method="autodiff")
    lin_fd = ph.linearize(ode, fp.M, fp.Q, fp.b, method="finite-difference")
    lam = ph.escape_rate(lin_ad, mean=mean)
    assert lam > 0.01  # the unspecialized point is a saddle
    assert lam == pytest.approx(ph.escape_rate(lin_fd, mean=mean), rel=1e-5)
    # the escape mode moves each head along (1, -1), orthogonally to the mean direction, and
    # the two heads in opposite directions (the spike-exchange symmetry is exact in the
    # quadrature; the head exchange only up to the quadrature error, so no equality there)
    k = ph.escape_mode(lin_ad, mean=mean)
    V = lin_ad.mode_M(k)
    np.testing.assert_allclose(V[:, 0], -V[:, 1], atol=1e-8)
    assert V[0, 0] * V[1, 0] < 0
    # growth of the drift along the mode: drift(x + h v) - drift(x - h v) = 2 h lambda v
    v = np.real(lin_ad.eigenvectors[:, k])
    x0 = np.asarray(ph.flatten_state(jnp.asarray(fp.M), jnp.asarray(fp.Q), jnp.asarray(fp.b)))
    h = 1e-5

    def drift_flat(x):
        Mx, Qx, bx = ph.unflatten_state(jnp.asarray(x), 2, 2)
        d = ode.drift(Mx, Qx, bx)
        return np.asarray(ph.flatten_state(d.M, d.Q, d.b))

    dv = (drift_flat(x0 + h * v) - drift_flat(x0 - h * v)) / (2 * h)
    np.testing.assert_allclose(dv, lam * v, atol=1e-6 * max(1.0, np.abs(dv).max()))
    # amplitude of a perturbation along the mode
    assert ph.mode_amplitude(lin_ad, k, fp.M + 1e-3 * V) == pytest.approx(1e-3 * np.linalg.norm(V), rel=1e-6)


def test_linear_escape_time_and_predicted_slope():
    t = np.linspace(0, 50, 501)
    lam = np.full_like(t, 0.25)
    A0 = np.array([1e-2, 1e-3])
    np.testing.assert_allclose(ph.linear_escape_time(t, lam, A0, threshold=0.1), np.log(0.1 / A0) / 0.25, rtol=1e-9)
    assert ph.predicted_escape_slope(0.25) == pytest.approx(2.0)
    # doubling D lowers A0 by sqrt(2): the escape is delayed by log(2) / (2 lambda)
    t1, t2 = ph.linear_escape_time(t, lam, np.array([1e-3, 1e-3 / np.sqrt(2)]))
    assert t2 - t1 == pytest.approx(np.log(2) * ph.predicted_escape_slope(0.25))


def test_symmetric_coordinates_roundtrip():
    x = np.array([0.7, 0.4, 0.3, -0.05, 0.2])
    M, Q, b = (np.asarray(a) for a in ph.symmetric_state(jnp.asarray(x), 3, 2))
    np.testing.assert_allclose(ph.symmetric_coordinates(M, Q, b), x, atol=1e-12)
