"""The exact route (singleloc.expectations._laplace): its risk against independent references.

* plain Monte Carlo over whole sequences, with its standard error, at trained states: heads
  that are exact copies, near copies (small ``R_orth``), specialised heads, random states; the
  attention masses likewise;
* closed forms: zero keys (uniform softmax weights, ``R = 1 - 1/L``; softmax1 and bsoftmax
  likewise), at ``L`` up to 4096;
* exact identities between the module's own pieces that share no code path: ``H`` identical
  heads of a per-head layer (pairs of heads, conditional variance zero) equal one head (no
  pairs); the bsoftmax Bayes point of a discrete prior has the Bayes risk (MODEL.md section 6).

Derivatives: tests/test_laplace_gradients.py; wide token fields (the profile grid): tests/test_laplace_wide.py;
the joint layer (bsoftmax): tests/test_laplace_joint.py; the Gram term: tests/test_laplace_gram.py.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _exact import _mass, _risk, _value_and_grad, rule_for, trained_state

import singleloc as sl
from singleloc.model._activations import exponential_form
from singleloc.model._layer import limit_loss

pytestmark = pytest.mark.exact_route


#: Every registered activation that declares a normalised-exponential form (the exact route's family).
ACTIVATIONS = tuple(a for a in sl.activation_names() if exponential_form(sl.get_activation(a), 4) is not None)
assert set(ACTIVATIONS) >= {"softmax", "softmax1", "bsoftmax", "ssmax"}
SLOW = pytest.mark.slow


@eqx.filter_jit
def _gram(rule, M, Q, b):
    return rule.gram(M, Q, b)


def test_a_sweep_over_L_compiles_the_risk_its_gradient_and_the_gram_term_once(programs):
    """``L`` and the scalable softmax's ``alpha = log L`` are arrays of the rule, not static fields
    (issue 49): rules that differ in them alone share one compiled risk with its gradient and one Gram
    term. Counted by JAX's backend-compile events: after the first ``L`` of softmax, ``L = 64, 1024,
    4096`` compile nothing, nor does ssmax at any ``L`` (its program is softmax's), nor a joint layer
    after its first ``L``. Each rule still has its own ``L``: at zero keys ``R = 1 - 1/L`` exactly."""
    H, F = 2, 2
    prior = sl.spikes(F, 2.5)
    state = (jnp.zeros((H, F)), jnp.zeros((H, H)), jnp.array([0.3, -0.2]))
    for name in ("softmax", "ssmax", "bsoftmax"):
        for i, L in enumerate((4, 64, 1024, 4096)):
            before = len(programs)
            rule = rule_for(name, L, H, prior)
            risk, grads = _value_and_grad(rule, *state)
            gram = _gram(rule, *state) if rule.exact_gram else jnp.zeros((H, H))
            assert float(risk) == pytest.approx(1 - 1 / L, abs=1e-10), (name, L)
            assert all(bool(jnp.all(jnp.isfinite(x))) for x in (*grads, gram))
            if i > 0 or name == "ssmax":
                assert programs[before:] == [], (name, L, programs[before:])


def monte_carlo(name, prior, L, M, Q, b, n=2**18, seed=0, batches=4):
    """Plain Monte Carlo risk of whole sequences (fields sampled directly), with its standard error."""
    act = sl.get_activation(name)
    H = Q.shape[0]
    Qh = jnp.asarray(sl.psd_sqrt(np.asarray(Q)))
    atoms, probs = jnp.asarray(prior.atoms_array()), jnp.asarray(prior.probs_array())
    cs = jnp.asarray(prior.cov_sqrt())

    @jax.jit
    def batch(key):
        k1, k2, k3 = jax.random.split(key, 3)
        g = jax.random.normal(k1, (n, L, H)) @ Qh
        theta = atoms[jax.random.choice(k2, len(probs), (n,), p=probs)] + jax.random.normal(k3, (n, cs.shape[1])) @ cs.T
        g = g.at[:, 0].add(theta @ M.T)
        f = jax.vmap(lambda x: limit_loss(act, x.T + b[:, None], 0))(g)
        return f.mean(), f.var()

    out = np.array([batch(k) for k in jax.random.split(jax.random.PRNGKey(seed), batches)])
    return out[:, 0].mean(), np.sqrt(out[:, 1].mean() / (n * batches))


MC_CASES = [(name, *case) for name in ACTIVATIONS
            for case in [("copies", 4, 1, 4), ("near", 3, 2, 8), ("specialised", 2, 2, 4), ("random", 3, 2, 4)]]


DEFAULT_MC = {("softmax", "copies"), ("bsoftmax", "near"), ("softmax1", "specialised"), ("ssmax", "random")}


@pytest.mark.parametrize("name,kind,H,F,L", [pytest.param(*c, marks=() if c[:2] in DEFAULT_MC else SLOW) for c in MC_CASES])
def test_risk_matches_monte_carlo_at_trained_states(name, kind, H, F, L, rng):
    prior = sl.spikes(F, 2.5)
    M, Q, b = trained_state(kind, H, F, rng)
    exact = float(_risk(rule_for(name, L, H, prior), M, Q, b))
    mean, se = monte_carlo(name, prior, L, M, Q, b)
    assert abs(exact - mean) < 4.5 * se, (exact, mean, se)


@pytest.mark.slow
@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("kind,H,F,L", [("copies", 6, 1, 4), ("near", 8, 2, 8), ("specialised", 4, 2, 16), ("near", 2, 1, 64)])
def test_risk_matches_large_monte_carlo(name, kind, H, F, L, rng):
    prior = sl.spikes(F, 2.5)
    M, Q, b = trained_state(kind, H, F, rng)
    exact = float(_risk(rule_for(name, L, H, prior), M, Q, b))
    mean, se = monte_carlo(name, prior, L, M, Q, b, n=2**19 if L <= 16 else 2**16, batches=16)
    assert abs(exact - mean) < 4.5 * se, (exact, mean, se)


@pytest.mark.parametrize("L", [2, pytest.param(64, marks=SLOW), 4096])
def test_zero_keys_closed_forms(L):
    """``Q = 0``: every score is the bias. Softmax and bsoftmax weights are ``1/L``
    (``R = 1 - 1/L``); softmax1 weights ``c = mean_h e^b_h / (1 + L e^b_h)``, ``R = (1 - c)^2 + (L-1) c^2``."""
    H, F = 3, 2
    prior = sl.spikes(F, 2.5)
    M, Q = jnp.zeros((H, F)), jnp.zeros((H, H))
    b = jnp.array([-0.7, 0.1, 1.3])
    for name in ("softmax", "bsoftmax", "ssmax"):
        assert float(_risk(rule_for(name, L, H, prior), M, Q, b)) == pytest.approx(1 - 1 / L, abs=1e-10)
    c = float(np.mean(np.exp(b) / (1 + L * np.exp(b))))
    assert float(_risk(rule_for("softmax1", L, H, prior), M, Q, b)) == pytest.approx((1 - c) ** 2 + (L - 1) * c**2, abs=1e-10)


@pytest.mark.parametrize("name,L", [pytest.param("softmax", 4, marks=SLOW), ("softmax", 256),
                                    pytest.param("softmax1", 4, marks=SLOW), pytest.param("softmax1", 256, marks=SLOW),
                                    ("ssmax", 4), pytest.param("ssmax", 8, marks=SLOW)])
def test_identical_heads_equal_one_head(name, L):
    """Copies of one head make a per-head layer one head: the pair integrals (conditional
    variance exactly zero) against the single-head integrals, which are exact at any token
    variance (the profile grid). The pairs' first field is on the normal rule's nodes: at ssmax's
    token variance of about 15 (L = 8) Gauss-Hermite nodes were off by 3e-8, and the stated error
    (against the refined rule) covers what is left; elsewhere they agree to 1e-9."""
    prior = sl.gaussian([1.0, 0.5], [[1.0, 0.2], [0.2, 0.5]])
    m, q, bias = np.array([[1.4, -0.6]]), np.array([[2.1]]), np.array([0.4])
    one = float(_risk(rule_for(name, L, 1, prior), jnp.asarray(m), jnp.asarray(q), jnp.asarray(bias)))
    H = 4
    copies = (jnp.asarray(np.repeat(m, H, 0)), jnp.full((H, H), q[0, 0]), jnp.full(H, bias[0]))
    rule = rule_for(name, L, H, prior)
    many = float(_risk(rule, *copies))
    stated = abs(many - float(_risk(rule.refined(), *copies)))
    assert abs(many - one) <= max(1e-9, 2 * stated)


@pytest.mark.parametrize("K", [pytest.param(1, marks=SLOW), 2, pytest.param(3, marks=SLOW)])
def test_bayes_point_has_the_bayes_risk(K):
    """MODEL.md section 6: bsoftmax with H = K heads at the Bayes point is the Bayes estimator."""
    prior = sl.spikes(K, 2.5) if K > 1 else sl.discrete([[2.5]], [1.0])
    L = 6
    M, Q, b = sl.bayes_point(prior)
    exact = float(_value_and_grad(rule_for("bsoftmax", L, K, prior), M, Q, b)[0])
    bayes = sl.bayes_risk(prior, L, points=8192, replicates=8, route="rule")  # the closed-form posterior
    assert abs(exact - bayes.value) < 5 * bayes.error + 1e-6, (exact, bayes)


@pytest.mark.parametrize("name", ["softmax1", "bsoftmax", pytest.param("softmax", marks=SLOW), pytest.param("ssmax", marks=SLOW)])
def test_attention_mass_matches_monte_carlo_at_trained_states(name, rng):
    """``w_h = E[sum_l A_hl]`` on the exact route at near copies with a switched-off head (bias -12)
    against plain Monte Carlo over whole sequences, within 5 standard errors; softmax heads have
    exactly 1 and bsoftmax heads sum to H."""
    H, F, L = 3, 2, 8
    M, Q, b = trained_state("near", H, F, rng)
    b = b.at[2].set(-12.0)
    prior = sl.spikes(F, 2.5)
    w = np.asarray(_mass(rule_for(name, L, H, prior), M, Q, b))
    act = sl.get_activation(name)
    Qh = jnp.asarray(sl.psd_sqrt(np.asarray(Q)))
    atoms = jnp.asarray(prior.atoms_array())

    @jax.jit
    def batch(key):
        k1, k2 = jax.random.split(key)
        g = jax.random.normal(k1, (2**17, L, H)) @ Qh
        g = g.at[:, 0].add(atoms[jax.random.choice(k2, len(atoms), (2**17,))] @ M.T)
        mass = jax.vmap(lambda x: jnp.sum(act(x.T + b[:, None]), axis=1))(g)  # (n, H)
        return mass.mean(0), mass.var(0)

    out = [batch(k) for k in jax.random.split(jax.random.PRNGKey(3), 4)]
    ref = np.mean([o[0] for o in out], axis=0)
    se = np.sqrt(np.mean([o[1] for o in out], axis=0) / (4 * 2**17))
    assert np.all(np.abs(w - ref) < 5 * se + 1e-10), (w, ref, se)  # 1e-10: the y range's neglected tails (TAIL_EPS)
    if name in ("softmax", "ssmax"):
        np.testing.assert_allclose(w, 1.0, atol=1e-9)
    if name == "bsoftmax":
        assert w.sum() == pytest.approx(H, abs=1e-9)
    if name == "softmax1":
        assert w[2] < 0.05 < w[0]  # the switched-off head


def test_route_rule_and_exact_are_chosen_from_the_config():
    cfg = sl.load_config("default")
    assert sl.OrderParameterODE.from_setup(sl.build(cfg)).expectation.route == "exact"
    assert sl.OrderParameterODE.from_setup(sl.build(cfg.replace(theory={"route": "rule"}))).expectation.route == "rule"
    sl.register_activation("test_laplace_relu", lambda s: jax.nn.relu(s) / (1e-9 + jnp.sum(jax.nn.relu(s), -1, keepdims=True)),
                           overwrite=True)
    other = cfg.replace(model={"activation": "test_laplace_relu"})
    assert sl.OrderParameterODE.from_setup(sl.build(other)).expectation.route == "rule"
    with pytest.raises(ValueError, match="theory.route"):
        sl.OrderParameterODE.from_setup(sl.build(other.replace(theory={"route": "exact"})))


def test_integrate_runs_on_the_exact_route_and_states_its_error(tiny_theory):
    """The users' default end to end on the canonical tiny problem trained to tau = 20 (a value: the
    session's exact program): the solve on the exact route, its stated risk error, and the same
    trajectory as the Sobol route of 1024 points to within that route's error (about 1e-3)."""
    from _tiny import tiny

    cfg = tiny("sgd.tau_max=20")
    exact = sl.integrate(cfg)
    assert exact.route == "exact" and exact.risk_error < 1e-8
    assert "exact route" in exact.quadrature() and "relative drift error" in exact.quadrature()
    assert np.isnan(exact.exact_drift_error) or exact.exact_drift_error < 1e-5
    rule = sl.integrate(cfg.replace(theory={"route": "rule", "points": 1024}))
    assert rule.route == "rule" and abs(rule.risk[0, -1] - exact.risk[0, -1]) < rule.risk_error + exact.risk_error
    assert exact.risk[0, -1] < exact.risk[0, 0] - 0.05  # it trained: the comparison is not of two starts
    np.testing.assert_allclose(exact.risk, rule.risk, atol=3e-3)


def test_gram_term_is_rank_aware(rng):
    """The exact route's lr^2 term at a trained state with near-copy heads: the rank-aware rule
    (principal axes, direction-major Sobol coordinates) against the head-symmetric one at the
    same points, both against the rank-aware rule at 2^17 points (its stated error: tests/test_scrambled_errors.py)."""
    H, L = 6, 4
    cfg = sl.load_config("default").replace(model={"heads": H}, problem={"F": 1})
    M, Q, b = trained_state("near", H, 1, rng)
    prior = cfg.problem.build_prior()
    gram = eqx.filter_jit(lambda fields, ode, *s: eqx.tree_at(lambda o: o.expectation.gram_term.fields, ode, fields).gram(*s))
    ode = sl.OrderParameterODE.from_setup(sl.build(cfg))
    ref = np.asarray(gram(sl.LocalFields.make(L, H, prior, 1 << 17, 99, principal=True), ode, M, Q, b))
    err = {}
    for principal in (False, True):
        err[principal] = np.mean([np.max(np.abs(np.asarray(gram(
            sl.LocalFields.make(L, H, prior, 4096, s, principal=principal, symmetric=not principal), ode, M, Q, b)) - ref))
            for s in range(4)])
    assert err[True] < err[False] / 3


def test_a_large_stated_error_warns_with_the_token_variance():
    """Few nodes (theory.nodes = 16: 32 nodes of y over a range of about 40) do not resolve even narrow fields
    to the route's targets: the solve's stated errors say so (a warning naming the token variance and
    theory.nodes), not silently. (Fields wider than the rule claims to resolve, 5 x 16 / 64 here, stop the
    solve instead: tests/test_resolved_width.py.)"""
    cfg = sl.load_config("default", ["sgd.tau_max=0.01", "sgd.n_save=2", "theory.nodes=16", "problem.F=1"])
    M = jnp.full((2, 1), 1.0)
    Q = M @ M.T + 0.5 * jnp.eye(2)  # token variance 1.5, within the width 1.25^2
    with pytest.warns(UserWarning, match=r"variance of 1\.5 .*raise theory\.nodes"):
        r = sl.integrate(cfg, (M, Q, jnp.zeros(2)))
    assert r.route == "exact" and (r.risk_error > 1e-6 or r.exact_drift_error > 1e-4)


def test_the_token_variance_named_by_the_warning_includes_the_priors_gaussian_part():
    """Under a Gaussian prior the relevant token's fields have variance ``alpha^2 (Q + M Sigma M^T)_hh``,
    ten times ``Q_hh`` at the trained softmax1 state of four heads on N(0, 3^2 I) (keys of 3.5, Q_hh 12.5,
    where the exact route at 64 nodes stated a risk error of 5e-5): the warning must name that variance."""
    from singleloc.expectations._laplace_expectation import largest_token_variance

    M = np.array([[-2.889, 1.824], [-1.893, -2.97], [2.987, -1.874], [1.852, 2.978]])
    Q = M @ M.T + 0.1 * np.eye(4)
    gaussian = sl.load_config("softmax1", ["problem.prior=gaussian", "problem.strength=3.0", "model.heads=4"])
    expected = max(Q[h, h] + 9.0 * M[h] @ M[h] for h in range(4))
    assert largest_token_variance(gaussian.problem.build_prior(), 1.0, M, Q) == pytest.approx(expected)
    prior = gaussian.problem.build_prior()
    assert largest_token_variance(prior, 2.0, M[None], Q[None]) == pytest.approx(4 * expected)  # alpha^2, a batch
    spikes = gaussian.replace(problem={"prior": "spikes"})  # discrete: the noise tokens' Q_hh
    assert largest_token_variance(spikes.problem.build_prior(), 1.0, M, Q) == pytest.approx(np.max(np.diag(Q)))
