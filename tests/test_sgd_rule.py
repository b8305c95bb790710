"""The SGD rule (singleloc/sgd/_sgd_rule.py): its per-step update in order parameters and its drift are one
rule (issue 23 item 2); its finite-D step against the update is the contract of tests/test_training_variants.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import tiny

import singleloc as sl
from singleloc.theory._fluctuations import update_moments
from singleloc.theory._theory import flatten_state


def test_the_sde_drift_is_the_ode_drift_from_one_pass():
    """On the Sobol rule the SDE's drift is the mean update of the pass that gives its covariance
    (review D5: no second quadrature); it is the ODE's drift to rounding, and the rule's drift of the
    ODE's field averages is the ODE's drift."""
    cfg = tiny("problem.F=2", "theory.points=256", rule=True, preset="bsoftmax")  # (bsoftmax trains its biases)
    ode = sl.OrderParameterODE.from_setup(sl.build(cfg))
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
    with pytest.raises(TypeError, match="^OrderParameterODE: expectation must be a singleloc.AbstractExpectation, got Local"):
        sl.OrderParameterODE(fields, sl.OnlineSGD(0.5))
    cfg = sl.load_config("default", ["sgd.lr=0.25"])
    assert sl.sgd_rule(cfg.sgd, cfg.model) == sl.OnlineSGD(0.25, False)
