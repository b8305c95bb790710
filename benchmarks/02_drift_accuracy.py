"""Work-precision of the field quadrature: drift error against the number of Sobol points.

For each configuration the drift ``(dM, dQ, db)`` at a test point is computed with
``theory.points`` = 256 ... 16384 and compared with a reference rule of 128 x 4096 points
(an independent scrambling). Printed: the maximal absolute error over all entries and the
time of one jitted drift evaluation. Configurations (one per activation, one with singular
``Q``), each at two points: the initial overlaps of seed 0 (``M = O(1/sqrt(D))``) and a
mid-training point (the theory state at ``tau = 20``).

Acceptance (issue "order-parameter ODE"): at the default ``theory.points = 4096`` the error
is below 1e-3 everywhere.

Run: ``python benchmarks/02_drift_accuracy.py``.
"""

from __future__ import annotations

import time

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import singleloc as sl  # noqa: E402

POINTS = [256, 1024, 4096, 16384]
REFERENCE = 128 * 4096

CONFIGS = {
    "softmax (default)": ("default", []),
    "softmax1 + bias": ("softmax1", []),
    "bsoftmax + bias": ("bsoftmax", []),
}


@eqx.filter_jit
def drift(ode, M, Q, b):
    return ode.drift(M, Q, b)


def with_points(cfg, points, seed):
    return sl.OrderParameterODE.from_config(cfg.replace(theory={"points": points, "qmc_seed": seed}))


def test_points(cfg):
    y0 = sl.initial_conditions(cfg, 1)
    start = (y0.M[0], y0.Q[0], y0.b[0])
    th = sl.integrate(cfg.replace(sgd={"tau_max": 20.0, "n_save": 2}), progress=False)
    mid = (jnp.asarray(th.M[0, -1]), jnp.asarray(th.Q[0, -1]), jnp.asarray(th.b[0, -1]))
    # identical heads (singular Q): both heads at the mean of the mid-training heads
    Mm = jnp.broadcast_to(mid[0].mean(0), mid[0].shape)
    q = float(jnp.mean(jnp.diag(mid[1])))
    Qs = jnp.full(mid[1].shape, q)
    singular = (Mm, Qs, jnp.full(mid[2].shape, float(mid[2].mean())))
    return {"start": start, "tau=20": mid, "identical heads": singular}


def main():
    print(f"| config | point | {' | '.join(f'n={n}' for n in POINTS)} | time/drift at n=4096 |")
    print(f"|---|---|{'---|' * len(POINTS)}---|")
    worst_default = 0.0
    for name, (preset, overrides) in CONFIGS.items():
        cfg = sl.load_config(preset, overrides)
        ref_ode = with_points(cfg, REFERENCE, 12345)
        for label, (M, Q, b) in test_points(cfg).items():
            ref = drift(ref_ode, M, Q, b)
            errs, t_default = [], float("nan")
            for n in POINTS:
                ode = with_points(cfg, n, 0)
                d = jax.block_until_ready(drift(ode, M, Q, b))
                if n == 4096:
                    t0 = time.perf_counter()
                    for _ in range(5):
                        jax.block_until_ready(drift(ode, M, Q, b))
                    t_default = (time.perf_counter() - t0) / 5
                errs.append(max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(d, ref)))
            worst_default = max(worst_default, errs[POINTS.index(4096)])
            print(f"| {name} | {label} | {' | '.join(f'{e:.1e}' for e in errs)} | {1e3 * t_default:.1f} ms |")
    print(f"\nworst error at the default 4096 points: {worst_default:.2e} (target < 1e-3)")
    np.testing.assert_array_less(worst_default, 1e-3)


if __name__ == "__main__":
    main()
