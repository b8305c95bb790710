"""The exact route stays within the widths of token fields its rule resolves (issue 59 item 4).

Long keys widen the token fields; beyond :attr:`~singleloc.expectations._laplace.LaplaceRule.widest` the pair
rule's first field is not resolved and the drift is wrong (the default problem at ``lr = 256`` ended at risk 0.691
where the Sobol rule and the simulation train to 0.52). The solve stops there: ``"auto"``'s choice goes on on the
Sobol rule, an explicit ``theory.route = "exact"`` refuses, naming what to change.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import tiny

import singleloc as sl
from singleloc.configuration._specs import ON_THE_RULE
from singleloc.expectations._laplace import NODES, RESOLVED_SIGMA, exact_rule
from singleloc.expectations._laplace_expectation import DRIFT_ERROR_WARN, RISK_ERROR_WARN, LaplaceExpectation
from singleloc.preflight._build import build
from singleloc.theory._step_budget import UnresolvedFields

#: A start of the tiny problem just inside the widest field the default rule resolves (standard deviation 4.9 of
#: 5), whose keys grow past it at this learning rate within the tiny solve.
START = (np.array([[3.0], [2.0]]), np.array([[24.0, 8.0], [8.0, 23.0]]), np.zeros(2))
LR = "sgd.lr=64"


def test_fields_outgrowing_the_exact_rule_leave_it_or_refuse():
    """``"auto"`` returns the Sobol rule's trajectory (bit for bit the ``theory.route = "rule"`` solve: no
    exact part is kept), ``"exact"`` raises with the width and the keys to change; before, both returned the
    exact route's trajectory with a warning."""
    assert RESOLVED_SIGMA**2 > START[1].max()
    with pytest.warns(UserWarning, match=r"wider than its rule resolves.*: solving on the Sobol rule instead"):
        auto = sl.integrate(tiny(LR), START)
    assert auto.route == "rule"
    rule = sl.integrate(tiny(LR, rule=True), START)
    np.testing.assert_array_equal(auto.risk, rule.risk)
    np.testing.assert_array_equal(auto.Q, rule.Q)
    assert rule.Q[0, -1].diagonal().max() > RESOLVED_SIGMA**2  # the keys did grow past the width
    with pytest.raises(UnresolvedFields, match=r"stopped near tau = .*wider than its rule resolves.*of 5 at "
                                               r"theory\.nodes = 64.*theory\.route = 'rule'.*raise theory\.nodes"):
        sl.integrate(tiny(LR, "theory.route=exact"), START)


@pytest.mark.parametrize("keys", ["theory.gram=exact", "theory.gram_points=1024"])
def test_leaving_the_exact_route_drops_its_gram_keys(keys):
    """A run with the exact route's Gram keys set and ``theory.route = "auto"`` goes on on the Sobol rule, as one
    without them does (the retry kept them and met the rule route's refusal of them, :func:`check_gram`)."""
    config = tiny(keys)
    assert build(config).route.route == "exact"
    with pytest.raises(ValueError, match="applies to the exact route's Gram term"):
        build(config.replace(theory={"route": "rule"}))
    setup = build(config.replace(theory=ON_THE_RULE))
    assert (setup.route.route, setup.theory.gram, setup.theory.gram_points) == ("rule", "auto", "auto")
    assert config.replace(theory=ON_THE_RULE).replace(theory={"route": "auto"}) == tiny()


@pytest.mark.slow
@pytest.mark.parametrize("sigma", [0.99 * RESOLVED_SIGMA])
def test_the_widest_field_is_within_the_stated_accuracy(sigma):
    """At a state of the default problem (two aligned heads, as trained at ``lr = 8``, scaled) whose widest token
    field has the standard deviation the default rule resolves, its risk and ``O(lr)`` drift agree with a rule of
    twice the nodes (an independent finer rule: the stated error uses 1.5 times) within the thresholds above which
    the route warns; at twice the width they do not, so the limit is needed."""
    config = sl.load_config("default")
    setup = build(config)
    coarse, fine = (exact_rule(setup.route.activation, 4, 2, setup.prior, nodes=n) for n in (NODES, 2 * NODES))
    expectation = LaplaceExpectation(rule=coarse, gram_term=None, activation=setup.route.activation, check=fine)
    shape_M, shape_Q = np.array([[3.17, 3.14], [3.14, 3.16]]), np.array([[28.04, 20.0], [20.0, 28.01]])  # lr = 8, tau = 30
    errors = []
    for s in (sigma, 2 * sigma):
        scale = s**2 / shape_Q.max()
        M, Q, b = jnp.asarray(np.sqrt(scale) * shape_M), jnp.asarray(scale * shape_Q), jnp.zeros(2)
        assert bool(coarse.resolves(M, Q, b)) is (s <= RESOLVED_SIGMA)
        errors.append(tuple(map(float, _errors(expectation, setup.rule, M, Q, b))))
    (risk, drift), (wide_risk, wide_drift) = errors
    assert risk < RISK_ERROR_WARN and drift < DRIFT_ERROR_WARN, errors
    assert wide_risk > RISK_ERROR_WARN or wide_drift > DRIFT_ERROR_WARN, errors


@eqx.filter_jit
def _errors(expectation, sgd, M, Q, b):
    """The risk's difference to the finer rule, and the relative drift error."""
    return jnp.abs(expectation.risk(M, Q, b) - expectation.risk_check(M, Q, b)), expectation.drift_error(sgd, M, Q, b)
