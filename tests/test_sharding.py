"""Every local device: the batch of starts, seeds or points split over two CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=2``, in fresh processes) gives the numbers
of one device, to float rounding; three starts, seeds and points do not divide two devices, so
the padding is exercised too."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

_RUN = textwrap.dedent("""
    import sys
    import jax
    import numpy as np
    jax.config.update("jax_enable_x64", True)
    import singleloc as sl
    from singleloc._ode import integrate_points
    from singleloc._sharding import shard_batch

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
