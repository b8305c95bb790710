"""The SGD rule (singleloc/sgd/_sgd_rule.py): its finite-D step, its per-step update in order
parameters and its drift are one rule (issue 23 item 2)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import singleloc as sl
from singleloc.model._data import make_spikes, sample_sequence
from singleloc.model._layer import finite_loss, scores, token_weights
from singleloc.theory._fluctuations import update_moments
from singleloc.theory._theory import flatten_state


@pytest.mark.parametrize("train_bias", [True, False])
def test_the_step_in_order_parameters_is_the_update(train_bias):
    """D times the change of ``(M, Q, b)`` by one finite-D :meth:`OnlineSGD.step` on one sequence
    equals :meth:`OnlineSGD.update` of that sequence's score gradient and fields (docs/model.md
    section 5.2), exactly, once the update's Gram term ``lr^2 d d^T`` is given the sequence's own
    token Gram matrix ``X X^T / D`` in place of its limit ``I``."""
    D, H, F, L, lr = 512, 2, 2, 4, 0.7
    rule = sl.OnlineSGD(lr, train_bias)
    act = sl.get_activation("bsoftmax")
    kstar = make_spikes(jax.random.PRNGKey(0), F, D).astype(jnp.float64)
    K = jnp.array([[0.8, 0.3], [-0.2, 0.6]]) @ kstar + 0.5 * jax.random.normal(jax.random.PRNGKey(1), (H, D))
    b = jnp.array([0.1, -0.2])
    X, eps = sample_sequence(jax.random.PRNGKey(2), sl.binary(F, 3.0), kstar, L)
    gK, gb = jax.grad(lambda K, b: finite_loss(act, K, b, X, eps), argnums=(0, 1))(K, b)
    params = sl.LayerParameters(K, b)
    (K1, b1, _), state = rule.step(0.0, params, sl.LayerParameters(gK, gb), rule.init_state(params), D)
    assert state == ()  # plain SGD has no state of its own
    M, Q = K @ kstar.T / D, K @ K.T / D
    stepped = (D * (K1 @ kstar.T / D - M), D * (K1 @ K1.T / D - Q), D * (b1 - b))

    d = jax.grad(lambda S: jnp.sum((X[eps] - token_weights(act, S) @ X) ** 2) / D)(scores(K, b, X))  # (H, L)
    g, nu = X @ K.T / jnp.sqrt(D), X @ kstar.T / jnp.sqrt(D)  # head fields (L, H), spike fields (L, F)
    U = rule.update(0.0, M, Q, b, d, g, nu)
    gram = lr**2 * d @ (X @ X.T / D - jnp.eye(L)) @ d.T
    np.testing.assert_allclose(stepped[0], U.M, rtol=0, atol=1e-12)
    np.testing.assert_allclose(stepped[1], U.Q + gram, rtol=0, atol=1e-12)
    np.testing.assert_allclose(stepped[2], U.b if train_bias else 0 * b, rtol=0, atol=1e-12)
    assert not train_bias or np.abs(U.b).max() > 1e-3  # (the biases do move)


def test_the_sde_drift_is_the_ode_drift_from_one_pass():
    """On the Sobol rule the SDE's drift is the mean update of the pass that gives its covariance
    (review D5: no second quadrature); it is the ODE's drift to rounding, and the rule's drift of the
    ODE's field averages is the ODE's drift."""
    cfg = sl.load_config("bsoftmax", ["theory.points=256", "theory.route=rule", "model.train_bias=true", "problem.L=3"])
    ode = sl.OrderParameterODE.from_config(cfg)
    M = jnp.array([[0.8, 0.3], [-0.2, 0.6]])
    Q, b = M @ M.T + 0.3 * jnp.eye(2), jnp.array([0.1, -0.2])
    drift, _ = update_moments(ode, M, Q, b)
    d = ode.drift(M, Q, b)
    expected = flatten_state(d.M, d.Q, d.b)
    np.testing.assert_allclose(drift, expected, rtol=0, atol=1e-13 * float(jnp.abs(expected).max()))
    again = ode.sgd.drift(0.0, M, Q, b, ode.gradient_moments(M, Q, b))
    for x, y in zip(again, d):
        np.testing.assert_array_equal(x, y)


def test_the_ode_takes_an_expectation_route_and_a_rule():
    fields = sl.LocalFields.make(3, 2, sl.binary(2, 3.0), 64, 0)
    act = sl.get_activation("softmax")
    ode = sl.OrderParameterODE(sl.SobolExpectation(fields=fields, activation=act), sl.OnlineSGD(0.5, True))
    assert float(ode.lr) == 0.5 and ode.train_bias and ode.activation is act
    assert isinstance(ode.sgd.lr, jax.Array)  # a value of the compiled programs, not a constant
    with pytest.raises(TypeError, match="expectation must be an expectation route"):
        sl.OrderParameterODE(fields, sl.OnlineSGD(0.5))
    assert sl.sgd_rule(sl.load_config("default", ["sgd.lr=0.25"])) == sl.OnlineSGD(0.25, False)
