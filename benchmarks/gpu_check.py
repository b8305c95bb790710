"""Speed of the package on the local devices (a GPU, or the CPU): the figures of ``docs/scale.md``.

Prints ``jax.devices()`` first, then

1. ``singleloc integrate default --set sgd.tau_max=300``, run twice in this process: the first
   wall time includes the compilation, the second is the steady cost;
2. the drift ``OrderParameterODE.from_setup(build(...)).drift`` at H = 16, L = 8, F = 4 with 2^18
   scrambled-Sobol points (2^19 nodes with the mirrors), under ``equinox.filter_jit``: compilation, and
   time per evaluation;
3. ``singleloc simulate default`` at D = 1e4 with 8 seeds to tau = 10 (1e5 SGD steps per seed),
   and to tau = 5: each run compiles anew, so the difference of the two wall times is the cost of
   the extra steps, which gives the steady rate in steps per second (and seed-steps per second);
4. one exact drift (the exact route's ``O(lr)`` part and its ``lr^2`` Gram term, softmax, L = 8,
   F = 2) against the number of heads, H = 2 ... 128, at a specialised state: the first call
   (compilation) and the time per evaluation, stopping before a size whose predicted first call
   passes ``DRIFT_TABLE_BUDGET`` seconds (the cost grows like pairs of heads, ``H^2``).

``--save PATH`` also writes every number as JSON (benchmarks/_common.py; the page
docs/benchmarks/gpu_check.md shows the saved runs).

``QUICK=1`` shrinks every size (tau 30; H = 4, L = 4, F = 2, 2^12 points; D = 1000, 2 seeds,
tau 4 and 2; the drift table to H = 8) to check the script on a CPU in about two minutes. It installs nothing. Run it
through ``benchmarks/gpu_check.sh``, which adds the sweep benchmark.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_save_option, save  # noqa: E402

from singleloc import OrderParameterODE, build, load_config  # noqa: E402
from singleloc.cli import main as cli  # noqa: E402

QUICK = os.environ.get("QUICK", "0") == "1"
INTEGRATE_TAU = 30.0 if QUICK else 300.0
DRIFT = dict(heads=4, L=4, F=2, log2_points=12) if QUICK else dict(heads=16, L=8, F=4, log2_points=18)
SIMULATE = dict(D=1000, seeds=2, tau=4.0) if QUICK else dict(D=10_000, seeds=8, tau=10.0)
DRIFT_HEADS = (2, 4, 8) if QUICK else (2, 4, 8, 16, 32, 64, 128)
#: Seconds the first call of the next size of the drift table may be predicted to take (from the
#: last size's, times the ratio of pairs of heads); the table stops before it.
DRIFT_TABLE_BUDGET = 120.0
RESULTS: dict = {}


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
    RESULTS["integrate"] = {"tau_max": INTEGRATE_TAU, "first_s": first, "steady_s": steady}


def time_drift(config, M: np.ndarray, Q: np.ndarray) -> tuple[str, float, float, int]:
    """The route, the first call's seconds (compilation included), the seconds per later call
    and their count, of the drift of ``config``'s ODE at ``(M, Q, 0)`` under ``equinox.filter_jit``."""
    ode = OrderParameterODE.from_setup(build(config))
    args = (jnp.asarray(M), jnp.asarray(Q), jnp.zeros(M.shape[0]))
    drift = eqx.filter_jit(lambda ode, M, Q, b: ode.drift(M, Q, b))
    t0 = time.perf_counter()
    jax.block_until_ready(drift(ode, *args))
    first = time.perf_counter() - t0
    n, t0 = 0, time.perf_counter()
    while n < 3 or (n < 100 and time.perf_counter() - t0 < 5.0):
        jax.block_until_ready(drift(ode, *args))
        n += 1
    return ode.expectation.route, first, (time.perf_counter() - t0) / n, n


def check_drift() -> None:
    H, L, F, p = DRIFT["heads"], DRIFT["L"], DRIFT["F"], DRIFT["log2_points"]
    config = load_config("default", [f"model.heads={H}", f"problem.L={L}", f"problem.F={F}", f"theory.points={2**p}",
                                     "theory.route=rule"])
    rng = np.random.default_rng(0)
    M = 0.3 * rng.standard_normal((H, F))
    Q = M @ M.T + 0.25 * np.eye(H)  # R_orth = Q - M M^T = I / 4: a valid state
    route, first, per, n = time_drift(config, M, Q)
    print(f"drift H = {H}, L = {L}, F = {F}, 2^{p} QMC points ({route} route): first call {first:.2f} s "
          f"(compilation included), {1e3 * per:.2f} ms per evaluation (mean of {n})", flush=True)
    RESULTS["drift_rule"] = {"heads": H, "L": L, "F": F, "points": 2**p, "first_s": first, "per_call_s": per}


def specialised_state(H: int, F: int) -> tuple[np.ndarray, np.ndarray]:
    """Heads taking the spikes in turn with overlap 1.5 and orthogonal parts of variance 0.3: a
    specialised layer, its fields wide as trained layers' are."""
    M = 1.5 * np.eye(H, F) + 1.5 * np.eye(H, F, -F) + 0.05
    return M, M @ M.T + 0.3 * np.eye(H)


def check_drift_table() -> None:
    """One exact drift (``O(lr)`` part and Gram term) against the number of heads (module docstring, 4)."""
    L, F = 8, 2
    rows, last = [], None
    print(f"exact drift against heads, softmax, L = {L}, F = {F}, at a specialised state:", flush=True)
    for H in DRIFT_HEADS:
        if last is not None and last[1] * (H / last[0]) ** 2 > DRIFT_TABLE_BUDGET:
            print(f"  H = {H}: skipped (predicted first call over {DRIFT_TABLE_BUDGET:g} s)", flush=True)
            break
        config = load_config("default", [f"model.heads={H}", f"problem.L={L}", f"problem.F={F}"])
        route, first, per, n = time_drift(config, *specialised_state(H, F))
        print(f"  H = {H:3d} ({route} route): first call {first:7.2f} s, {1e3 * per:9.2f} ms per evaluation (mean of {n})",
              flush=True)
        rows.append({"heads": H, "route": route, "first_s": first, "per_call_s": per})
        last = (H, first)
    RESULTS["drift_against_heads"] = {"L": L, "F": F, "rows": rows}


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
    RESULTS["simulate"] = {"D": D, "seeds": seeds, "tau": tau, "full_s": full, "half_s": half,
                           "steps_per_s": steps / 2 / extra if extra > 0.05 * full else None}


def main() -> None:
    args = add_save_option(argparse.ArgumentParser(description=__doc__.splitlines()[0])).parse_args()
    print(f"jax {jax.__version__}, devices: {jax.devices()}, default backend: {jax.default_backend()}"
          f"{' (QUICK sizes)' if QUICK else ''}", flush=True)
    with tempfile.TemporaryDirectory(prefix="singleloc-gpu-check-") as tmp:
        check_integrate(tmp)
        check_drift()
        check_simulate(tmp)
    check_drift_table()
    save(args, __file__, {"quick": QUICK, **RESULTS})


if __name__ == "__main__":
    main()
