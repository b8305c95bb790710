"""The attention activations (docs/model.md section 2): normalisation, switch-off, stability,
registry, and token-permutation equivariance. Reference values are computed in numpy."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import singleloc
from singleloc import bsoftmax, get_activation, register_activation, softmax, softmax1
from singleloc.model._layer import limit_loss, token_weights

BUILTINS = {"softmax": softmax, "softmax1": softmax1, "bsoftmax": bsoftmax}
#: Every activation the package registers: the properties every activation must have are tested on
#: all of them, so that a new one is covered without editing a list.
REGISTERED = singleloc.activation_names()


def _scores(rng, H=3, L=5, scale=2.0):
    return scale * rng.standard_normal((H, L))


# -- normalisation ----------------------------------------------------------------------


def test_softmax_rows_sum_to_one(rng):
    s = _scores(rng, H=4, L=7)
    A = np.asarray(softmax(jnp.asarray(s)))
    assert A.shape == s.shape
    assert np.all(A > 0)
    np.testing.assert_allclose(A.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    # closed form, numpy
    e = np.exp(s)
    np.testing.assert_allclose(A, e / e.sum(axis=1, keepdims=True), rtol=1e-12)


def test_softmax_ignores_a_per_head_bias(rng):
    s = _scores(rng)
    b = rng.standard_normal((s.shape[0], 1))
    np.testing.assert_allclose(softmax(jnp.asarray(s + b)), softmax(jnp.asarray(s)), rtol=1e-12)


def test_softmax1_closed_form_and_rows_below_one(rng):
    s = _scores(rng, H=4, L=6)
    A = np.asarray(softmax1(jnp.asarray(s)))
    e = np.exp(s)
    expected = e / (1.0 + e.sum(axis=1, keepdims=True))
    np.testing.assert_allclose(A, expected, rtol=1e-12)
    rows = A.sum(axis=1)
    assert np.all(rows < 1.0)
    # the missing mass is exactly 1 / (1 + sum exp(s))
    np.testing.assert_allclose(1.0 - rows, 1.0 / (1.0 + e.sum(axis=1)), rtol=1e-10)


def test_softmax1_switches_off_for_very_negative_scores(rng):
    base = _scores(rng, H=2, L=4, scale=1.0)
    totals = []
    for shift in (0.0, -5.0, -20.0, -60.0):
        A = np.asarray(softmax1(jnp.asarray(base + shift)))
        totals.append(A.sum(axis=1))
    totals = np.array(totals)
    assert np.all(np.diff(totals, axis=0) < 0)  # decreasing with the shift
    assert np.all(totals[-1] < 1e-20)  # switched off
    # and -> 1 for a very positive common shift
    A = np.asarray(softmax1(jnp.asarray(base + 60.0)))
    np.testing.assert_allclose(A.sum(axis=1), 1.0, atol=1e-20)


def test_bsoftmax_total_mass_and_head_average(rng):
    for H, L in ((1, 3), (3, 5), (6, 2)):
        s = _scores(rng, H=H, L=L)
        A = np.asarray(bsoftmax(jnp.asarray(s)))
        np.testing.assert_allclose(A.sum(), H, rtol=1e-12)
        e = np.exp(s)
        np.testing.assert_allclose(A, H * e / e.sum(), rtol=1e-12)
        a = np.asarray(token_weights(bsoftmax, jnp.asarray(s)))
        assert a.shape == (L,)
        assert np.all(a >= 0)
        np.testing.assert_allclose(a.sum(), 1.0, atol=1e-12)
        # the head average is the marginal over heads of the joint softmax
        np.testing.assert_allclose(a, e.sum(axis=0) / e.sum(), rtol=1e-12)


def test_bsoftmax_heads_are_not_normalised_separately(rng):
    s = _scores(rng, H=3, L=4)
    s[0] += 3.0  # head 0 dominates
    A = np.asarray(bsoftmax(jnp.asarray(s)))
    rows = A.sum(axis=1)
    assert rows[0] > 1.0 and np.all(rows[1:] < 1.0)


# -- numerical stability ----------------------------------------------------------------


@pytest.mark.parametrize("name", REGISTERED)
def test_large_scores_give_finite_weights(name):
    act = get_activation(name)
    s = jnp.array([[1e4, -1e4, 0.0, 3.0], [-1e4, -1e4, 1e4 - 1.0, 1e4]])
    A = np.asarray(act(s))
    assert np.all(np.isfinite(A))
    assert np.all(A >= 0)
    if name == "softmax":
        np.testing.assert_allclose(A[0], [1, 0, 0, 0], atol=1e-300)
        e = np.exp([-1.0, 0.0])
        np.testing.assert_allclose(A[1, 2:], e / e.sum(), rtol=1e-12)
    if name == "softmax1":
        np.testing.assert_allclose(A.sum(axis=1), 1.0, atol=1e-12)
    if name == "bsoftmax":
        np.testing.assert_allclose(A.sum(), 2.0, rtol=1e-12)
    # all-very-negative scores
    A = np.asarray(act(jnp.full((2, 3), -1e4)))
    assert np.all(np.isfinite(A))
    if name == "softmax1":
        assert np.all(A == 0.0)  # underflow to an exact switch-off, not 0/0
    else:
        np.testing.assert_allclose(A.sum(axis=-1).sum(), 2.0, rtol=1e-12)


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_minus_inf_scores_give_exact_zeros(name):
    act = BUILTINS[name]
    s = jnp.array([[0.5, -jnp.inf, 2.0], [-jnp.inf, 1.0, -1.0]])
    A = np.asarray(act(s))
    assert not np.any(np.isnan(A))
    assert A[0, 1] == 0.0 and A[1, 0] == 0.0
    # the remaining weights are those of the finite scores alone
    finite = np.array([[0.5, 2.0], [1.0, -1.0]])
    e = np.exp(finite)
    if name == "softmax":
        expected = e / e.sum(axis=1, keepdims=True)
    elif name == "softmax1":
        expected = e / (1 + e.sum(axis=1, keepdims=True))
    else:
        expected = 2 * e / e.sum()
    np.testing.assert_allclose(A[0, [0, 2]], expected[0], rtol=1e-12)
    np.testing.assert_allclose(A[1, [1, 2]], expected[1], rtol=1e-12)


def test_minus_inf_rows_switch_off_softmax1_and_bsoftmax():
    s = jnp.array([[-jnp.inf, -jnp.inf, -jnp.inf], [0.0, 1.0, 2.0]])
    A1 = np.asarray(softmax1(s))
    assert np.all(A1[0] == 0.0) and not np.any(np.isnan(A1))
    Ab = np.asarray(bsoftmax(s))
    assert np.all(Ab[0] == 0.0) and not np.any(np.isnan(Ab))
    np.testing.assert_allclose(Ab.sum(), 2.0, rtol=1e-12)


@pytest.mark.parametrize("name", REGISTERED)
def test_gradients_finite_at_large_scores(name, rng):
    act = get_activation(name)
    c = jnp.asarray(rng.standard_normal((2, 4)))
    grad_c = jax.jit(jax.grad(lambda s: jnp.sum(c * act(s))))
    grad_l = jax.jit(jax.grad(lambda s: limit_loss(act, s, 2)))
    for s in (
        jnp.array([[1e4, -1e4, 0.0, 3.0], [-1e4, -1e4, 1e4 - 1.0, 1e4]]),
        jnp.full((2, 4), 1e4),
        jnp.full((2, 4), -1e4),
        jnp.array([[800.0, 799.0, -800.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
    ):
        g = np.asarray(grad_c(s))
        assert np.all(np.isfinite(g)), (name, s)
        gl = np.asarray(grad_l(s))
        assert np.all(np.isfinite(gl)), (name, s)


@pytest.mark.parametrize("name", REGISTERED)
def test_gradient_matches_finite_differences(name, rng):
    act = get_activation(name)
    s = jnp.asarray(_scores(rng, H=2, L=3, scale=1.0))
    f = jax.jit(lambda s: limit_loss(act, s, 1))
    g = np.asarray(jax.grad(f)(s))
    h = 1e-6
    fd = np.zeros_like(g)
    for i, j in itertools.product(range(2), range(3)):
        e = jnp.zeros_like(s).at[i, j].set(h)
        fd[i, j] = (f(s + e) - f(s - e)) / (2 * h)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-9)


# -- registry ---------------------------------------------------------------------------


def test_builtins_are_registered():
    names = singleloc.activation_names()
    assert set(BUILTINS) | {"ssmax"} <= set(names)
    for name, fn in BUILTINS.items():
        assert name in names
        assert get_activation(name) is fn


def test_register_custom_activation(rng):
    def relu_norm(scores):  # a token-equivariant activation
        r = jax.nn.relu(scores)
        return r / (1.0 + jnp.sum(r, axis=-1, keepdims=True))

    name = "test_relu_norm"
    register_activation(name, relu_norm, overwrite=True)
    assert name in singleloc.activation_names()
    assert get_activation(name) is relu_norm
    # usable in a model specification and by the layer
    model = singleloc.Model(activation=name, heads=3)
    assert model.activation == name
    s = jnp.asarray(_scores(rng, H=3, L=4))
    r = np.maximum(np.asarray(s), 0)
    expected = (r / (1 + r.sum(axis=1, keepdims=True))).mean(axis=0)
    np.testing.assert_allclose(token_weights(get_activation(name), s), expected, rtol=1e-12)
    # re-registering another function under the same name needs overwrite=True
    with pytest.raises(ValueError, match=name):
        register_activation(name, softmax)
    register_activation(name, softmax, overwrite=True)
    assert get_activation(name) is softmax


def test_register_rejects_bad_input():
    with pytest.raises(ValueError):
        register_activation("", softmax)
    with pytest.raises(TypeError):
        register_activation("test_not_callable", 3.0)


def test_unknown_activation_names_model_activation():
    with pytest.raises(ValueError, match=r"model\.activation") as err:
        get_activation("no_such_activation")
    assert "no_such_activation" in str(err.value)
    with pytest.raises(ValueError, match=r"model\.activation"):
        singleloc.Model(activation="no_such_activation")


# -- equivariance -----------------------------------------------------------------------


@pytest.mark.parametrize("name", REGISTERED)
def test_token_permutation_equivariance(name, rng):
    act = get_activation(name)
    s = _scores(rng, H=3, L=5)
    A = np.asarray(act(jnp.asarray(s)))
    for _ in range(5):
        perm = rng.permutation(5)
        Ap = np.asarray(act(jnp.asarray(s[:, perm])))
        np.testing.assert_allclose(Ap, A[:, perm], rtol=1e-12, atol=1e-15)
    # and the limit loss only depends on which token is relevant, not where it sits
    perm = rng.permutation(5)
    inv = np.argsort(perm)
    for eps in range(5):
        l0 = float(limit_loss(act, jnp.asarray(s), eps))
        l1 = float(limit_loss(act, jnp.asarray(s[:, perm]), int(inv[eps])))
        assert l1 == pytest.approx(l0, rel=1e-12)


@pytest.mark.parametrize("name", REGISTERED)
def test_head_permutation_leaves_token_weights_unchanged(name, rng):
    act = get_activation(name)
    s = _scores(rng, H=4, L=3)
    a = np.asarray(token_weights(act, jnp.asarray(s)))
    a_perm = np.asarray(token_weights(act, jnp.asarray(s[rng.permutation(4)])))
    np.testing.assert_allclose(a_perm, a, rtol=1e-12)
