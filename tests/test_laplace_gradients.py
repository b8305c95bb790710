"""The exact route's derivatives: the risk's gradient against central differences (at identical heads, by
Price's theorem, and at a head of zero norm included), the drift against the Sobol rule where that rule
converges, its symmetry under permuting the heads, and its stated error against a finer rule."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from _exact import _risk, _value_and_grad, rule_for, trained_state

import singleloc as sl

pytestmark = pytest.mark.exact_route

SLOW = pytest.mark.slow


def _central_difference(rule, M, Q, b, h=1e-5):
    """Derivatives of the risk in every entry of M, the upper triangle of Q (moved symmetrically)
    and b, by central differences."""
    def at(dM=0.0, dQ=0.0, db=0.0):
        return float(_risk(rule, M + dM, Q + dQ, b + db))

    H, F = M.shape
    gM = np.zeros((H, F))
    for i in range(H):
        for j in range(F):
            e = np.zeros((H, F))
            e[i, j] = h
            gM[i, j] = (at(dM=e) - at(dM=-e)) / (2 * h)
    gQ = np.zeros((H, H))
    for i in range(H):
        for j in range(i, H):
            e = np.zeros((H, H))
            e[i, j] = e[j, i] = h
            gQ[i, j] = gQ[j, i] = (at(dQ=e) - at(dQ=-e)) / (2 * h)
    gb = np.array([(at(db=h * np.eye(H)[i]) - at(db=-h * np.eye(H)[i])) / (2 * h) for i in range(H)])
    return gM, gQ, gb


@pytest.mark.parametrize("name", ["softmax", "bsoftmax", pytest.param("softmax1", marks=SLOW), pytest.param("ssmax", marks=SLOW)])
def test_gradient_matches_central_differences(name, rng):
    """The gradient along three random unit directions of (M, Q, b) (Q moved symmetrically) against central
    differences of the risk: a wrong entry of the gradient moves each directional derivative by its share of the
    direction (six risks rather than the 30 of every entry; the test below checks every entry, for softmax)."""
    prior = sl.spikes(2, 2.5)
    M, Q, b = trained_state("random", 3, 2, rng)
    rule = rule_for(name, 5, 3, prior)
    _, grads = _value_and_grad(rule, M, Q, b)
    h = 1e-5
    for _ in range(3):
        A = rng.standard_normal((3, 3))
        step = [rng.standard_normal((3, 2)), A + A.T, rng.standard_normal(3)]
        norm = np.sqrt(sum(np.sum(x**2) for x in step))
        step = [x / norm for x in step]
        along = sum(float(np.sum(np.asarray(g) * d)) for g, d in zip(grads, step))
        up, down = (float(_risk(rule, M + s * h * step[0], Q + s * h * step[1], b + s * h * step[2])) for s in (1, -1))
        assert along == pytest.approx((up - down) / (2 * h), abs=2e-7)


@pytest.mark.parametrize("prior,kind", [("spikes", "near"), pytest.param("gaussian", "random", marks=SLOW),
                                        pytest.param("gaussian", "near", marks=SLOW)])
def test_pair_gradient_matches_central_differences_at_near_copies_and_a_gaussian_prior(prior, kind, rng):
    """A per-head layer's gradient (its pairs differentiated through their checkpoint) against central differences
    of the risk at near copies (small conditional widths: the heat equation's regime) and under a prior with a
    Gaussian part (the relevant token with a table of its own), three softmax heads (the programs of the test above
    for the spikes). The differences' error at ``h = 1e-5`` is ``~h^2`` (1e-10) in truncation and
    ``~1e-16 / h`` in rounding: 1.2e-11 measured, so 1e-9."""
    prior = sl.spikes(2, 2.5) if prior == "spikes" else sl.gaussian([1.0, 0.5], [[1.0, 0.2], [0.2, 0.5]])
    M, Q, b = trained_state(kind, 3, 2, rng)
    rule = rule_for("softmax", 5, 3, prior)
    _, (gM, gQ, gb) = _value_and_grad(rule, M, Q, b)
    fM, fQ, fb = _central_difference(rule, M, Q, b)
    sym = np.asarray(gQ) + np.asarray(gQ).T - np.diag(np.diag(np.asarray(gQ)))
    for a, c in ((gM, fM), (sym, fQ), (gb, fb)):
        np.testing.assert_allclose(np.asarray(a), c, atol=1e-9)


@pytest.mark.parametrize("name", ["softmax1", "bsoftmax", pytest.param("softmax", marks=SLOW), pytest.param("ssmax", marks=SLOW)])
def test_gradient_at_identical_heads_is_finite_and_continuous(name):
    """At ``R_orth = 0`` with copies the square roots have infinite derivatives; Price's theorem
    keeps the gradient finite, and equal to the limit of the gradients at nearly identical heads."""
    H, F = 3, 1
    prior = sl.spikes(F, 2.5)
    M = jnp.full((H, F), 1.9)
    Q = M @ M.T
    b = jnp.array([0.1, 0.1, 0.1])
    rule = rule_for(name, 4, H, prior)
    exact = [np.asarray(x) for x in _value_and_grad(rule, M, Q, b)[1]]
    assert all(np.all(np.isfinite(x)) for x in exact)
    delta = 1e-6
    near = [np.asarray(x) for x in _value_and_grad(rule, M, Q + delta * jnp.eye(H), b)[1]]
    for a, c in zip(exact, near):
        np.testing.assert_allclose(a, c, atol=50 * delta)


@pytest.mark.parametrize("name", ["softmax", "bsoftmax", pytest.param("softmax1", marks=SLOW), pytest.param("ssmax", marks=SLOW)])
def test_a_head_of_zero_norm_has_a_finite_exact_gradient(name):
    """A head whose key is zero (``Q_hh = 0``, e.g. ``sgd.init_scale = 0``) beside a trained one: the
    pair rule's conditional law divides by the first field's variance, which gave NaN gradients.
    Now every derivative is finite, and those the drift uses (``M``, the other head's ``Q``, ``b``;
    ``dR/dQ_hh`` of the zero head is multiplied by ``M_h = 0`` and ``Q_h. = 0`` there) agree with
    central differences of the risk."""
    rule = rule_for(name, 16, 2, sl.spikes(2, 2.5))
    M, Q, b = jnp.array([[0.0, 0.0], [1.5, 0.2]]), jnp.array([[0.0, 0.0], [0.0, 3.0]]), jnp.array([-0.7, 1.3])
    _, (gM, gQ, gb) = _value_and_grad(rule, M, Q, b)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in (gM, gQ, gb))
    h = 1e-5
    entries = [(0, gM, (i, j)) for i in range(2) for j in range(2)] + [(1, gQ, (1, 1)), (2, gb, (0,)), (2, gb, (1,))]
    for arg, grad, index in entries:
        step = [jnp.zeros_like(x) for x in (M, Q, b)]
        step[arg] = step[arg].at[index].set(h)
        up = float(_value_and_grad(rule, *(x + d for x, d in zip((M, Q, b), step)))[0])
        down = float(_value_and_grad(rule, *(x - d for x, d in zip((M, Q, b), step)))[0])
        assert float(grad[index]) == pytest.approx((up - down) / (2 * h), abs=1e-7)


@pytest.mark.parametrize("name", ["softmax", pytest.param("bsoftmax", marks=SLOW)])
def test_drift_matches_converged_rule(name):
    """The exact drift against the Sobol rule's at 2^16 points (where it converges, a start)."""
    cfg = sl.load_config("default").replace(model={"activation": name}, problem={"L": 3}, theory={"points": 65536})
    y0 = sl.initial_conditions(cfg, 1)
    state = [jnp.asarray(x[0], jnp.float64) for x in y0]
    drift = eqx.filter_jit(lambda ode, *y: ode.drift(*y))
    exact = drift(sl.OrderParameterODE.from_setup(sl.build(cfg)), *state)
    rule = drift(sl.OrderParameterODE.from_setup(sl.build(cfg.replace(theory={"route": "rule"}))), *state)
    scale = max(float(jnp.max(jnp.abs(x))) for x in exact)
    for a, c in zip(exact, rule):
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), atol=2e-3 * scale)


@pytest.mark.parametrize("name", ["softmax1", pytest.param("bsoftmax", marks=SLOW)])
def test_permuting_the_heads_permutes_the_exact_drift(name, rng):
    """The exact route is a function of (M, Q, b): permuting the heads permutes its drift, to
    within the rule's error (a pair of heads is integrated with one of them outside)."""
    cfg = sl.load_config("default").replace(model={"activation": name, "heads": 3, "train_bias": True})
    M, Q, b = trained_state("random", 3, 2, rng)
    ode = sl.OrderParameterODE.from_setup(sl.build(cfg))
    drift = eqx.filter_jit(lambda o, *y: o.drift(*y))
    d = drift(ode, M, Q, b)
    p = np.array([2, 0, 1])
    dp = drift(ode, M[p], Q[p][:, p], b[p])
    scale = max(float(jnp.max(jnp.abs(x))) for x in d)
    np.testing.assert_allclose(np.asarray(dp.M), np.asarray(d.M)[p], atol=1e-6 * scale)
    np.testing.assert_allclose(np.asarray(dp.Q), np.asarray(d.Q)[p][:, p], atol=1e-6 * scale)
    np.testing.assert_allclose(np.asarray(dp.b), np.asarray(d.b)[p], atol=1e-6 * scale)


@pytest.mark.parametrize("stretch", [pytest.param(1.0, marks=pytest.mark.slow), 2.0])
def test_stated_drift_error_covers_the_drift_error(stretch):
    """The exact route's stated drift error (its ``O(lr)`` drift against a rule of 1.5 x the nodes)
    against the actual error (against a rule of 3 x the nodes), at a trained H = 2 state whose heads
    are near copies and at the same state with keys twice as long (token variance ~15, where 64
    Gauss-Hermite nodes resolved the drift to about 1e-4 only, the trapezoidal normal rule to 8e-6):
    within a factor 4 of each other, and under the issue's 1e-4."""
    from singleloc.expectations._laplace_expectation import exact_moments

    cfg = sl.load_config("default")
    M = stretch * jnp.array([[1.41, 1.28], [1.27, 1.40]])
    Q = stretch**2 * jnp.array([[3.79, 3.62], [3.62, 3.75]])
    b = jnp.zeros(2)
    ode = sl.OrderParameterODE.from_setup(sl.build(cfg), check=True)
    stated = float(eqx.filter_jit(lambda o, *s: o.exact_drift_error(*s))(ode, M, Q, b))
    lr_drift = eqx.filter_jit(lambda rule, sgd: jnp.concatenate(
        [x.ravel() for x in sgd.drift(0.0, M, Q, b, exact_moments(rule, M, Q, b, None, jnp.zeros((2, 2))))]))
    reference = sl.OrderParameterODE.from_setup(sl.build(cfg.replace(theory={"nodes": 192})))
    d, ref = lr_drift(ode.expectation.rule, ode.sgd), lr_drift(reference.expectation.rule, ode.sgd)
    actual = float(jnp.max(jnp.abs(d - ref)) / jnp.max(jnp.abs(ref)))
    assert actual / 4 < stated < 4 * actual
    assert stated < 1e-4
