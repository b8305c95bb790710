"""Linear stability of the unspecialized point: the state <-> vector map, the Jacobian (autodiff
against finite differences, and the fallback at repeated eigenvalues), the restricted flow
against the full ODE, the saddle and its escape mode, and the escape-time formulas."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

from singleloc import OrderParameterODE, load_config
from singleloc import _stability as st
from singleloc._theory import flatten_state, unflatten_state

TINY_OVERRIDES = ["theory.points=64", "problem.L=3", "problem.strength=3.0", "sgd.lr=1.0"]


@pytest.fixture(scope="module")
def tiny_ode():
    cfg = load_config("bsoftmax", TINY_OVERRIDES)
    return cfg, OrderParameterODE.from_config(cfg)


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


def test_jacobian_matches_finite_differences(tiny_ode):
    cfg, ode = tiny_ode
    rng = np.random.default_rng(0)
    M = np.array([[1.2, 0.9], [0.8, 1.1]]) + 0.05 * rng.standard_normal((2, 2))
    Q = M @ M.T + np.array([[0.4, -0.05], [-0.05, 0.35]])
    b = np.array([0.1, -0.1])
    J_ad, how = st.drift_jacobian(ode, M, Q, b, method="autodiff")
    J_fd, _ = st.drift_jacobian(ode, M, Q, b, method="finite-difference")
    assert how == "autodiff" and J_ad.shape == (2 * 2 + 3 + 2,) * 2
    np.testing.assert_allclose(J_ad, J_fd, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="method must be"):
        st.drift_jacobian(ode, M, Q, b, method="spline")


def test_unstable_eigenvalue_at_the_unspecialized_point(tiny_ode):
    cfg, ode = tiny_ode
    mean = cfg.problem.build_prior().mean()
    fp = st.unspecialized_point(ode, 2, 2, init_scale=cfg.sgd.init_scale, tau_flow=30.0, dt=0.2)
    assert fp.converged and fp.residual < 1e-10
    np.testing.assert_allclose(fp.M[0], fp.M[1])  # heads identical in M
    assert fp.M[0, 0] == pytest.approx(fp.M[0, 1])  # along the mean direction of the spikes
    assert fp.risk == pytest.approx(float(ode.risk(jnp.asarray(fp.M), jnp.asarray(fp.Q), jnp.asarray(fp.b))), abs=1e-14)
    lin_ad = st.linearize(ode, fp.M, fp.Q, fp.b, method="autodiff")
    lin_fd = st.linearize(ode, fp.M, fp.Q, fp.b, method="finite-difference")
    lam = st.escape_rate(lin_ad, mean=mean)
    assert lam > 0.01  # the unspecialized point is a saddle
    assert lam == pytest.approx(st.escape_rate(lin_fd, mean=mean), rel=1e-5)
    # the escape mode moves each head along (1, -1), orthogonally to the mean direction, and
    # the two heads in opposite directions (the spike-exchange symmetry is exact in the
    # quadrature; the head exchange only up to the quadrature error, so no equality there)
    k = st.escape_mode(lin_ad, mean=mean)
    V = lin_ad.mode_M(k)
    np.testing.assert_allclose(V[:, 0], -V[:, 1], atol=1e-8)
    assert V[0, 0] * V[1, 0] < 0
    # growth of the drift along the mode: drift(x + h v) - drift(x - h v) = 2 h lambda v
    v = np.real(lin_ad.eigenvectors[:, k])
    x0 = np.asarray(flatten_state(jnp.asarray(fp.M), jnp.asarray(fp.Q), jnp.asarray(fp.b)))
    h = 1e-5

    def drift_flat(x):
        d = ode.drift(*unflatten_state(jnp.asarray(x), 2, 2))
        return np.asarray(flatten_state(d.M, d.Q, d.b))

    dv = (drift_flat(x0 + h * v) - drift_flat(x0 - h * v)) / (2 * h)
    np.testing.assert_allclose(dv, lam * v, atol=1e-6 * max(1.0, np.abs(dv).max()))
    # amplitude of a perturbation along the mode
    assert st.mode_amplitude(lin_ad, k, fp.M + 1e-3 * V) == pytest.approx(1e-3 * np.linalg.norm(V), rel=1e-6)


def test_symmetric_flow_against_an_independent_solver(tiny_ode):
    """The restricted flow (diffrax Tsit5, fixed step 0.1) against scipy's DOP853 at tight
    tolerances on the same vector field. Fifth order: the difference is 5e-12 at h = 0.1 here
    (5e-10 at h = 0.2, 1e-7 at h = 0.5, the h^5 law); 1e-9 leaves room for rounding and fails
    for any method of order below four."""
    cfg, ode = tiny_ode
    x0 = np.array([0.05, 0.02, 0.25, 0.01, 0.1])
    taus, xs, risk = st.symmetric_flow(ode, x0, 2, 2, 6.0, dt=0.1, n_save=7)
    np.testing.assert_allclose(taus, np.arange(7.0), atol=1e-12)
    np.testing.assert_array_equal(xs[0], x0)
    field = jax.jit(lambda x: st.symmetric_drift(ode, x, 2, 2))
    ref = solve_ivp(lambda t, x: np.asarray(field(jnp.asarray(x))), (0.0, 6.0), x0, method="DOP853", t_eval=taus,
                    rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(xs, ref.y.T, atol=1e-9)
    M, Q, b = st.symmetric_state(jnp.asarray(ref.y[:, -1]), 2, 2)
    assert risk[-1] == pytest.approx(float(ode.risk(M, Q, b)), abs=1e-9)


def test_auto_jacobian_at_repeated_eigenvalues():
    """At a symmetric H = 3 state ``Q`` has a doubly repeated eigenvalue, split only by rounding:
    autodiff through ``eigh`` is finite there but wrong (about 15% off). "auto" must fall back to
    differences; checked along a random direction against a Richardson-extrapolated directional
    difference (error ~ h^4 = 1e-12, rounding ~ 1e-16 / h = 1e-13), an independent route."""
    H, F = 3, 2
    ode = OrderParameterODE.from_config(load_config("bsoftmax", TINY_OVERRIDES + [f"model.heads={H}"]))
    M, Q, b = (np.asarray(a) for a in st.symmetric_state(jnp.asarray([0.6, 0.6, 0.3, 0.05, 0.0]), H, F))
    assert np.ptp(np.linalg.eigvalsh(Q)[:2]) < 1e-14
    J, how = st.drift_jacobian(ode, M, Q, b)
    assert how == "finite-difference"
    field = jax.jit(lambda v: (lambda d: flatten_state(d.M, d.Q, d.b))(ode.drift(*unflatten_state(v, H, F))))
    v0 = flatten_state(jnp.asarray(M), jnp.asarray(Q), jnp.asarray(b))
    u = np.random.default_rng(1).standard_normal(len(v0))
    u = jnp.asarray(u / np.linalg.norm(u))

    def central(h):
        return (np.asarray(field(v0 + h * u)) - np.asarray(field(v0 - h * u))) / (2 * h)

    ref = (4 * central(5e-4) - central(1e-3)) / 3
    np.testing.assert_allclose(J @ np.asarray(u), ref, atol=1e-8)
    # away from repeated eigenvalues "auto" is autodiff
    _, how_generic = st.drift_jacobian(ode, M + np.array([[0.1, 0.0], [0.0, 0.2], [0.0, 0.0]]), Q + np.diag([0.3, 0.1, 0.0]), b)
    assert how_generic == "autodiff"


def test_linear_escape_time_and_predicted_slope():
    t = np.linspace(0, 50, 501)
    lam = np.full_like(t, 0.25)
    A0 = np.array([1e-2, 1e-3])
    np.testing.assert_allclose(st.linear_escape_time(t, lam, A0, threshold=0.1), np.log(0.1 / A0) / 0.25, rtol=1e-9)
    assert st.predicted_escape_slope(0.25) == pytest.approx(2.0)
    # doubling D lowers A0 by sqrt(2): the escape is delayed by log(2) / (2 lambda)
    t1, t2 = st.linear_escape_time(t, lam, np.array([1e-3, 1e-3 / np.sqrt(2)]))
    assert t2 - t1 == pytest.approx(np.log(2) * st.predicted_escape_slope(0.25))


def test_symmetric_coordinates_roundtrip():
    x = np.array([0.7, 0.4, 0.3, -0.05, 0.2])
    M, Q, b = (np.asarray(a) for a in st.symmetric_state(jnp.asarray(x), 3, 2))
    np.testing.assert_allclose(st.symmetric_coordinates(M, Q, b), x, atol=1e-12)
