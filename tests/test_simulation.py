"""Finite-D data, losses and online SGD (docs/model.md sections 1-5).

* the finite-D loss converges to the limit loss of section 3 (Monte Carlo at D = 4096);
* the D-independent held-out sampler of ``_heldout`` (``draw_heldout`` + ``heldout_losses``)
  has the law of brute-force D-dimensional sampling, and pruning's weights route scores the
  simulator's own held-out sequences;
* one SGD step equals a hand-written numpy gradient;
* saved overlaps match the final weights, runs are reproducible, the CLI writes the
  documented files, and divergence is reported.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import EXACT_TINY
from scipy import stats

import singleloc
from singleloc import finite_loss, get_activation, limit_loss, load_config, sample_sequence, simulate
from singleloc.cli import main
from singleloc.model._data import seed_keys
from singleloc.model._heldout import draw_heldout, heldout_losses
from singleloc.model._layer import token_weights
from singleloc.preflight._build import build
from singleloc.pruning._pruning import WeightsRisk, prune_weights
from singleloc.simulation._simulation import _run_functions

# The tiny run (_tiny.py: D = 64, 3 saved times, 2 seeds) of the preset's L = 4 and F = 2 and 64 SGD steps; softmax1
# with trained biases so that every recorded array moves.
TINY = [*EXACT_TINY, "problem.L=4", "problem.F=2", "sgd.tau_max=1"]
TINY_PRESET = "softmax1"
ARRAYS = ("tau", "M", "Q", "b", "risk", "risk_limit")


@pytest.fixture(scope="module")
def tiny_config():
    return load_config(TINY_PRESET, TINY)


@pytest.fixture(scope="module")
def tiny_run(tiny_config):
    return simulate(tiny_config, progress=False)


def _random_layer(rng, H, F, D, orthogonal_spikes):
    """Spikes, keys with O(1) overlaps (M ~ N(0, 0.8^2), Q ~ M M^T + 0.5 I) and biases."""
    kstar = orthogonal_spikes(rng, F, D)
    M = 0.8 * rng.standard_normal((H, F))
    K = M @ kstar + np.sqrt(0.5) * rng.standard_normal((H, D))
    b = 0.5 * rng.standard_normal(H)
    return jnp.asarray(K), jnp.asarray(b), jnp.asarray(kstar)


def _scores(K, b, X):
    return K @ X.T / jnp.sqrt(X.shape[-1]) + b[:, None]


# -- the loss as D -> infinity ------------------------------------------------------------


def test_finite_loss_tends_to_limit_loss(rng, orthogonal_spikes):
    """At D = 4096 the mean of ``finite - limit`` over fresh sequences is O(1/D).

    Exact decomposition: with ``P`` the projection on the r = H + F dimensional span of keys
    and spikes, ``w = e_eps - a`` and ``Y`` the (L, r) coordinates of the tokens in that span,
    ``D * finite = |w Y|^2 + |sum_l w_l P_perp x_l|^2`` and the second term has conditional
    mean ``(D - r)|w|^2`` given ``Y`` (P_perp x_l are i.i.d. N(0, P_perp), independent of the
    scores). Hence

    * ``finite - limit - (|w Y|^2 - r |w|^2) / D`` has mean exactly 0 (checked within 4 SE);
    * ``|E[finite - limit]| <= E[|w|^2 (sum_l |Y_l|^2 + r)] / D <= 2 ((L + 1) r + E|theta|^2) / D``
      (Cauchy-Schwarz, and ``|w|^2 <= 2`` because ``a >= 0`` and ``sum_l a_l <= 1``): the
      O(1/D) allowance of the raw difference, 0.013 here, against losses of order 1.
    """
    H, F, L, D = 2, 2, 4, 4096
    prior = singleloc.spikes(F, 2.5)
    K, b, kstar = _random_layer(rng, H, F, D, orthogonal_spikes)
    U = jnp.asarray(np.linalg.qr(np.concatenate([np.asarray(K), np.asarray(kstar)]).T)[0])  # (D, r)
    r = H + F
    acts = {name: get_activation(name) for name in ("softmax", "softmax1", "bsoftmax")}

    @jax.jit
    def chunk(key):
        def one(k):
            X, eps = sample_sequence(k, prior, kstar, L)
            s = _scores(K, b, X)
            Y = X @ U
            out = []
            for act in acts.values():
                fin, lim = finite_loss(act, K, b, X, eps), limit_loss(act, s, eps)
                w = jax.nn.one_hot(eps, L) - token_weights(act, s)
                corr = (jnp.sum((w @ Y) ** 2) - r * jnp.sum(w**2)) / D
                out.append(jnp.stack([fin, lim, fin - lim, fin - lim - corr]))
            return jnp.stack(out)

        return jax.vmap(one)(jax.random.split(key, 500))

    res = np.concatenate([np.asarray(chunk(jax.random.PRNGKey(i))) for i in range(6)])  # (N, 3, 4)
    n = res.shape[0]
    allowance = 2 * ((L + 1) * r + prior.probs_array() @ np.sum(prior.atoms_array() ** 2, 1)) / D
    for j, name in enumerate(acts):
        fin, lim, diff, exact = res[:, j].T
        assert 0.05 < lim.mean() < 1.5 and 0.05 < fin.mean() < 1.5, (name, lim.mean())
        # per-sample differences are O(1/sqrt(D)), i.e. small against the loss itself
        assert np.std(diff) < 0.1 * np.std(lim) + 0.05, name
        se = diff.std(ddof=1) / np.sqrt(n)
        assert abs(diff.mean()) <= 4 * se + allowance, (name, diff.mean(), se, allowance)
        se = exact.std(ddof=1) / np.sqrt(n)
        assert abs(exact.mean()) <= 4 * se, (name, exact.mean(), se)


def test_finite_loss_closed_form(rng):
    """``finite_loss`` against the formula written in numpy on fixed tokens."""
    H, L, D = 3, 5, 50
    K, b, X = rng.standard_normal((H, D)), rng.standard_normal(H), rng.standard_normal((L, D))
    for name in ("softmax", "softmax1", "bsoftmax"):
        A = _np_weights(name, K @ X.T / np.sqrt(D) + b[:, None])
        for eps in (0, 3):
            expected = np.sum((X[eps] - A.mean(0) @ X) ** 2) / D
            got = float(finite_loss(get_activation(name), jnp.asarray(K), jnp.asarray(b), jnp.asarray(X), eps))
            assert got == pytest.approx(expected, rel=1e-12)


def test_sample_sequence_law(rng, orthogonal_spikes):
    """Tokens: noise tokens are N(0, I); the relevant one carries theta along the spikes."""
    F, L, D, n = 2, 3, 256, 4000
    prior = singleloc.spikes(F, 2.0)
    kstar = jnp.asarray(orthogonal_spikes(rng, F, D))
    draw = jax.jit(jax.vmap(lambda k: sample_sequence(k, prior, kstar, L)))
    X, eps = draw(jax.random.split(jax.random.PRNGKey(3), n))
    X, eps = np.asarray(X), np.asarray(eps)
    counts = np.bincount(eps, minlength=L) / n
    assert np.all(np.abs(counts - 1 / L) < 5 * np.sqrt((1 / L) * (1 - 1 / L) / n))
    nu = X @ np.asarray(kstar).T / np.sqrt(D)  # (n, L, F)
    relevant = nu[np.arange(n), eps]  # ~ theta + N(0, I)
    others = nu[np.arange(n)[:, None], (eps[:, None] + np.arange(1, L)) % L].reshape(-1, F)
    np.testing.assert_allclose(relevant.mean(0), prior.mean(), atol=5 * np.sqrt((1 + 1.0) / n))
    assert np.all(np.abs(others.mean(0)) < 5 / np.sqrt(len(others)))
    assert np.all(np.abs(others.var(0) - 1) < 5 * np.sqrt(2 / len(others)))
    # squared norms: |x_l|^2 / D = 1 + O(1/sqrt(D)), plus |theta|^2 / D on the relevant token
    sq = (X**2).sum(-1) / D
    np.testing.assert_allclose(sq[np.arange(n), eps].mean(), 1 + 4.0 / D, atol=5 * np.sqrt(2 / D / n))


# -- the D-independent test sampler ---------------------------------------------------------


def test_heldout_losses_match_brute_force(rng, orthogonal_spikes):
    """``draw_heldout`` + ``heldout_losses`` (span coordinates + one chi-square) against
    building the D-dimensional tokens.

    Two independent Monte Carlo samples of the same law: the means agree within 4 combined
    SE, and a two-sample Kolmogorov-Smirnov test does not reject, for the empirical finite-D
    loss and for the limit loss. At D = 64 the finite-D loss differs visibly from the limit
    loss, so the comparison also tells the two apart.
    """
    H, F, L, D, n = 2, 2, 4, 64, 40_000
    act = get_activation("softmax1")  # one activation: compiling the sampler dominates the cost
    prior = singleloc.flipped(F, 2.0)
    K, b, kstar = _random_layer(rng, H, F, D, orthogonal_spikes)
    keys_b = jax.random.split(jax.random.PRNGKey(11), n)
    heldout = jax.jit(lambda k: heldout_losses(act, draw_heldout(k, prior, K, kstar, n, L), b))
    emp_a, lim_a = (np.asarray(x) for x in heldout(jax.random.PRNGKey(10)))

    @jax.jit
    def brute(keys):
        def one(k):
            X, eps = sample_sequence(k, prior, kstar, L)
            return finite_loss(act, K, b, X, eps), limit_loss(act, _scores(K, b, X), eps)

        return jax.vmap(one)(keys)

    emp_b, lim_b = (np.asarray(x) for x in brute(keys_b))
    for a, bb, what in ((emp_a, emp_b, "finite-D"), (lim_a, lim_b, "limit")):
        assert a.shape == (n,) and np.all(np.isfinite(a))
        se = np.sqrt(a.var(ddof=1) / n + bb.var(ddof=1) / n)
        assert abs(a.mean() - bb.mean()) <= 4 * se, (what, a.mean(), bb.mean(), se)
        assert stats.ks_2samp(a, bb).pvalue > 1e-3, what
    # power: the finite-D loss is not the limit loss at D = 64
    se = np.sqrt(emp_b.var() / n + lim_a.var() / n)
    assert abs(emp_b.mean() - lim_a.mean()) > 4 * se


def test_pruning_weights_route_reproduces_the_test_risk(tiny_run, tiny_config):
    """Pruning's weights evaluator and the simulator draw the same held-out sequences: with
    every head kept and the simulator's test key of the last saved time, ``WeightsRisk``
    returns the recorded test risks of each seed. The only difference allowed is float32
    rounding of the mean (the simulator averages in float32 inside its jitted program); another
    key, i.e. other sequences, moves the risk by its Monte Carlo error, far beyond that."""
    cfg, res = tiny_config, tiny_run
    S, T = res.risk.shape
    n = cfg.simulation.test_samples
    for s in range(S):
        key = jax.random.fold_in(seed_keys(cfg.simulation.seed, s).test, T - 1)
        weights = [res.K[s], res.b[s, -1], res.kstar[s]]
        emp = WeightsRisk(build(cfg, theory=False), *weights, key=key)
        lim = WeightsRisk(build(cfg, theory=False), *weights, key=key, loss="limit")
        everyone = list(range(cfg.model.heads))
        for ev, recorded in ((emp, res.risk[s, -1]), (lim, res.risk_limit[s, -1])):
            losses = ev.losses(everyone)
            assert losses.shape == (n,)
            np.testing.assert_allclose(np.float32(losses.astype(np.float32).mean()), recorded, rtol=1e-6)
        pruned = prune_weights(cfg, *weights, [0], key=key)
        assert pruned.risks[0, 0] == pytest.approx(res.risk[s, -1], rel=1e-6)
        other = WeightsRisk(build(cfg, theory=False), *weights, key=jax.random.fold_in(key, 1))(everyone)
        assert abs(other[0] - res.risk[s, -1]) > 1e-4 * res.risk[s, -1]


# -- one SGD step against numpy ---------------------------------------------------------------


def _np_weights(name, s):
    e = np.exp(s - s.max())
    if name == "softmax":
        return e / e.sum(axis=1, keepdims=True)
    if name == "softmax1":
        e = np.exp(s)
        return e / (1 + e.sum(axis=1, keepdims=True))
    return s.shape[0] * e / e.sum()


def _np_loss(name, K, b, X, eps):
    D = X.shape[1]
    a = _np_weights(name, K @ X.T / np.sqrt(D) + b[:, None]).mean(0)
    r = X[eps] - a @ X
    return r @ r / D


def _np_grad(name, K, b, X, eps):
    """Backward pass of ``l = |x_eps - sum_l a_l x_l|^2 / D`` written by hand."""
    H, D = K.shape
    s = K @ X.T / np.sqrt(D) + b[:, None]
    A = _np_weights(name, s)
    a = A.mean(0)
    res = X[eps] - a @ X
    g_a = -2.0 * (X @ res) / D  # dl/da_l
    g_A = np.broadcast_to(g_a / H, A.shape)  # dl/dA_hl
    if name in ("softmax", "softmax1"):  # dA_hl/ds_hm = A_hl (delta_lm - A_hm), for both
        g_s = A * (g_A - np.sum(A * g_A, axis=1, keepdims=True))
    else:  # A = H p with p the joint softmax: dl/ds = A g_A - p sum(A g_A)
        g_s = A * g_A - (A / H) * np.sum(A * g_A)
    return g_s @ X / np.sqrt(D), g_s.sum(axis=1)


@pytest.mark.parametrize("name", ["softmax", "softmax1", "bsoftmax"])
def test_numpy_gradient_is_right(name, rng):
    """The hand-written backward pass against central finite differences (all float64)."""
    H, L, D = 2, 3, 8
    K, b, X = rng.standard_normal((H, D)), rng.standard_normal(H), rng.standard_normal((L, D))
    gK, gb = _np_grad(name, K, b, X, 1)
    h = 1e-6
    for idx in [(0, 0), (1, 5), (0, 7)]:
        E = np.zeros_like(K)
        E[idx] = h
        fd = (_np_loss(name, K + E, b, X, 1) - _np_loss(name, K - E, b, X, 1)) / (2 * h)
        assert gK[idx] == pytest.approx(fd, rel=1e-6, abs=1e-9)
    for h_ in range(H):
        e = np.zeros(H)
        e[h_] = h
        fd = (_np_loss(name, K, b + e, X, 1) - _np_loss(name, K, b - e, X, 1)) / (2 * h)
        assert gb[h_] == pytest.approx(fd, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("name, train_bias", [("softmax", True), ("softmax1", True), ("bsoftmax", True), ("softmax1", False)])
def test_one_sgd_step_matches_numpy(name, train_bias):
    lr, D, H, L = 0.7, 64, 3, 4
    cfg = load_config(
        "default",
        [
            f"model.activation={name}",
            f"model.train_bias={'true' if train_bias else 'false'}",
            "model.bias_init=-0.4",
            f"model.heads={H}",
            f"problem.L={L}",
            f"sgd.lr={lr}",
            "sgd.init_scale=1.0",
            f"simulation.D={D}",
            "simulation.seed=5",
        ],
    )
    init, advance, _ = _run_functions(build(cfg, theory=False))
    state, consts = init(1)
    (K0, b0, _), _ = state
    kstar, train_key, _ = consts
    (K1, b1, _), _ = advance(state, consts, 0, 1)
    # the sample of step t = 0 comes from fold_in(train, 0) (documented in singleloc.model._data)
    X, eps = sample_sequence(jax.random.fold_in(train_key, 0), cfg.problem.build_prior(), kstar, L)
    K0n, b0n, Xn = (np.asarray(x, dtype=np.float64) for x in (K0, b0, X))
    gK, gb = _np_grad(name, K0n, b0n, Xn, int(eps))
    K1n, b1n = np.asarray(K1, np.float64), np.asarray(b1, np.float64)
    tol = 2e-6 if K1.dtype == jnp.float32 else 1e-12
    assert np.max(np.abs(K1n - K0n)) > 1e3 * tol  # the step moved the keys
    np.testing.assert_allclose(K1n, K0n - lr * gK, rtol=0, atol=tol)
    if not train_bias:
        np.testing.assert_array_equal(b1n, b0n)
        return
    expected_b = b0n - (lr / D) * gb
    np.testing.assert_allclose(b1n, expected_b, rtol=0, atol=0.1 * tol)
    if name == "softmax":  # the bias cancels in softmax: no gradient
        np.testing.assert_allclose(gb, 0.0, atol=1e-12)
    else:  # the bias moves by lr/D times its gradient (not lr times it)
        assert np.max(np.abs(expected_b - b0n)) > 1e2 * tol
        assert np.max(np.abs(b1n - (b0n - lr * gb))) > 1e2 * tol


def test_advance_does_not_depend_on_chunking(tiny_config):
    init, advance, _ = _run_functions(build(tiny_config, theory=False))
    params, consts = init(0)
    step = jax.jit(advance)
    whole = step(params, consts, 0, 6)
    parts = step(step(step(params, consts, 0, 2), consts, 2, 5), consts, 5, 6)
    assert jax.tree.structure(whole) == jax.tree.structure(parts)
    for x, y in zip(jax.tree.leaves(whole), jax.tree.leaves(parts)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# -- whole runs ----------------------------------------------------------------------------


def test_recorded_overlaps_match_final_weights(tiny_run, tiny_config):
    res = tiny_run
    S, H, F, D = 2, 2, 2, 64
    assert res.K.shape == (S, H, D) and res.kstar.shape == (S, F, D)
    np.testing.assert_allclose(res.tau, [0.0, 0.5, 1.0])
    K, kstar = res.K.astype(np.float64), res.kstar.astype(np.float64)
    # spikes are orthogonal with squared norm D
    for s in range(S):
        np.testing.assert_allclose(kstar[s] @ kstar[s].T, D * np.eye(F), atol=1e-4 * D)
    M = np.einsum("shd,sfd->shf", K, kstar) / D
    Q = np.einsum("shd,sgd->shg", K, K) / D
    np.testing.assert_allclose(res.M[:, -1], M, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res.Q[:, -1], Q, rtol=1e-5, atol=1e-6)
    # and the saved initial overlaps are those of the documented initialisation
    for s in range(S):
        M0, Q0 = singleloc.initial_overlaps(tiny_config.simulation.seed, s, F, H, D, tiny_config.sgd.init_scale)
        np.testing.assert_allclose(res.M[s, 0], np.asarray(M0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(res.Q[s, 0], np.asarray(Q0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.diagonal(res.Q[:, 0], axis1=1, axis2=2), 0.25, atol=0.25 * 5 * np.sqrt(2 / D))
    np.testing.assert_allclose(res.b[:, 0], 0.0)
    assert not np.allclose(res.b[:, -1], 0.0)  # trained biases moved
    assert np.all(np.isfinite(res.risk)) and np.all(res.risk > 0)
    assert np.all(np.isfinite(res.risk_limit)) and np.all(res.risk_limit > 0)


def test_same_seed_is_bit_identical(tiny_run, tiny_config):
    again = simulate(tiny_config, progress=False)
    for name in ARRAYS + ("K", "kstar"):
        np.testing.assert_array_equal(getattr(again, name), getattr(tiny_run, name), err_msg=name)


def test_different_seeds_differ(tiny_run, tiny_config):
    # the two seeds of one run
    for name in ("M", "Q", "b", "risk", "risk_limit", "K", "kstar"):
        x = getattr(tiny_run, name)
        assert not np.array_equal(x[0], x[1]), name
    # another base seed
    other = simulate(tiny_config.replace(simulation={"seed": 1}), progress=False)
    np.testing.assert_array_equal(other.tau, tiny_run.tau)
    for name in ("M", "Q", "b", "risk", "risk_limit", "K", "kstar"):
        assert not np.array_equal(getattr(other, name), getattr(tiny_run, name)), name


def test_cli_simulate_writes_documented_files(tmp_path, tiny_run, tiny_config, capsys):
    out = tmp_path / "run"
    argv = ["simulate", TINY_PRESET, "--out", str(out), "--no-progress"]
    for text in TINY:
        argv += ["--set", text]
    assert main(argv) == 0
    assert "simulation.npz" in capsys.readouterr().out
    with np.load(out / "simulation.npz") as data:
        arrays = {k: data[k] for k in data.files}
    assert set(arrays) == set(ARRAYS)
    S, T, H, F = 2, 3, 2, 2
    shapes = {"tau": (T,), "M": (S, T, H, F), "Q": (S, T, H, H), "b": (S, T, H), "risk": (S, T), "risk_limit": (S, T)}
    for k, shape in shapes.items():
        assert arrays[k].shape == shape, k
    # the CLI run is the same run as the API one (same config and seed)
    for k in ARRAYS:
        np.testing.assert_array_equal(arrays[k], getattr(tiny_run, k), err_msg=k)
    meta = json.loads((out / "config.json").read_text())
    assert meta["singleloc_version"] == singleloc.__version__
    for section in ("problem", "model", "sgd", "simulation", "theory"):
        assert isinstance(meta[section], dict), section
    assert meta["simulation"]["D"] == 64 and meta["simulation"]["seeds"] == 2
    assert meta["model"]["activation"] == "softmax1" and meta["model"]["train_bias"] is True
    assert meta["sgd"]["tau_max"] == 1.0 and meta["sgd"]["lr"] == 0.5  # resolved defaults included
    assert meta["problem"]["prior"] == "spikes" and meta["problem"]["L"] == 4
    assert singleloc.Config.from_dict({k: v for k, v in meta.items() if k != "singleloc_version"}) == tiny_config
    assert not list(out.glob(".*.tmp"))  # no temporary files left behind


# -- divergence ----------------------------------------------------------------------------

# lr = 1e6: the first step already blows the keys up (|Q| ~ lr^2 / D). (With lr = 1e4 at
# D = 64 the saturated softmax stops the growth at |Q| ~ 3e5, below the detector's 1e6.)
DIVERGE = TINY + ["sgd.lr=1e6"]


def test_divergence_raises_floating_point_error(tiny_config):
    cfg = tiny_config.replace(sgd={"lr": 1e6})
    with pytest.raises(FloatingPointError, match=r"sgd\.lr"):
        simulate(cfg, progress=False)


def test_cli_divergence_exit_code(tmp_path, capsys):
    argv = ["simulate", TINY_PRESET, "--out", str(tmp_path / "run"), "--no-progress"]
    for text in DIVERGE:
        argv += ["--set", text]
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "sgd.lr" in lines[0], captured.err
    assert "Traceback" not in captured.err
    assert not (tmp_path / "run" / "simulation.npz").exists()


def test_too_small_dimension_is_rejected():
    cfg = load_config("default", ["simulation.D=4", "simulation.seeds=1"])  # D = H + F: no room for the noise tokens
    with pytest.raises(ValueError, match=r"simulation\.D"):
        simulate(cfg, progress=False)
