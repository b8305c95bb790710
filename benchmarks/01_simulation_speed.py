"""Speed of the finite-D online SGD simulator: JAX (jitted, seeds batched) against plain numpy.

What is measured
    SGD steps per second of the simulator's inner loop at D = 1e3 and 1e4 (H = 4 heads,
    L = 4 tokens, softmax, spikes prior with F = 2), one step being: draw one fresh sequence
    (theta, eps, L tokens of dimension D), forward pass, gradient of
    ``|x_eps - sum_l a_l x_l|^2 / D`` with respect to the keys, update.

    * ``jax``: the simulator's own per-seed ``advance`` (``singleloc.simulation._simulation._run_functions``),
      ``vmap``-ed over 1 or 8 seeds and ``jit``-ed, exactly as ``singleloc simulate`` runs it.
      Compilation is excluded by a warm-up call (the step bounds are traced, so the timed
      calls reuse the compiled program), and every timed call ends with
      ``block_until_ready``.
    * ``numpy``: a plain Python loop over steps doing the same arithmetic for one seed, with a
      hand-written backward pass, in the simulator's precision.

    ``steps/s`` counts SGD steps of the whole batch (each advances every seed);
    ``seed-steps/s = seeds * steps/s`` is the useful throughput. The ratio column is the
    JAX throughput over the numpy one (single seed). Each figure is the best of three timed
    repeats of about ``--seconds`` each, so a background load inflates nothing but the noise.

How to run
    python benchmarks/01_simulation_speed.py            # about 1-2 minutes on a laptop CPU
    python benchmarks/01_simulation_speed.py --seconds 2 --save benchmarks/results/01_simulation_speed.json

It prints a markdown table; ``--save PATH`` also writes its numbers as JSON (``benchmarks/_common.py``).
"""

from __future__ import annotations

import argparse
import platform
import time

import jax

jax.config.update("jax_enable_x64", True)  # as the CLI does; the simulator keeps its own dtype

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import add_save_option, save  # noqa: E402

import singleloc as sl  # noqa: E402
from singleloc.preflight._build import build  # noqa: E402

# the simulator's own per-seed step, timed on purpose: private, as no public function runs SGD steps without measuring
from singleloc.simulation._simulation import _run_functions  # noqa: E402

H, L, F, STRENGTH, LR = 4, 4, 2, 2.5, 0.5


def _config(D: int, seeds: int):
    return sl.load_config(
        "default",
        [
            f"simulation.D={D}",
            f"simulation.seeds={seeds}",
            f"model.heads={H}",
            f"problem.L={L}",
            f"problem.F={F}",
            'problem.prior="spikes"',
            f"problem.strength={STRENGTH}",
            'model.activation="softmax"',
            f"sgd.lr={LR}",
        ],
    )


def _best_rate(run, seconds: float) -> float:
    """Steps per second of ``run(n_steps)`` (which must block), best of three repeats of
    about ``seconds`` each, after calibrating ``n_steps``."""
    n = 16
    while True:
        t = time.perf_counter()
        run(n)
        dt = time.perf_counter() - t
        if dt > 0.2:
            break
        n *= 4
    n = max(1, int(n * seconds / dt))
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        run(n)
        best = max(best, n / (time.perf_counter() - t))
    return best


def jax_rate(D: int, seeds: int, seconds: float) -> tuple[float, str]:
    init, advance, _ = _run_functions(build(_config(D, seeds), theory=False))
    params, consts = jax.jit(jax.vmap(init))(jnp.arange(seeds))
    advance_all = jax.jit(jax.vmap(advance, in_axes=(0, 0, None, None)))
    state = {"params": params, "t": 0}

    def run(n: int) -> None:
        t0 = state["t"]
        state["params"] = jax.block_until_ready(advance_all(state["params"], consts, t0, t0 + n))
        state["t"] = t0 + n

    run(4)  # warm-up: compile (excluded from the timings)
    return _best_rate(run, seconds), str(params[0].K.dtype)


def numpy_rate(D: int, seconds: float, dtype) -> float:
    rng = np.random.default_rng(0)
    kstar = (np.sqrt(D) * np.linalg.qr(rng.standard_normal((D, F)))[0].T).astype(dtype)  # (F, D)
    K = (0.5 * rng.standard_normal((H, D))).astype(dtype)
    b = np.zeros(H, dtype=dtype)
    sqrt_d = dtype(np.sqrt(D))
    lr = dtype(LR)

    def step(K):
        f, eps = rng.integers(F), rng.integers(L)
        X = rng.standard_normal((L, D), dtype=dtype)
        X[eps] += (STRENGTH / sqrt_d) * kstar[f]
        # forward
        s = K @ X.T / sqrt_d + b[:, None]
        e = np.exp(s - s.max(axis=1, keepdims=True))
        A = e / e.sum(axis=1, keepdims=True)
        a = A.mean(axis=0)
        res = X[eps] - a @ X
        # backward of |res|^2 / D
        g_A = (-2.0 / D / H) * (X @ res)  # dl/dA_hl, the same for every head
        g_s = A * (g_A[None, :] - (A @ g_A)[:, None])
        return K - lr * (g_s @ X) / sqrt_d

    state = {"K": K}

    def run(n: int) -> None:
        K = state["K"]
        for _ in range(n):
            K = step(K)
        state["K"] = K

    run(4)
    return _best_rate(run, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="target duration of one timed repeat")
    args = add_save_option(parser).parse_args()

    rows = []
    for D in (1_000, 10_000):
        jax_rates = {}
        dtype_name = "float32"
        for seeds in (1, 8):
            jax_rates[seeds], dtype_name = jax_rate(D, seeds, args.seconds)
        np_rate = numpy_rate(D, args.seconds, np.dtype(dtype_name).type)
        for seeds in (1, 8):
            r = jax_rates[seeds]
            rows.append((D, "jax (vmap+jit)", seeds, r, seeds * r, seeds * r / np_rate, dtype_name))
        rows.append((D, "numpy loop", 1, np_rate, np_rate, 1.0, dtype_name))

    print(f"SGD speed, H={H}, L={L}, F={F}, softmax, spikes; {platform.processor() or platform.machine()}, "
          f"jax {jax.__version__} on {jax.devices()[0].platform}, numpy {np.__version__}\n")
    print("| D | implementation | seeds | steps/s | seed-steps/s | jax/numpy |")
    print("|---:|---|---:|---:|---:|---:|")
    for D, impl, seeds, r, sr, ratio, _ in rows:
        print(f"| {D:,} | {impl} | {seeds} | {r:,.0f} | {sr:,.0f} | {ratio:.2f} |")
    print(f"\n(precision: {rows[0][-1]}; jax/numpy = seed-steps/s over the single-seed numpy loop)")
    keys = ("D", "implementation", "seeds", "steps_per_s", "seed_steps_per_s", "jax_over_numpy", "precision")
    save(args, __file__, {"H": H, "L": L, "F": F, "activation": "softmax", "prior": "spikes",
                          "rows": [dict(zip(keys, row)) for row in rows]})


if __name__ == "__main__":
    main()
