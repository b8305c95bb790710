"""Long sequences (issue 22, experiments/long_context.py, docs/long_context.md).

* The checks before a run follow the route: on the exact route (the risk and ``O(lr)`` drift
  of the Laplace form, whose cost does not depend on ``L``) a long sequence is not refused by
  the rule route's quadrature limits, and ``singleloc sweep`` accepts it; on the rule route it
  still is.
* Scalable softmax is softmax on rescaled keys: with ``c = s log L``, the ssmax risk at
  ``(M, Q, b)`` is the softmax risk at ``(c M, c^2 Q, c b)`` (exact route, any ``L``), and its
  ODE at learning rate ``lr`` is softmax's at ``c^2 lr`` in the rescaled coordinates.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _tiny import route_of

import singleloc as sl
from singleloc.expectations._sobol_geometry import NODE_BATCH, node_batch
from singleloc.preflight import _resources
from singleloc.preflight._build import build

pytestmark = pytest.mark.exact_route


def _config(L: int, route: str, **extra) -> sl.Config:
    sets = [f"problem.L={L}", "model.heads=4", "problem.F=1", f"theory.route={route}"]
    return sl.load_config("default", sets + [f"{k}={v}" for k, v in extra.items()])


def test_long_sequences_pass_the_checks_on_the_exact_route_only(monkeypatch):
    monkeypatch.setenv(_resources.MEMORY_ENV, "none")  # the quadrature's limits alone
    exact = _config(4096, "auto")
    assert route_of(exact).route == "exact"
    _resources.check_run(build(exact), theory_starts=exact.simulation.seeds)  # 4 starts at L * H = 16384: not refused
    _resources.check_run(build(_config(32768, "auto")), theory_starts=1)  # beyond Sobol's 21201 dimensions
    with pytest.raises(ValueError, match="theory.points = 4096 must be at least"):
        _resources.check_run(build(_config(4096, "rule")), theory_starts=1)
    with pytest.raises(ValueError, match="Sobol"):
        _resources.check_run(build(_config(8192, "rule", **{"theory.points": 65536})), theory_starts=1)


def test_sweep_accepts_a_long_sequence_on_the_exact_route(monkeypatch, tmp_path):
    """``singleloc sweep`` runs its checks for every point before the first is computed: the grid
    ``L = 4, 4096`` with two heads and four seeds is accepted within 24 GB (the sweep itself is
    replaced: only the checks run)."""
    from types import SimpleNamespace

    import singleloc.sweeps._sweep
    from singleloc import cli

    monkeypatch.setenv(_resources.MEMORY_ENV, "24G")
    checked, swept = [], []
    monkeypatch.setattr(_resources, "check_workers", lambda *a, **k: checked.append(True))  # after every point's check_run
    stats = SimpleNamespace(failed=0, computed=0, cached=0, seconds=0.0)
    monkeypatch.setattr(singleloc.sweeps._sweep, "compute_sweep", lambda *a, **k: swept.append(True) or
                        SimpleNamespace(rows=[], stats=stats))
    monkeypatch.setattr(singleloc.sweeps._sweep, "write_sweep_outputs", lambda *a, **k: None)
    code = cli.main(["sweep", "default", "--set", "theory.route=auto", "--set", "model.heads=2", "--set", "problem.F=1",
                     "--grid", "problem.L=4,4096", "--out", str(tmp_path / "out")])
    assert code == 0 and checked and swept


def test_ssmax_risk_is_softmax_risk_on_rescaled_keys():
    prior = sl.spikes(1, 2.5)
    L = 64
    c = math.log(L)  # the registered ssmax: s = 1
    M, Q, b = np.array([[0.6]]), np.array([[0.5]]), np.zeros(1)
    ss = sl.population_risk(prior, L, "ssmax", M, Q, b)
    sm = sl.population_risk(prior, L, "softmax", c * M, c**2 * Q, c * b)
    assert abs(ss.value - sm.value) < 1e-9 + 10 * (ss.error + sm.error)
    assert abs(ss.value - sl.population_risk(prior, L, "softmax", M, Q, b).value) > 0.02  # not a trivial equality


@pytest.mark.slow
def test_ssmax_ode_is_softmax_ode_at_rescaled_learning_rate():
    import jax.numpy as jnp

    L, lr = 16, 0.5
    c = math.log(L)
    ss = sl.load_config("default", [f"problem.L={L}", "model.heads=1", "problem.F=1", "model.activation=ssmax",
                                    "theory.route=auto", f"sgd.lr={lr}"])
    sm = ss.replace(model={"activation": "softmax"}, sgd={"lr": lr * c**2})
    M, Q, b = jnp.array([[0.7]]), jnp.array([[0.8]]), jnp.zeros(1)
    d_ss = sl.OrderParameterODE.from_setup(sl.build(ss)).drift(M, Q, b)
    d_sm = sl.OrderParameterODE.from_setup(sl.build(sm)).drift(c * M, c**2 * Q, c * b)
    np.testing.assert_allclose(c * np.asarray(d_ss.M), np.asarray(d_sm.M), rtol=1e-6)
    np.testing.assert_allclose(c**2 * np.asarray(d_ss.Q), np.asarray(d_sm.Q), rtol=1e-6)


def test_four_heads_at_L_4096_fit_because_the_node_batch_follows_L(monkeypatch):
    """Four heads and four seeds at ``L = 4096`` were refused at 76 GB: the quadrature evaluated
    8192 nodes of 16384 fields at once for every start. The rule's node batch now follows ``L *
    H`` (256 nodes there), the memory estimate counts the same batch, and the run fits in 24 GB
    (about 16 GB estimated: the exact route's rank-aware Gram rule holds ``2 L H`` coordinates per
    node); a few fields keep the batch of 8192 (no number changes there)."""
    monkeypatch.setenv(_resources.MEMORY_ENV, "24G")
    cfg = _config(4096, "auto")
    _resources.check_run(build(cfg), theory_starts=4)
    assert _resources.theory_bytes(cfg.problem.L, cfg.model.heads, cfg.problem.build_prior(), cfg.theory, route_of(cfg), 4) < 20e9
    rule = sl.LocalFields.make(4096, 4, cfg.problem.build_prior(), 16)
    assert rule.batch_size == node_batch(4096, 4) == 256
    assert sl.LocalFields.make(4, 2, cfg.problem.build_prior(), 16).batch_size == NODE_BATCH
