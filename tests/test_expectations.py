"""The expectation routes against each other: plain Monte Carlo (:class:`~singleloc.MonteCarloExpectation`,
which shares no code with the others: fields drawn as the data is generated, products averaged) is the
independent reference of the Sobol rule and of the exact route, at a fresh and at a trained state;
the route decision (:func:`~singleloc.choose_route`) and the route registry.

Tolerances: the Monte Carlo error is measured, not assumed: ``R`` independent sets of draws give a
standard error per entry, and every entry of the other routes must lie within ``Z`` standard errors of
their mean (``Z = 5``: a false alarm over the few dozen entries compared has probability below 1e-4),
plus the other route's own stated error (the Sobol rule's scatter over scramblings).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import route_of

import singleloc as sl
from singleloc.expectations._routes import ROUTE_CLASSES, ROUTES, decide, route_class
from singleloc.preflight._build import build

Z = 5.0
DRAWS, SETS = 8192, 8


def _monte_carlo(fn, state, activation, prior, L, H):
    """``fn(expectation, state)`` (jitted) over ``SETS`` independent Monte Carlo routes (one compiled program for
    every state of its shapes: the draws and the state are its arguments): the mean and standard error of every leaf."""
    values = [jax.tree.map(np.asarray, fn(sl.MonteCarloExpectation.make(activation, prior, L, H, DRAWS, seed), state))
              for seed in range(SETS)]
    stacked = jax.tree.map(lambda *x: np.stack(x), *values)
    return jax.tree.map(lambda x: x.mean(0), stacked), jax.tree.map(lambda x: x.std(0, ddof=1) / np.sqrt(SETS), stacked)


STATES = {
    "fresh": (np.array([[0.3, -0.1], [0.05, 0.2]]), np.array([[0.4, 0.05], [0.05, 0.35]]), np.zeros(2)),
    # a trained layer: long keys near the spikes, small orthogonal parts, a bias
    "trained": (np.array([[1.9, 0.2], [0.1, 1.7]]), None, np.array([0.2, -0.1])),
}


def _state(name):
    M, Q, b = STATES[name]
    if Q is None:
        Q = M @ M.T + np.array([[0.3, 0.1], [0.1, 0.25]])
    return jnp.asarray(M), jnp.asarray(Q), jnp.asarray(b)


@eqx.filter_jit
def _moments(expectation, state):
    m = expectation.gradient_moments(*state)
    return {"risk": expectation.risk(*state), "cnu": m.cnu, "cg": m.cg, "c": m.c, "cc": m.cc,
            "mass": expectation.attention_mass(*state)}


@pytest.mark.parametrize("activation, heads, gram", [
    ("softmax", 2, "sobol"), ("softmax1", 1, "exact"),
    # softmax1's pair of heads against Monte Carlo in the default suite: tests/test_laplace.py's trained states
    pytest.param("softmax1", 2, "sobol", marks=pytest.mark.slow),
    pytest.param("softmax", 2, "exact", marks=pytest.mark.slow),  # the two-head exact Gram term compiles for a minute
])
@pytest.mark.parametrize("state", list(STATES))
def test_the_exact_route_agrees_with_plain_monte_carlo(activation, heads, gram, state):
    """The Laplace route's risk, gradient moments (from the exact risk's gradient) and attention mass, and
    its exact Gram term where it is taken, within ``Z`` Monte Carlo standard errors (its own error, 1e-10
    in the risk and 1e-7 in the gradient, is below the slack)."""
    L, prior = 4, sl.spikes(2, 2.5)
    cfg = sl.load_config("default", [f"model.activation={activation}", f"model.heads={heads}", "theory.route=exact",
                                     f"theory.gram={gram}", "model.train_bias=true"])
    exact = sl.OrderParameterODE.from_setup(sl.build(cfg), points=64).expectation
    assert isinstance(exact, sl.LaplaceExpectation) and exact.gram_name == gram
    M, Q, b = _state(state)
    s = (M[:heads], Q[:heads, :heads], b[:heads])
    got = jax.tree.map(np.asarray, _moments(exact, s))
    mean, se = _monte_carlo(_moments, s, sl.get_activation(activation), prior, L, heads)
    for key in got:
        if key == "cc" and gram != "exact":
            continue  # the Sobol Gram term: tests/test_laplace.py
        assert np.all(np.abs(got[key] - mean[key]) <= Z * se[key] + 1e-7), (key, got[key], mean[key], se[key])


@pytest.mark.parametrize("state", list(STATES))
def test_the_sobol_route_agrees_with_plain_monte_carlo(state):
    """The Sobol route's averages (conditional expectation of the spike fields, whitened nodes, head
    shifts, mirrors) within ``Z`` combined standard errors of the Monte Carlo mean; the Sobol rule's
    error is its scatter over four scramblings."""
    L, H, prior = 4, 2, sl.spikes(2, 2.5)
    act = sl.get_activation("bsoftmax")  # a joint layer: any activation is one for this route
    s = _state(state)
    rule = [jax.tree.map(np.asarray, _moments(sl.SobolExpectation(fields=sl.LocalFields.make(L, H, prior, 1024, k),
                                                                 activation=act), s)) for k in range(4)]
    got = jax.tree.map(lambda *x: np.mean(x, 0), *rule)
    rule_se = jax.tree.map(lambda *x: np.std(x, 0, ddof=1) / 2, *rule)
    mean, se = _monte_carlo(_moments, s, act, prior, L, H)
    for key in got:
        tol = Z * np.sqrt(se[key] ** 2 + rule_se[key] ** 2) + 1e-9
        assert np.all(np.abs(got[key] - mean[key]) <= tol), (key, got[key], mean[key], se[key], rule_se[key])


def test_a_wrong_reference_is_caught():
    """The comparison can fail: a Gram term 5% off leaves the Monte Carlo band at the trained state."""
    L, H, prior = 4, 1, sl.spikes(2, 2.5)
    cfg = sl.load_config("default", ["theory.route=exact", "theory.gram=exact", "model.heads=1"])
    exact = sl.OrderParameterODE.from_setup(sl.build(cfg), points=64).expectation
    M, Q, b = _state("trained")
    s = (M[:1], Q[:1, :1], b[:1])
    gram = eqx.filter_jit(lambda e, s: e.gram(*s))
    mean, se = _monte_carlo(gram, s, sl.get_activation("softmax"), prior, L, H)
    wrong = 1.05 * np.asarray(gram(exact, s))
    assert np.any(np.abs(wrong - mean) > Z * se)


def test_the_monte_carlo_route_is_a_registered_route_end_to_end():
    """``theory.route = "montecarlo"``: one module and one line in the registry take it through the
    ODE, the solve and its statement; its drift at the start agrees with the exact route's within its
    sampling error (2^15 draws)."""
    assert "montecarlo" in ROUTE_CLASSES and "montecarlo" in ROUTES
    assert route_class("montecarlo") is sl.MonteCarloExpectation
    cfg = sl.load_config("default", ["theory.route=montecarlo", "theory.points=8192", "sgd.tau_max=1", "sgd.n_save=3"])
    ode = sl.OrderParameterODE.from_setup(sl.build(cfg))
    assert ode.expectation.route == "montecarlo" and route_of(cfg).route == "montecarlo"
    exact = sl.OrderParameterODE.from_setup(sl.build(cfg.replace(theory={"route": "exact", "gram": "sobol"})))
    y = sl.initial_conditions(cfg, 1)
    s = (y.M[0], y.Q[0], y.b[0])
    d, d_exact = (eqx.filter_jit(lambda o, s: o.state_drift(sl.OrderParameters(*s)))(o, s) for o in (ode, exact))
    flat = lambda d: np.concatenate([np.ravel(x) for x in d])  # noqa: E731
    scale = np.max(np.abs(flat(d_exact)))
    assert np.max(np.abs(flat(d) - flat(d_exact))) < 0.05 * scale  # 2^14 draws: a few percent
    result = sl.integrate(cfg.replace(theory={"points": 1024}))
    assert result.route == result.gram_route == "montecarlo" and np.all(np.isfinite(result.risk))
    # issue 62: the route states its own standard error (2048 draws evaluate the start's risk), and names itself
    start_risk = float(eqx.filter_jit(exact.risk)(*s))
    assert 1e-4 < result.risk_error < 0.02 and abs(result.risk[0, 0] - start_risk) < 5 * result.risk_error
    line = result.quadrature()
    assert "Monte Carlo route (plain draws): 2048 draws" in line and "Sobol" not in line and "rule" not in line, line
    with pytest.raises(ValueError, match="no Sobol rule for the SDE"):
        ode.expectation.sde_rule  # noqa: B018


def test_the_route_is_decided_once_with_its_budgets():
    spikes = sl.spikes(2, 2.5)
    assert decide("softmax", 4, 2, spikes, "auto").route == "exact"
    assert decide("softmax", 4, 2, spikes, "auto").gram == "sobol"  # L H = 8 < GRAM_EXACT_FROM
    assert decide("softmax", 32, 2, spikes, "auto").gram == "exact"
    assert decide("softmax", 4, 1, spikes, "auto").gram == "exact"
    assert decide("bsoftmax", 4, 8, spikes, "auto").route == "rule"  # beyond JOINT_EXACT_MAX
    assert decide("bsoftmax", 4, 8, spikes, "exact").route == "exact"
    assert decide("bsoftmax", 4, 2, spikes, "auto", weighting=sl.TrainedHeads()).route == "rule"
    assert decide("softmax", 4, 2, spikes, "montecarlo").route == "montecarlo"
    sl.register_activation("test_expectations_tanh", lambda s: jnp.tanh(s), overwrite=True)
    assert decide("test_expectations_tanh", 4, 2, spikes, "auto").route == "rule"  # no normalised-exponential form
    with pytest.raises(ValueError, match="not a normalised exponential"):
        decide("test_expectations_tanh", 4, 2, spikes, "exact")
    with pytest.raises(ValueError, match=r"theory\.gram = 'exact' applies to the exact route's Gram term"):
        build(sl.load_config("default", ["theory.route=rule", "theory.gram=exact"]))
    with pytest.raises(ValueError, match=r"theory\.gram = 'exact': the exact Gram term takes one head"):
        decide("softmax", 4, 3, spikes, "exact", gram="exact")
    with pytest.raises(ValueError, match="theory.route must be one of"):
        decide("softmax", 4, 2, spikes, "quadrature")
    choice = sl.choose_route(sl.Problem(), sl.Model(), sl.Theory(route="auto"))
    assert isinstance(choice, sl.RouteChoice) and choice.route == "exact" and choice.form is not None


@pytest.mark.parametrize("dim, n, seed", [(1, 1, 4), (3, 32, 1), (17, 16384, 5), (300, 500, 4294967295)])
def test_sobol_points_are_scipys_to_the_bit(dim, n, seed):
    """The package's scrambled Sobol normals (made without importing ``scipy.stats``) against SciPy's generator, an
    independent implementation of the same sequence (direction numbers, LMS + shift, Gray-code order)."""
    from scipy.special import ndtri
    from scipy.stats import qmc

    from singleloc.expectations._fields import sobol_normals

    u = qmc.Sobol(dim, scramble=True, seed=seed).random_base2(int(np.ceil(np.log2(n))))[:n]
    np.testing.assert_array_equal(sobol_normals(dim, n, seed), ndtri(np.clip(u, 1e-12, 1 - 1e-12)))
