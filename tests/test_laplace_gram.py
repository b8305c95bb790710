"""The exact ``lr^2`` Gram term of one head (singleloc/expectations/_laplace_gram.py) against independent routes:
the polynomial and its distinct-token moments against brute-force sums over tokens, a closed form
where the weights are constant, plain Monte Carlo of whole sequences (with its standard error) at
trained states, and the ODE's use of it."""

from __future__ import annotations

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import tiny

import singleloc as sl
from singleloc.expectations._laplace import RESOLVED_SIGMA, LaplaceRule
from singleloc.expectations._laplace_gram import WIDE_GRAM_SIGMA, distinct_moments, gram_polynomials
from singleloc.model._activations import exponential_form
from singleloc.model._layer import limit_loss

jax.config.update("jax_enable_x64", True)


def _direct(A):
    """``sum_l c_hl c_gl / alpha^2`` (H, H) from the weights ``A`` (H, L) of the head average (token 0
    relevant): ``c_hl = A_hl (e_l - e_bar_h) / H``, ``e_l = 2 (a_l - delta_l0)``, ``e_bar_h = sum_m e_m A_hm``."""
    H, L = A.shape
    e = 2 * (A.mean(axis=0) - np.eye(L)[0])
    c = A * (e[None, :] - (A @ e)[:, None]) / H
    return c @ c.T


def _evaluate(poly, A):
    """The polynomial at the weights ``A`` (H, L): ``prod_h A_h0^(a_h) prod p_k``, ``p_k = sum_{l >= 1}
    prod_h A_hl^(k_h)``."""
    power = lambda k, cols: np.prod(A[:, cols] ** np.array(k)[:, None], axis=0)  # noqa: E731
    return sum(c * power(a, [0])[0] * np.prod([np.sum(power(k, slice(1, None))) for k in ks]) for (a, ks), c in poly.items())


def _distinct(moments, A):
    """The distinct-token sums of :func:`distinct_moments` at the weights ``A``, each sum over distinct
    noise tokens by brute force (none when there are fewer noise tokens than factors)."""
    L, total = A.shape[1], 0.0
    for (a, ks), coefficient in moments.items():
        tokens = itertools.permutations(range(1, L), len(ks))
        head0 = np.prod(A[:, 0] ** np.array(a))
        total += coefficient * head0 * sum(np.prod([np.prod(A[:, l] ** np.array(k)) for l, k in zip(ls, ks)])
                                           for ls in tokens)
    return total


@pytest.mark.parametrize("H, L", [(1, 2), (1, 3), (1, 5), (2, 2), (2, 4)])
def test_the_gram_polynomials_and_their_distinct_moments_are_the_sums_over_tokens(H, L):
    rng = np.random.default_rng(10 * H + L)
    polys = gram_polynomials(H)
    for _ in range(4):
        A = rng.dirichlet(np.ones(L), size=H) * rng.uniform(0.5, 1.0, size=(H, 1))  # softmax1 leaves mass on the offset
        direct = _direct(A)
        for (h, g), poly in polys.items():
            np.testing.assert_allclose(_evaluate(poly, A), direct[h, g], rtol=1e-12, atol=1e-15)
            np.testing.assert_allclose(_distinct(distinct_moments(poly), A), direct[h, g], rtol=1e-12, atol=1e-15)


#: The node counts these tests were written for (``theory.nodes = 64`` at a scale ``alpha <= 1``).
NODES = {"n_t": 128, "n_outer": 64, "n_inner": 64}


def _rule(name, L, prior, H=1):
    return LaplaceRule.make(exponential_form(sl.get_activation(name), L), L, H, prior, **NODES)


@eqx.filter_jit
def _gram(rule, M, Q, b):
    return rule.gram(M, Q, b)


@pytest.mark.parametrize("name, offset", [("softmax", 0.0), ("softmax1", 1.0)])
def test_constant_weights_give_the_closed_form(name, offset):
    """Keys of zero length and no bias: every weight is ``1 / (kappa + L)``, and the Gram term is the
    sum over tokens of ``c_l^2`` at those weights."""
    L = 6
    rule = _rule(name, L, sl.spikes(1, 2.0))
    A = np.full(L, 1.0 / (offset + L))
    e = 2 * (A - np.eye(L)[0])
    expected = np.sum((A * (e - e @ A)) ** 2)
    value = float(_gram(rule, jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.zeros(1))[0, 0])
    assert value == pytest.approx(expected, rel=1e-9)


def monte_carlo_gram(name, prior, L, M, Q, b, n=2**15, batches=8, seed=0):
    """Plain Monte Carlo of ``sum_l c_l^2`` over whole sequences (the loss gradient by autodiff), with
    its standard error."""
    act = sl.get_activation(name)
    atoms, probs = jnp.asarray(prior.atoms_array()), jnp.asarray(prior.probs_array())

    @jax.jit
    def batch(key):
        k1, k2 = jax.random.split(key)
        g = jax.random.normal(k1, (n, L, 1)) * jnp.sqrt(Q[0, 0])
        g = g.at[:, 0].add(atoms[jax.random.choice(k2, len(probs), (n,), p=probs)] @ M.T)
        c = jax.vmap(lambda x: jax.grad(lambda s: limit_loss(act, s, 0))(x.T + b[:, None]))(g)
        G = jnp.sum(c**2, axis=(1, 2))
        return G.mean(), G.var()

    out = np.array([batch(k) for k in jax.random.split(jax.random.PRNGKey(seed), batches)])
    return out[:, 0].mean(), np.sqrt(out[:, 1].mean() / (n * batches))


#: Trained one-head states: softmax on one spike at tau = 300 (long key), softmax1 with a bias on
#: two spikes, ssmax at L = 64, bsoftmax (one head: softmax) at L = 16.
STATES = [
    ("softmax", 4, 1, [[1.96]], [[3.86]], [0.0]),
    ("softmax1", 8, 2, [[1.5, 0.3]], [[2.6]], [0.2]),
    ("ssmax", 64, 1, [[0.5]], [[0.4]], [0.0]),
    ("bsoftmax", 16, 1, [[2.2]], [[5.0]], [-0.3]),
]


@pytest.mark.parametrize("name, L, F, M, Q, b", STATES)
def test_the_exact_gram_term_agrees_with_monte_carlo(name, L, F, M, Q, b):
    prior = sl.spikes(F, 2.5)
    M, Q, b = (jnp.asarray(x, float) for x in (M, Q, b))
    value = float(_gram(_rule(name, L, prior), M, Q, b)[0, 0])
    ref, se = monte_carlo_gram(name, prior, L, M, Q, b)
    assert abs(value - ref) < 5 * se, (value, ref, se)
    assert se < 0.01 * ref  # the check resolves the term to a percent


@pytest.mark.slow
def test_the_exact_gram_term_at_a_long_sequence():
    """L = 1024, a trained key: the rank-aware Sobol rule at 4096 points (the budget's choice there)
    was off by 5% (0.02712 +- 0.00018 over 8 scramblings), the exact term agrees with Monte Carlo of
    2^19 sequences."""
    prior = sl.spikes(1, 2.5)
    M, Q, b = jnp.array([[2.5]]), jnp.array([[6.5]]), jnp.zeros(1)
    value = float(_gram(_rule("softmax", 1024, prior), M, Q, b)[0, 0])
    ref, se = monte_carlo_gram("softmax", prior, 1024, M, Q, b, n=2**14, batches=32)
    assert abs(value - ref) < 5 * se, (value, ref, se)


@pytest.mark.parametrize("name, L, F, M, Q, b", STATES[:2])
def test_the_stated_error_is_against_the_finer_rule(name, L, F, M, Q, b):
    rule = _rule(name, L, sl.spikes(F, 2.5))
    M, Q, b = (jnp.asarray(x, float) for x in (M, Q, b))
    value, finer = float(_gram(rule, M, Q, b)[0, 0]), float(_gram(rule.refined(), M, Q, b)[0, 0])
    assert abs(value - finer) < 1e-9 * abs(finer)


#: A one-head problem on the exact route (the canonical tiny problem with one head): its solve holds the exact Gram
#: term; the two tests below share its program (the horizon and the start are values).
ONE_HEAD = ("model.heads=1", "theory.route=exact")


def test_a_one_head_ode_has_the_exact_gram_term_and_states_it():
    cfg = tiny(*ONE_HEAD, "sgd.tau_max=5")
    ode = sl.OrderParameterODE.from_setup(sl.build(cfg))
    assert ode.expectation.gram_name == "exact"
    result = sl.integrate(cfg)
    assert result.gram_route == "exact" and result.gram_error < 1e-9
    assert "Gram term exact" in result.quadrature()
    two = sl.OrderParameterODE.from_setup(sl.build(cfg.replace(model={"heads": 2}))).expectation
    assert two.gram_name == "sobol"  # two heads at L = 3: the Sobol rule


def test_theory_gram_chooses_the_gram_term_and_names_itself_when_it_cannot():
    base = ["model.heads=2", "problem.F=1", "theory.route=exact"]
    ode = lambda *extra: sl.OrderParameterODE.from_setup(sl.build(sl.load_config("default", [*base, *extra]))).expectation  # noqa: E731
    exact = lambda e: e.gram_name == "exact"  # noqa: E731
    assert not exact(ode())  # auto at L = 4: the Sobol rule for two heads, where it is cheaper
    assert exact(ode("problem.L=32"))  # auto from L H = 64 on: the exact term, cheaper there
    assert not exact(ode("problem.L=32", "model.activation=bsoftmax"))  # a joint layer: the rule
    assert not exact(ode("problem.L=32", "theory.gram=sobol"))
    assert exact(ode("theory.gram=exact"))
    assert not exact(ode("model.heads=1", "theory.gram=sobol"))
    for extra in (["model.activation=bsoftmax"], ["model.heads=3"], ["model.head_weights=trained"]):
        with pytest.raises(ValueError, match="theory.gram = 'exact'"):
            ode("theory.gram=exact", *extra)
    with pytest.raises(ValueError, match="theory.gram"):
        sl.load_config("default", ["theory.gram=quadrature"])


def monte_carlo_gram2(name, prior, L, M, Q, b, n=2**15, batches=8, seed=0):
    """Plain Monte Carlo of ``sum_l c_l c_l^T`` (2, 2) of two heads over whole sequences."""
    act = sl.get_activation(name)
    atoms, probs = jnp.asarray(prior.atoms_array()), jnp.asarray(prior.probs_array())
    Qh = jnp.asarray(sl.psd_sqrt(np.asarray(Q)))

    @jax.jit
    def batch(key):
        k1, k2 = jax.random.split(key)
        g = jax.random.normal(k1, (n, L, 2)) @ Qh
        g = g.at[:, 0].add(atoms[jax.random.choice(k2, len(probs), (n,), p=probs)] @ M.T)
        c = jax.vmap(lambda x: jax.grad(lambda s: limit_loss(act, s, 0))(x.T + b[:, None]))(g)
        G = jnp.einsum("nhl,ngl->nhg", c, c)
        return G.mean(0), G.var(0)

    out = [batch(k) for k in jax.random.split(jax.random.PRNGKey(seed), batches)]
    return np.mean([o[0] for o in out], axis=0), np.sqrt(np.mean([o[1] for o in out], axis=0) / (n * batches))


@pytest.mark.parametrize("name, L, F, M, Q, b", [
    ("softmax", 4, 1, [[1.96], [1.96]], [[3.86, 3.85], [3.85, 3.86]], [0.0, 0.0]),  # near copies
    pytest.param("softmax", 4, 2, [[2.2, 0.1], [0.05, 2.1]], [[5.0, 0.3], [0.3, 4.6]], [0.0, 0.0],  # specialised
                 marks=pytest.mark.slow),
    pytest.param("softmax1", 8, 2, [[1.5, 0.3], [0.2, 1.4]], [[2.6, 0.5], [0.5, 2.3]], [0.2, -0.1], marks=pytest.mark.slow),
])
def test_the_exact_gram_term_of_two_heads_agrees_with_monte_carlo(name, L, F, M, Q, b):
    prior = sl.spikes(F, 2.5)
    M, Q, b = (jnp.asarray(x, float) for x in (M, Q, b))
    rule = _rule(name, L, prior, H=2)
    value = np.asarray(_gram(rule, M, Q, b))
    ref, se = monte_carlo_gram2(name, prior, L, M, Q, b)
    assert np.all(np.abs(value - ref) < 5 * se), (value, ref, se)
    assert np.all(se < 0.01 * ref)


def test_trained_head_weights_keep_the_sobol_gram_term():
    cfg = sl.load_config("default", ["model.heads=1", "problem.F=1", "model.head_weights=trained", "theory.route=exact"])
    ode = sl.OrderParameterODE.from_setup(sl.build(cfg))
    assert ode.expectation.route == "exact" and ode.expectation.gram_name == "sobol"


def test_a_gram_term_beyond_its_resolution_is_refused_naming_what_to_change():
    """A head with token fields of standard deviation 8, beyond what the exact Gram term resolves
    (``WIDE_GRAM_SIGMA`` at 64 nodes): the exact route's width check (``RESOLVED_SIGMA``, below
    ``WIDE_GRAM_SIGMA``, so the Gram term never meets fields it does not resolve) refuses the solve with the
    exact Gram term at its start, naming ``theory.nodes`` and ``theory.route``, instead of integrating it."""
    assert RESOLVED_SIGMA < WIDE_GRAM_SIGMA < 8.0
    cfg = tiny(*ONE_HEAD, "sgd.tau_max=0.01")
    M = jnp.array([[8.0]])
    with pytest.raises(FloatingPointError, match=r"grew wider than its rule resolves.*theory\.route = 'rule'.*theory\.nodes"):
        sl.integrate(cfg, (M, M @ M.T + 0.4 * jnp.eye(1), jnp.zeros(1)))


@pytest.mark.parametrize("replicates", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_sobol_gram_term_with_a_large_error_warns_with_its_effect_on_the_risk(replicates):
    """Three heads (the Gram term on the Sobol rule) with long keys and few Gram points: the warning names
    ``theory.replicates``, and with replicates it states their standard error of the risk."""
    cfg = sl.load_config("default", ["sgd.tau_max=0.01", "sgd.n_save=2", "model.heads=3", "theory.route=exact",
                                     "theory.gram_points=64",
                                     f"theory.replicates={replicates}"])
    M = jnp.array([[3.5, 0.3], [0.2, 3.5], [2.5, 2.4]])
    match = r"Gram term has a stated relative error .*" + (
        r"standard error of the risk over the 2 replicates" if replicates == 2 else r"theory\.replicates = 2 or more")
    with pytest.warns(UserWarning, match=match):
        r = sl.integrate(cfg, (M, M @ M.T + 0.3 * jnp.eye(3), jnp.zeros(3)))
    assert r.gram_error > 1e-2
