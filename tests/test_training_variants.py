"""Training variants of the SGD rule (issue 24, docs/model.md section 11): mini-batches, weight
decay, learning-rate schedules and gradient flow, each against finite-D SGD.

The fast checks take the finite-D side from the simulator's own step (``_run_functions``): many
independent steps from one state give the mean increment (the drift) and its covariance (the SDE's)
with their Monte Carlo errors; the slow ones compare ODE and simulation trajectories at large D.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import tiny
from helpers import finite_windows

import singleloc as sl
from singleloc.model._data import make_spikes, sample_sequence
from singleloc.model._layer import finite_loss, scores, token_weights
from singleloc.sgd._sgd_rule import AbstractVariant
from singleloc.theory._fluctuations import update_moments
from singleloc.theory._theory import flatten_state, unflatten_state

# ---------------------------------------------------------------------------------------------
# configuration keys


@pytest.mark.parametrize("override, key", [
    ("sgd.batch=0", "sgd.batch"), ("sgd.batch=1.5", "sgd.batch"), ("sgd.weight_decay=-0.1", "sgd.weight_decay"),
    ("sgd.bias_decay=-1", "sgd.bias_decay"), ("sgd.schedule=linear", "sgd.schedule"),
    ("sgd.schedule_tau=0", "sgd.schedule_tau"), ("sgd.decay_factor=2", "sgd.decay_factor"),
    ("sgd.warmup_tau=-1", "sgd.warmup_tau"), ("sgd.schedule=warmup", "sgd.warmup_tau"),
    ("sgd.gradient_flow=1", "sgd.gradient_flow"), ("sgd.momentum=1", "sgd.momentum"), ("sgd.momentum=-0.1", "sgd.momentum"),
    ("sgd.momentum=fast", "sgd.momentum"),
])
def test_invalid_variant_keys_are_named(override, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        sl.load_config("default", [override])


def test_variant_keys_reach_the_rule():
    cfg = sl.load_config("softmax1", ["model.train_bias=true", "sgd.batch=8", "sgd.weight_decay=0.3", "sgd.bias_decay=0.2",
                                      "sgd.schedule=cosine", "sgd.schedule_tau=20", "sgd.decay_factor=0.05",
                                      "sgd.warmup_tau=1.5", "sgd.gradient_flow=true"])
    rule = sl.sgd_rule(cfg.sgd, cfg.model)
    assert rule == sl.GradientFlow(cfg.sgd.lr, True, (sl.LearningRateSchedule("cosine", 20.0, 0.05, 1.5), sl.MiniBatch(8),
                                                      sl.WeightDecay(0.3, 0.2)))
    assert rule.batch == 8 and rule.weighting == sl.UniformHeads()
    assert sl.Config.from_dict(cfg.to_dict()) == cfg  # config.json reads back
    plain = sl.load_config("default")
    assert sl.sgd_rule(plain.sgd, plain.model) == sl.OnlineSGD(0.5, False)  # the defaults are plain SGD
    with pytest.raises(ValueError, match=r"sgd\.bias_decay .*model\.train_bias"):
        sl.load_config("softmax1", ["sgd.bias_decay=0.1", "model.train_bias=false"])
    with pytest.raises(ValueError, match=r"sgd\.gradient_flow"):
        sl.simulate(sl.load_config("default", ["sgd.gradient_flow=true", "simulation.D=64", "sgd.tau_max=1"]))


def test_schedule_values():
    """The rates of docs/model.md section 11.3, from their closed forms."""
    lr = 0.8

    def rate(kind, tau, **kw):
        cfg = sl.load_config("default", [f"sgd.lr={lr}", f"sgd.schedule={kind}"] + [f"sgd.{k}={v}" for k, v in kw.items()])
        return float(sl.sgd_rule(cfg.sgd, cfg.model).learning_rate(tau))

    assert rate("constant", 7.0) == lr
    assert [rate("step", t, schedule_tau=10, decay_factor=0.5) for t in (0, 9.99, 10, 25)] == pytest.approx(
        [0.8, 0.8, 0.4, 0.2], rel=1e-12)
    assert [rate("cosine", t, schedule_tau=10, decay_factor=0.1) for t in (0, 5, 10, 30)] == pytest.approx(
        [0.8, 0.8 * 0.55, 0.08, 0.08], rel=1e-12)
    assert rate("cosine", 2.5, schedule_tau=10, decay_factor=0.0) == pytest.approx(0.8 * (1 + math.cos(math.pi / 4)) / 2)
    assert [rate("inverse", t, schedule_tau=5) for t in (0, 5, 15)] == pytest.approx([0.8, 0.4, 0.2], rel=1e-12)
    assert [rate("warmup", t, warmup_tau=2) for t in (0, 1, 2, 50)] == pytest.approx([0.0, 0.4, 0.8, 0.8], rel=1e-12)
    # the ramp multiplies any schedule
    assert rate("inverse", 1.0, schedule_tau=1, warmup_tau=4) == pytest.approx(0.8 * 0.25 * 0.5, rel=1e-12)
    # per sequence, a batch of B divides it
    cfg = sl.load_config("default", ["sgd.lr=0.8", "sgd.batch=4", "sgd.schedule=inverse", "sgd.schedule_tau=5"])
    assert float(sl.sgd_rule(cfg.sgd, cfg.model).rate(5.0)) == pytest.approx(0.1, rel=1e-12)


# ---------------------------------------------------------------------------------------------
# one finite-D step, exactly (every rule: plain SGD, a batch with decay)


@pytest.mark.parametrize("activation, lr, train_bias, B, wd, bd", [("bsoftmax", 0.7, True, 1, 0.0, 0.0),
                                                                   ("bsoftmax", 0.7, False, 1, 0.0, 0.0),
                                                                   ("softmax1", 0.9, True, 3, 0.7, 0.4)],
                         ids=["plain", "plain-fixed-bias", "batch-decay"])
def test_a_step_in_order_parameters_is_the_update(activation, lr, train_bias, B, wd, bd):
    """The contract of a step: ``D`` times the change of ``(M, Q, b)`` by one finite-D :meth:`step` of ``B``
    sequences (the mean gradient of the batch; plain SGD: one, docs/model.md section 5.2), with weight and
    bias decay, is the sum over the batch of the rule's per-sequence ``update`` (rate ``lr / B``), exactly,
    once the finite-D terms docs/model.md section 11 drops are added: the batch's full token Gram matrix (its
    cross blocks included; ``I`` in the update's limit) and the decay's square and its product with the
    gradient. Plain SGD has no state of its own, and fixed biases do not move."""
    D, H, F, L = 512, 2, 2, 4
    variants = (sl.MiniBatch(B), sl.WeightDecay(wd, bd)) if B > 1 else ()
    rule = sl.OnlineSGD(lr, train_bias, variants)
    act = sl.get_activation(activation)
    kstar = make_spikes(jax.random.PRNGKey(0), F, D).astype(jnp.float64)
    K = jnp.array([[0.8, 0.3], [-0.2, 0.6]]) @ kstar + 0.5 * jax.random.normal(jax.random.PRNGKey(1), (H, D))
    b = jnp.array([0.1, -0.2])
    seqs = [sample_sequence(k, sl.binary(F, 3.0), kstar, L) for k in jax.random.split(jax.random.PRNGKey(2), B)]
    grad = jax.jit(jax.grad(lambda K, b, X, eps: finite_loss(act, K, b, X, eps), argnums=(0, 1)))
    grads = [grad(K, b, X, eps) for X, eps in seqs]
    gK, gb = sum(g[0] for g in grads) / B, sum(g[1] for g in grads) / B
    params = sl.LayerParameters(K, b)
    (K1, b1, _), state = rule.step(0.0, params, sl.LayerParameters(gK, gb), rule.init_state(params), D)
    assert variants or state == ()
    M, Q = K @ kstar.T / D, K @ K.T / D
    stepped = (D * (K1 @ kstar.T / D - M), D * (K1 @ K1.T / D - Q), D * (b1 - b))

    r = lr / B
    total = [0.0, 0.0, 0.0]
    ds, Xs = [], []
    score_grad = jax.jit(jax.grad(lambda S, X, eps: jnp.sum((X[eps] - token_weights(act, S) @ X) ** 2) / D))
    for X, eps in seqs:
        d = score_grad(scores(K, b, X), X, eps)
        g, nu = X @ K.T / jnp.sqrt(D), X @ kstar.T / jnp.sqrt(D)
        U = rule.update(0.0, M, Q, b, d, g, nu)
        total = [t + u for t, u in zip(total, U)]
        ds.append(d)
        Xs.append(X)
    Dd = jnp.concatenate(ds, axis=1)  # (H, B L): the batch's score gradients
    X = jnp.concatenate(Xs)  # (B L, D)
    gram = r**2 * (Dd @ (X @ X.T / D) @ Dd.T - Dd @ Dd.T)  # full finite-D Gram minus the update's limit part
    a = lr * wd / D
    gbar = (Dd @ X / jnp.sqrt(D)) / B  # the mean key gradient, (H, D)
    decay = a**2 * D * Q + a * lr * (gbar @ K.T + K @ gbar.T)
    np.testing.assert_allclose(stepped[0], total[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(stepped[1], total[1] + gram + decay, rtol=0, atol=1e-11)
    np.testing.assert_allclose(stepped[2], total[2] if train_bias else 0 * b, rtol=0, atol=1e-12)
    assert not train_bias or np.abs(total[2]).max() > 1e-3  # (the biases do move)
    assert not wd or (np.abs(B * r * wd * M).max() > 0.1 and np.abs(B * r * bd * b).max() > 0.01)  # the decay acts


# ---------------------------------------------------------------------------------------------
# the drift and the covariance against many finite-D steps from one state

#: The tiny problem on the rule with the state's 2 heads x 2 spikes (helpers.finite_windows), at D = 600.
BASE = ("problem.L=4", "problem.F=2", "simulation.D=600", "theory.points=256", "sgd.lr=1.0")
N_STEPS = 4000


VARIANTS = {
    "plain": [],
    "batch": ["sgd.batch=4", "sgd.lr=2.0"],
    "decay": ["sgd.weight_decay=0.5", "sgd.bias_decay=1.0"],
    "schedule": ["sgd.batch=2", "sgd.lr=2.0", "sgd.schedule=step", "sgd.schedule_tau=0.5", "sgd.decay_factor=0.5"],
    "momentum": ["sgd.lr=0.5", "sgd.momentum=0.75"],  # effective rate 2; windows of 4 steps and 100 that land the echo
}


def variant(name: str):
    """The config of a variant of :data:`VARIANTS` (softmax1: trained biases)."""
    return tiny(*BASE, *VARIANTS[name], rule=True, preset="softmax1")


def test_the_contract_covers_every_variant_class():
    """Every SGD variant class of the package is in the contract (:data:`VARIANTS`)."""
    classes = {type(p) for name in VARIANTS for p in sl.sgd_rule(variant(name).sgd, variant(name).model).variants}
    assert classes == {c for c in AbstractVariant.__subclasses__() if c.__module__.startswith("singleloc.")}


@pytest.fixture(scope="module")
def moments():
    """The field averages of the loss gradient at the state of :func:`~helpers.finite_windows` (the same
    layer for every variant: the spikes and the state depend on the seed and ``D`` only)."""
    cfg = variant("plain")
    y0, _ = finite_windows(cfg, 2)
    M, Q, b = unflatten_state(y0, 2, 2)
    return (M, Q, b), sl.OrderParameterODE.from_setup(sl.build(cfg)).gradient_moments(M, Q, b)


# plain SGD is the control (slow: tests/test_simulation.py and tests/test_sgd_rule.py cover it)
@pytest.mark.parametrize("name", [pytest.param("plain", marks=pytest.mark.slow), "batch", "decay", "schedule", "momentum"])
def test_variant_drift_is_the_mean_of_finite_D_steps(name, moments):
    """The contract of every variant: the rule's drift at a trained-like state against the mean increment
    per sequence of 4000 independent windows of simulator steps there (time ``tau = t B / D``, so the drift is
    ``D / B`` times the mean change of a step; with momentum, windows of 4 steps whose echo 100 zero-gradient
    steps land), within 4 standard errors plus 0.01 (quadrature and O(1/D)); the plain rule at the same
    ``sgd.lr`` (no batch, no decay, no schedule, no momentum) is rejected by the same data."""
    cfg = variant(name)
    B, D = cfg.sgd.batch, cfg.simulation.D
    t = 330 if name == "schedule" else 0  # tau = t B / D = 1.1: the rate has dropped twice (lr / 4)
    tau = t * B / D
    windows = {"steps": 4, "flush": 100} if name == "momentum" else {}
    y0, v = finite_windows(cfg, N_STEPS, t=t, **windows)
    mean, se = v.mean(0) / B, v.std(0, ddof=1) / B / np.sqrt(len(v))
    (M, Q, b), m = moments
    np.testing.assert_array_equal(y0, flatten_state(M, Q, b, True))
    drift = np.asarray(flatten_state(*sl.sgd_rule(cfg.sgd, cfg.model).drift(tau, M, Q, b, m), True))
    err = np.abs(mean - drift)
    assert np.all(err <= 4 * se + 0.01), (name, err, se)
    if name != "plain":
        plain = np.asarray(flatten_state(*sl.OnlineSGD(cfg.sgd.lr, True).drift(tau, M, Q, b, m), True))
        assert np.max(np.abs(mean - plain) / (4 * se + 0.01)) > 3, name


@pytest.mark.slow
def test_batch_update_covariance_is_the_single_sequence_covariance_at_rate_lr_over_B():
    """A step of ``B`` sequences adds ``B`` independent updates at the rate ``lr / B``: the
    covariance of ``D`` times its change is ``B Sigma`` with the rule's ``Sigma`` (the SDE's
    covariance per sequence, docs/model.md section 11.1), so at the same ``lr`` the per-step
    noise carries ``1 / B``. Relative Frobenius error below 0.1 (Monte Carlo of fourth moments
    over 6000 steps and finite D; the single-step test of tests/test_fluctuations.py sees 4-6%);
    a covariance ``B`` times larger (noise summed over the batch, not averaged) is rejected."""
    cfg = variant("batch")
    y0, v = finite_windows(cfg, 6000)
    emp = np.cov(v.T)
    ode = sl.OrderParameterODE.from_setup(sl.build(cfg))
    _, Sigma = update_moments(ode, *unflatten_state(y0, 2, 2))
    B = cfg.sgd.batch
    rel = lambda S: np.linalg.norm(S - emp) / np.linalg.norm(emp)
    assert rel(B * np.asarray(Sigma)) < 0.1, rel(B * np.asarray(Sigma))
    assert rel(B * B * np.asarray(Sigma)) > 0.5


# ---------------------------------------------------------------------------------------------
# gradient flow

GF = ["problem.prior=flipped", "problem.strength=3.0", "problem.L=3", "theory.points=64", "theory.route=rule",
      "theory.rtol=1e-8", "theory.atol=1e-10", "simulation.D=200", "simulation.seeds=1"]


def test_gradient_flow_is_the_small_rate_limit_in_the_time_lr_tau():
    """SGD's ODE at rate ``eps`` on the times ``s / eps`` tends to gradient flow at rate 1 on ``s``,
    its difference halving with ``eps`` (an O(eps) correction, docs/model.md section 11.4); and the
    gradient flow at rate 0.5 on ``s / 0.5`` is that at rate 1 on ``s`` (time ``lr tau``)."""
    base = sl.load_config("bsoftmax", GF)
    y0 = sl.initial_conditions(base)
    s = np.linspace(0.0, 6.0, 4)
    flow = sl.integrate(base.replace(sgd={"lr": 1.0, "gradient_flow": True}), y0, ts=s, progress=False)
    half = sl.integrate(base.replace(sgd={"lr": 0.5, "gradient_flow": True}), y0, ts=s / 0.5, progress=False)
    np.testing.assert_allclose(half.Q, flow.Q, atol=1e-5)
    np.testing.assert_allclose(half.M, flow.M, atol=1e-5)
    gaps = []
    for eps in (0.2, 0.1):
        sgd = sl.integrate(base.replace(sgd={"lr": eps}), y0, ts=s / eps, progress=False)
        gaps.append(max(np.abs(sgd.Q - flow.Q).max(), np.abs(sgd.M - flow.M).max()))
    assert gaps[0] > 1e-3  # the lr^2 term is visible at eps = 0.2
    assert 0.35 < gaps[1] / gaps[0] < 0.65, gaps


# ---------------------------------------------------------------------------------------------
# trajectories: ODE against simulation at large D (slow)

SLOW_VARIANTS = {
    "batch": ["sgd.batch=4", "sgd.lr=2.0"],
    "decay": ["sgd.weight_decay=0.3", "sgd.bias_decay=0.5", "sgd.lr=1.0"],
    "cosine": ["sgd.schedule=cosine", "sgd.schedule_tau=3", "sgd.decay_factor=0.1", "sgd.warmup_tau=0.5", "sgd.lr=1.0"],
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(SLOW_VARIANTS))
def test_variant_theory_tracks_a_large_D_simulation(variant):
    """As tests/test_ode.py's check of plain SGD: early dynamics (tau <= 3) at D = 4000, the ODE of
    each seed's start against its simulation, within 4 Monte Carlo errors of the test risk plus
    0.01, and the overlaps within 0.05."""
    cfg = sl.load_config("softmax1", ["model.train_bias=true", "simulation.D=4000", "simulation.seeds=2", "sgd.tau_max=3",
                                      "sgd.n_save=4", "theory.points=1024", "theory.route=rule", *SLOW_VARIANTS[variant]])
    sim = sl.simulate(cfg, progress=False)
    th = sl.integrate(cfg, sl.initial_conditions(cfg), ts=sim.tau, progress=False)
    se = 1.0 / np.sqrt(cfg.simulation.test_samples)
    assert np.max(np.abs(sim.risk - th.risk)) < 4 * se + 0.01
    assert np.max(np.abs(sim.M - th.M)) < 0.05
    assert np.max(np.abs(sim.Q - th.Q)) < 0.05
