"""Trained head weights (issue 24 item 5, docs/model.md section 11.5): ``a_l = sum_h v_h A_hl``
with ``v`` learned by SGD like the biases.

Independent routes: the exact (Laplace) risk of a weighted layer against the Sobol rule's
expectation of the weighted loss (replicates give the tolerance); the drift of ``v`` against the
mean of many finite-D simulator steps; the ODE against a large-D simulation (slow).
"""

from __future__ import annotations

from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import route_of, tiny
from helpers import random_overlaps

import singleloc as sl
from singleloc.model._layer import limit_loss
from singleloc.preflight._build import build
from singleloc.simulation._simulation import _run_functions
from singleloc.sweeps._grid import grid_points, parse_grid
from singleloc.sweeps._sweep_dataset import sweep_dataset
from singleloc.theory._theory import flatten_state, unflatten_state


def test_head_weights_key_is_validated_and_reaches_the_rule(tmp_path):
    with pytest.raises(ValueError, match=r"model\.head_weights"):
        sl.load_config("default", ["model.head_weights=learned"])
    cfg = sl.load_config("softmax1", ["model.head_weights=trained"])
    assert sl.sgd_rule(cfg.sgd, cfg.model).weighting == sl.TrainedHeads()
    plain = sl.load_config("default")
    assert sl.sgd_rule(plain.sgd, plain.model).weighting == sl.UniformHeads()
    assert sl.Config.from_dict(cfg.to_dict()) == cfg
    y0 = sl.initial_conditions(cfg, 2)
    assert isinstance(y0, sl.WeightedOrderParameters)
    np.testing.assert_array_equal(y0.v, np.full((2, cfg.model.heads), 1 / cfg.model.heads))
    assert type(sl.initial_conditions(sl.load_config("softmax1"), 2)) is sl.OrderParameters


@pytest.mark.parametrize("activation", ["softmax", pytest.param("softmax1", marks=pytest.mark.slow), "bsoftmax"])
def test_uniform_head_weights_are_the_head_average(activation):
    """``v = 1/H`` gives the layer of the default (uniform) model: the same loss, risk and drift of
    ``(M, Q, b)`` on both routes, and a drift of ``v`` that is the risk's gradient."""
    H = 3
    s = jax.random.normal(jax.random.PRNGKey(0), (H, 4))
    act = sl.get_activation(activation)
    v = jnp.full((H,), 1 / H)
    assert float(limit_loss(act, s, 1, v)) == pytest.approx(float(limit_loss(act, s, 1)), rel=1e-14)
    M, Q, b = (jnp.asarray(x) for x in random_overlaps(np.random.default_rng(1), H, 2, m=0.8, r=0.6, b=0.3))
    base = [f"model.activation={activation}", "model.heads=3", "model.train_bias=true", "theory.points=1024", "sgd.lr=0.7"]
    both = eqx.filter_jit(lambda w, u, M, Q, b, v: (w.risk(M, Q, b, v), u.risk(M, Q, b), w.drift(M, Q, b, v=v),
                                                    u.drift(M, Q, b), jax.grad(partial(w.risk, M, Q, b))(v)))
    for route in ("rule", "exact") if activation != "bsoftmax" else ("rule",):
        uniform, weighted = (sl.OrderParameterODE.from_setup(sl.build(sl.load_config("default", [*base, f"theory.route={route}",
                                                                                          *extra])))
                             for extra in ([], ["model.head_weights=trained"]))
        risk_v, risk, d, du, grad_v = both(weighted, uniform, M, Q, b, v)
        assert float(risk_v) == pytest.approx(float(risk), rel=1e-12, abs=1e-14)
        for x, y in zip(d[:3], du):
            np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(d.v, -0.7 * grad_v, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("activation", ["softmax", *(pytest.param(a, marks=pytest.mark.slow) for a in ("softmax1", "ssmax"))])
def test_exact_weighted_risk_against_the_rule(activation):
    """The exact route's risk of a weighted layer and its gradient in ``v`` (pairs of heads
    weighted by ``v_h v_g``) against the Sobol rule's expectation of the weighted loss and of
    ``dl/dv``, on 4 scramblings of 16384 points: within 5 of their standard errors plus 1e-6."""
    H = 3
    M, Q, b = (jnp.asarray(x) for x in random_overlaps(np.random.default_rng(2), H, 2, m=0.9, r=0.7, b=0.4))
    v = jnp.array([0.55, 0.15, 0.6])
    cfg = sl.load_config("default", [f"model.activation={activation}", "model.heads=3", "model.train_bias=true",
                                     "model.head_weights=trained", "theory.points=16384"])
    exact = sl.OrderParameterODE.from_setup(sl.build(cfg.replace(theory={"route": "exact"})))
    risk, grad_v = eqx.filter_jit(lambda exact: jax.value_and_grad(lambda v: exact.risk(M, Q, b, v))(v))(exact)
    rules = [sl.OrderParameterODE.from_setup(sl.build(cfg.replace(theory={"route": "rule", "qmc_seed": 10 + r})))
             for r in range(4)]
    rule_moments = eqx.filter_jit(lambda ode: ode.expectation.moments(M, Q, b, v=v))  # one program for the four
    moments = [rule_moments(ode) for ode in rules]
    risks = np.array([float(m["risk"]) for m in moments])
    grads = np.array([np.asarray(m["cv"]) for m in moments])
    se = lambda x: x.std(axis=0, ddof=1) / np.sqrt(len(x))
    assert abs(float(risk) - risks.mean()) <= 5 * se(risks) + 1e-6, (float(risk), risks)
    np.testing.assert_array_less(np.abs(np.asarray(grad_v) - grads.mean(0)), 5 * se(grads) + 1e-6)
    # the weights matter: the head average's risk is far outside that tolerance
    assert abs(float(exact.risk(M, Q, b)) - float(risk)) > 100 * se(risks) + 1e-3


def test_head_weight_drift_is_the_mean_of_finite_D_steps():
    """The ODE's drift of ``(M, Q, b, v)`` at a trained-like weighted state against the mean
    increment of 4000 independent simulator steps (``D`` times the change), within 4 standard
    errors plus 0.01 (O(1/D) terms); the data reject the drift of ``v`` with its sign flipped."""
    cfg = sl.load_config("softmax1", ["model.train_bias=true", "model.head_weights=trained", "simulation.D=600",
                                      "sgd.lr=1.0", "theory.route=exact"])
    D = cfg.simulation.D
    init, advance, _ = _run_functions(build(cfg, theory=False))
    ((K0, b0, v0), rule_state), (kstar, _, test) = init(0)
    orth = jax.random.normal(jax.random.PRNGKey(11), K0.shape, K0.dtype)
    orth = 0.6 * (orth - (orth @ kstar.T / D) @ kstar)
    K = (jnp.array([[1.2, 0.2], [0.1, 0.9]], K0.dtype) @ kstar + orth).astype(K0.dtype)
    b, v = jnp.array([0.3, -0.4], b0.dtype), jnp.array([0.8, 0.35], v0.dtype)

    def flat(K, b, v):
        K, ks = K.astype(jnp.float64), kstar.astype(jnp.float64)
        return jnp.concatenate([flatten_state(K @ ks.T / D, K @ K.T / D, b.astype(jnp.float64), True),
                                v.astype(jnp.float64)])

    step = jax.jit(jax.vmap(lambda key: flat(*advance((sl.LayerParameters(K, b, v), rule_state), (kstar, key, test), 0, 1)[0])))
    y0 = flat(K, b, v)
    inc = D * (np.asarray(step(jax.random.split(jax.random.PRNGKey(5), 4000))) - np.asarray(y0))
    mean, se = inc.mean(0), inc.std(0, ddof=1) / np.sqrt(len(inc))
    M, Q, bb = unflatten_state(y0[:-2], 2, 2)
    d = sl.OrderParameterODE.from_setup(sl.build(cfg)).drift(M, Q, bb, v=jnp.asarray(y0[-2:]))
    drift = np.concatenate([np.asarray(flatten_state(d.M, d.Q, d.b, True)), np.asarray(d.v)])
    err = np.abs(mean - drift)
    assert np.all(err <= 4 * se + 0.01), (err, se)
    assert np.abs(np.asarray(d.v)).max() > 10 * se[-2:].max()  # v moves, measurably
    assert np.any(np.abs(mean[-2:] + drift[-2:]) > 4 * se[-2:] + 0.01)  # and a flipped sign is rejected


def test_routes_and_refusals():
    """bsoftmax with trained weights goes on the rule (its head mixture is not a normalised
    exponential); the computations written for the head average refuse trained weights by name."""
    assert route_of(sl.load_config("bsoftmax", ["model.head_weights=trained", "theory.route=auto"])).route == "rule"
    assert route_of(sl.load_config("softmax1", ["model.head_weights=trained", "theory.route=auto"])).route == "exact"
    with pytest.raises(ValueError, match=r"model\.head_weights"):
        sl.OrderParameterODE.from_setup(sl.build(sl.load_config("bsoftmax", ["model.head_weights=trained",
                                                                          "theory.route=exact"])))
    cfg = sl.load_config("softmax1", ["model.head_weights=trained", "theory.points=256"])
    y0 = sl.initial_conditions(cfg, 1)
    with pytest.raises(ValueError, match=r"integrate_sde: model\.head_weights"):
        sl.integrate_sde(sl.build(cfg), y0, jax.random.split(jax.random.PRNGKey(0), 1))
    pred = sl.predicted_escape(cfg)  # not predicted (no head-symmetric flow): NaN, and the fallback horizon
    assert np.isnan(pred.predicted_escape) and not pred.escapes and pred.horizon == sl.escape_horizon(np.nan)
    with pytest.raises(ValueError, match=r"TheoryRisk: model\.head_weights"):
        sl.TheoryRisk(build(cfg), y0.M[0], y0.Q[0], y0.b[0])
    with pytest.raises(ValueError, match=r"model\.head_weights = 'uniform'"):
        sl.integrate(sl.load_config("softmax1"), sl.WeightedOrderParameters(*y0))


def test_integrate_and_simulate_carry_the_head_weights(tmp_path, tiny_theory):
    cfg = tiny("model.head_weights=trained", preset="softmax1")  # the smallest shapes: its programs are its own
    th = sl.integrate(cfg)
    assert th.v.shape == (1, 3, 2) and np.all(th.v[:, 0] == 0.5) and np.all(th.v[:, -1] != 0.5)
    assert "v" in np.load(sl.save_theory(tmp_path / "th", cfg, th))
    sim = sl.simulate(cfg, progress=False)
    assert sim.v.shape == (2, 3, 2) and np.all(sim.v[:, 0] == 0.5)
    assert "v" in np.load(sl.save_simulation(tmp_path / "sim", cfg, sim))
    plain = tiny_theory  # a solve of uniform head weights (the session's, on the default route)
    assert plain.v is None and "v" not in np.load(sl.save_theory(tmp_path / "plain", tiny(), plain))


@pytest.mark.slow
def test_trained_head_weights_theory_tracks_a_large_D_simulation():
    """softmax1 (spikes prior, H = 2, trained biases and head weights) to tau = 40: the ODE's
    limit risk and head-weight sum against 8 seeds at D = 4000, within 4 standard errors of the
    seeds plus 0.01 (risk) or 0.02 (weights; O(1/sqrt(D)) finite-size terms)."""
    cfg = sl.load_config("softmax1", ["model.head_weights=trained", "model.train_bias=true", "sgd.tau_max=40",
                                      "sgd.n_save=9", "simulation.D=4000", "simulation.seeds=8",
                                      "simulation.test_samples=2000", "theory.route=exact"])
    th = sl.integrate(cfg)
    sim = sl.simulate(cfg, progress=False)
    se = lambda x: x.std(axis=0, ddof=1) / np.sqrt(len(x))
    risk, vsum = sim.risk_limit, sim.v.sum(-1)
    print(f"max |sim - theory|: risk {np.abs(risk.mean(0) - th.risk[0]).max():.4f} (largest SE {se(risk).max():.4f}), "
          f"sum v {np.abs(vsum.mean(0) - th.v[0].sum(-1)).max():.4f} (largest SE {se(vsum).max():.4f}); "
          f"final sum v {th.v[0, -1].sum():.4f}")
    assert np.all(np.abs(risk.mean(0) - th.risk[0]) <= 4 * se(risk) + 0.01), (risk.mean(0), th.risk[0])
    assert np.all(np.abs(vsum.mean(0) - th.v[0].sum(-1)) <= 4 * se(vsum) + 0.02), (vsum.mean(0), th.v[0].sum(-1))
    assert th.v[0, -1].sum() - 1 > 0.05  # the weights moved away from the head average


def test_sweep_dataset_holds_the_head_weights_of_the_points_that_train_them():
    """A grid over ``model.head_weights``: ``v`` is the trained point's entry, NaN for the head
    average (which stores none)."""
    grids = [parse_grid("model.head_weights=uniform,trained")]
    rows, entries = [], []
    for values, config in grid_points(sl.load_config("default"), grids):
        rows.append({**values, "heads": 2, "F": 2, "status": "ok"})
        theory = {"tau": np.array([0.0, 1.0]), "M": np.ones((1, 2, 2, 2)), "Q": np.ones((1, 2, 2, 2)), "b": np.zeros((1, 2, 2)),
                  "risk": np.ones((1, 2))}
        if config.model.head_weights == "trained":
            theory["v"] = np.array([[[0.5, 0.5], [0.7, 0.4]]])
        entries.append({"theory": theory})
    ds = sweep_dataset(sl.load_config("default"), grids, rows, entries)
    assert ds.v.dims == ("model_head_weights", "seed", "step", "head")
    np.testing.assert_array_equal(ds.v.sel(model_head_weights="trained").values, entries[1]["theory"]["v"])
    assert np.isnan(ds.v.sel(model_head_weights="uniform").values).all()

