"""Speed of the theory: ``integrate`` wall time and its ratio to a simulation.

1. ``singleloc integrate default --set sgd.tau_max=300`` as a user runs it: a fresh process,
   compilation included (target: <= 20 s on a 2-core CPU).
2. The ratio of ``simulate`` (D = 1e4, 1 seed) to ``integrate`` wall time over the same tau
   range (target: >= 50x). The simulation is run as a fresh process to ``SIM_TAU`` and to
   ``2 SIM_TAU``; the difference gives its cost per unit tau (constant: one fresh sample and
   one gradient per step), which extrapolates the first run (compilation included) to
   ``tau_max``.

Run: ``python benchmarks/03_theory_speed.py [--tau-max 300]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time

SIM_TAU = 3.0


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tau-max", type=float, default=300.0)
    args = parser.parse_args()
    cli = [sys.executable, "-m", "singleloc"]
    with tempfile.TemporaryDirectory() as tmp:
        t_int = timed([*cli, "integrate", "default", "--set", f"sgd.tau_max={args.tau_max}", "--out", f"{tmp}/i", "--no-progress"])
        sim = [*cli, "simulate", "default", "--set", "simulation.D=10000", "--set", "simulation.seeds=1", "--set", "sgd.n_save=4",
               "--out", f"{tmp}/s", "--no-progress"]
        t1 = timed([*sim, "--set", f"sgd.tau_max={SIM_TAU}"])
        t2 = timed([*sim, "--set", f"sgd.tau_max={2 * SIM_TAU}"])
    per_tau = (t2 - t1) / SIM_TAU
    t_sim_full = t1 + per_tau * (args.tau_max - SIM_TAU)
    print(f"integrate default, tau_max = {args.tau_max:g}: {t_int:.1f} s wall (fresh process, compilation included)")
    print(f"simulate D = 1e4, 1 seed: {t1:.1f} s to tau = {SIM_TAU:g}, {t2:.1f} s to tau = {2 * SIM_TAU:g}: "
          f"{per_tau:.1f} s per unit tau -> {t_sim_full:.0f} s to tau = {args.tau_max:g}")
    print(f"ratio simulate / integrate: {t_sim_full / t_int:.0f}x")


if __name__ == "__main__":
    main()
