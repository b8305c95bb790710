"""The exact route's joint layer (bsoftmax: every head's scores in one normalisation): its identities (copies
with biases ``b_h`` are one head with bias ``logsumexp(b)``; one joint head is one softmax head), its conditional
product form against a dense tensor rule with plain autodiff, its combination rule's moments and node budget, and
(slow) its drift at trained states against finer rules and plain Monte Carlo."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _exact import _mass, _risk, _value_and_grad, rule_for

import singleloc as sl
from singleloc.expectations._cubature import joint_node_count, joint_nodes
from singleloc.expectations._laplace_joint import joint_layout, refined_layout

pytestmark = pytest.mark.exact_route

SLOW = pytest.mark.slow


def test_bsoftmax_copies_equal_one_head_with_logsumexp_bias():
    prior = sl.spikes(2, 2.5)
    b = np.array([-1.0, 0.3, 0.5, 2.0])
    M1, Q1 = jnp.array([[1.2, 0.4]]), jnp.array([[2.5]])
    one = float(_risk(rule_for("bsoftmax", 8, 1, prior), M1, Q1, jnp.array([np.log(np.exp(b).sum())])))
    many = float(_risk(rule_for("bsoftmax", 8, 4, prior), jnp.repeat(M1, 4, 0), jnp.full((4, 4), 2.5), jnp.asarray(b)))
    assert many == pytest.approx(one, abs=1e-8)


def test_one_joint_head_is_one_softmax_head():
    """A joint layer of one head is softmax: its conditional product form smooths the head's whole
    variance on one node, the per-head layer's rule takes the profile grid (two code paths)."""
    prior = sl.spikes(2, 2.5)
    M, Q, b = jnp.array([[2.0, 0.3]]), jnp.array([[4.3]]), jnp.array([0.2])
    joint, single = rule_for("bsoftmax", 64, 1, prior), rule_for("softmax", 64, 1, prior)
    (rj, grads_j), (rs, grads_s) = _value_and_grad(joint, M, Q, b), _value_and_grad(single, M, Q, b)
    assert float(rj) == pytest.approx(float(rs), abs=1e-12)
    for gj, gs in zip(grads_j, grads_s):
        np.testing.assert_allclose(np.asarray(gj), np.asarray(gs), atol=1e-10)


def _near_the_spikes(H):
    """Heads near two spikes (``M_{h, h mod 2} = 2.4 - 0.05 h``) with a random ``R_orth`` of scale 0.15:
    key variances 10 to 16 on two directions, the others 0.03 to 0.1 beyond the smallest."""
    M = np.zeros((H, 2))
    for h in range(H):
        M[h, h % 2], M[h, (h + 1) % 2] = 2.4 - 0.05 * h, 0.05 * h
    A = 0.1 * np.random.default_rng(0).normal(size=(H, H))
    return M, M @ M.T + 0.15 * np.eye(H) + 0.03 + A @ A.T, np.linspace(-0.2, 0.2, H)


@SLOW
def test_eight_joint_heads_against_their_identities_and_monte_carlo():
    """bsoftmax at H = 8 on its default exact rule (the combination rule of seven directions). Copies of one head
    with biases ``b_h``: ``sum_h exp(k.xi + b_h) = exp(k.xi + lse(b))``, one softmax head of bias ``lse(b)`` (another
    code path: its whole variance smoothed in one table), and ``lse``'s derivative at the copies is ``p = softmax(b)``,
    so ``dR/dM_h = p_h dR_1/dM``, ``dR/db_h = p_h dR_1/db``: to 1e-8 (the copies' one direction, of width 2, on the
    64-node trapezoidal rule; two heads at widths to 3.5 are exact to 1e-13). A trained-like state (heads near two
    spikes, key variances 10 to 16, six small directions): the risk against plain Monte Carlo of the bsoftmax
    weights over 400000 sequences, within 5 standard errors."""
    prior, L, H = sl.spikes(2, 2.5), 16, 8
    rule = rule_for("bsoftmax", L, H, prior)
    m, q, bias = np.array([[1.9, 0.4]]), np.array([[4.3]]), np.linspace(-0.5, 0.5, H)
    v1, (gM1, _, gb1) = _value_and_grad(rule_for("bsoftmax", L, 1, prior), jnp.asarray(m), jnp.asarray(q),
                                        jnp.asarray([np.log(np.exp(bias).sum())]))
    v, (gM, _, gb) = _value_and_grad(rule, jnp.asarray(np.repeat(m, H, 0)), jnp.full((H, H), q[0, 0]), jnp.asarray(bias))
    p = np.exp(bias) / np.exp(bias).sum()
    assert abs(float(v) - float(v1)) < 1e-8
    np.testing.assert_allclose(np.asarray(gM), p[:, None] * np.asarray(gM1), atol=1e-8)
    np.testing.assert_allclose(np.asarray(gb), p * np.asarray(gb1), atol=1e-8)

    M, Q, b = _near_the_spikes(H)
    exact = float(_value_and_grad(rule, jnp.asarray(M), jnp.asarray(Q), jnp.asarray(b))[0])
    rng, chol, losses = np.random.default_rng(0), np.linalg.cholesky(Q), []
    atoms = np.asarray(prior.atoms_array())
    for _ in range(20):  # the fields' law (MODEL.md): noise tokens N(b, Q), the relevant one N(b + M theta, Q)
        x = b + rng.normal(size=(20000, L, H)) @ chol.T
        x[:, 0] += atoms[rng.choice(len(atoms), size=20000, p=np.asarray(prior.probs_array()))] @ M.T
        u = np.exp(x - x.max(axis=(1, 2), keepdims=True)).sum(axis=2)
        a = u / u.sum(axis=1, keepdims=True)
        losses.append((1 - a[:, 0]) ** 2 + np.sum(a[:, 1:] ** 2, axis=1))
    losses = np.concatenate(losses)
    assert abs(exact - losses.mean()) < 5 * losses.std() / np.sqrt(len(losses))


#: bsoftmax with H = 3 trained on two spikes (tau = 160 of the head-count point): two heads aligned with key
#: variances 5.6 and 5.8, a third between them.
THREE_TRAINED_HEADS = ([[0.015, 2.344], [0.336, 1.095], [2.366, -0.024]],
                       [[5.648, 2.571, -0.02], [2.571, 1.464, 0.767], [-0.02, 0.767, 5.757]], [0.09, -0.189, 0.099])


@SLOW
@pytest.mark.parametrize("H, state, reference, tolerance", [
    (3, THREE_TRAINED_HEADS, (96, 72), 1e-9),
    # a third direction of variance 0.07 beyond the smallest, on 5 Gauss-Hermite nodes (8 in the reference; on the
    # degree-5 rule, 3 nodes, it was off by 4.8e-5)
    (4, _near_the_spikes(4), (96, 72, 8), 1e-6),
])
def test_a_trained_joint_layer_has_an_accurate_drift(H, state, reference, tolerance):
    """bsoftmax trained on two spikes: the O(lr) drift of the default rule (normal rules on two leading
    directions and the next) against a rule of 1.5 x the leading nodes and every
    other direction on normal nodes, relative to the drift's largest entry (the quantity the solve
    states). The former tensor rule of 24 Gauss-Hermite nodes per direction was off by 5.7e-4 at the
    three-head state."""
    from singleloc.expectations._laplace_expectation import exact_moments

    cfg = sl.load_config("bsoftmax", ["problem.F=2", f"model.heads={H}", "theory.points=1024"])
    M, Q, b = (jnp.asarray(x, float) for x in state)
    ode = sl.OrderParameterODE.from_setup(sl.build(cfg))
    fine = rule_for("bsoftmax", 4, H, cfg.problem.build_prior(), joint_sizes=reference)
    drift = lambda rule: np.concatenate([np.ravel(x) for x in ode.sgd.drift(
        0.0, M, Q, b, exact_moments(rule, M, Q, b, None, jnp.zeros((H, H))))])
    d, ref = drift(ode.expectation.rule), drift(fine)
    assert np.max(np.abs(d - ref)) / np.max(np.abs(ref)) < tolerance


def _dense_joint_token(sizes):
    """A reference for one joint-layer token's ``E[f(y + lse(x))]`` (4, n_t) and the heads' shares of
    ``rho_1`` (n_t, H): a dense tensor rule of trapezoidal normal rules of ``sizes`` (one per head) on
    ``x = mean + z Lambda^(1/2) V^T`` (all principal axes of ``C``, none smoothed), ``lse`` evaluated
    at every node and differentiated by plain autodiff (through ``eigh``: the states below have
    distinct eigenvalues). It shares no code with the conditional product form but the profiles."""
    from singleloc.expectations._cubature import normal_rule
    from singleloc.expectations._laplace_profiles import RHO1, _profile, _profiles

    rules = [normal_rule(n) for n in sizes]
    z = jnp.asarray(np.stack([g.ravel() for g in np.meshgrid(*[r[0] for r in rules], indexing="ij")], axis=1))
    w = jnp.asarray(np.prod(np.meshgrid(*[r[1] for r in rules], indexing="ij"), axis=0).ravel())

    def nodes(mean, C):
        lam, V = jnp.linalg.eigh(C)
        return mean + (z * jnp.sqrt(jnp.maximum(lam, 0.0))) @ V.T

    def token(y, mean, C, *_):
        x = nodes(mean, C)
        return jax.lax.map(lambda yy: _profiles(yy + jax.nn.logsumexp(x, axis=-1)) @ w, y).T

    def shares(y, mean, C, *_):
        x = nodes(mean, C)
        p = w[:, None] * jax.nn.softmax(x, axis=-1)
        return jax.lax.map(lambda yy: _profile(yy + jax.nn.logsumexp(x, axis=-1), RHO1) @ p, y)

    return token, shares


@pytest.mark.parametrize("L, M, Q, b, reference, gradient_tolerance", [
    # two bsoftmax heads trained on two spikes at L = 16 (experiments/long_context.py --heads): variance 6.9
    (16, [[2.605, 0.005], [0.005, 2.605]], [[6.937, 0.025], [0.025, 6.937]], [0.0, 0.0], (160, 160), 1e-9),
    # wider, correlated, unequal heads with biases, at a long sequence (first field's standard deviation 2.9)
    pytest.param(1024, [[2.8, 0.3], [0.2, 2.6]], [[8.4, 1.1], [1.1, 7.3]], [0.3, -0.2], (160, 160), 1e-9, marks=SLOW),
    pytest.param(4, *THREE_TRAINED_HEADS, (96, 72, 48), 1e-8, marks=SLOW),
])
def test_a_joint_layer_is_exact_in_conditional_product_form(monkeypatch, L, M, Q, b, reference, gradient_tolerance):
    """bsoftmax: one token's ``E[f(y + lse(x))]`` in conditional product form (the smallest principal
    variance smoothed into each head's profiles, a tensor rule on the other directions,
    ``singleloc.expectations._laplace_joint._joint_token``; derivatives by Price's theorem) against a dense tensor rule
    over all ``H`` fields with ``lse`` at every node and plain autodiff (the former route, kept here
    as the reference): the risk to 1e-10, its gradient to ``gradient_tolerance`` of its size, the
    attention masses to 1e-10."""
    import singleloc.expectations._laplace_joint as laplace

    prior = sl.spikes(2, 2.5)
    state = (jnp.asarray(M, float), jnp.asarray(Q, float), jnp.asarray(b, float))
    flat = lambda d: np.concatenate([np.ravel(x) for x in d])
    rule = rule_for("bsoftmax", L, len(b), prior)

    value, grad = _value_and_grad(rule, *state)
    r, g, w = float(value), flat(grad), np.asarray(_mass(rule, *state))
    token, shares = _dense_joint_token(reference)
    monkeypatch.setattr(laplace, "_joint_token", token)
    monkeypatch.setattr(laplace, "_joint_shares", shares)
    # traced afresh (not the shared programs): the patched functions are looked up at tracing
    value, grad = jax.jit(lambda *x: jax.value_and_grad(rule.risk, argnums=(0, 1, 2))(*x))(*state)
    rr, gr, wr = float(value), flat(grad), np.asarray(jax.jit(lambda *x: rule.attention_mass(*x))(*state))
    assert abs(r - rr) < 1e-10
    assert np.max(np.abs(g - gr)) < gradient_tolerance * np.max(np.abs(gr))
    np.testing.assert_allclose(w, wr, atol=1e-10)


@pytest.mark.parametrize("H, F", [(2, 2), (3, 2), (4, 2), (4, 3), (5, 2), (8, 1)])
def test_the_refined_rule_is_the_rule_the_joint_budget_counts(H, F):
    """The refined rule (the stated error's reference) has 1.5 x the nodes of every kind (in a joint layer
    every leading normal rule and each small direction's Gauss-Hermite rule); the joint sizing that budgets the
    route (``joint_rule_size``, :mod:`singleloc.expectations._routes`) counts the nodes of exactly these rules."""
    from singleloc.expectations._laplace_joint import joint_rule_size

    prior = sl.spikes(F, 2.5)
    rule = sl.exact_rule(sl.get_activation("bsoftmax"), 8, H, prior)
    fine = rule.refined()
    assert (fine.n_t, fine.z_outer.shape[0], fine.z_inner.shape[0]) == (192, 96, 96)
    assert float(fine.u_grid[1] - fine.u_grid[0]) <= float(rule.u_grid[1] - rule.u_grid[0]) / 1.5
    work = lambda r: r.layer.w.shape[0] * H * len(prior.atoms)  # noqa: E731
    assert work(rule) == joint_rule_size(H, prior) and work(fine) == joint_rule_size(H, prior, refined=True)
    levels, small, axis = rule.layer.layout
    assert fine.layer.layout == (tuple(tuple(int(np.ceil(1.5 * n)) for n in sizes) for sizes in levels), small,
                                 int(np.ceil(1.5 * axis)))


@pytest.mark.parametrize("small", [1, 2, 5])
def test_the_joint_combination_rule_integrates_the_moments_it_claims(small):
    """``joint_nodes`` (a joint layer's token rule, the leading rules of a combination rule times difference rules
    on the small directions) against the moments of standard normals, ``E[z^(2k)] = (2k - 1)!!``: every monomial
    of degree 5 in the small coordinates times any leading moment its normal rules hold, and powers of one small
    coordinate up to ``2 axis - 1``; the weights sum to one."""
    import itertools
    import math

    from singleloc.expectations._cubature import joint_nodes

    axis = 5
    z, w = joint_nodes(((8, 6), (6, 4), (4, 2)), small, axis)
    moment = lambda k: 0.0 if k % 2 else float(math.prod(range(k - 1, 0, -2)))  # noqa: E731
    expect = lambda powers: math.prod(moment(k) for k in powers)  # noqa: E731
    lead = [(0, 0), (2, 0), (0, 2), (2, 1)]  # within the coarsest leading rule's (Gauss-Hermite 4 x 2) degree
    monomials = [p for d in range(6) for p in itertools.product(range(d + 1), repeat=small) if sum(p) == d]
    monomials += [(k,) + (0,) * (small - 1) for k in range(6, 2 * axis)] + [(0,) * (small - 1) + (8,)]
    for a, p in itertools.product(lead, monomials):
        powers = a + tuple(p)
        assert np.sum(w * np.prod(z ** np.array(powers), axis=1)) == pytest.approx(expect(powers), abs=1e-10), powers


@pytest.mark.parametrize("H", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("F", [1, 2, 3])
def test_the_joint_rules_size_is_counted_without_its_nodes(H, F):
    """The memory check's and the estimates' count of a joint layer's token nodes (from the weights alone) is the
    number of nodes the rule is built with, for the default and the refined layout."""
    for layout in (joint_layout(H, F), refined_layout(joint_layout(H, F))):
        assert joint_node_count(*layout) == len(joint_nodes(*layout)[1])
