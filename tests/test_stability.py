"""Linear stability of the unspecialized point: the state <-> vector map, the Jacobian (autodiff
against finite differences, and the fallback at repeated eigenvalues), the restricted flow
against the full ODE, the saddle and its escape mode, the validity of the polished point, the
escape-time formulas, the escape time of the ODE from a controlled amplitude, and the predicted
escape and horizon of a configuration."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import tiny
from scipy.integrate import solve_ivp

from singleloc import OrderParameterODE, build, integrate, load_config
from singleloc.analysis import _drift_jacobian as dj
from singleloc.analysis import _fixed_point as fxp
from singleloc.analysis import _stability as st
from singleloc.analysis._predictions import EscapePrediction, escape_horizon, predicted_escape, prediction_setup
from singleloc.theory._theory import flatten_state, unflatten_state

#: The tiny problem with two spikes (the states below are of 2 heads x 2 spikes), stronger and faster.
SETS = ("problem.F=2", "problem.strength=3.0", "sgd.lr=1.0")


@pytest.fixture(scope="module")
def tiny_ode():
    cfg = tiny(*SETS, preset="bsoftmax")
    return cfg, OrderParameterODE.from_setup(build(cfg))


def test_flatten_state_roundtrip():
    rng = np.random.default_rng(3)
    M = jnp.asarray(rng.standard_normal((3, 2)))
    A = rng.standard_normal((3, 3))
    Q, b = jnp.asarray(A @ A.T), jnp.asarray(rng.standard_normal(3))
    v = flatten_state(M, Q, b)
    assert v.shape == (3 * 2 + 6 + 3,)
    for got, want in zip(unflatten_state(v, 3, 2), (M, Q, b)):
        np.testing.assert_array_equal(got, want)
    # frozen biases are not coordinates: they come from the argument
    v_nb = flatten_state(M, Q, b, train_bias=False)
    assert v_nb.shape == (12,)
    np.testing.assert_array_equal(unflatten_state(v_nb, 3, 2, b).b, b)


def _generic_state():
    rng = np.random.default_rng(0)
    M = np.array([[1.2, 0.9], [0.8, 1.1]]) + 0.05 * rng.standard_normal((2, 2))
    Q = M @ M.T + np.array([[0.4, -0.05], [-0.05, 0.35]])
    return M, Q, np.array([0.1, -0.1])


@pytest.mark.parametrize("route", ["rule", "exact"])
def test_jacobian_matches_finite_differences(route):
    """Autodiff against central differences where autodiff is the drift's derivative: the Sobol rule
    (bsoftmax), and a per-head layer on the exact route (softmax)."""
    preset = "bsoftmax" if route == "rule" else "default"
    ode = OrderParameterODE.from_setup(build(tiny(*SETS, f"theory.route={route}", preset=preset)))
    M, Q, b = _generic_state()
    J_ad, how = dj.drift_jacobian(ode, M, Q, b, method="autodiff")
    J_fd, _ = dj.drift_jacobian(ode, M, Q, b, method="finite-difference")
    n = 2 * 2 + 3 + (2 if ode.train_bias else 0)
    assert how == "autodiff" and J_ad.shape == (n, n)
    np.testing.assert_allclose(J_ad, J_fd, rtol=1e-5, atol=1e-7)
    assert dj.drift_jacobian(ode, M, Q, b)[1] == "autodiff"  # "auto" at distinct eigenvalues
    with pytest.raises(ValueError, match="method must be"):
        dj.drift_jacobian(ode, M, Q, b, method="spline")


def test_a_joint_layer_on_the_exact_route_takes_its_jacobian_by_differences(tiny_ode):
    """bsoftmax on the exact route is differentiated once, by Price's theorem with the token's
    conditional law held fixed: its drift is exact, autodiff of the drift is not (the ``Q`` columns
    were off by 0.08 of 0.3 at this state). "auto" takes central differences, checked along a random
    direction against a Richardson-extrapolated directional difference (error ~ h^4), and "autodiff"
    is refused with the remedy."""
    cfg, ode = tiny_ode
    assert ode.expectation.route == "exact" and not ode.expectation.second_derivatives
    M, Q, b = _generic_state()
    J, how = dj.drift_jacobian(ode, M, Q, b)
    assert how == "finite-difference"
    with pytest.raises(ValueError, match="method = 'autodiff'.*use method = 'auto'"):
        dj.drift_jacobian(ode, M, Q, b, method="autodiff")
    field = lambda v: dj._flat_drift_jit(ode, v, jnp.asarray(b), 2, 2)  # noqa: E731 (drift_jacobian's program)
    v0 = flatten_state(jnp.asarray(M), jnp.asarray(Q), jnp.asarray(b))
    u = np.random.default_rng(2).standard_normal(len(v0))
    u = jnp.asarray(u / np.linalg.norm(u))
    central = lambda h: (np.asarray(field(v0 + h * u)) - np.asarray(field(v0 - h * u))) / (2 * h)  # noqa: E731
    np.testing.assert_allclose(J @ np.asarray(u), (4 * central(5e-4) - central(1e-3)) / 3, atol=1e-8)


@pytest.mark.slow
def test_unstable_eigenvalue_at_the_unspecialized_point(tiny_ode):
    cfg, ode = tiny_ode
    mean = cfg.problem.build_prior().mean()
    fp = fxp.unspecialized_point(ode, 2, 2, init_scale=cfg.sgd.init_scale, tau_flow=30.0, dt=0.2)
    assert fp.converged and fp.residual < 1e-10
    np.testing.assert_allclose(fp.M[0], fp.M[1])  # heads identical in M
    assert fp.M[0, 0] == pytest.approx(fp.M[0, 1])  # along the mean direction of the spikes
    assert fp.risk == pytest.approx(float(ode.risk(jnp.asarray(fp.M), jnp.asarray(fp.Q), jnp.asarray(fp.b))), abs=1e-14)
    # a joint layer on the exact route: "auto" takes differences (its autodiff is not the derivative;
    # test_a_joint_layer_on_the_exact_route_takes_its_jacobian_by_differences), checked along the mode below
    lin = st.linearize(ode, fp.M, fp.Q, fp.b)
    assert lin.method == "finite-difference"
    lam = st.escape_rate(lin, mean=mean)
    assert lam > 0.01  # the unspecialized point is a saddle
    # the escape mode moves each head along (1, -1), orthogonally to the mean direction, and
    # the two heads in opposite directions (the spike-exchange symmetry is exact in the
    # quadrature; the head exchange only up to the quadrature error, so no equality there)
    k = st.escape_mode(lin, mean=mean)
    V = lin.mode_M(k)
    np.testing.assert_allclose(V[:, 0], -V[:, 1], atol=1e-8)
    assert V[0, 0] * V[1, 0] < 0
    # growth of the drift along the mode: drift(x + h v) - drift(x - h v) = 2 h lambda v
    v = np.real(lin.eigenvectors[:, k])
    x0 = np.asarray(flatten_state(jnp.asarray(fp.M), jnp.asarray(fp.Q), jnp.asarray(fp.b)))
    h = 1e-5

    def drift_flat(x):
        d = ode.drift(*unflatten_state(jnp.asarray(x), 2, 2))
        return np.asarray(flatten_state(d.M, d.Q, d.b))

    dv = (drift_flat(x0 + h * v) - drift_flat(x0 - h * v)) / (2 * h)
    np.testing.assert_allclose(dv, lam * v, atol=1e-6 * max(1.0, np.abs(dv).max()))


def test_symmetric_flow_against_an_independent_solver():
    """The restricted flow (diffrax Tsit5, fixed step 0.1) against scipy's DOP853 at tight
    tolerances on the same vector field, the Sobol rule's (the subject is the integrator, not the field:
    the exact route's took ten times as long to compile). Fifth order: the difference is 5e-12 at h = 0.1
    here (5e-10 at h = 0.2, 1e-7 at h = 0.5, the h^5 law; the state moves by 0.41); 1e-9 leaves room for
    rounding and fails for any method of order below four."""
    ode = OrderParameterODE.from_setup(build(tiny(*SETS, "theory.route=rule", preset="bsoftmax")))
    x0 = np.array([0.05, 0.02, 0.25, 0.01, 0.1])
    taus, xs, risk = st.symmetric_flow(ode, x0, 2, 2, 2.0, dt=0.1, n_save=3)
    np.testing.assert_allclose(taus, np.arange(3.0), atol=1e-12)
    np.testing.assert_array_equal(xs[0], x0)
    field = jax.jit(lambda x: st.symmetric_drift(ode, x, 2, 2))
    ref = solve_ivp(lambda t, x: np.asarray(field(jnp.asarray(x))), (0.0, 2.0), x0, method="DOP853", t_eval=taus,
                    rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(xs, ref.y.T, atol=1e-9)
    assert risk[-1] == pytest.approx(float(fxp._symmetric_risk_jit(ode, jnp.asarray(ref.y[:, -1]), 2, 2)), abs=1e-9)


def test_auto_jacobian_at_repeated_eigenvalues():
    """At a symmetric H = 3 state ``Q`` has a doubly repeated eigenvalue, split only by rounding:
    autodiff through ``eigh`` is finite there but wrong (about 15% off). "auto" must fall back to
    differences; checked along a random direction against a Richardson-extrapolated directional
    difference (error ~ h^4 = 1e-12, rounding ~ 1e-16 / h = 1e-13), an independent route."""
    H, F = 3, 2  # on the Sobol rule, whose Q^{1/2} goes through eigh (a joint exact layer always takes differences)
    ode = OrderParameterODE.from_setup(build(tiny(*SETS, f"model.heads={H}", "theory.route=rule", preset="bsoftmax")))
    M, Q, b = (np.asarray(a) for a in st.symmetric_state(jnp.asarray([0.6, 0.6, 0.3, 0.05, 0.0]), H, F))
    assert np.ptp(np.linalg.eigvalsh(Q)[:2]) < 1e-14
    J, how = dj.drift_jacobian(ode, M, Q, b)
    assert how == "finite-difference"
    field = lambda v: dj._flat_drift_jit(ode, v, jnp.asarray(b), H, F)  # noqa: E731 (drift_jacobian's program)
    v0 = flatten_state(jnp.asarray(M), jnp.asarray(Q), jnp.asarray(b))
    u = np.random.default_rng(1).standard_normal(len(v0))
    u = jnp.asarray(u / np.linalg.norm(u))

    def central(h):
        return (np.asarray(field(v0 + h * u)) - np.asarray(field(v0 - h * u))) / (2 * h)

    ref = (4 * central(5e-4) - central(1e-3)) / 3
    np.testing.assert_allclose(J @ np.asarray(u), ref, atol=1e-8)
    # away from repeated eigenvalues "auto" is autodiff
    _, how_generic = dj.drift_jacobian(ode, M + np.array([[0.1, 0.0], [0.0, 0.2], [0.0, 0.0]]), Q + np.diag([0.3, 0.1, 0.0]), b)
    assert how_generic == "autodiff"


@pytest.mark.parametrize("route", ["rule", "exact"])
def test_escape_rate_from_the_antisymmetric_subspace_matches_the_full_jacobian(route, monkeypatch):
    """Issue 61 item 3: the escape rate of the prediction, from the Jacobian restricted to the
    perturbations antisymmetric between heads 1 and 2 (k directions), against the full
    Jacobian's (n directions, every eigenvector's asymmetry) at symmetric states, with and
    without a mean filter; both by central differences (step 1e-6: error ~1e-9 here). The full
    Jacobian is averaged with its image under the swap of the two heads, ``(J + S J S) / 2``: the
    quadratures (the Sobol rule; the exact route's Gram term) are not symmetric in the heads and
    break the commutation by their own error (2e-5 here on the exact route), which the restriction
    ``U^T J U`` leaves out exactly (the part of ``J`` that anticommutes with ``S`` maps the
    subspace into its complement)."""
    H, F = 2, 2
    preset = "bsoftmax" if route == "rule" else "default"  # the programs of test_jacobian_matches_finite_differences
    ode = OrderParameterODE.from_setup(build(tiny(*SETS, f"theory.route={route}", preset=preset)))
    U = st.antisymmetric_basis(H, F, bool(ode.train_bias))
    assert U.shape[1] == F + 1 + bool(ode.train_bias)
    np.testing.assert_allclose(U.T @ U, np.eye(U.shape[1]), atol=1e-15)
    S = np.eye(len(U)) - 2 * U @ U.T  # the swap of the two heads: -1 on U, +1 on its complement
    for x in ([0.6, 0.4, 0.5, 0.1, 0.05], [0.0, 0.0, 0.3, 0.0, -0.1]):  # on a plateau; at a zero-mean start
        M, Q, b = (np.asarray(a) for a in st.symmetric_state(jnp.asarray(x), H, F))
        J = dj.drift_jacobian(ode, M, Q, b, method="finite-difference")[0]
        symmetrized = ((J + S @ J @ S) / 2, "finite-difference")
        with monkeypatch.context() as m:
            m.setattr(st, "drift_jacobian", lambda *a, J=symmetrized, **k: J)
            lin = st.linearize(ode, M, Q, b)
        A = None  # the restricted Jacobian the first rate computes, given to the others (it does not depend on the mean)
        for mean in (None, np.array([1.0, 0.5]), np.array([1.0, 0.0])):
            full = st.escape_rate(lin, mean=mean)
            assert np.isfinite(full)
            rate = st.symmetric_escape_rate(ode, x, H, F, mean=mean, method="finite-difference", jacobian=A)
            assert rate == pytest.approx(full, abs=1e-8)
            A = st.symmetric_jacobian(ode, x, H, F, method="finite-difference") if A is None else A


def test_linear_escape_time_and_predicted_slope():
    t = np.linspace(0, 50, 501)
    lam = np.full_like(t, 0.25)
    A0 = np.array([1e-2, 1e-3])
    np.testing.assert_allclose(st.linear_escape_time(t, lam, A0, threshold=0.1), np.log(0.1 / A0) / 0.25, rtol=1e-9)
    assert st.predicted_escape_slope(0.25) == pytest.approx(2.0)
    # doubling D lowers A0 by sqrt(2): the escape is delayed by log(2) / (2 lambda)
    t1, t2 = st.linear_escape_time(t, lam, np.array([1e-3, 1e-3 / np.sqrt(2)]))
    assert t2 - t1 == pytest.approx(np.log(2) * st.predicted_escape_slope(0.25))


# -- validity of the polished point ---------------------------------------------------------


def test_valid_symmetric_state():
    # R_orth = r_d I + r_o 1 1^T has eigenvalues r_d and r_d + H r_o
    assert fxp.valid_symmetric_state([1.4, 1.4, 0.1, 0.04, 0.0], 2, 2)
    assert not fxp.valid_symmetric_state([1.467, 1.467, -0.415, 0.308, 0.0], 2, 2)  # r_d < 0
    assert not fxp.valid_symmetric_state([1.0, 1.0, 0.2, -0.11, 0.0], 2, 2)  # r_d + 2 r_o < 0
    assert fxp.valid_symmetric_state([1.0, 1.0, 0.2, -0.1, 0.0], 2, 2)  # on the boundary
    assert not fxp.valid_symmetric_state([np.nan, 1.0, 0.2, 0.0, 0.0], 2, 2)
    assert fxp.valid_symmetric_state([1.0, 0.0, 0.0], 1, 2) and not fxp.valid_symmetric_state([1.0, -1e-3, 0.0], 1, 1)


@pytest.mark.slow
def test_polish_keeps_the_point_in_the_valid_set():
    """Softmax at the default problem creeps: a root finder started at the end of a flow of
    length 200 can land outside the valid set (r_d < 0, not a Gram matrix; seen with the rule
    before its head closure). Whatever the polish does, the returned point is a valid state:
    either a converged root inside the set, or the flow's end point, unconverged (about 10 s)."""
    ode = OrderParameterODE.from_setup(build(load_config("default", ["theory.points=256"])))
    fp = fxp.unspecialized_point(ode, 2, 2, init_scale=0.5, tau_flow=200.0, dt=0.5)
    assert fxp.valid_symmetric_state(fp.x, 2, 2)
    assert np.linalg.eigvalsh(fp.Q - fp.M @ fp.M.T).min() >= -1e-9
    if fp.converged:
        assert fp.residual < 1e-10
    else:
        np.testing.assert_array_equal(fp.x, fp.path_x[-1])


# -- escape time from a controlled amplitude, and the horizon rule --------------------------


FLIPPED = ["problem.prior=flipped", "theory.points=1024", "theory.rtol=1e-10", "theory.atol=1e-12"]


@pytest.fixture(scope="module")
def flipped():
    """bsoftmax, zero-mean prior (theta = +-2.5 e_f), H = F = 2: the unspecialized point is
    M = 0 and is a fixed point of the full flow (no creep in M)."""
    cfg = load_config("bsoftmax", FLIPPED)
    ode = OrderParameterODE.from_setup(build(cfg))
    fp = fxp.unspecialized_point(ode, 2, 2, init_scale=cfg.sgd.init_scale, tau_flow=10.0, dt=0.5)
    return cfg, ode, fp, st.linearize(ode, fp.M, fp.Q, fp.b)


@pytest.mark.slow
def test_escape_time_from_a_controlled_amplitude(flipped):
    """Start the full ODE at the fixed point plus A v (v the unit escape eigenvector) for A = 1e-4
    and 1e-5; the times at which |M| reaches 0.05 differ by log(10) / lambda.

    Tolerance: starting exactly on the eigenvector, the two runs differ only by the O(A^2)
    terms the larger one picked up before the smaller one reaches amplitude A, a time shift of
    order A / lambda = 4e-4; the solver (rtol 1e-10) and the log-linear interpolation of the
    crossing between saved times 0.05 apart add less than 1e-6. So 1e-3, which a rate off by
    0.02% already exceeds (the measured difference is 4e-6)."""
    cfg, ode, fp, lin = flipped
    assert fp.converged and np.abs(fp.M).max() < 1e-12
    k = st.escape_mode(lin)
    lam = lin.eigenvalues[k]
    assert lam.imag == 0 and lam.real > 0.1
    v = np.real(lin.eigenvectors[:, k])
    v /= np.linalg.norm(v)
    x0 = np.asarray(flatten_state(jnp.asarray(fp.M), jnp.asarray(fp.Q), jnp.asarray(fp.b), cfg.model.train_bias))
    A = np.array([1e-4, 1e-5])
    starts = [unflatten_state(jnp.asarray(x0 + a * v), 2, 2, jnp.asarray(fp.b)) for a in A]
    y0 = type(starts[0])(*(jnp.stack(parts) for parts in zip(*starts)))
    ts = np.arange(0.0, 36.0, 0.05)
    r = integrate(cfg, y0, ts=ts, progress=False)
    amp = np.log(np.linalg.norm(r.M, axis=(-1, -2)))  # (2, T)
    target = np.log(0.05)
    times = []
    for s in range(2):
        i = int(np.argmax(amp[s] >= target))
        assert i > 0
        times.append(ts[i - 1] + (target - amp[s, i - 1]) / (amp[s, i] - amp[s, i - 1]) * (ts[i] - ts[i - 1]))
    assert times[1] - times[0] == pytest.approx(np.log(10.0) / lam.real, abs=1e-3)


def test_linear_escape_time_with_a_rate_that_changes_sign():
    # lambda(t) = 0.1 (t - 5): the growth int_0^t = 0.05 (t - 5)^2 - 1.25 first reaches g at
    # t = 5 + sqrt((g + 1.25) / 0.05); the trapezoid rule is exact for a linear rate
    t = np.linspace(0.0, 20.0, 4001)
    g = np.array([0.5, 2.0])
    got = st.linear_escape_time(t, 0.1 * (t - 5.0), np.exp(-g), 1.0)
    np.testing.assert_allclose(got, 5.0 + np.sqrt((g + 1.25) / 0.05), atol=1e-5)
    # beyond the path: NaN, or the last rate held (inf when it is not positive)
    assert np.isnan(st.linear_escape_time(t[:100], np.full(100, 0.1), 1e-3, 1.0))
    far = st.linear_escape_time(t[:101], np.full(101, 0.1), 1e-3, 1.0, extrapolate=True)
    assert far == pytest.approx(np.log(1e3) / 0.1)
    assert st.linear_escape_time(t, -np.ones_like(t), 1e-3, 1.0, extrapolate=True) == np.inf


def test_tangent_escape_against_closed_forms():
    """The tangent-linear escape (issue 61 item 3) against the closed form of a constant Jacobian with a coupling
    (a perturbation of Q_11 - Q_22 feeding M: Phi_12 = c (e^(lam t) - e^(mu t)) / (lam - mu)), the mean projection
    (F = 1 along the mean: nothing to escape) and the growth beyond the path at the last Jacobian's top rate."""
    from scipy.optimize import brentq

    lam, mu, c, H, F = 0.05, -0.2, 0.3, 2, 1
    var = st.start_variances(H, F, 0.5, 1000, False)
    np.testing.assert_allclose(var, [0.25 / 1000, 2 * 0.0625 / 1000], rtol=1e-15)
    A = np.array([[lam, c], [0.0, mu]])
    t = np.arange(0.0, 200.0, 0.5)

    def amplitude(t):
        phi12 = c * (np.exp(lam * t) - np.exp(mu * t)) / (lam - mu)
        return np.sqrt((H - 1) * (np.exp(2 * lam * t) * var[0] + phi12**2 * var[1]))

    esc, amp = st.tangent_escape(t, [A] * len(t), var, H, F)
    np.testing.assert_allclose(amp, amplitude(t), rtol=1e-10)
    exact = brentq(lambda x: amplitude(x) - 1.0, 0.0, 200.0, xtol=1e-12)
    # log-linear within a step of 0.5 where log a has curvature below 1e-4: an error below 1e-5
    assert esc == pytest.approx(exact, abs=1e-5)
    far, _ = st.tangent_escape(t[:100], [A] * 100, var, H, F)  # beyond the path: the top rate lam
    assert far == pytest.approx(t[99] + np.log(1.0 / amplitude(t[99])) / lam, rel=1e-6)
    assert st.tangent_escape(t, [A] * len(t), var, H, F, mean=np.ones(1))[0] == np.inf  # only the mean direction
    assert st.tangent_escape(t[:10], [-np.eye(2)] * 10, var, H, F)[0] == np.inf  # no growth


def test_start_variances_are_those_of_the_simulators_starts():
    """The start's covariance along the antisymmetric directions (start_variances) against the coordinates of 4000
    of the simulator's initial overlaps (initial_conditions, D = 1000): within 5 standard errors (sqrt(2 / 4000) of
    a variance, and the spikes' O(D^-1/2) overlaps)."""
    from singleloc import initial_conditions

    H, F, s = 4, 3, 0.5
    cfg = tiny(f"model.heads={H}", f"problem.F={F}", f"sgd.init_scale={s}", "simulation.D=1000", "model.train_bias=false")
    y = initial_conditions(cfg, 4000)
    U = st.antisymmetric_basis(H, F, False)
    iu = np.triu_indices(H)  # flatten_state's coordinates, in NumPy
    coords = np.concatenate([np.asarray(y.M).reshape(4000, -1), np.asarray(y.Q)[:, iu[0], iu[1]]], axis=1) @ U
    want = st.start_variances(H, F, s, 1000, False)
    np.testing.assert_allclose(coords.var(0), want, rtol=5 * np.sqrt(2 / 4000) + 3 / np.sqrt(1000))


def test_escape_horizon_rule():
    assert escape_horizon(100.0) == 500.0
    assert escape_horizon(123.4) == 620.0  # 5 * 123.4 = 617, rounded up to two digits
    assert escape_horizon(0.42) == 2.1
    assert escape_horizon(700.0) == 3000.0  # the cap
    assert escape_horizon(np.inf) == escape_horizon(np.nan) == 300.0  # the fallback
    assert escape_horizon(np.inf, fallback=5000.0) == 3000.0
    assert escape_horizon(100.0, multiple=4.0, cap=350.0) == 350.0
    grid = np.geomspace(0.1, 5000.0, 400)
    h = np.array([escape_horizon(x) for x in grid])
    assert np.all(np.diff(h) >= 0)
    assert np.all(h >= np.minimum(5.0 * grid, 3000.0)) and np.all(h <= np.minimum(5.5 * grid, 3000.0))
    with pytest.raises(ValueError, match="must be > 0"):
        escape_horizon(10.0, multiple=0.0)


@pytest.mark.slow
def test_predicted_escape_of_a_configuration(flipped):
    """The rule on a real configuration: the rates are those of the linearisation along the
    symmetric flow (checked at the same times on the constant-step flow, an independent
    integration), the last approaches the fixed point's rate, and the prediction is
    tau_0 + log(D) / (2 lambda) with the effective rate where it comes after tau_0;
    H = 1 has no escape and the fallback horizon."""
    cfg, _, fp, lin = flipped
    lam_star = st.escape_rate(lin)  # the exact route's
    p = predicted_escape(cfg)
    ode = OrderParameterODE.from_setup(prediction_setup(build(cfg)))  # the prediction's rule, whatever the run's route
    assert p.escapes and p.D == cfg.simulation.D and len(p.path_tau) >= 2
    if p.predicted_escape > p.tau_plateau:  # the effective rate along the plateau
        assert p.predicted_escape == pytest.approx(p.tau_plateau + np.log(p.D) / (2 * p.rate), rel=1e-12)
    else:  # an escape on the way down (the zero-mean start is the unstable point from tau = 0): the last rate
        assert p.rate == p.path_rate[-1]
    assert p.horizon == escape_horizon(p.predicted_escape)
    x0 = np.array([0.0, 0.0, cfg.sgd.init_scale**2, 0.0, 0.0])
    # every step saved (h = 0.05): the nearest saved state is at most 0.025 away, where the rate
    # moves by less than 1e-5 relative (it drifts by 1% over tau = 30)
    n = int(np.ceil(p.path_tau[-1] / 0.05))
    taus, xs, _ = st.symmetric_flow(ode, x0, 2, 2, n * 0.05, dt=0.05, n_save=n + 1)
    nearest = [int(np.argmin(np.abs(taus - t))) for t in p.path_tau]
    assert np.max(np.abs(taus[nearest] - p.path_tau)) <= 0.025 + 1e-9
    np.testing.assert_allclose(p.path_rate, st.escape_rate_along(ode, p.path_tau, xs[nearest], 2, 2), rtol=1e-4)
    assert abs(p.path_rate[-1] / lam_star - 1) < 0.05  # the last rate (the path starts at tau = 0)
    one = predicted_escape(cfg.replace(model={"heads": 1}))
    assert not one.escapes and np.isnan(one.rate) and one.horizon == 300.0 and len(one.path_rate) == 0
    assert EscapePrediction.from_arrays(p.arrays()).predicted_escape == p.predicted_escape


def test_a_series_of_linearizations_says_k_of_n(tiny_ode, monkeypatch):
    """Issue 61 item 4: the repeated "linearized the drift" lines of an escape prediction say where
    they stand ("k of at most n" along the flow; "k of n" along given states)."""
    from singleloc.analysis import _predictions

    cfg, ode = tiny_ode
    said = []

    class Recorder:
        def __init__(self, stages, *args, **kwargs):
            said.append(stages)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(st, "Phase", Recorder)
    stable = lambda ode, M, Q, b, method, basis: (-basis, "autodiff")  # noqa: E731
    monkeypatch.setattr(st, "drift_jacobian", stable)
    x = st.symmetric_start(2, 2, cfg.sgd.init_scale, cfg.model.bias_init)
    st.escape_rate_along(ode, [0.0, 1.0, 2.0], [x, x, x], 2, 2)
    assert [s[1] for s in said] == [f"linearized the drift, {k} of 3" for k in (1, 2, 3)]
    counts = []
    monkeypatch.setattr(_predictions, "symmetric_path", lambda ode, x0, H, F, ts, **tol:
                        (np.tile(x0, (len(ts), 1)), np.exp(-ts) + 0.1, None))
    monkeypatch.setattr(_predictions, "symmetric_jacobian", lambda ode, x, H, F, *, count, **k:
                        counts.append(count) or 0.001 * np.eye(F + H - 1 + int(ode.train_bias)))
    said.clear()
    monkeypatch.setattr(_predictions, "Phase", Recorder)
    predicted_escape(cfg, tau_flow=10.0)
    assert said[0][0].startswith("following the head-symmetric flow of 2 heads to tau = 10 (")  # the flow is said too
    n = len(counts)
    assert n > 1 and counts == [f"{k} of at most {n} along the flow" for k in range(1, n + 1)]  # a rate too small to escape


def test_the_prediction_takes_the_sobol_rule_whatever_the_runs_route(monkeypatch):
    """Issue 61 item 3: the escape prediction's rule is the Sobol rule of at most 2^18 / (L H) points, never fewer than
    256, and the run's own below (every problem of the README, L H <= 16, keeps its rule: bit for bit), on the rule
    route and the exact route alike (the exact flow cost as much as the run's solve)."""
    from singleloc.analysis import _predictions

    th = tiny(rule=True).theory
    assert th.prediction_points(4, 4, 4096) == 4096 and th.prediction_points(4, 2, 65536) == 32768
    assert th.prediction_points(64, 8, 4096) == 512 and th.prediction_points(64, 8, 256) == 256
    assert th.prediction_points(64, 3, 4096) == 1024 and th.prediction_points(1024, 16, 4096) == 256
    assert th.prediction_points(4, 2, None) == 4096 and th.prediction_points(64, 8, None) == 512  # another route: 4096
    seen = []

    def stop(setup, **kwargs):
        seen.append((setup.route.route, setup.theory.route, setup.theory.points))
        raise RuntimeError("stop: the rule is chosen")

    monkeypatch.setattr(_predictions.OrderParameterODE, "from_setup", stop)
    for rule in (True, False):
        with pytest.raises(RuntimeError, match="stop"):
            predicted_escape(tiny("problem.L=64", "model.heads=8", "theory.points=4096", rule=rule))
    assert seen == [("rule", "rule", 512)] * 2


def test_a_flow_too_stiff_to_follow_stops_as_a_solve_does_and_says_so():
    """The escape prediction's head-symmetric flow stops where the solve would (at ``sgd.lr = 1e4`` it ran 100000
    steps of 1e-7, hours, on the exact route of the default problem): a flow too stiff to follow warns with the
    reason and predicts nothing (NaN, the fallback horizon) rather than an escape read off a flow stopped at its
    start. At 4096 points: the flow's program of the test below (the learning rate and the horizon are values)."""
    with pytest.warns(UserWarning, match=r"head-symmetric flow stopped near its start, tau = 0: its steps fell below "
                                         r"1e-07.*no escape predicted \(the horizon is 300\)"):
        stiff = predicted_escape(tiny("sgd.lr=1e4", "theory.points=4096", rule=True), tau_flow=100.0)
    assert np.isnan(stiff.predicted_escape) and np.isnan(stiff.rate) and stiff.horizon == 300.0


def test_an_exact_run_whose_fields_outgrow_its_rule_is_predicted_on_the_sobol_rule():
    """The exact route's flow at ``lr = 64`` on the tiny problem stopped at tau 0.27, where its fields outgrew the rule
    (and went on on the Sobol rule when the route was "auto"'s choice): the prediction is now on the Sobol rule for
    every route, so the exact route's runs, chosen or asked for, are predicted as the rule route's at its default
    count (4096; the exact route's ``theory.points`` are its own), without a stop."""
    rule = predicted_escape(tiny("sgd.lr=64", "theory.points=4096", rule=True), tau_flow=1.0, n_rates=2).arrays()
    for route in ("theory.route=auto", "theory.route=exact"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no stop, no switch
            np.testing.assert_equal(predicted_escape(tiny("sgd.lr=64", route), tau_flow=1.0, n_rates=2).arrays(), rule)


@pytest.mark.slow
def test_the_tangent_linear_amplitude_follows_the_ode_from_random_starts():
    """The tangent-linear model of the escape (issue 61 item 3) against its independent route, the ODE integrated
    from 32 of the simulator's D = 1000 starts (bsoftmax, H = 3, F = 2, the rule route): while the model's amplitude
    is small (below 0.25, where the nonlinear terms are of its square), the root mean square over the starts of
    |(M - mean_h M) P| follows it within 4 standard errors of a root mean square of 32 starts of 2 degrees of freedom
    each (0.5 sqrt(2 / 64) = 0.088: 35%). Measured: 0.88-0.92 of the model (the 32 starts' own size), growing
    from 0.022 to 0.23 by tau = 16; beyond, the runs' growth slows (0.39 of the model at tau = 40)."""
    from singleloc import initial_conditions

    H, F, T = 3, 2, 40.0
    cfg = tiny("model.activation=bsoftmax", f"model.heads={H}", f"problem.F={F}", "simulation.D=1000", "simulation.seeds=32",
               f"sgd.tau_max={T}", "sgd.n_save=41", rule=True)
    setup = build(cfg)
    ode, mean = OrderParameterODE.from_setup(setup), setup.prior.mean()
    ts = np.linspace(0.0, T, 41)
    xs, _, _ = st.symmetric_path(ode, st.symmetric_start(H, F, cfg.sgd.init_scale, cfg.model.bias_init), H, F, ts)
    variances = st.start_variances(H, F, cfg.sgd.init_scale, cfg.simulation.D, bool(ode.train_bias))
    _, amp = st.tangent_escape(ts[::4], [st.symmetric_jacobian(ode, x, H, F) for x in xs[::4]], variances, H, F, mean=mean)
    M = np.asarray(integrate(cfg, initial_conditions(cfg)).M)
    mu = mean / np.linalg.norm(mean)
    P = np.eye(F) - np.outer(mu, mu)
    rms = np.sqrt(np.mean(np.linalg.norm((M - M.mean(-2, keepdims=True)) @ P, axis=(-2, -1)) ** 2, axis=0))[::4]
    small = amp < 0.25
    assert small.sum() >= 4 and amp[small].max() > 5 * amp[0]  # it grows tenfold within the comparison
    np.testing.assert_allclose(rms[small], amp[small], rtol=4 * 0.5 * np.sqrt(2 / 64))
