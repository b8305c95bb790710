"""The contract of an expectation route, run over every class in the registry (as diffrax's test_solver runs
over its solvers): a route builds from a tiny setup, its risk at a fresh start agrees with the exact route's
within the route's own stated error, its Gram term states a finite error, and it answers what the rest of the
package asks it (memory, cost class, description, device split) without being asked its name.

Reference and tolerance: the exact route's risk (the Laplace form, independent of the Sobol rule and of the
Monte Carlo draws), with its own stated error against its finer rule. A route whose error is stated by one
rule against a finer one (``refined_error``) is compared within that error; the others within ``Z = 5``
standard errors of the mean over ``R`` independent replicates (the Monte Carlo route's stated error is the
same standard error from one set of draws: :meth:`risk_check`).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import route_of, tiny
from jax.sharding import Mesh

import singleloc as sl
from singleloc.expectations._expectation import AbstractExpectation
from singleloc.expectations._routes import ROUTE_CLASSES, route_class
from singleloc.expectations._sharding import _put
from singleloc.ground._choices import ROUTE_WORDS
from singleloc.preflight._build import build
from singleloc.preflight._resources import theory_bytes

Z, R = 5.0, 4


@eqx.filter_jit
def _answers(expectation, evaluation, M, Q, b):
    return {"risk": expectation.risk(M, Q, b), "check": expectation.risk_check(M, Q, b),
            "gram": expectation.gram(M, Q, b), "gram_error": expectation.gram_error(evaluation, M, Q, b)}


def _route(name: str, seed: int = 0):
    """The route ``name`` of the tiny problem (64 points, scrambling ``seed``), its evaluation (the independent
    rule a solve evaluates with: scrambling ``seed + 100``), both with what their statements need, and the tiny
    start."""
    setup, other = (build(tiny(f"theory.route={name}", f"theory.qmc_seed={s}")) for s in (seed, seed + 100))
    expectation, evaluation = (route_class(name).from_setup(x, points=64, check=True) for x in (setup, other))
    y = sl.initial_conditions(tiny(), 1)
    return setup, expectation, evaluation, (y.M[0], y.Q[0], y.b[0])


@pytest.fixture(scope="module")
def exact_reference():
    """The exact route's risk at the tiny start, with its stated error (against its finer rule)."""
    _, _, evaluation, state = _route("exact")
    got = _answers(evaluation, evaluation, *state)
    return float(got["risk"]), abs(float(got["risk"]) - float(got["check"]))


@pytest.mark.parametrize("name", list(ROUTE_CLASSES))
def test_every_route_keeps_the_contract(name, exact_reference):
    cls = route_class(name)
    assert issubclass(cls, AbstractExpectation) and cls.route == name
    assert isinstance(cls.field_nodes, bool) and isinstance(cls.refined_error, bool)
    replicates = [_route(name, seed) for seed in range(1 if cls.refined_error else R)]
    setup, expectation, evaluation, state = replicates[0]
    assert type(expectation) is cls and expectation.replicates == 1
    answers = [jax.tree.map(np.asarray, _answers(e, ev, *s)) for _, e, ev, s in replicates]
    risks = np.array([a["risk"] for a in answers])
    if cls.refined_error:  # one rule, its error against its finer copy
        stated = abs(float(answers[0]["check"]) - risks[0])
    else:  # the replicates' standard error; a route with a finer check of its own states it as well
        stated = Z * risks.std(ddof=1) / np.sqrt(len(risks))
        assert np.isnan(answers[0]["check"]) or answers[0]["check"] > risks[0]  # Monte Carlo: risk + its SE
    reference, reference_error = exact_reference
    assert abs(risks.mean() - reference) <= stated + reference_error + 1e-12, (name, risks, reference, stated)
    scrambled = getattr(getattr(expectation, "gram_term", None), "scrambled", False)  # stated after the solve
    for a in answers:  # the Gram term: a symmetric matrix with a finite stated error
        assert np.all(np.isfinite(a["gram"])) and np.allclose(a["gram"], a["gram"].T)
        assert np.isfinite(a["gram_error"]) or (scrambled and np.isnan(a["gram_error"]))
    # it says what it is: its name in words, its Gram term's way, and nothing it is not
    assert expectation.gram_name in ("exact", "sobol", "montecarlo")
    result = sl.TheoryResult(np.zeros(1), *(np.zeros((1, 1, *np.shape(x))) for x in state), np.zeros((1, 1)), points=64,
                             route=name, gram_route=expectation.gram_name, replicates=2)
    line = result.quadrature()
    assert f"{ROUTE_WORDS[name]} route" in line, line
    if expectation.gram_name != "sobol":  # the Monte Carlo route is never described as the Sobol rule
        assert "Sobol" not in line, line
    # what the preflight and the estimates ask it
    choice = route_of(tiny(f"theory.route={name}"))
    points, principal = cls.memory_points(choice, setup.theory, 3, 2, 64)
    assert points >= 1 and isinstance(principal, bool) and cls.rule_bytes(choice, 2, setup.prior) >= 0
    config = tiny(f"theory.route={name}")
    pb = config.problem
    assert theory_bytes(pb.L, config.model.heads, pb.build_prior(), config.theory, route_of(config), 1) > 0
    assert expectation.stated_points(setup.theory, 3, 2, 64) >= 1
    # its device split: on a mesh of one device, the same risk (None: no nodes to split)
    split = expectation.shard(Mesh(np.array(jax.devices()[:1]), ("devices",)), _put)
    if split is not None:
        assert type(split) is cls
        assert float(jax.jit(lambda e: e.risk(*state))(split)) == pytest.approx(float(risks[0]), abs=1e-14)


def test_a_route_states_what_the_contract_asks():
    """A class that states the averages but not its name nor how it is built is refused (abstract-or-final)."""

    class Nameless(AbstractExpectation):
        activation: object

        def risk(self, M, Q, b, v=None):
            return jnp.zeros(())

        gradient_moments = gram = attention_mass = risk

    with pytest.raises(TypeError, match="abstract methods describe, for_risk, from_setup, gram_name"):
        Nameless(None)
