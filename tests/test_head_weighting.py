"""The contract of a head weighting, run over every class in the registry (as tests/test_route_contract.py runs
over the routes): what it declares (its name, its ODE state and the starts of its parts), that its layer at the
start is the head average, that the ODE's risk and drift of ``(M, Q, b)`` at the start are the uniform layer's,
that its own part (when it has one) is the layer's weights, moves down the risk and is the large-D limit of the
simulator's step, and which routes take it.

References: the head average ``jnp.mean`` of the activation; the uniform layer's ODE on the same rule; the risk's
gradient by autodiff of :meth:`~singleloc.OrderParameterODE.state_risk`; the finite-D step at ``D = 10^6``
(its O(1/D) terms under the tolerance 1e-5).
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
    """Risk, drift, the risk's gradient in the state's own parts (beyond ``M, Q, b``) and ``E[dl/dv]`` at ``y``."""
    extras = tuple(y[3:])
    risk_of = lambda extras: ode.state_risk(y._make((*y[:3], *extras)))
    cv = ode.gradient_moments(*y[:3], ode.sgd.weighting.weights(y)).cv
    return ode.state_risk(y), ode.state_drift(y), jax.grad(risk_of)(extras), cv


@pytest.mark.parametrize("name", list(HEAD_WEIGHTINGS))
def test_every_head_weighting_keeps_the_contract(name):
    cls = HEAD_WEIGHTINGS[name]
    weighting = cls()
    assert issubclass(cls, sl.AbstractHeadWeighting) and cls.name == name and isinstance(cls.head_average, bool)
    assert cls.State._fields[:3] == ("M", "Q", "b")
    config = tiny(f"model.head_weights={name}", "model.train_bias=true", "sgd.lr=0.7", rule=True)
    assert config.model.weighting == weighting and sl.sgd_rule(config.sgd, config.model).weighting == weighting
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
    ode, uniform = (sl.OrderParameterODE.from_setup(sl.build(c)) for c in (config, tiny("model.train_bias=true", "sgd.lr=0.7",
                                                                               rule=True)))
    risk, drift, *_ = _views(ode, y)
    risk_u, drift_u, *_ = _views(uniform, sl.OrderParameters(M, Q, b))
    assert type(drift) is cls.State and float(risk) == pytest.approx(float(risk_u), rel=1e-12)
    for x, x_u in zip(drift[:3], drift_u):
        np.testing.assert_allclose(x, x_u, rtol=1e-10, atol=1e-13)

    # its own part, when it has one, is the layer's weights v (what the simulator steps and the results store)
    assert len(y) - 3 in (0, 1) and (len(y) == 3 or weighting.weights(y) is y[3])
    # away from the start that part moves down the risk (for parameters that step like the biases, as trained
    # weights do, along -r dR/dv: tests/test_head_weights.py), as the finite-D step of one sequence moves the
    # simulator's v to O(1/D): D (v' - v) -> its drift
    y = y._make((M, Q, b, *(x + 0.2 * jax.random.normal(jax.random.PRNGKey(2), x.shape) for x in y[3:])))
    risk, drift, grads, cv = _views(ode, y)
    rule, D = sl.sgd_rule(config.sgd, config.model), 10**6
    for v, d, g in zip(y[3:], drift[3:], grads, strict=True):
        assert float(jnp.vdot(d, g)) < -1e-3 * float(jnp.vdot(g, g))
        params = sl.LayerParameters(jnp.zeros((H, 1)), jnp.zeros(H), v)
        grads_v = sl.LayerParameters(jnp.zeros((H, 1)), jnp.zeros(H), cv)
        v1 = rule.step(0.0, params, grads_v, rule.init_state(params), D)[0].v
        np.testing.assert_allclose(D * (v1 - v), d, rtol=1e-5, atol=1e-9)
    if len(y) == 3:  # no part: the simulator's layer is the head average, and stays so
        assert weighting.layer_start(H, jnp.float64) is None and weighting.step(None, None, 0.7, D) is None

    # the routes: a joint layer (bsoftmax) and the exact Gram term take only the head average
    prior = sl.spikes(1, 2.0)
    assert decide("softmax", 3, 2, prior, "exact", weighting=weighting).route == "exact"
    assert decide("bsoftmax", 3, 2, prior, "auto", weighting=weighting).route == ("exact" if cls.head_average else "rule")
    for refused in (lambda: decide("bsoftmax", 3, 2, prior, "exact", weighting=weighting),
                    lambda: decide("softmax", 3, 1, prior, "exact", weighting=weighting, gram="exact"),
                    lambda: require_uniform_head_weights(config.model, "here")):
        if cls.head_average:
            refused()
        else:
            with pytest.raises(ValueError, match=rf"{name}"):
                refused()
