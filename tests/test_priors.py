"""Priors of theta (docs/model.md section 1): sampled moments against hand-written closed forms.

For each prior the test writes down the support (or the Gaussian law) by hand, derives the
mean, covariance and the fourth central moments from it, checks ``prior.mean()`` and
``prior.cov()`` against them, and checks the sample moments of ``n`` draws of
``prior.sample`` within ``Z`` standard errors, the standard errors being derived from the
closed-form moments and ``n`` (not fitted to the sample).
"""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest

from singleloc import Prior, binary, discrete, flipped, gaussian, spikes

N = 200_000
Z = 5.0  # standard errors


def _discrete_moments(atoms, probs):
    """Mean, covariance and the standard errors of the sample mean and sample covariance
    of ``n`` i.i.d. draws of a finite law, all from the support."""
    atoms, probs = np.asarray(atoms, float), np.asarray(probs, float)
    mean = probs @ atoms
    c = atoms - mean
    cov = np.einsum("k,ki,kj->ij", probs, c, c)
    m4 = np.einsum("k,ki,kj->ij", probs, c**2, c**2)  # E[(X_i-mu_i)^2 (X_j-mu_j)^2]
    return mean, cov, np.sqrt(np.diag(cov) / N), np.sqrt(np.clip(m4 - cov**2, 0, None) / N)


def _gaussian_moments(mean, cov):
    mean, cov = np.asarray(mean, float), np.asarray(cov, float)
    d = np.diag(cov)
    # Isserlis: E[(X_i-mu_i)^2 (X_j-mu_j)^2] = S_ii S_jj + 2 S_ij^2, so Var = S_ii S_jj + S_ij^2
    return mean, cov, np.sqrt(d / N), np.sqrt((np.outer(d, d) + cov**2) / N)


def _check_samples(prior: Prior, mean, cov, se_mean, se_cov, seed: int):
    theta = np.asarray(prior.sample(jax.random.PRNGKey(seed), (N,)))
    assert theta.shape == (N, prior.F)
    assert np.all(np.isfinite(theta))
    m = theta.mean(axis=0)
    c = np.cov(theta, rowvar=False, bias=True).reshape(prior.F, prior.F)
    tol_m = Z * se_mean + 1e-12
    # the sample covariance is centred at the sample mean: an extra error (m_i - mu_i)(m_j - mu_j),
    # of order 1/n, which dominates when the fourth-moment term vanishes (e.g. |theta_f| constant)
    tol_c = Z * se_cov + Z**2 * np.outer(se_mean, se_mean) + 1e-12
    assert np.all(np.abs(m - mean) <= tol_m), (m, mean, tol_m)
    assert np.all(np.abs(c - cov) <= tol_c), (c, cov, tol_c)
    return theta


def _check_on_support(theta, atoms, probs):
    atoms = np.asarray(atoms, float)
    d = np.abs(theta[:, None, :] - atoms[None, :, :]).max(axis=2)  # (N, K)
    idx = d.argmin(axis=1)
    assert np.all(d[np.arange(len(theta)), idx] < 1e-6), "a sample is not a support point"
    freq = np.bincount(idx, minlength=len(atoms)) / len(theta)
    probs = np.asarray(probs, float)
    assert np.all(np.abs(freq - probs) <= Z * np.sqrt(probs * (1 - probs) / len(theta)) + 1e-12)


# -- discrete priors ---------------------------------------------------------------------


@pytest.mark.parametrize("F, strength", [(1, 1.5), (2, 2.5), (3, 1.0)])
def test_spikes(F, strength):
    prior = spikes(F, strength)
    atoms, probs = strength * np.eye(F), np.full(F, 1.0 / F)
    mean, cov, se_m, se_c = _discrete_moments(atoms, probs)
    # closed forms written out: E theta = s/F 1, Cov = s^2 (I/F - 1 1^T / F^2)
    np.testing.assert_allclose(mean, strength / F * np.ones(F), rtol=1e-12)
    np.testing.assert_allclose(cov, strength**2 * (np.eye(F) / F - np.ones((F, F)) / F**2), atol=1e-12)
    np.testing.assert_allclose(prior.mean(), mean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(prior.cov(), cov, rtol=1e-12, atol=1e-14)
    assert prior.F == F and prior.is_discrete
    theta = _check_samples(prior, mean, cov, se_m, se_c, seed=1)
    _check_on_support(theta, atoms, probs)


def test_flipped():
    F, s = 3, 2.0
    prior = flipped(F, s)
    atoms = np.concatenate([s * np.eye(F), -s * np.eye(F)])
    probs = np.full(2 * F, 1.0 / (2 * F))
    mean, cov, se_m, se_c = _discrete_moments(atoms, probs)
    np.testing.assert_allclose(mean, 0.0, atol=1e-14)  # zero mean
    np.testing.assert_allclose(cov, s**2 / F * np.eye(F), atol=1e-12)
    np.testing.assert_allclose(prior.mean(), mean, atol=1e-14)
    np.testing.assert_allclose(prior.cov(), cov, rtol=1e-12, atol=1e-14)
    theta = _check_samples(prior, mean, cov, se_m, se_c, seed=2)
    _check_on_support(theta, atoms, probs)


def test_binary_p03():
    F, s, p = 3, 2.0, 0.3
    prior = binary(F, s, p)
    atoms = np.array(list(itertools.product([0.0, s], repeat=F)))
    probs = np.array([np.prod([p if u else 1 - p for u in row]) for row in atoms])
    mean, cov, se_m, se_c = _discrete_moments(atoms, probs)
    np.testing.assert_allclose(mean, s * p * np.ones(F), rtol=1e-12)
    np.testing.assert_allclose(cov, s**2 * p * (1 - p) * np.eye(F), atol=1e-12)
    # fourth central moment of s*Bernoulli(p): s^4 p (1-p) ((1-p)^3 + p^3) ... on the diagonal
    se_diag = np.sqrt((s**4 * p * (1 - p) * ((1 - p) ** 3 + p**3) - (s**2 * p * (1 - p)) ** 2) / N)
    np.testing.assert_allclose(np.diag(se_c), se_diag, rtol=1e-10)
    np.testing.assert_allclose(prior.mean(), mean, rtol=1e-12)
    np.testing.assert_allclose(prior.cov(), cov, rtol=1e-12, atol=1e-14)
    theta = _check_samples(prior, mean, cov, se_m, se_c, seed=3)
    _check_on_support(theta, atoms, probs)


def test_discrete():
    support = [[1.0, 0.0], [0.0, 2.0], [-1.0, -1.0]]
    probs = [0.2, 0.5, 0.3]
    prior = discrete(support, probs)
    mean, cov, se_m, se_c = _discrete_moments(support, probs)
    np.testing.assert_allclose(mean, [0.2 - 0.3, 1.0 - 0.3], rtol=1e-12)
    ex2 = np.array([[0.2 + 0.3, 0.3], [0.3, 0.5 * 4 + 0.3]])  # E[theta theta^T] by hand
    np.testing.assert_allclose(cov, ex2 - np.outer(mean, mean), atol=1e-12)
    np.testing.assert_allclose(prior.mean(), mean, rtol=1e-12)
    np.testing.assert_allclose(prior.cov(), cov, rtol=1e-12, atol=1e-14)
    theta = _check_samples(prior, mean, cov, se_m, se_c, seed=4)
    _check_on_support(theta, support, probs)


# -- Gaussian priors ---------------------------------------------------------------------


def test_gaussian_isotropic():
    prior = gaussian([0.0, 0.0, 0.0], 1.5**2)
    mean, cov, se_m, se_c = _gaussian_moments(np.zeros(3), 2.25 * np.eye(3))
    assert not prior.is_discrete
    np.testing.assert_allclose(prior.mean(), mean, atol=1e-14)
    np.testing.assert_allclose(prior.cov(), cov, rtol=1e-12, atol=1e-14)
    _check_samples(prior, mean, cov, se_m, se_c, seed=5)


def test_gaussian_anisotropic():
    mu = [1.0, -0.5]
    S = [[1.0, 0.6], [0.6, 0.5]]
    prior = gaussian(mu, S)
    mean, cov, se_m, se_c = _gaussian_moments(mu, S)
    np.testing.assert_allclose(prior.mean(), mean, rtol=1e-12)
    np.testing.assert_allclose(prior.cov(), cov, rtol=1e-12, atol=1e-14)
    _check_samples(prior, mean, cov, se_m, se_c, seed=6)


def test_gaussian_diagonal_vector_cov():
    prior = gaussian([0.0, 1.0], [4.0, 0.25])
    np.testing.assert_allclose(prior.cov(), np.diag([4.0, 0.25]), atol=1e-14)
    mean, cov, se_m, se_c = _gaussian_moments([0.0, 1.0], np.diag([4.0, 0.25]))
    _check_samples(prior, mean, cov, se_m, se_c, seed=7)


def test_gaussian_mixture_prior():
    """A user-defined mixture ``atoms + noise``: mean and covariance add up."""
    atoms = np.array([[2.0, 0.0], [0.0, 2.0]])
    probs = np.array([0.25, 0.75])
    noise = np.array([[0.5, 0.1], [0.1, 0.3]])
    prior = Prior(atoms, probs, noise)
    mean = probs @ atoms
    cov = np.einsum("k,ki,kj->ij", probs, atoms - mean, atoms - mean) + noise
    np.testing.assert_allclose(prior.mean(), mean, rtol=1e-12)
    np.testing.assert_allclose(prior.cov(), cov, rtol=1e-12)
    theta = np.asarray(prior.sample(jax.random.PRNGKey(8), (N,)))
    se_m = np.sqrt(np.diag(cov) / N)
    assert np.all(np.abs(theta.mean(0) - mean) <= Z * se_m)


def test_sample_shapes_and_keys():
    prior = spikes(2, 1.0)
    key = jax.random.PRNGKey(0)
    assert prior.sample(key).shape == (2,)
    assert prior.sample(key, (3, 5)).shape == (3, 5, 2)
    a = np.asarray(prior.sample(key, (100,)))
    np.testing.assert_array_equal(a, np.asarray(prior.sample(key, (100,))))
    assert not np.array_equal(a, np.asarray(prior.sample(jax.random.PRNGKey(1), (100,))))


# -- bad parameters ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: spikes(0, 1.0),
        lambda: spikes(2.5, 1.0),
        lambda: spikes(2, -1.0),
        lambda: spikes(2, float("nan")),
        lambda: flipped(2, 0.0),
        lambda: binary(2, 1.0, 1.5),
        lambda: binary(2, 1.0, 0.0),
        lambda: discrete([[1.0, 0.0], [0.0, 1.0]], [0.5, 0.6]),
        lambda: discrete([[1.0, 0.0], [0.0, 1.0]], [1.2, -0.2]),
        lambda: discrete([[1.0, 0.0], [0.0, 1.0]], [1.0]),
        lambda: discrete([1.0, 2.0], [0.5, 0.5]),
        lambda: gaussian([0.0, 0.0], [[1.0, 2.0], [2.0, 1.0]]),  # not PSD
        lambda: gaussian([0.0, 0.0], [[1.0, 0.5], [0.0, 1.0]]),  # not symmetric
        lambda: gaussian([0.0, 0.0], np.eye(3)),  # wrong shape
        lambda: Prior([[1.0, 0.0]], [1.0], [[1.0]]),  # cov shape
        lambda: Prior([[1.0, np.inf]], [1.0], np.zeros((2, 2))),
    ],
)
def test_bad_prior_parameters_raise(make):
    with pytest.raises((TypeError, ValueError)):  # a count that is not an integer, a support of one axis: TypeError
        make()
