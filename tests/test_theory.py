"""The population risk and the ODE drift against independent routes.

* The O(lr) part of the drift must be the gradient flow of R(M, Q, b) through the order
  parameters (derivatives of R alone, by autodiff through the symmetric square root):
  dM = -lr (P + (G + G^T) M), dQ = -lr (P M^T + M P^T + (G + G^T) Q + Q (G + G^T)).
* At the exact Bayes points of docs/model.md section 6 that part vanishes.
* The quadrature agrees with plain Monte Carlo over (g, nu) drawn directly, within the MC error.
* Identical heads stay identical (the rule does not break the permutation symmetry).

Tolerances come from the quadrature error, estimated as the spread between independent
scramblings of the rule.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import singleloc as sl
from singleloc import LocalFields, OrderParameterODE


def make_ode(activation="softmax", prior=None, L=4, H=2, points=4096, seed=0, lr=0.5, train_bias=True):
    prior = prior or sl.spikes(2, 2.5)
    rule = sl.SobolExpectation(fields=LocalFields.make(L, H, prior, points, seed), activation=sl.get_activation(activation))
    return OrderParameterODE(rule, sl.OnlineSGD(lr, train_bias))


def random_point(H, F, rng, scale=0.8):
    M = rng.normal(size=(H, F)) * scale
    A = rng.normal(size=(H, H)) * 0.5
    Q = M @ M.T + A @ A.T
    b = rng.normal(size=H) * 0.3
    return jnp.asarray(M), jnp.asarray(Q), jnp.asarray(b)


def first_order_drift(ode_factory, M, Q, b):
    """The O(lr) part d1 of drift = lr d1 + lr^2 d2, from lr = 1 and lr = 2 (black box)."""
    d_1 = ode_factory(1.0).drift(M, Q, b)
    d_2 = ode_factory(2.0).drift(M, Q, b)
    return [(4 * x - y) / 2 for x, y in zip(d_1, d_2)]


def gradient_flow(ode, M, Q, b):
    """-(P + (G + G^T) M), -(P M^T + M P^T + (G + G^T) Q + Q (G + G^T)), -dR/db from R alone."""
    P, G, Pb = jax.grad(ode.risk, argnums=(0, 1, 2))(M, Q, b)
    S = G + G.T
    return [-(P + S @ M), -(P @ M.T + M @ P.T + S @ Q + Q @ S), -Pb]


@pytest.mark.parametrize("activation", ["softmax", "softmax1", "bsoftmax"])
def test_drift_is_gradient_flow_plus_lr2_term(activation):
    rng = np.random.default_rng(3)
    M, Q, b = random_point(2, 2, rng)
    results = []
    for seed in (0, 1):
        d1 = first_order_drift(lambda lr, seed=seed: make_ode(activation, seed=seed, lr=lr), M, Q, b)
        gf = gradient_flow(make_ode(activation, seed=seed, lr=1.0), M, Q, b)
        results.append((d1, gf))
    # quadrature error: spread of each route between two independent scramblings
    spread = max(float(jnp.max(jnp.abs(x - y))) for i in (0, 1) for x, y in zip(results[0][i], results[1][i]))
    for d1, gf in results:
        for name, x, y in zip("MQb", d1, gf):
            assert float(jnp.max(jnp.abs(x - y))) <= 3 * spread + 1e-8, (name, x, y)
    scale = max(float(jnp.max(jnp.abs(x))) for x in results[0][0])
    assert spread < 0.02 * scale  # the rule itself is accurate to a few per mille of the drift


def test_drift_matches_gradient_flow_for_a_user_activation():
    """A newly registered activation gets its ODE from autodiff, with no further code."""

    def sigmoid_attention(s):
        return jax.nn.sigmoid(s) / s.shape[-1]

    sl.register_activation("test_sigmoid", sigmoid_attention, overwrite=True)
    rng = np.random.default_rng(5)
    M, Q, b = random_point(2, 2, rng)
    d1 = first_order_drift(lambda lr: make_ode("test_sigmoid", lr=lr), M, Q, b)
    gf = gradient_flow(make_ode("test_sigmoid", lr=1.0), M, Q, b)
    d1b = first_order_drift(lambda lr: make_ode("test_sigmoid", seed=1, lr=lr), M, Q, b)
    spread = max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(d1, d1b))
    for x, y in zip(d1, gf):
        assert float(jnp.max(jnp.abs(x - y))) <= 3 * spread + 1e-8


def test_bayes_point_of_bsoftmax_is_stationary():
    """Discrete prior with K atoms, H = K bsoftmax heads at M_h = theta^(h), R_orth = 0,
    b_h = log pi_h - |theta^(h)|^2 / 2 reproduce the Bayes estimator: a global minimum."""
    prior = sl.discrete([[2.0, 0.5], [-0.5, 1.5], [1.0, -1.5]], [0.5, 0.3, 0.2])
    atoms, probs = prior.atoms_array(), prior.probs_array()
    M = jnp.asarray(atoms)
    Q = M @ M.T
    b = jnp.asarray(np.log(probs) - 0.5 * np.sum(atoms**2, axis=1))
    make = lambda lr, seed=0: make_ode("bsoftmax", prior=prior, H=3, seed=seed, lr=lr)  # noqa: E731
    d1 = first_order_drift(make, M, Q, b)
    # the scale of the drift away from the optimum, to make "vanishes" meaningful
    d_off = first_order_drift(make, 0.7 * M, 0.7**2 * Q, b)
    off = max(float(jnp.max(jnp.abs(x))) for x in d_off)
    d1b = first_order_drift(lambda lr: make(lr, seed=1), M, Q, b)
    spread = max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(d1, d1b))
    for x in d1:
        assert float(jnp.max(jnp.abs(x))) <= 3 * spread + 1e-6
    assert off > 10 * (3 * spread + 1e-6)


def test_softmax_point_is_stationary_for_a_point_prior():
    """F = 1, theta = strength: one softmax head with M = strength, Q = strength^2."""
    s = 2.0
    prior = sl.discrete([[s]], [1.0])
    M, Q, b = jnp.array([[s]]), jnp.array([[s * s]]), jnp.zeros(1)
    make = lambda lr, seed=0: make_ode("softmax", prior=prior, H=1, seed=seed, lr=lr, train_bias=False)  # noqa: E731
    d1 = first_order_drift(make, M, Q, b)
    d1b = first_order_drift(lambda lr: make(lr, seed=1), M, Q, b)
    spread = max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(d1, d1b))
    d_off = first_order_drift(make, 0.5 * M, 0.25 * Q, b)
    for x in d1:
        assert float(jnp.max(jnp.abs(x))) <= 3 * spread + 1e-6
    assert float(jnp.max(jnp.abs(d_off[0]))) > 1e-2


@pytest.mark.parametrize("activation", ["softmax", "softmax1", "bsoftmax"])
def test_risk_agrees_with_monte_carlo(activation):
    """R(M, Q, b) by the rule against plain Monte Carlo over fields drawn independently
    (token position eps uniform, Cholesky of the joint covariance), within 4 MC errors."""
    rng = np.random.default_rng(11)
    H, F, L = 2, 2, 4
    M, Q, b = (np.asarray(x) for x in random_point(H, F, rng))
    prior = sl.flipped(F, 2.0)
    risk = float(make_ode(activation, prior=prior).risk(jnp.asarray(M), jnp.asarray(Q), jnp.asarray(b)))

    n = 200_000
    C = np.block([[Q, M], [M.T, np.eye(F)]])
    chol = np.linalg.cholesky(C + 1e-12 * np.eye(H + F))
    z = rng.normal(size=(n, L, H + F)) @ chol.T
    atoms = prior.atoms_array()
    theta = atoms[rng.integers(len(atoms), size=n)]
    eps = rng.integers(L, size=n)
    g = z[..., :H]
    g[np.arange(n), eps] += theta @ M.T
    s = np.swapaxes(g, 1, 2) + b[None, :, None]
    act = sl.get_activation(activation)
    losses = np.asarray(jax.vmap(lambda s, e: sl.limit_loss(act, s, e))(jnp.asarray(s), jnp.asarray(eps)))
    se = losses.std() / np.sqrt(n)
    assert abs(losses.mean() - risk) < 4 * se + 1e-4


def test_identical_heads_stay_identical():
    """Q singular (two identical heads): the drift keeps the heads identical."""
    ode = make_ode("softmax1")
    M = jnp.array([[0.3, 0.1], [0.3, 0.1]])
    Q = jnp.full((2, 2), 0.5)
    b = jnp.array([0.2, 0.2])
    dM, dQ, db = ode.drift(M, Q, b)
    assert np.all(np.isfinite(dM)) and np.all(np.isfinite(dQ))
    np.testing.assert_array_equal(np.asarray(dM[0]), np.asarray(dM[1]))
    np.testing.assert_allclose(np.asarray(dQ), np.asarray(dQ[0, 0]) * np.ones((2, 2)), rtol=1e-12, atol=1e-14)
    assert float(db[0]) == float(db[1])


def test_quadrature_reproduces_gaussian_moments():
    """E[g g^T] = Q + M E[theta theta^T] M^T on token 0 and Q elsewhere, with a Gaussian prior."""
    prior = sl.gaussian([0.5, -1.0], [[1.0, 0.3], [0.3, 0.5]])
    rule = LocalFields.make(3, 2, prior, 1024, 0)
    rng = np.random.default_rng(2)
    M, Q, _ = random_point(2, 2, rng)
    m = rule.expect(lambda g, theta: {"g0": jnp.outer(g[0], g[0]), "g1": jnp.outer(g[1], g[1]), "t": theta}, M, Q)
    Ett = prior.cov() + np.outer(prior.mean(), prior.mean())
    np.testing.assert_allclose(m["t"], prior.mean(), atol=1e-12)  # odd moments exact (antithetic)
    np.testing.assert_allclose(m["g1"], Q, atol=2e-3 * float(jnp.max(Q)))
    np.testing.assert_allclose(m["g0"], Q + M @ Ett @ M.T, atol=5e-3 * float(jnp.max(Q + M @ Ett @ M.T)))


@pytest.mark.parametrize("activation", ["softmax1", "bsoftmax"])
def test_drift_agrees_with_monte_carlo_over_g_and_nu(activation):
    """docs/model.md's drift taken literally: draw (g_l, nu_l) jointly (Cholesky of
    C = [[Q, M], [M^T, I]]), eps uniform, and average -lr sum_l c_l nu_l^T etc.; the quadrature
    route (conditional means, no nu drawn) must agree within 4 Monte Carlo errors."""
    rng = np.random.default_rng(8)
    H, F, L, lr = 2, 2, 4, 0.5
    M, Q, b = (np.asarray(x) for x in random_point(H, F, rng, scale=0.6))
    prior = sl.spikes(F, 2.0)
    dM, dQ, db = make_ode(activation, prior=prior, lr=lr).drift(jnp.asarray(M), jnp.asarray(Q), jnp.asarray(b))

    n = 200_000
    chol = np.linalg.cholesky(np.block([[Q, M], [M.T, np.eye(F)]]))
    z = rng.normal(size=(n, L, H + F)) @ chol.T
    theta = prior.atoms_array()[rng.integers(F, size=n)]
    eps = rng.integers(L, size=n)
    z[np.arange(n), eps] += np.concatenate([theta @ M.T, theta], axis=1)
    g, nu = z[..., :H], z[..., H:]
    act = sl.get_activation(activation)
    scores = jnp.asarray(np.swapaxes(g, 1, 2) + b[None, :, None])
    c = np.asarray(jax.vmap(jax.grad(lambda s, e: sl.limit_loss(act, s, e)))(scores, jnp.asarray(eps)))
    samples = {
        "M": -lr * np.einsum("nhl,nlf->nhf", c, nu),
        "Q": -lr * (np.einsum("nhl,nlk->nhk", c, g) + np.einsum("nkl,nlh->nhk", c, g)) + lr**2 * np.einsum("nhl,nkl->nhk", c, c),
        "b": -lr * c.sum(axis=2),
    }
    for name, value in zip("MQb", (dM, dQ, db)):
        mean, se = samples[name].mean(0), samples[name].std(0) / np.sqrt(n)
        assert np.all(np.abs(mean - np.asarray(value)) < 4 * se + 2e-4), (name, mean, np.asarray(value), se)
