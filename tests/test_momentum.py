"""SGD with heavy-ball momentum (``sgd.momentum``, docs/model.md section 11.6): the finite-D step
against its closed form, and the online limit (plain SGD at the effective rate ``lr / (1 - beta)``)
against the simulator: the mean and the covariance of many finite-D windows from one state, and
(slow) whole trajectories at large D.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import tiny
from helpers import finite_windows

import singleloc as sl
from singleloc.theory._fluctuations import update_moments
from singleloc.theory._theory import flatten_state, unflatten_state


def test_momentum_key_reaches_the_rule_and_stays_out_of_plain_configs():
    cfg = sl.load_config("softmax1", ["model.train_bias=true", "sgd.momentum=0.9", "sgd.batch=2", "sgd.weight_decay=0.1"])
    rule = sl.sgd_rule(cfg.sgd, cfg.model)
    assert rule == sl.OnlineSGD(cfg.sgd.lr, True, (sl.MiniBatch(2), sl.WeightDecay(0.1), sl.Momentum(0.9)))
    assert float(rule.rate(0.0)) == pytest.approx(cfg.sgd.lr / 2 / 0.1, rel=1e-12)
    assert sl.Config.from_dict(cfg.to_dict()) == cfg
    # plain SGD's config.json (so every run folder's and sweep entry's hash) does not gain the key
    assert "momentum" not in sl.load_config("default").to_dict()["sgd"]
    plain = sl.load_config("default", ["sgd.momentum=0"])
    assert sl.sgd_rule(plain.sgd, plain.model) == sl.OnlineSGD(plain.sgd.lr, False)
    with pytest.raises(ValueError, match=r"^Momentum: beta: must be < 1.0, got 1.0"):
        sl.Momentum(1.0)


def test_the_heavy_ball_step_is_the_geometric_echo_of_the_gradients():
    """After ``n`` steps from a zero velocity with given gradients ``g_s``, the parameters are
    ``p_0 - lr sum_s g_s (1 - beta^(n - s)) / (1 - beta)`` (keys) and the same with ``lr / D``
    (biases, head weights), the closed form of ``u <- beta u + g, p <- p - lr u``; with a weight
    decay before the momentum the velocity holds the decay too (a recursion written out here)."""
    H, D, n, lr, beta, wd = 2, 50, 7, 0.3, 0.6, 0.8
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    p0 = sl.LayerParameters(jax.random.normal(keys[0], (H, D)), jnp.array([0.2, -0.1]), jnp.array([0.5, 0.5]))
    gs = [sl.LayerParameters(*(jax.random.normal(k, x.shape) for x in p0)) for k in jax.random.split(keys[1], n)]
    rule = sl.OnlineSGD(lr, True, (sl.Momentum(beta),), weighting=sl.TrainedHeads())
    params, state = p0, rule.init_state(p0)
    for g in gs:
        params, state = rule.step(0.0, params, g, state, D)
    weights = [(1 - beta ** (n - s)) / (1 - beta) for s in range(n)]
    echo = [sum(w * getattr(g, name) for w, g in zip(weights, gs)) for name in ("K", "b", "v")]
    np.testing.assert_allclose(params.K, p0.K - lr * echo[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(params.b, p0.b - lr / D * echo[1], rtol=0, atol=1e-13)
    np.testing.assert_allclose(params.v, p0.v - lr / D * echo[2], rtol=0, atol=1e-13)
    assert np.abs(np.asarray(params.K - p0.K + lr * sum(g.K for g in gs))).max() > 1.0  # not plain SGD

    coupled = sl.OnlineSGD(lr, False, (sl.WeightDecay(wd), sl.Momentum(beta)))
    params, state = p0, coupled.init_state(p0)
    K, u = p0.K, jnp.zeros_like(p0.K)
    for g in gs:
        params, state = coupled.step(0.0, params, g, state, D)
        u = beta * u + g.K + (wd / D) * K
        K = K - lr * u
    np.testing.assert_allclose(params.K, K, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(params.b, p0.b)  # the biases do not train here

    # beta = 0 is plain SGD, bit for bit (u = 0 u + g = g)
    still, plain = sl.OnlineSGD(lr, True, (sl.Momentum(0.0),)), sl.OnlineSGD(lr, True)
    p_still, p_plain = (r.step(0.0, p0, gs[0], r.init_state(p0), D)[0] for r in (still, plain))
    for x, y in zip(jax.tree.leaves(p_still), jax.tree.leaves(p_plain)):
        np.testing.assert_array_equal(x, y)


def test_a_decay_moves_at_the_rate_of_its_place_in_the_chain():
    """A weight decay before the momentum enters the velocity (its drift terms at ``lr / (1 - beta)``,
    the coupled decay ``sgd_rule`` builds); after it, the step (at ``lr``, decoupled), from the closed
    forms ``-r wd M``, ``-2 r wd Q``. (The decoupled order is not reachable from a config and has no
    finite-D check here.)"""
    lr, beta, wd = 0.4, 0.5, 0.3
    M, Q, b = jnp.array([[0.5, 0.1], [0.0, 0.3]]), jnp.array([[1.0, 0.2], [0.2, 0.8]]), jnp.zeros(2)
    m = sl.GradientMoments(jnp.ones((2, 2)), jnp.eye(2), jnp.ones(2), jnp.eye(2))
    bare = sl.OnlineSGD(lr, False, (sl.Momentum(beta),)).drift(0.0, M, Q, b, m)
    for chain, r in (((sl.WeightDecay(wd), sl.Momentum(beta)), lr / (1 - beta)), ((sl.Momentum(beta), sl.WeightDecay(wd)), lr)):
        d = sl.OnlineSGD(lr, False, chain).drift(0.0, M, Q, b, m)
        np.testing.assert_allclose(d.M - bare.M, -r * wd * M, rtol=1e-14)
        np.testing.assert_allclose(d.Q - bare.Q, -2 * r * wd * Q, rtol=1e-14)


# ---------------------------------------------------------------------------------------------
# the online limit against finite-D windows from one state

LR, BETA = 0.5, 0.75  # effective rate LR / (1 - BETA) = 2; the echo lasts about 1 / (1 - BETA) = 4 steps
BASE = ("problem.L=4", "problem.F=2", "simulation.D=600", "theory.points=256")  # tiny(rule=True): the state's 2 x 2
N_SEQ, N_FLUSH = 4, 100  # sequences per window; zero-gradient steps that land the echo (BETA^100 ~ 3e-13)


@pytest.fixture(scope="module")
def windows():
    """Momentum ``BETA`` at ``LR``, and plain SGD at the effective rate ``LR / (1 - BETA)`` on the same
    sequences: ``(cfg, y0, v_momentum, v_plain)`` of :func:`~helpers.finite_windows` (``N_SEQ`` steps, ``N_FLUSH``
    to land the echo), 4000 windows each."""
    cfg = tiny(*BASE, f"sgd.lr={LR}", f"sgd.momentum={BETA}", rule=True, preset="softmax1")
    y0, v = finite_windows(cfg, 4000, steps=N_SEQ, flush=N_FLUSH)
    plain = tiny(*BASE, f"sgd.lr={LR / (1 - BETA)}", rule=True, preset="softmax1")
    y0_plain, v_plain = finite_windows(plain, 4000, steps=N_SEQ, flush=N_FLUSH)
    np.testing.assert_array_equal(y0, y0_plain)
    return cfg, y0, v, v_plain


def test_momentum_drift_is_plain_sgd_at_the_effective_rate(windows):
    """The momentum rule's drift is plain SGD's at ``lr / (1 - beta)`` (exactly; the contract of
    tests/test_training_variants.py checks it against the mean of finite-D windows and rejects plain SGD at
    ``lr``), and the windows of momentum and of plain SGD at ``lr / (1 - beta)`` fed the same sequences agree:
    the paired difference of their means within 4 of its standard errors plus the O(1/D) left by the window
    (its gradients are taken ``N_SEQ + beta / (1 - beta)`` steps apart at most, the second term the mean delay
    of an echo), that many steps over ``D`` times the largest drift entry. The data reject a Gram term of
    ``lr^2 / (1 - beta^2)`` (the velocity's own square without the cross terms of the keys against the
    velocity; its shift of the paired difference)."""
    cfg, y0, v, v_plain = windows
    M, Q, b = unflatten_state(y0, 2, 2)
    m = sl.OrderParameterODE.from_setup(sl.build(cfg)).gradient_moments(M, Q, b)
    r = LR / (1 - BETA)
    drift = np.asarray(flatten_state(*sl.sgd_rule(cfg.sgd, cfg.model).drift(0.0, M, Q, b, m), True))
    np.testing.assert_array_equal(drift, np.asarray(flatten_state(*sl.OnlineSGD(r, True).drift(0.0, M, Q, b, m), True)))
    paired = v - v_plain
    lag = BETA / (1 - BETA)
    tol_paired = 4 * paired.std(0, ddof=1) / np.sqrt(len(v)) + (N_SEQ + lag) / cfg.simulation.D * np.abs(drift).max()
    assert np.all(np.abs(paired.mean(0)) <= tol_paired), (paired.mean(0), tol_paired)
    naive_shift = -np.asarray(flatten_state(0 * M, (r**2 - LR**2 / (1 - BETA**2)) * m.cc, 0 * b, True))
    assert np.max(np.abs(paired.mean(0) - naive_shift) / tol_paired) > 3


def test_momentum_update_covariance_is_plain_sgd_at_the_effective_rate(windows):
    """The covariance of ``D`` times a window's change is ``N_SEQ`` times the SDE's ``Sigma`` at the
    effective rate (each sequence's echo-summed update is independent of the others'): relative
    Frobenius error below 0.1 (Monte Carlo of fourth moments over 4000 windows and finite D, as the
    batch's check in tests/test_training_variants.py); ``Sigma`` at the plain rate ``lr`` (a sixteenth
    of it here) is rejected."""
    cfg, y0, v, _ = windows
    emp = N_SEQ * np.cov(v.T)  # v holds D / N_SEQ times a window's change
    state = unflatten_state(y0, 2, 2)
    _, Sigma = update_moments(sl.OrderParameterODE.from_setup(sl.build(cfg)), *state)
    _, plain = update_moments(sl.OrderParameterODE.from_setup(sl.build(cfg.replace(sgd={"momentum": None}))), *state)
    rel = lambda S: np.linalg.norm(np.asarray(S) - emp) / np.linalg.norm(emp)
    assert rel(Sigma) < 0.1, rel(Sigma)
    assert rel(plain) > 0.5


# ---------------------------------------------------------------------------------------------
# trajectories at large D (slow: two simulations of 12000 steps at D = 4000 and three ODE solves, about 2 minutes)


@pytest.mark.slow
def test_momentum_simulation_tracks_plain_sgd_and_the_ode_at_the_effective_rate():
    """Momentum ``0.75`` at ``lr = 0.25`` against plain SGD at ``lr / (1 - beta) = 1`` on the same seeds
    (same starts, same sequences) and against the ODE from each seed's start, at ``D = 4000`` (8 seeds,
    ``tau <= 3``), for the risk, ``M`` and ``Q`` at each saved time ``tau > 0``; means over the seeds,
    standard errors from their spread:

    * momentum against plain SGD, paired by seed: within 4 standard errors plus the delay of the echo,
      ``delta = beta / ((1 - beta) D)`` in ``tau``, times the largest rate of change of the quantity
      along the ODE (so ``O(1/D)``; the state a gradient is taken at lags its echo by that much);
    * each simulation against the ODE (the momentum ODE is plain SGD's at the effective rate, bit for
      bit): within 4 standard errors plus 0.01 (quadrature and O(1/D), as
      tests/test_training_variants.py);
    * the ODE at the plain rate ``lr`` misses the momentum simulation by more than 10 times that."""
    lr, beta, S = 0.25, 0.75, 8
    base = ["model.train_bias=true", "simulation.D=4000", f"simulation.seeds={S}", "sgd.tau_max=3", "sgd.n_save=4",
            "theory.points=1024", "theory.route=rule"]
    momentum = sl.load_config("softmax1", base + [f"sgd.lr={lr}", f"sgd.momentum={beta}"])
    effective = sl.load_config("softmax1", base + [f"sgd.lr={lr / (1 - beta)}"])
    sim, plain = sl.simulate(momentum, progress=False), sl.simulate(effective, progress=False)
    np.testing.assert_array_equal(sim.tau, plain.tau)
    y0 = sl.initial_conditions(momentum)
    fine = np.union1d(sim.tau, np.linspace(0.0, 3.0, 31))
    at_saved = np.isin(fine, sim.tau)
    ode = sl.integrate(momentum, y0, ts=fine, progress=False)
    ode_plain = sl.integrate(effective, y0, ts=fine, progress=False)
    np.testing.assert_array_equal(ode.Q, ode_plain.Q)
    wrong = sl.integrate(momentum.replace(sgd={"momentum": None}), y0, ts=sim.tau, progress=False)

    def deviation(a, b):  # per quantity: (mean over seeds, its standard error), saved times tau > 0
        d = (a - b).reshape(S, len(sim.tau), -1)[:, 1:]
        return d.mean(0), d.std(0, ddof=1) / np.sqrt(S)

    delta = beta / ((1 - beta) * momentum.simulation.D)
    for k in ("risk", "M", "Q"):
        X = getattr(ode, k).reshape(S, len(fine), -1)
        rate = np.max(np.abs(np.diff(X, axis=1)) / np.diff(fine)[:, None])
        mean, se = deviation(getattr(sim, k), getattr(plain, k))
        assert np.all(np.abs(mean) <= 4 * se + delta * rate), (k, mean, se, delta * rate)
        for run in (sim, plain):
            mean, se = deviation(getattr(run, k), getattr(ode, k)[:, at_saved])
            assert np.all(np.abs(mean) <= 4 * se + 0.01), (k, mean, se)
        mean, se = deviation(getattr(sim, k), getattr(wrong, k))
        assert np.max(np.abs(mean)) > 10 * (4 * np.max(se) + 0.01), (k, mean)
