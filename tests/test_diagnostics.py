"""Normalization diagnostics (docs/model.md section 8), the ssmax activation and ``singleloc diagnose``.

Every expected value is worked out by hand in the test (uniform, one-hot and two-token rows)
or computed by an independent route (``jax.jacobian``, dense eigenvalues, explicit loops).
"""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import singleloc
from singleloc import cli


@pytest.fixture
def rng() -> np.random.Generator:
    """A fixed generator (defined here so that the module does not depend on conftest.py)."""
    return np.random.default_rng(20250825)


@jax.jit
def jax_jacobians(logits, T):
    """``d softmax(l/T) / d l`` for every row of ``logits`` (R, L), by autodiff."""
    return jax.vmap(jax.jacobian(lambda z: jax.nn.softmax(z / T)))(logits)


def softmax_np(z):
    z = np.asarray(z, dtype=float)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# --------------------------------------------------------------------------- vanishing attention


def test_vanishing_uniform_row_sits_on_both_bounds():
    v = singleloc.vanishing_attention(logits=np.zeros((3, 8)))
    np.testing.assert_allclose(v.a, 0.0)
    np.testing.assert_allclose(v.lower, 1 / 8)
    np.testing.assert_allclose(v.upper, 1 / 8)
    np.testing.assert_allclose(v.min_scaled, 1.0)
    np.testing.assert_allclose(v.max_scaled, 1.0)
    np.testing.assert_allclose(v.lower_ratio, 1.0)
    np.testing.assert_allclose(v.upper_ratio, 1.0)
    assert v.holds.all() and v.L.tolist() == [8, 8, 8]


def test_vanishing_two_tokens_by_hand():
    a = 0.7
    v = singleloc.vanishing_attention(logits=np.array([a, -a]))
    big = math.exp(a) / (math.exp(a) + math.exp(-a))
    assert v.a == pytest.approx(a)
    assert v.lower == pytest.approx(math.exp(-2 * a) / 2)
    assert v.upper == pytest.approx(math.exp(2 * a) / 2)
    assert v.max_weight == pytest.approx(big)
    assert v.min_weight == pytest.approx(1 - big)
    assert v.max_scaled == pytest.approx(2 * big)
    assert v.upper_ratio == pytest.approx(big / (math.exp(2 * a) / 2))
    assert v.lower_ratio == pytest.approx((1 - big) / (math.exp(-2 * a) / 2))
    assert bool(v.holds)


@pytest.mark.parametrize("L", [4, 64, 1024])
def test_softmax_weights_stay_within_the_one_over_L_bounds(rng, L):
    a = 1.5
    logits = rng.uniform(-a, a, size=(50, L))
    w = softmax_np(logits)
    assert (L * w >= math.exp(-2 * a) - 1e-12).all() and (L * w <= math.exp(2 * a) + 1e-12).all()
    v = singleloc.vanishing_attention(w, logit_bound=a)
    assert v.holds.all()
    assert (v.lower_ratio >= 1).all() and (v.upper_ratio <= 1).all()
    # The extreme row (one logit a, the rest -a) gets closer to the upper bound as L grows.
    ext = np.full(L, -a)
    ext[0] = a
    e = singleloc.vanishing_attention(logits=ext)
    assert e.max_weight == pytest.approx(math.exp(a) / (math.exp(a) + (L - 1) * math.exp(-a)))


def test_effective_logit_bound_is_half_the_log_range():
    w = softmax_np(np.array([1.0, -1.0, 0.0]))
    assert singleloc.effective_logit_bound(w) == pytest.approx(1.0)
    v = singleloc.vanishing_attention(w)  # weights alone use the effective bound
    assert v.a == pytest.approx(1.0)
    assert v.lower == pytest.approx(math.exp(-2) / 3)
    # a zero weight needs an infinite logit range unless it is masked out
    assert np.isinf(singleloc.effective_logit_bound(np.array([0.5, 0.5, 0.0])))
    assert singleloc.effective_logit_bound(np.array([0.5, 0.5, 0.0]), mask=np.array([True, True, False])) == 0.0


def test_vanishing_mask_sets_row_length():
    w = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    mask = np.tril(np.ones((3, 3), dtype=bool))
    v = singleloc.vanishing_attention(w, mask=mask)
    assert v.L.tolist() == [1, 2, 3]
    np.testing.assert_allclose(v.max_scaled, [1.0, 1.0, 1.5])
    np.testing.assert_allclose(v.min_scaled, [1.0, 1.0, 0.6])


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"weights": np.array([0.5, np.nan])}, "weights"),
        ({"weights": np.array([0.5, -0.1])}, "non-negative"),
        ({"logits": np.array([1.0, np.inf])}, "logits"),
        ({"weights": np.array([0.5, 0.5]), "logit_bound": -1.0}, "logit_bound"),
        ({"weights": np.ones((2, 3)) / 3, "mask": np.ones(4, dtype=bool)}, "mask"),
        ({}, "weights or logits"),
    ],
)
def test_vanishing_bad_input(kwargs, word):
    with pytest.raises(ValueError, match=word):
        singleloc.vanishing_attention(**kwargs)


# --------------------------------------------------------------------------- top-N diagnostics


def test_top_n_uniform_weights_orthonormal_tokens():
    L, N = 4, 2
    w = np.full(L, 1 / L)
    x = np.eye(L)
    t = singleloc.top_n_diagnostics(w, x, N)
    assert t.selected.tolist() == [True, True, False, False]  # ties: lower index first
    np.testing.assert_allclose(t.context, [0.25, 0.25, 0, 0])
    # unselected j: |e_j/4 - (e_0 + e_1)/4|^2 = 3/16; selected i: |s - e_i/4| = 1/4
    assert t.distance == pytest.approx(2 * math.sqrt(3) / 4)
    assert t.radius == pytest.approx(math.sqrt(3) / 4)
    assert t.n_separable == 2 and t.separability == 1.0


def test_top_n_one_hot_and_strict_separability():
    x = np.array([[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]])
    w = np.array([1.0, 0.0, 0.0])
    t1 = singleloc.top_n_diagnostics(w, x, 1)
    np.testing.assert_allclose(t1.context, [3, 4])
    assert t1.distance == pytest.approx(10.0)  # two unselected tokens at |x_0| = 5
    assert t1.radius == pytest.approx(5.0)
    assert t1.separability == 1.0
    # N = 2 selects token 1 (zero weight, lowest index among the ties): it sits at |s| = r,
    # which is not strictly inside the radius.
    t2 = singleloc.top_n_diagnostics(w, x, 2)
    assert t2.selected.tolist() == [True, True, False]
    assert t2.n_separable == 1 and t2.separability == 0.5


def test_top_n_two_tokens_by_hand():
    w = np.array([0.3, 0.7])
    x = np.array([[0.0, 2.0], [1.0, 0.0]])
    t = singleloc.top_n_diagnostics(w, x, 1)
    assert t.selected.tolist() == [False, True]
    np.testing.assert_allclose(t.context, [0.7, 0.0])
    assert t.distance == pytest.approx(math.sqrt(0.7**2 + 0.6**2))
    assert t.radius == pytest.approx(math.sqrt(0.85))
    assert t.separability == 1.0


def test_separability_zero_when_an_unselected_token_coincides_with_the_context():
    w = np.array([0.5, 0.3, 0.2])
    x = np.array([[1.0, 0.0], [0.0, 1.0], [2.5, 1.5]])  # 0.2 x_2 = s = 0.5 x_0 + 0.3 x_1
    t = singleloc.top_n_diagnostics(w, x, 2)
    assert t.radius == pytest.approx(0.0, abs=1e-7)
    assert t.n_separable == 0 and t.separability == 0.0


def test_top_n_matches_explicit_loops_with_shared_values(rng):
    layers, heads, Lq, L, d, N = 2, 3, 5, 9, 4, 3
    w = rng.dirichlet(np.ones(L), size=(layers, heads, Lq))
    x = rng.standard_normal((layers, heads, L, d))
    t = singleloc.top_n_diagnostics(w, x[:, :, None], N)
    for i in np.ndindex(layers, heads, Lq):
        row, X = w[i], x[i[:2]]
        top = sorted(range(L), key=lambda j: -row[j])[:N]
        s = sum(row[j] * X[j] for j in top)
        dist = [np.linalg.norm(row[j] * X[j] - s) for j in range(L)]
        rest = [j for j in range(L) if j not in top]
        r = min(dist[j] for j in rest)
        assert sorted(np.nonzero(t.selected[i])[0].tolist()) == sorted(top)
        np.testing.assert_allclose(t.context[i], s, atol=1e-12)
        assert t.distance[i] == pytest.approx(sum(dist[j] for j in rest), rel=1e-10)
        assert t.radius[i] == pytest.approx(r, rel=1e-10)
        assert t.n_separable[i] == sum(dist[j] < r for j in top)


def test_top_n_respects_mask():
    w = np.array([0.1, 0.2, 0.3, 0.4])
    mask = np.array([True, True, True, False])  # the largest weight is not part of the row
    assert singleloc.select_top_n(w, 2, mask).tolist() == [False, True, True, False]
    t = singleloc.top_n_diagnostics(w, np.eye(4), 2, mask=mask)
    s = np.array([0, 0.2, 0.3, 0])
    assert t.distance == pytest.approx(np.linalg.norm(0.1 * np.eye(4)[0] - s))  # token 3 left out
    assert np.isnan(t.token_distance[3])
    # a row with no unselected token has no distance or radius
    short = singleloc.top_n_diagnostics(w, np.eye(4), 3, mask=mask)
    assert np.isnan(short.distance) and np.isnan(short.separability)


@pytest.mark.parametrize(
    "n, values, word",
    [
        (0, np.eye(4), r"n: must be >= 1, got 0 \(1 <= n < L = 4\)"),
        (4, np.eye(4), r"n: must be <= 3, got 4 \(1 <= n < L = 4\)"),
        (1.5, np.eye(4), "top_n_diagnostics: n must be an integer, got float 1.5"),  # a TypeError, at the door
        (1, np.eye(3), "values must have shape"),
        (1, np.ones((3, 4, 2)), "broadcast"),
        (1, np.full((4, 2), np.nan), "values contains NaN"),
    ],
)
def test_top_n_bad_input(n, values, word):
    w = np.full((2, 4), 0.25)
    with pytest.raises((TypeError, ValueError), match=word):
        singleloc.top_n_diagnostics(w, values, n)


# --------------------------------------------------------------------------- critical top-N


def test_critical_top_n_uniform_rows_collapse_where_the_distance_peaks():
    # Uniform weights on orthonormal tokens: d(N) = (L - N) sqrt(1 + N) / L, the same in every
    # row. The critical N is the first N with d(N + 1) <= d(N).
    L, S = 32, 20
    w = np.full((S, L), 1 / L)
    x = np.broadcast_to(np.eye(L), (S, L, L))
    grid = list(range(1, L))
    res = singleloc.critical_top_n(w, x, grid)
    f = [(L - n) * math.sqrt(1 + n) / L for n in grid]
    np.testing.assert_allclose(res.distance[:, 0], f, rtol=1e-10)
    expected = next(n for n, a, b in zip(grid, f, f[1:]) if b <= a)
    assert res.critical_n == expected
    assert (res.pvalue[: expected - 1] < 0.01).all() and res.pvalue[expected - 1] >= 0.01


def test_ks_critical_n_on_constructed_samples(rng):
    grid = [1, 2, 4, 8, 16]
    base = rng.standard_normal((5, 200))
    growing = base + np.array([0, 10, 20, 30, 40])[:, None]
    assert singleloc.ks_critical_n(grid, growing).critical_n is None
    saturating = base + np.array([0, 10, 20, 20, 10])[:, None]
    res = singleloc.ks_critical_n(grid, saturating)
    assert res.critical_n == 4
    assert res.pvalue[-1] == pytest.approx(1.0)  # a decreasing distance never rejects


def test_critical_top_n_pools_over_query_rows(rng):
    w = rng.dirichlet(np.ones(10), size=(2, 3, 5))
    x = rng.standard_normal((2, 3, 1, 10, 4))
    res = singleloc.critical_top_n(w, x, [1, 2, 4], pool_axes=(-1,))
    assert res.distance.shape == (3, 6)  # one sample per head
    assert singleloc.critical_top_n(w, x, [1, 2, 4]).distance.shape == (3, 30)
    with pytest.raises(ValueError, match="pool_axes"):
        singleloc.critical_top_n(w, x, [1, 2], pool_axes=(3,))
    with pytest.raises(ValueError, match="n_grid"):
        singleloc.critical_top_n(w, x, [2, 1])


# --------------------------------------------------------------------------- gradient sensitivity


@pytest.mark.parametrize("T", [0.05, 0.3, 1.0, 7.0])
def test_exact_jacobian_and_norms_against_jax(rng, T):
    logits = rng.standard_normal((4, 7)) * 2
    refs = np.asarray(jax_jacobians(jnp.asarray(logits), T))
    for l, ref in zip(logits, refs):
        np.testing.assert_allclose(singleloc.softmax_jacobian(l, T), ref, atol=1e-13)
        assert singleloc.softmax_jacobian_norm(l, T) == pytest.approx(np.linalg.norm(ref, 2), rel=1e-10)
        assert singleloc.softmax_jacobian_norm(l, T, norm="frobenius") == pytest.approx(np.linalg.norm(ref, "fro"), rel=1e-10)
    batch = singleloc.softmax_jacobian(logits, T)
    assert batch.shape == (4, 7, 7)


def test_jacobian_norm_closed_forms():
    L, T = 5, 0.5
    # uniform: J = (I/L - 11^T/L^2)/T has eigenvalues 1/(LT) (L - 1 times) and 0
    assert singleloc.softmax_jacobian_norm(np.zeros(L), T) == pytest.approx(1 / (L * T))
    assert singleloc.softmax_jacobian_norm(np.zeros(L), T, norm="frobenius") == pytest.approx(math.sqrt(L - 1) / (L * T))
    # two tokens with gap g: J = e(1-e)/T [[1,-1],[-1,1]], norm 2 e (1-e)/T, also for tiny e
    for g, t in [(1.0, 1.0), (3.0, 0.1), (50.0, 0.5)]:
        e = 1 / (1 + math.exp(g / t))
        expected = 2 * e * (1 - e) / t
        assert singleloc.softmax_jacobian_norm(np.array([g, 0.0]), t) == pytest.approx(expected, rel=1e-12)
        assert singleloc.softmax_jacobian_norm(np.array([g, 0.0]), t, norm="frobenius") == pytest.approx(expected, rel=1e-12)
    # tied top pair: the worst case 1/(2T), for any small T
    for t in [1e-3, 1e-2]:
        assert singleloc.softmax_jacobian_norm(np.array([1.0, 1.0, -3.0, -5.0]), t) == pytest.approx(1 / (2 * t), rel=1e-9)
    # a masked (-inf) token is absent
    assert singleloc.softmax_jacobian_norm(np.array([0.0, 0.0, -np.inf]), 1.0) == pytest.approx(0.5)


def test_jacobian_norm_never_exceeds_half_over_T(rng):
    for T in [0.01, 0.1, 1.0]:
        n = singleloc.softmax_jacobian_norm(rng.standard_normal((200, 12)), T)
        assert (n <= 0.5 / T * (1 + 1e-12)).all() and (n >= 0).all()


def test_finite_difference_converges_to_jacobian_vector_norm(rng):
    T = 0.4
    logits = rng.standard_normal((3, 6))
    v = singleloc.random_directions(logits.shape, 2, seed=3)
    np.testing.assert_allclose(np.linalg.norm(v, axis=-1), 1.0)
    J = np.asarray(jax_jacobians(jnp.asarray(logits), T))
    jv = np.linalg.norm(np.einsum("rij,rkj->rki", J, v), axis=-1)  # |J v| per row and direction
    fd = [singleloc.finite_difference_sensitivity(logits, T, e, directions=v) for e in (1e-1, 1e-3, 1e-6)]
    errors = [np.max(np.abs(f - jv)) for f in fd]
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 1e-5 * jv.max()
    # for a large eps the estimate is at most sqrt(2)/eps
    big = singleloc.finite_difference_sensitivity(logits, 0.01, 10.0, num_directions=8, seed=1)
    assert big.shape == (3, 8) and (big <= math.sqrt(2) / 10 + 1e-12).all()
    # seeded: the same directions, the same result
    np.testing.assert_array_equal(
        singleloc.finite_difference_sensitivity(logits, T, 0.1, num_directions=3, seed=5),
        singleloc.finite_difference_sensitivity(logits, T, 0.1, num_directions=3, seed=5),
    )


def test_logits_from_weights_reproduce_the_row():
    w = np.array([[0.5, 0.3, 0.2, 0.0]])
    lg = singleloc.logits_from_weights(w)
    assert np.isneginf(lg[0, 3])
    np.testing.assert_allclose(softmax_np(lg), w)
    d = singleloc.random_directions(lg.shape, 1, mask=np.isfinite(lg))
    assert d[0, 0, 3] == 0.0


@pytest.mark.parametrize(
    "call, word",
    [
        (lambda: singleloc.softmax_jacobian_norm(np.zeros(3), 0.0), "temperature"),
        (lambda: singleloc.softmax_jacobian_norm(np.zeros(3), -1.0), "temperature"),
        (lambda: singleloc.softmax_jacobian(np.zeros(3), float("nan")), "temperature"),
        (lambda: singleloc.softmax_jacobian_norm(np.zeros(3), 1.0, norm="nuclear"), "norm"),
        (lambda: singleloc.softmax_jacobian(np.array([0.0, np.nan]), 1.0), "logits"),
        (lambda: singleloc.softmax_jacobian(np.array([-np.inf, -np.inf]), 1.0), "finite logit"),
        (lambda: singleloc.finite_difference_sensitivity(np.zeros(3), 1.0, 0.0), "eps"),
        (lambda: singleloc.finite_difference_sensitivity(np.zeros(3), 1.0, 0.1, directions=np.zeros((1, 3))), "directions"),
        (lambda: singleloc.random_directions((2, 3), 0), "num"),
    ],
)
def test_gradient_sensitivity_bad_input(call, word):
    with pytest.raises(ValueError, match=word):
        call()


# --------------------------------------------------------------------------- ssmax


def test_ssmax_is_length_scaled_softmax(rng):
    scores = rng.standard_normal((3, 17))
    act = singleloc.get_activation("ssmax")
    assert act is singleloc.ssmax
    out = np.asarray(act(jnp.asarray(scores)))
    np.testing.assert_allclose(out, softmax_np(np.log(17) * scores), rtol=1e-12)
    np.testing.assert_allclose(out.sum(axis=-1), 1.0, rtol=1e-12)
    # scale s = 1/log(L) gives back softmax at that L; another s rescales the logits
    def scaled(s):
        return np.asarray(singleloc.scalable_softmax(s)(jnp.asarray(scores)))

    np.testing.assert_allclose(scaled(1 / np.log(17)), softmax_np(scores), rtol=1e-12)
    np.testing.assert_allclose(scaled(0.3), softmax_np(0.3 * np.log(17) * scores), rtol=1e-12)


def test_ssmax_is_stable_and_usable_by_the_layer():
    s = jnp.array([[1e4, 0.0, -1e4, -jnp.inf], [-1e4, -1e4, -1e4, -1e4]])
    out = np.asarray(singleloc.ssmax(s))
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out[0], [1, 0, 0, 0])
    np.testing.assert_allclose(out[1], 0.25)
    np.testing.assert_allclose(np.asarray(singleloc.ssmax(jnp.array([[5.0], [-1e4]]))), 1.0)  # L = 1
    act = singleloc.get_activation("ssmax")
    g = jax.grad(lambda sc: singleloc.limit_loss(act, sc, 0))(jnp.array([[0.3, -0.2, 1.0]]))
    assert np.isfinite(np.asarray(g)).all()


@pytest.mark.parametrize("s", [0.0, -1.0, float("nan"), float("inf"), "x"])
def test_scalable_softmax_rejects_bad_scale(s):
    with pytest.raises((TypeError, ValueError), match="s must be"):  # "x": a TypeError, at the door
        singleloc.scalable_softmax(s)


# --------------------------------------------------------------------------- diagnose_attention


def test_diagnose_attention_agrees_with_the_row_functions(rng):
    """The whole-array report against the row functions applied by hand to the same rows."""
    L = 12
    w = _causal_attention(rng, (3, 2), L)  # 6 heads, 12 query rows
    v = rng.standard_normal((3, 2, L, 4))
    grid = [1, 2, 4, 8]
    d = singleloc.diagnose_attention(w, v, top_n=grid, temperatures=[0.5, 2.0], max_rows=5, significance=0.2)
    rows = [0, 3, 6, 8, 11]  # linspace(11, 0, 5) rounded, sorted: evenly spaced and with the last one
    assert d.query_rows == tuple(rows) and d.mask == "causal" and d.heads == 6
    sel = w[..., rows, :]
    mask = np.arange(L)[None, :] <= np.array(rows)[:, None]
    keep = np.broadcast_to(mask.sum(-1) >= 2, sel.shape[:-1])  # query row 0 has a single token
    assert d.rows_analysed == keep.sum() == 6 * 4
    va = singleloc.vanishing_attention(sel, mask=np.broadcast_to(mask, sel.shape))
    assert d.vanishing["L_times_max_weight"]["max"] == pytest.approx(va.max_scaled[keep].max(), rel=1e-12)
    np.testing.assert_array_equal(d.tokens, np.broadcast_to(mask.sum(-1), keep.shape)[keep])
    crit = singleloc.critical_top_n(sel, v[..., None, :, :], grid, significance=0.2, mask=np.broadcast_to(mask, sel.shape),
                                    pool_axes=(-1,))
    assert d.top_n["critical_n"] == crit.critical_n and d.top_n["ks_samples"] == "heads" and d.ks_sample_count == 6
    np.testing.assert_allclose(d.top_n["ks_pvalue"], crit.pvalue, rtol=1e-12)
    t = singleloc.top_n_diagnostics(sel, v[..., None, :, :], 2, mask=np.broadcast_to(mask, sel.shape))
    assert d.top_n["distance"][1]["mean"] == pytest.approx(np.nanmean(t.distance), rel=1e-12)
    logits = singleloc.logits_from_weights(sel, np.broadcast_to(mask, sel.shape))[keep]
    assert d.jacobian[0]["spectral_mean"] == pytest.approx(singleloc.softmax_jacobian_norm(logits, 0.5).mean(), rel=1e-12)
    assert [r["T"] for r in d.jacobian] == [0.5, 2.0] and d.jacobian[1]["bound"] == 0.25
    data = json.loads(json.dumps(d.to_dict()))
    assert data["query_rows"] == rows and data["top_n"]["N"] == grid
    assert "critical top-N" in d.table() and "mask: causal" in d.table()


def test_diagnose_attention_without_values_and_one_row():
    from singleloc.attention._attention_diagnosis import TEMPERATURES

    d = singleloc.diagnose_attention(np.array([0.5, 0.25, 0.25]))
    assert d.top_n is None and "top_n" not in d.to_dict() and d.query_rows == (0,) and d.mask == "none"
    assert d.vanishing["L_times_max_weight"]["max"] == pytest.approx(1.5)
    assert [r["T"] for r in d.jacobian] == list(TEMPERATURES)


def test_diagnose_help_states_the_library_defaults(capsys):
    from singleloc.attention._attention_diagnosis import TEMPERATURES
    from singleloc.ground._choices import KS_SAMPLES, MASKS

    with pytest.raises(SystemExit):
        cli.main(["diagnose", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: " + " ".join(f"{t:g}" for t in TEMPERATURES) + ")" in text
    assert "(default: " + " ".join(f"{e:g}" for e in singleloc.FD_EPSILONS) + ")" in text
    choices = {a.dest: a.choices for a in cli.build_parser()._subparsers._group_actions[0].choices["diagnose"]._actions}
    assert tuple(choices["mask"]) == MASKS and tuple(choices["ks_over"]) == KS_SAMPLES


# --------------------------------------------------------------------------- the diagnose command


def _causal_attention(rng, shape, L):
    s = rng.standard_normal(shape + (L, L)) * 2
    s = np.where(np.tril(np.ones((L, L), dtype=bool)), s, -np.inf)
    return softmax_np(s)


def test_diagnose_command_writes_files(tmp_path, rng, capsys, monkeypatch):
    monkeypatch.setenv("SINGLELOC_PROGRESS", "lines")  # the suite's "off" (tests/conftest.py): the lines said here
    L = 16
    w = _causal_attention(rng, (2, 3), L)
    v = rng.standard_normal((2, 3, L, 4))
    np.save(tmp_path / "attn.npy", w.astype(np.float32))
    np.save(tmp_path / "vals.npy", v)
    out = tmp_path / "out"
    code = cli.main(["diagnose", str(tmp_path / "attn.npy"), "--values", str(tmp_path / "vals.npy"), "--out", str(out),
                     "--temperature", "0.1", "1", "--top-n", "1", "2", "4", "--max-rows", "0"])
    assert code == 0
    for name in ("attn_diagnostics.json", "attn_vanishing.png", "attn_jacobian.png", "attn_topn.png"):
        assert (out / name).stat().st_size > 0
    assert not list(out.glob(".*.tmp"))
    data = json.loads((out / "attn_diagnostics.json").read_text())
    assert data["mask"] == "causal" and data["heads"] == 6
    assert data["rows_analysed"] == 6 * (L - 1)  # the first query row has a single token
    row_max = w.astype(np.float32).astype(float).max(axis=-1)  # (2, 3, L); query q has q + 1 tokens
    expected_max = (row_max * np.arange(1, L + 1))[..., 1:].max()
    assert data["vanishing"]["L_times_max_weight"]["max"] == pytest.approx(expected_max, rel=1e-6)
    assert [r["T"] for r in data["jacobian"]] == [0.1, 1.0]
    assert data["top_n"]["N"] == [1, 2, 4] and data["top_n"]["ks_samples"] == "heads"
    captured = capsys.readouterr()
    assert "critical top-N" in captured.out and "mask: causal" in captured.out
    # what it is doing, said before the seconds it takes (stderr is no terminal: one line at the start and the end)
    assert "singleloc diagnose: diagnosing 6 head(s) of 16 tokens (vanishing attention, sensitivity at 2 temperatures, top-N)" \
        in captured.err and "singleloc diagnose: diagnosed in " in captured.err


def test_diagnose_defaults_next_to_the_input(tmp_path, rng):
    w = softmax_np(rng.standard_normal((6, 10)))  # one head, 6 query rows, no mask
    np.save(tmp_path / "head.npy", w)
    assert cli.main(["diagnose", str(tmp_path / "head.npy"), "--temperature", "1", "--max-rows", "4"]) == 0
    data = json.loads((tmp_path / "head_diagnostics.json").read_text())
    assert data["mask"] == "none" and len(data["query_rows"]) == 4 and data["query_rows"][-1] == 5
    assert (tmp_path / "head_jacobian.png").exists() and not (tmp_path / "head_topn.png").exists()


@pytest.mark.parametrize(
    "make, extra, word",
    [
        (lambda w: np.where(w > 0.5, np.nan, w), [], "NaN"),
        (lambda w: -w, [], "non-negative"),
        (lambda w: w, ["--top-n", "8"], "top_n entry: must be <= 7, got 8 (1 <= top_n entry < L = 8)"),
        (lambda w: w, ["--top-n", "0"], "--top-n: must be >= 1, got 0"),
        (lambda w: w, ["--top-n", "4", "2"], "top_n must be an increasing sequence"),
        (lambda w: w, ["--temperature", "0"], "temperatures: must be > 0, got 0.0"),
        (lambda w: w, ["--epsilon", "inf"], "epsilons: must be finite, got inf"),
        (lambda w: w, ["--significance", "1"], "significance: must be < 1, got 1.0"),
        (lambda w: w, ["--mask", "nope"], "--mask: invalid choice"),
        (lambda w: w, ["--values", "BADVALUES"], "values of shape (2, 7, 3) do not match the weights (2, 5, 8)"),
        (lambda w: w, ["--mask", "causal"], "mask 'causal' needs square (L, L) last axes"),
        (lambda w: w[..., :1], [], "at least 2 tokens"),
        (lambda w: w, ["--values", "MISSING"], "does not exist"),
    ],
)
def test_diagnose_bad_input_exits_2_with_one_line(tmp_path, rng, capsys, make, extra, word):
    w = softmax_np(rng.standard_normal((2, 5, 8)))
    np.save(tmp_path / "a.npy", make(w))
    np.save(tmp_path / "bad_values.npy", np.ones((2, 7, 3)))  # 7 tokens instead of 8
    extra = [str(tmp_path / "bad_values.npy") if e == "BADVALUES" else str(tmp_path / "nope.npy") if e == "MISSING" else e
             for e in extra]
    code = cli.main(["diagnose", str(tmp_path / "a.npy"), "--out", str(tmp_path / "o"), *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("singleloc diagnose: error:") and word in err
    assert not (tmp_path / "o").exists()


def test_diagnose_rejects_a_file_that_is_not_npy(tmp_path, capsys):
    (tmp_path / "x.npy").write_text("not an array\n")
    assert cli.main(["diagnose", str(tmp_path / "x.npy")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a readable .npy" in err


@pytest.mark.parametrize("samples", [20, 45, 116, 270])
def test_the_stated_power_is_the_smallest_ks_statistic_that_rejects(samples):
    """The detectable shift against scipy's exact one-sided test: samples ``a`` and ``a`` shifted by
    ``k + 1/2`` have the KS statistic ``(k + 1) / S``; the smallest one that rejects at 0.01 lies
    within one step ``1/S`` above the stated shift."""
    from scipy import stats

    from singleloc.attention._top_n import detectable_shift

    a = np.arange(samples, dtype=float)
    rejecting = [stats.ks_2samp(a, a + k + 0.5, alternative="greater") for k in range(samples)]
    smallest = min(r.statistic for r in rejecting if r.pvalue < 0.01)
    shift = detectable_shift(samples, samples, 0.01)
    assert shift - 1e-9 <= smallest <= shift + 1.0 / samples + 1e-9


def test_diagnose_states_its_power_and_warns_when_it_is_low(rng):
    from singleloc.attention._top_n import stable_samples

    L = 16
    few = singleloc.diagnose_attention(_causal_attention(rng, (1, 45), L), rng.standard_normal((1, 45, L, 4)),
                                       top_n=[1, 2, 4], temperatures=[1.0], max_rows=4)
    table = few.table()
    assert few.ks_sample_count == 45 and few.top_n["detectable_shift"] == pytest.approx(math.sqrt(math.log(100) / 45))
    assert "power: with 45 samples per N the tests detect a rise of d only where it moves" in table
    assert f"warning: low power: fewer than {stable_samples(0.01)} samples (heads: 45)" in table
    many = singleloc.diagnose_attention(_causal_attention(rng, (1, 150), L), rng.standard_normal((1, 150, L, 4)),
                                        top_n=[1, 2, 4], temperatures=[1.0], max_rows=4)
    assert many.top_n["detectable_shift"] < 0.2 and "power: with 150 samples" in many.table()
    assert "warning: low power" not in many.table() and stable_samples(0.01) == 116
