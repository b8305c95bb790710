"""The exact route's ``lr^2`` Gram term ``E[sum_l c_l c_l^T]`` on its Sobol rule and by Monte Carlo, against
what is known independently of both:

* identical heads: ``H`` copies of a head have ``c_h = c / H`` sequence by sequence (``c`` the one-head
  gradient), for a per-head layer and for a joint one (bsoftmax), so their Gram term is ``G_1 / H^2`` in every
  entry, ``G_1`` the one-head term, which is exact in the Laplace form; ``dQ`` of the copies is then the one
  head's at ``lr / H`` (docs/model.md section 4.6, "Gram terms of identical heads");
* the exact two-head term (``theory.gram = "exact"``) at trained states: near copies, wide fields;
* plain Monte Carlo of whole sequences, written here (fields ``g_l = M nu_l + R^{1/2} z_l``, the latent drawn,
  not summed), with its standard error.

The Sobol rule with whitened nodes is biased at long sequences by more than its scramblings' spread (the
reproduction below); the exact route's rule is not whitened, and the Monte Carlo term's standard error covers
its actual error."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import singleloc as sl
from singleloc.expectations._fields import LocalFields
from singleloc.expectations._monte_carlo_gram import MonteCarloGram
from singleloc.expectations._sobol_expectation import SobolGram
from singleloc.model._layer import limit_loss

jax.config.update("jax_enable_x64", True)

#: A trained key of one head on one spike of strength 2.5 at long contexts (docs/model.md section 4.6).
M1, Q1 = 2.5, 6.5


def _expectation(activation, L, H, F=1, gram="auto", *extra):
    cfg = sl.load_config("default", [f"model.activation={activation}", f"model.heads={H}", f"problem.L={L}",
                                     f"problem.F={F}", "theory.route=exact", f"theory.gram={gram}", *extra])
    return sl.OrderParameterODE.from_setup(sl.build(cfg)).expectation


@eqx.filter_jit
def _gram(term, M, Q, b):
    return term.gram(M, Q, b)


@eqx.filter_jit
def _gram_and_error(term, M, Q, b):
    return term.gram_and_error(M, Q, b)


def _one_head_over(H, L):
    """``G_1 / H^2``: the exact one-head term (Laplace form) of the trained key, per entry of ``H`` copies."""
    one = _expectation("softmax", L, 1, 1, "exact")
    return float(_gram(one.gram_term, jnp.array([[M1]]), jnp.array([[Q1]]), jnp.zeros(1))[0, 0]) / H**2


def _copies(H):
    return jnp.full((H, 1), M1), jnp.full((H, H), Q1), jnp.zeros(H)


def plain_monte_carlo(activation, prior, L, M, Q, b, n=2**14, batches=4, seed=0):
    """``E[sum_l c_l c_l^T]`` (H, H) and its standard error over ``n * batches`` independent sequences drawn as the
    data is (the latent from the prior, spike fields ``nu``, ``g_l = M nu_l + R^{1/2} z_l``, ``R = Q - M M^T``)."""
    act = sl.get_activation(activation)
    atoms, probs = jnp.asarray(prior.atoms_array()), jnp.asarray(prior.probs_array())
    M, Q, b = (jnp.asarray(x, float) for x in (M, Q, b))
    H, F = M.shape
    root = jnp.asarray(sl.psd_sqrt(np.asarray(Q - M @ M.T)))

    @jax.jit
    def batch(key):
        k1, k2, k3 = jax.random.split(key, 3)
        nu = jax.random.normal(k1, (n, L, F)).at[:, 0].add(atoms[jax.random.choice(k2, len(probs), (n,), p=probs)])
        g = nu @ M.T + jax.random.normal(k3, (n, L, H)) @ root
        c = jax.vmap(lambda x: jax.grad(lambda s: limit_loss(act, s, 0))(x.T + b[:, None]))(g)
        G = jnp.einsum("nhl,ngl->nhg", c, c)
        return G.mean(0), G.var(0)

    out = [batch(k) for k in jax.random.split(jax.random.PRNGKey(seed), batches)]
    return np.mean([o[0] for o in out], axis=0), np.sqrt(np.mean([o[1] for o in out], axis=0) / (n * batches))


@pytest.mark.parametrize("activation, H", [("softmax", 2), ("softmax", 3), ("bsoftmax", 2), ("bsoftmax", 4)])
def test_identical_heads_have_the_one_head_gradient_over_H(activation, H):
    """Sequence by sequence: the scores of ``H`` copies give ``c_h = c / H`` (``c`` of one head), so that
    ``sum_l c_l c_l^T = G_1 / H^2`` in every entry, for a per-head and for a joint layer."""
    act = sl.get_activation(activation)
    s = jax.random.normal(jax.random.PRNGKey(H), (5, 1, 9)) * 2.5
    for one in s:
        c1 = jax.grad(lambda x: limit_loss(act, x, 0))(one)
        cH = jax.grad(lambda x: limit_loss(act, x, 0))(jnp.tile(one, (H, 1)))
        np.testing.assert_allclose(cH, jnp.tile(c1, (H, 1)) / H, rtol=1e-12, atol=1e-15)


def test_plain_monte_carlo_of_identical_heads_is_the_exact_one_head_term_over_H_squared():
    """The identity checked on the expectations: plain Monte Carlo of two copies of a trained bsoftmax key
    against the exact one-head term over four, within its standard error."""
    L = 16
    ref = _one_head_over(2, L)
    value, se = plain_monte_carlo("bsoftmax", sl.spikes(1, 2.5), L, *_copies(2))
    assert np.all(np.abs(value - ref) < 5 * se), (value, ref, se)
    assert np.all(se < 0.02 * ref)


def _scramblings(L, H, points, whiten, seeds=range(4)):
    M, Q, b = _copies(H)
    prior, act = sl.spikes(1, 2.5), sl.get_activation("bsoftmax")
    values = [float(_gram(SobolGram(fields=LocalFields.make(L, H, prior, points, s, principal=True, whiten=whiten),
                                    activation=act), M, Q, b)[0, 1]) for s in seeds]
    return np.mean(values), np.std(values, ddof=1) / np.sqrt(len(values))


def test_a_whitened_sobol_rule_is_biased_beyond_its_scramblings_spread():
    """The reproduction (issue 50): two copies of a trained bsoftmax key at ``L = 32`` on the rank-aware rule
    with ``n = 4 d`` points (``d = 2 L H = 128`` coordinates). Whitened, the scramblings agree with one another
    and miss the exact value (``G_1 / 4``) by many of their standard errors (measured: 7-9% low, 10-14
    standard errors); unwhitened (the exact route's rule), they cover it."""
    L, H, points = 32, 2, 512
    ref = _one_head_over(H, L)
    whitened, se_w = _scramblings(L, H, points, True)
    assert abs(whitened - ref) > 5 * se_w and abs(whitened / ref - 1) > 0.03, (whitened, ref, se_w)
    plain, se = _scramblings(L, H, points, False)
    assert abs(plain - ref) < 5 * se, (plain, ref, se)


#: Trained states with an independent reference: (activation, L, H, F, M, Q, b, reference) where the reference
#: is "copies" (the exact one-head term over H^2), "exact" (the exact two-head term) or "mc" (plain Monte Carlo).
STATES = [
    ("bsoftmax", 32, 2, 1, *_copies(2), "copies"),
    ("softmax", 16, 3, 1, *_copies(3), "copies"),
    ("softmax", 32, 2, 1, [[2.5], [2.45]], [[6.5, 6.3], [6.3, 6.4]], [0.0, 0.0], "exact"),  # near copies
    pytest.param("softmax", 8, 2, 2, [[6.0, 0.0], [0.0, 6.0]], [[36.28, 0.0], [0.0, 36.28]], [0.0, 0.0], "exact",
                 marks=pytest.mark.slow),  # wide fields
    ("bsoftmax", 16, 2, 2, [[2.2, 0.1], [0.05, 2.1]], [[5.0, 0.3], [0.3, 4.6]], [0.1, -0.1], "mc"),  # joint, specialised
]


def _reference(activation, L, H, F, M, Q, b, kind):
    if kind == "copies":
        return np.full((H, H), _one_head_over(H, L)), np.zeros((H, H))
    if kind == "exact":
        return np.asarray(_gram(_expectation(activation, L, H, F, "exact").gram_term, M, Q, b)), np.zeros((H, H))
    return plain_monte_carlo(activation, sl.spikes(F, 2.5), L, M, Q, b)


@pytest.mark.parametrize("activation, L, H, F, M, Q, b, kind", STATES)
def test_the_monte_carlo_gram_term_is_unbiased_and_states_its_error(activation, L, H, F, M, Q, b, kind):
    """``theory.gram = "montecarlo"``: within five of its own standard errors (and the reference's, where that
    is Monte Carlo too) of the reference, whose error it must cover; and the standard error is a few percent."""
    M, Q, b = (jnp.asarray(x, float) for x in (M, Q, b))
    term = _expectation(activation, L, H, F, "montecarlo", "theory.gram_points=8192").gram_term
    assert isinstance(term, MonteCarloGram) and term.draws >= 8192
    value, se = (np.asarray(x) for x in _gram_and_error(term, M, Q, b))
    ref, ref_se = _reference(activation, L, H, F, M, Q, b, kind)
    assert np.all(np.abs(value - ref) < 5 * np.hypot(se, ref_se)), (value, ref, se)
    assert np.max(se) < 0.03 * np.max(np.abs(ref))


@pytest.mark.slow
@pytest.mark.parametrize("activation, L, H, F, M, Q, b, kind", STATES)
def test_the_exact_routes_sobol_gram_term_covers_its_error(activation, L, H, F, M, Q, b, kind):
    """``theory.gram = "sobol"`` (unwhitened): four scramblings' mean within five of their standard errors of the
    reference."""
    M, Q, b = (jnp.asarray(x, float) for x in (M, Q, b))
    values = np.array([_gram(_expectation(activation, L, H, F, "sobol", f"theory.qmc_seed={s}").gram_term, M, Q, b)
                       for s in range(4)])
    mean, se = values.mean(0), values.std(0, ddof=1) / 2
    ref, ref_se = _reference(activation, L, H, F, M, Q, b, kind)
    assert np.all(np.abs(mean - ref) < 5 * np.hypot(se, ref_se) + 1e-12), (mean, ref, se)


@pytest.mark.slow
def test_a_long_context_gram_term_of_copies_is_unbiased():
    """``L = 512``, two copies of a trained bsoftmax key: the exact route's Sobol rule at its default points
    (4096 over ``d = 2048`` coordinates, where the whitened rule was 10% off) and the Monte Carlo term, each
    within five standard errors of ``G_1 / 4``."""
    L, H = 512, 2
    ref = _one_head_over(H, L)
    M, Q, b = _copies(H)
    values = [float(_gram(_expectation("bsoftmax", L, H, 1, "sobol", f"theory.qmc_seed={s}").gram_term, M, Q, b)[0, 1])
              for s in range(4)]
    assert abs(np.mean(values) - ref) < 5 * np.std(values, ddof=1) / 2, (values, ref)
    value, se = _gram_and_error(_expectation("bsoftmax", L, H, 1, "montecarlo").gram_term, M, Q, b)
    assert abs(float(value[0, 1]) - ref) < 5 * float(se[0, 1]), (value, se, ref)


def test_theory_gram_montecarlo_takes_any_layer_and_its_stated_error_is_its_standard_error():
    for extra in (["model.heads=3"], ["model.activation=bsoftmax"], ["model.head_weights=trained"]):
        assert _expectation("softmax", 4, 2, 2, "montecarlo", *extra).gram_name == "montecarlo"
    e = _expectation("softmax", 4, 3, 2, "montecarlo", "theory.gram_points=256")
    M = jnp.array([[3.5, 0.3], [0.2, 3.5], [2.5, 2.4]])
    y0 = (M, M @ M.T + 0.3 * jnp.eye(3), jnp.zeros(3))
    G, se = _gram_and_error(e.gram_term, *y0)
    stated = eqx.filter_jit(lambda e, s: e.gram_error(e, *s))(e, y0)
    assert float(stated) == pytest.approx(float(jnp.max(se) / jnp.max(jnp.abs(G))), rel=1e-12)


@pytest.mark.slow
def test_a_solve_with_the_monte_carlo_gram_term_states_its_standard_error():
    """In a solve: the result's ``gram_error`` is the term's relative standard error at the start and end, and a
    large one warns, naming ``theory.gram_points``."""
    cfg = sl.load_config("default", ["sgd.tau_max=0.01", "sgd.n_save=2", "model.heads=3", "theory.route=exact",
                                     "theory.gram=montecarlo", "theory.gram_points=16"])
    M = jnp.array([[3.5, 0.3], [0.2, 3.5], [2.5, 2.4]])
    y0 = (M, M @ M.T + 0.3 * jnp.eye(3), jnp.zeros(3))
    with pytest.warns(UserWarning, match=r"Gram term has a stated relative error .*standard error.*theory\.gram_points"):
        r = sl.integrate(cfg, y0)
    term = sl.OrderParameterODE.from_setup(sl.build(cfg)).expectation.gram_term
    G, se = _gram_and_error(term, *y0)
    assert r.gram_route == "montecarlo"
    assert r.gram_error == pytest.approx(float(jnp.max(se) / jnp.max(jnp.abs(G))), rel=0.5)


@pytest.mark.slow
@pytest.mark.parametrize("activation, L, gram", [("softmax", 32, "exact"), ("bsoftmax", 8, "montecarlo")])
def test_copies_drift_as_one_head_at_lr_over_H(activation, L, gram):
    """The whole identity on the exact route: two copies of a trained key drift, entry by entry, as the one head at
    ``lr / 2`` (``dM_h``, ``dQ_hh'``): to the exact rules' precision with the exact two-head Gram term (per-head
    layer), and for the joint layer with the Monte Carlo Gram term within five of its standard errors (times
    ``lr^2``) in ``dQ``."""
    H, lr = 2, 0.5

    def drift(heads, rate, gram, M, Q, b):
        cfg = sl.load_config("default", [f"model.activation={activation}", f"model.heads={heads}", f"problem.L={L}",
                                         "problem.F=1", "theory.route=exact", f"theory.gram={gram}", f"sgd.lr={rate}"])
        ode = sl.OrderParameterODE.from_setup(sl.build(cfg))
        return eqx.filter_jit(lambda o, *s: o.drift(*s))(ode, M, Q, b), ode

    (dM1, dQ1, _), _ = drift(1, lr / H, "exact", jnp.array([[M1]]), jnp.array([[Q1]]), jnp.zeros(1))
    (dM, dQ, _), ode = drift(H, lr, gram, *_copies(H))
    # the pair rule of two heads and the one-head rule are different quadratures, each exact to about 1e-8 relative
    # here (the drift's stated error is at most 1e-5 where the risk's is below 1e-9: DRIFT_CHECK_ABOVE); measured 4e-9
    # (softmax) and 1.3e-8 (bsoftmax)
    np.testing.assert_allclose(dM, np.full((H, 1), float(dM1[0, 0])), rtol=1e-6)
    tolerance = 1e-6 * abs(float(dQ1[0, 0]))
    if gram == "montecarlo":
        tolerance += 5 * lr**2 * float(jnp.max(_gram_and_error(ode.expectation.gram_term, *_copies(H))[1]))
    np.testing.assert_allclose(dQ, np.full((H, H), float(dQ1[0, 0])), rtol=0, atol=tolerance)


def test_the_sobol_checks_of_the_risks_are_unbiased_at_long_contexts():
    """The rule behind population_risk's check at few points per coordinate (n / 2LH = 2): against the
    exact risk of a trained two-head softmax layer at L = 64, the mean of 8 scramblings within 4 of its
    standard errors (the whitened rule was 2.8 % low there, 27 standard errors)."""
    prior = sl.load_config("default").problem.build_prior()
    M = np.array([[2.5, 0.0], [0.0, 2.5]])
    Q = M @ M.T + np.eye(2) + 0.5
    b = np.zeros(2)
    exact = sl.population_risk(prior, 64, "softmax", M, Q, b)  # the exact route
    rule = sl.population_risk(prior, 64, "softmax", M, Q, b, points=512, replicates=8, route="rule")
    assert abs(rule.value - exact.value) < 4 * rule.error + exact.error, (rule, exact)
    bayes_exact = sl.bayes_risk(prior, 64)  # bsoftmax at its Bayes point, exactly
    bayes_rule = sl.bayes_risk(prior, 64, points=512, route="rule")  # the closed-form posterior on the rule: 3.6 % low whitened
    assert abs(bayes_rule.value - bayes_exact.value) < 4 * bayes_rule.error + bayes_exact.error, (bayes_rule, bayes_exact)
