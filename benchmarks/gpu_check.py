"""Speed of the package on the local devices (a GPU, or the CPU): the figures of ``docs/scale.md``.

Prints ``jax.devices()`` first, then

1. ``singleloc integrate default --set sgd.tau_max=300``, run twice in this process: the first
   wall time includes the compilation, the second is the steady cost;
2. the drift ``OrderParameterODE.from_config(...).drift`` at H = 16, L = 8, F = 4 with 2^18
   scrambled-Sobol points (2^19 nodes with the mirrors), under ``equinox.filter_jit``: compilation, and
   time per evaluation;
3. ``singleloc simulate default`` at D = 1e4 with 8 seeds to tau = 10 (1e5 SGD steps per seed),
   and to tau = 5: each run compiles anew, so the difference of the two wall times is the cost of
   the extra steps, which gives the steady rate in steps per second (and seed-steps per second).

``QUICK=1`` shrinks every size (tau 30; H = 4, L = 4, F = 2, 2^12 points; D = 1000, 2 seeds,
tau 4 and 2) to check the script on a CPU in about two minutes. It installs nothing. Run it
through ``benchmarks/gpu_check.sh``, which adds the sweep benchmark.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import time

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from singleloc import OrderParameterODE, load_config  # noqa: E402
from singleloc.cli import main as cli  # noqa: E402

QUICK = os.environ.get("QUICK", "0") == "1"
INTEGRATE_TAU = 30.0 if QUICK else 300.0
DRIFT = dict(heads=4, L=4, F=2, log2_points=12) if QUICK else dict(heads=16, L=8, F=4, log2_points=18)
SIMULATE = dict(D=1000, seeds=2, tau=4.0) if QUICK else dict(D=10_000, seeds=8, tau=10.0)


def run_cli(args: list[str]) -> float:
    """Wall time of one in-process ``singleloc`` command (its own printout suppressed)."""
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        rc = cli(args + ["--no-progress"])
    if rc:
        raise SystemExit(f"singleloc {' '.join(args)} failed ({rc})")
    return time.perf_counter() - t0


def check_integrate(tmp: str) -> None:
    args = ["integrate", "default", "--set", f"sgd.tau_max={INTEGRATE_TAU:g}", "--out", f"{tmp}/integrate"]
    first, steady = run_cli(args), run_cli(args)
    print(f"integrate default, tau_max = {INTEGRATE_TAU:g}: {first:.2f} s first run (compilation included), "
          f"{steady:.2f} s steady (second run in-process)", flush=True)


def check_drift() -> None:
    H, L, F, p = DRIFT["heads"], DRIFT["L"], DRIFT["F"], DRIFT["log2_points"]
    config = load_config("default", [f"model.heads={H}", f"problem.L={L}", f"problem.F={F}", f"theory.points={2**p}"])
    ode = OrderParameterODE.from_config(config)
    rng = np.random.default_rng(0)
    M = 0.3 * rng.standard_normal((H, F))
    Q = M @ M.T + 0.25 * np.eye(H)  # R_orth = Q - M M^T = I / 4: a valid state
    args = (jnp.asarray(M), jnp.asarray(Q), jnp.zeros(H))
    drift = eqx.filter_jit(lambda ode, M, Q, b: ode.drift(M, Q, b))
    t0 = time.perf_counter()
    jax.block_until_ready(drift(ode, *args))
    first = time.perf_counter() - t0
    n, t0 = 0, time.perf_counter()
    while n < 3 or (n < 100 and time.perf_counter() - t0 < 5.0):
        jax.block_until_ready(drift(ode, *args))
        n += 1
    per = (time.perf_counter() - t0) / n
    print(f"drift H = {H}, L = {L}, F = {F}, 2^{p} QMC points ({ode.expectation.route} route): first call {first:.2f} s "
          f"(compilation included), {1e3 * per:.2f} ms per evaluation (mean of {n})", flush=True)


def check_simulate(tmp: str) -> None:
    D, seeds, tau = SIMULATE["D"], SIMULATE["seeds"], SIMULATE["tau"]
    base = ["simulate", "default", "--set", f"simulation.D={D}", "--set", f"simulation.seeds={seeds}", "--set", "sgd.n_save=5",
            "--out", f"{tmp}/simulate"]
    half = run_cli(base + ["--set", f"sgd.tau_max={tau / 2:g}"])
    full = run_cli(base + ["--set", f"sgd.tau_max={tau:g}"])
    steps = round(tau * D)
    extra = full - half  # the cost of the second half of the steps
    rate = f"{steps / 2 / extra:,.0f} steps/s steady, {seeds * steps / 2 / extra:,.0f} seed-steps/s" if extra > 0.05 * full \
        else "steady rate not resolved (compilation dominates)"
    print(f"simulate D = {D}, {seeds} seeds to tau = {tau:g} ({steps} steps per seed): {full:.2f} s (compilation "
          f"included; {half:.2f} s to tau = {tau / 2:g}): {rate}", flush=True)


def main() -> None:
    print(f"jax {jax.__version__}, devices: {jax.devices()}, default backend: {jax.default_backend()}"
          f"{' (QUICK sizes)' if QUICK else ''}", flush=True)
    with tempfile.TemporaryDirectory(prefix="singleloc-gpu-check-") as tmp:
        check_integrate(tmp)
        check_drift()
        check_simulate(tmp)


if __name__ == "__main__":
    main()
