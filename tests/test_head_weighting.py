"""The contract of a head weighting, run over every class in the registry (as tests/test_route_contract.py runs
over the routes): what it declares (its name, its ODE state and the starts of its parts), that its layer at the
start is the head average, that the ODE's risk and drift of ``(M, Q, b)`` at the start are the uniform layer's,
that its parts follow the gradient of the risk at the rule's rate (the ``O(r)`` drift of parameters that step
like the biases), that its finite-D step is the drift of one sequence, and which routes take it.

References: the head average ``jnp.mean`` of the activation; the uniform layer's ODE on the same rule; the risk's
gradient by autodiff of :meth:`~singleloc.OrderParameterODE.state_risk` (on the Sobol rule the risk is the rule's
mean of the loss and the drift the mean of its gradient, so they agree to rounding: 1e-10).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import tiny
from helpers import random_overlaps

import singleloc as sl
from singleloc.configuration._config import require_uniform_head_weights
from singleloc.expectations._routes import decide
from singleloc.model._layer import token_weights
from singleloc.sgd._head_weighting import HEAD_WEIGHTINGS


@eqx.filter_jit
def _views(ode, y):
    """Risk, drift and the risk's gradient in the state's own parts (beyond ``M, Q, b``) at the state ``y``."""
    extras = tuple(y[3:])
    risk_of = lambda extras: ode.state_risk(y._make((*y[:3], *extras)))
    return ode.state_risk(y), ode.state_drift(y), jax.grad(risk_of)(extras)


@pytest.mark.parametrize("name", list(HEAD_WEIGHTINGS))
def test_every_head_weighting_keeps_the_contract(name):
    cls = HEAD_WEIGHTINGS[name]
    weighting = cls()
    assert issubclass(cls, sl.AbstractHeadWeighting) and cls.name == name and isinstance(cls.head_average, bool)
    assert cls.State._fields[:3] == ("M", "Q", "b")
    config = tiny(f"model.head_weights={name}", "model.train_bias=true", "sgd.lr=0.7", rule=True)
    assert config.model.weighting == weighting and sl.sgd_rule(config).weighting == weighting
    H = config.model.heads

    # the start: (M0, Q0, b0) gains the declared parts, per-head vectors; a full state is kept; others refused
    y0 = sl.initial_conditions(config, 2)
    assert type(y0) is cls.State and all(x.shape == (2, H) for x in y0[3:])
    assert all(a is b for a, b in zip(weighting.state(y0), y0, strict=True))
    assert type(weighting.state(tuple(y0[:3]))) is cls.State
    with pytest.raises(ValueError, match=rf"model\.head_weights = '{name}'"):
        weighting.state((*y0, y0.b))

    # the layer at the start is the head average, in the ODE and in the simulator
    s = jax.random.normal(jax.random.PRNGKey(0), (H, 4))
    act = sl.get_activation(config.model.activation)
    average = jnp.mean(act(s), axis=0)
    for v in (weighting.weights(jax.tree.map(lambda x: x[0], y0)), weighting.layer_start(H, jnp.float64)):
        np.testing.assert_allclose(token_weights(act, s, v), average, rtol=1e-15, atol=1e-16)

    # risk and drift of (M, Q, b) at a start away from the origin: the uniform layer's
    M, Q, b = (jnp.asarray(x) for x in random_overlaps(np.random.default_rng(1), H, 1, m=0.8, r=0.6, b=0.3))
    y = weighting.state((M, Q, b))
    ode, uniform = (sl.OrderParameterODE.from_config(c) for c in (config, tiny("model.train_bias=true", "sgd.lr=0.7",
                                                                               rule=True)))
    risk, drift, _ = _views(ode, y)
    risk_u, drift_u, _ = _views(uniform, sl.OrderParameters(M, Q, b))
    assert type(drift) is cls.State and float(risk) == pytest.approx(float(risk_u), rel=1e-12)
    for x, x_u in zip(drift[:3], drift_u):
        np.testing.assert_allclose(x, x_u, rtol=1e-10, atol=1e-13)

    # away from the start its own parts follow -r dR/d(part); the keys' drift moves with them
    y = y._make((M, Q, b, *(x + 0.2 * jax.random.normal(jax.random.PRNGKey(2), x.shape) for x in y[3:])))
    risk, drift, grads = _views(ode, y)
    for d, g in zip(drift[3:], grads, strict=True):
        np.testing.assert_allclose(d, -0.7 * g, rtol=1e-10, atol=1e-13)
        assert np.abs(np.asarray(d)).max() > 1e-3  # they move

    # the finite-D step of one sequence is its drift (U of that sequence): D (v' - v) = -lr dl/dv
    rule, D, dv = sl.sgd_rule(config), 64, jnp.array([0.3, -0.2])
    v0 = rule.weighting.layer_start(H, jnp.float64)
    params = sl.LayerParameters(jnp.zeros((H, D)), jnp.zeros(H), v0)
    grads = sl.LayerParameters(jnp.zeros((H, D)), jnp.zeros(H), None if v0 is None else dv)
    v1 = rule.step(0.0, params, grads, rule.init_state(params), D)[0].v
    moved = rule.weighting.drift(sl.OrderParameters(M, Q, b), 0.7, dv)[3:]
    assert (v1 is None) == (v0 is None) == (len(moved) == 0)
    if v1 is not None:
        np.testing.assert_allclose(D * (v1 - v0), moved[0], rtol=1e-12)

    # the routes: a joint layer (bsoftmax) and the exact Gram term take only the head average
    prior = sl.spikes(1, 2.0)
    assert decide("softmax", 3, 2, prior, "exact", weighting=weighting).route == "exact"
    assert decide("bsoftmax", 3, 2, prior, "auto", weighting=weighting).route == ("exact" if cls.head_average else "rule")
    for refused in (lambda: decide("bsoftmax", 3, 2, prior, "exact", weighting=weighting),
                    lambda: decide("softmax", 3, 1, prior, "exact", weighting=weighting, gram="exact"),
                    lambda: require_uniform_head_weights(config, "here")):
        if cls.head_average:
            refused()
        else:
            with pytest.raises(ValueError, match=rf"{name}"):
                refused()
