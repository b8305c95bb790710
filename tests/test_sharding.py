"""Every local device: the batch of starts, seeds or points split over two CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=2``, in fresh processes) gives the numbers
of one device, to float rounding; three starts, seeds and points do not divide two devices, so
the padding is exercised too. One start: the quadrature nodes are split instead, padded to
blocks of equal size with points of weight zero."""

import dataclasses
import os
import subprocess
import sys
import textwrap

import equinox as eqx
import numpy as np
import pytest

import singleloc as sl
from singleloc.preflight._build import build
from singleloc.theory._theory import OrderParameterODE

_RUN = textwrap.dedent("""
    import sys
    import jax
    import numpy as np
    jax.config.update("jax_enable_x64", True)
    import singleloc as sl
    from singleloc.theory._ode import integrate_points
    from singleloc.expectations._sharding import shard_batch

    (x,), _, n = shard_batch((jax.numpy.arange(3.0),))
    cfg = sl.load_config("default", ["sgd.tau_max=3", "sgd.n_save=4", "theory.points=64", "simulation.seeds=3",
                                     "simulation.D=64", "simulation.test_samples=32"])
    theory = sl.integrate(cfg, sl.initial_conditions(cfg))
    points = integrate_points([(cfg.replace(sgd={"lr": lr}), None) for lr in (0.3, 0.4, 0.5)])
    sim = sl.simulate(cfg, progress=False)
    np.savez(sys.argv[1], devices=len(x.sharding.device_set), n=n, M=theory.M, risk=theory.risk,
             points_M=np.stack([p.M for p in points]), sim_M=sim.M, sim_risk=sim.risk, sim_K=sim.K)
""")


def _run(tmp_path, devices: int) -> dict:
    out = tmp_path / f"devices{devices}.npz"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "SINGLELOC_CACHE_DIR": "",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    done = subprocess.run([sys.executable, "-c", _RUN, str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(np.load(out))


@pytest.mark.slow
def test_two_devices_give_the_numbers_of_one(tmp_path):
    one, two = _run(tmp_path, 1), _run(tmp_path, 2)
    assert (int(one["devices"]), int(two["devices"])) == (1, 2) and int(two["n"]) == 3
    for name in ("M", "risk", "points_M"):  # float64 ODE: rounding, amplified along the solve
        np.testing.assert_allclose(two[name], one[name], rtol=0, atol=1e-10, err_msg=name)
    for name in ("sim_M", "sim_risk", "sim_K"):  # float32 SGD over ~200 steps
        np.testing.assert_allclose(two[name], one[name], rtol=0, atol=1e-4 * np.max(np.abs(one[name])), err_msg=name)


# one start of H = 3 heads: 64 points make 21 base points (each with its 3 head shifts and mirrors),
# which two devices split as 11 + 11 with one padded point; a Gaussian prior also splits its nodes u
_NODES = ["theory.route=rule", "model.heads=3", "theory.points=64", "problem.prior=gaussian", "sgd.tau_max=3", "sgd.n_save=4"]

_RUN_NODES = textwrap.dedent("""
    import re
    import sys
    import jax
    import numpy as np
    jax.config.update("jax_enable_x64", True)
    import singleloc as sl
    from singleloc.theory import _ode
    from singleloc.expectations._sharding import shard_batch
    from singleloc.preflight._build import build
    from singleloc.theory._theory import OrderParameterODE

    cfg = sl.load_config("default", sys.argv[2:])
    received = []  # the rule integrate's program receives
    call = _ode.exported_call
    rule = lambda ode: ode.expectation.fields.w
    _ode.exported_call = lambda name, fn, *args, **kw: received.append(rule(args[0])) or call(name, fn, *args, **kw)
    theory = sl.integrate(cfg)
    w = received[0]
    y0, (ode,), _ = shard_batch(sl.initial_conditions(cfg, 1), (OrderParameterODE.from_setup(build(cfg)),))
    drift = jax.jit(lambda ode, y: ode.drift(y.M[0], y.Q[0], y.b[0]))
    hlo = drift.lower(ode, y0).compile().as_text()
    np.savez(sys.argv[1], M=theory.M, Q=theory.Q, risk=theory.risk, drift=np.concatenate([np.ravel(x) for x in drift(ode, y0)]),
             sharding=str(w.sharding), blocks=[s.data.shape[-3] for s in w.addressable_shards],
             all_reduce=len(re.findall(r" all-reduce\\(", hlo)), all_gather=len(re.findall(r" all-gather\\(", hlo)))
""")


def _run_nodes(tmp_path, devices: int) -> dict:
    out = tmp_path / f"nodes{devices}.npz"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "SINGLELOC_CACHE_DIR": "",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    done = subprocess.run([sys.executable, "-c", _RUN_NODES, str(out), *_NODES], capture_output=True, text=True, timeout=600,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(np.load(out))


@pytest.mark.slow
def test_one_start_splits_its_nodes_over_two_devices(tmp_path):
    one, two = _run_nodes(tmp_path, 1), _run_nodes(tmp_path, 2)
    # integrate's rule arrives in two blocks of 11 base points (21 + 1 padded), one per device; the
    # sum over the blocks is an all-reduce, and the nodes are never gathered
    assert list(one["blocks"]) == [21] and list(two["blocks"]) == [11, 11]
    assert "devices" in str(two["sharding"]) and int(one["all_reduce"]) == 0
    assert int(two["all_reduce"]) > 0 and int(two["all_gather"]) == 0
    # the drift is the same sum in another order: float64 rounding, ~1e-17 here (6e-18, 1.4e-15 of the largest entry,
    # since the rule's moments are contractions over the nodes); the solve amplifies that along its adaptive steps
    # (as for the split batch, measured 6e-14)
    np.testing.assert_allclose(two["drift"], one["drift"], rtol=0, atol=1e-14 * np.max(np.abs(one["drift"])))
    for name in ("M", "Q", "risk"):
        np.testing.assert_allclose(two[name], one[name], rtol=0, atol=1e-10, err_msg=name)


# all nodes at once (nodes w only: a discrete prior), or lax.map over batches of 2 base points (w and u)
@pytest.mark.parametrize("prior, batch_size", [("spikes", 8192), ("gaussian", 12)])
def test_split_rule_integrates_as_the_whole_rule(prior, batch_size):
    """The padding of LocalFields.split is neutral: 21 base points in 2 or 4 blocks (1 or 3 padded
    points) give the moments of the whole rule, on one device."""
    cfg = sl.load_config("default", ["model.heads=3", "theory.points=64", f"problem.prior={prior}", "theory.route=rule"])
    ode = OrderParameterODE.from_setup(build(cfg)).expectation  # the Sobol rule's route (its subject: the rule's blocks)
    ode = dataclasses.replace(ode, fields=dataclasses.replace(ode.fields, batch_size=batch_size))
    M, Q, b = (x[0] for x in sl.initial_conditions(cfg, 1))
    Q = Q + 0.3 * M @ M.T  # a state with some alignment, so that every moment is far from zero
    moments = eqx.filter_jit(lambda ode: ode.moments(M, Q, b))
    whole = moments(ode)
    # the same sum in another order: float64 rounding of integrands of order one (c_sum is a sum of
    # rounding errors, E[sum_l c_l] = 0 for softmax), so one scale for all moments
    scale = max(np.max(np.abs(value)) for value in whole.values())
    for shards in (2, 4):
        rule = ode.fields.split(shards)
        assert rule.w.shape[0] % shards == 0 and rule.w.shape[0] - rule.padding == ode.fields.w.shape[0] == 21
        split = moments(dataclasses.replace(ode, fields=rule))
        for name, value in whole.items():
            np.testing.assert_allclose(split[name], value, rtol=0, atol=1e-14 * scale, err_msg=f"{name}, {shards} blocks")
