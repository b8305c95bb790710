"""The fluctuation SDE: update covariance against single SGD steps, and the D -> infinity limit."""

from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import tiny

from singleloc import OrderParameterODE, OrderParameters, build, integrate
from singleloc.model._activations import get_activation
from singleloc.model._data import make_spikes, sample_sequence
from singleloc.model._layer import finite_loss
from singleloc.runtime._numerics import psd_sqrt
from singleloc.theory import _fluctuations as fl
from singleloc.theory._fluctuations import integrate_sde, update_moments
from singleloc.theory._theory import flatten_state

CFG = tiny("problem.L=4", "problem.F=2", "problem.prior=flipped", "problem.strength=3.0", "sgd.lr=1.0", "theory.points=256",
           preset="bsoftmax")


@pytest.mark.slow
def test_update_covariance_matches_single_sgd_steps():
    ode = OrderParameterODE.from_setup(build(CFG.replace(theory={"route": "rule"})))  # the covariance is the rule's
    D, H, F, L = 600, 2, 2, 4
    kstar = make_spikes(jax.random.PRNGKey(0), F, D).astype(jnp.float64)
    orth = jax.random.normal(jax.random.PRNGKey(1), (H, D))
    orth = 0.5 * (orth - (orth @ kstar.T / D) @ kstar)
    K = jnp.array([[0.8, 0.3], [-0.2, 0.6]]) @ kstar + orth
    b = jnp.array([0.1, -0.2])
    _, Sigma = update_moments(ode, K @ kstar.T / D, K @ K.T / D, b)
    grad = jax.grad(lambda K, b, X, eps: finite_loss(get_activation("bsoftmax"), K, b, X, eps), argnums=(0, 1))
    prior, iu = CFG.problem.build_prior(), np.triu_indices(H)

    def one(key):  # the increments of one step, times D / lr (lr = 1)
        X, eps = sample_sequence(key, prior, kstar, L)
        gK, gb = grad(K, b, X.astype(jnp.float64), eps)
        dQ = -(gK @ K.T + K @ gK.T) + gK @ gK.T  # K -> K - gK: D times the change of Q, its Gram term included
        return jnp.concatenate([-(gK @ kstar.T).ravel(), dQ[iu], -gb])

    u = np.asarray(jax.jit(jax.vmap(one))(jax.random.split(jax.random.PRNGKey(2), 20000)))
    emp = np.cov(u.T)
    # Relative error 0.04-0.06 over seeds (Monte Carlo of fourth moments, D = 600, 256 points); without the
    # fluctuation of the Gram term of Q it is 0.08-0.10.
    assert np.linalg.norm(np.asarray(Sigma) - emp) / np.linalg.norm(emp) < 0.07


@pytest.mark.slow
def test_sde_reduces_to_the_ode_as_D_grows():
    H = 2
    M0 = jnp.array([[[0.05, -0.02], [-0.03, 0.04]]])
    y0 = OrderParameters(M0, M0 @ jnp.swapaxes(M0, -1, -2) + 0.25 * jnp.eye(H), jnp.zeros((1, H)))
    ts = np.linspace(0.0, 2.0, 5)
    ode = integrate(CFG, y0, ts=ts, progress=False)
    y2 = OrderParameters(*(jnp.concatenate([x, x]) for x in y0))
    sde = integrate_sde(build(CFG), y2, jax.random.split(jax.random.PRNGKey(0), 2), D=jnp.array([1e12, 100.0]), ts=ts, dt=0.01)
    np.testing.assert_allclose(sde.M[0], ode.M[0], atol=2e-3)  # Euler at dt = 0.01 vs the adaptive solver
    np.testing.assert_allclose(sde.risk[0], ode.risk[0], atol=2e-3)
    assert np.abs(sde.M[1] - ode.M[0]).max() > 1e-2  # at D = 100 the noise shows


@pytest.mark.slow
def test_one_moment_evaluation_per_step(monkeypatch):
    """The SDE term's increment is ``drift dt + sqrt(Sigma / D) dW`` from a single
    :func:`update_moments` call (a drift term and a diffusion term would make two)."""
    ode = OrderParameterODE.from_setup(build(CFG.replace(theory={"route": "rule"})))
    M = jnp.array([[0.8, 0.3], [-0.2, 0.6]])
    Q, b = M @ M.T + 0.3 * jnp.eye(2), jnp.array([0.1, -0.2])
    v = flatten_state(M, Q, b)
    bm = diffrax.VirtualBrownianTree(0.0, 1.0, tol=0.01, shape=v.shape, key=jax.random.PRNGKey(3))
    term = fl._SDETerm(ode, ode.expectation.sde_rule, bm, b, jnp.asarray(1e-2), 2, 2)
    calls = []
    monkeypatch.setattr(fl, "update_moments", lambda *a: calls.append(1) or update_moments(*a))
    dt, dW = term.contr(0.0, 0.05)
    step = term.vf_prod(0.0, v, None, (dt, dW))
    assert len(calls) == 1
    drift, Sigma = update_moments(ode, M, Q, b)
    np.testing.assert_allclose(step, drift * 0.05 + psd_sqrt(Sigma * 1e-2) @ dW, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(dW, bm.evaluate(0.0, 0.05))


def test_a_non_finite_path_raises_naming_the_learning_rate():
    """diffrax reports a failed solve as NaN (the package traces its checks as NaN): the SDE checks its paths
    instead of returning them (on the tiny problem's rule: the subject is the check, not the layer)."""
    M0 = jnp.array([[[jnp.nan], [-0.03]], [[0.05], [-0.03]]])
    y0 = OrderParameters(M0, M0 @ jnp.swapaxes(M0, -1, -2) + 0.25 * jnp.eye(2), jnp.zeros((2, 2)))
    with pytest.raises(FloatingPointError, match=r"SDE path 0 stopped being finite by tau = 0 \(sgd.lr = 1.0"):
        integrate_sde(build(tiny("sgd.lr=1.0", rule=True)), y0, jax.random.split(jax.random.PRNGKey(0), 2), D=100.0,
                      ts=np.linspace(0.0, 0.2, 3), dt=0.05)
