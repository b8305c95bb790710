"""Benchmark 05: a 16-point theory sweep, one process vs Dask worker processes.

The points: the default preset with ``model.heads = 1, 2`` x ``problem.F = 1, 2`` x ``sgd.lr =
0.3, 0.5`` x ``problem.strength = 2.5, 3.5`` and ``sgd.tau_max = 100``. Each is the theory of a
sweep point (:func:`singleloc._sweep.compute_point`: one batched ODE solve over the seeds'
initial overlaps), run through :func:`singleloc._distributed.run_points`

1. serially in this process (``workers = 1``: no Dask), then
2. on a local cluster of ``--workers`` (default 2) single-threaded worker processes, started and
   closed inside the timing,

both from a cold start (no compiled program in memory). The results must agree (the workers'
XLA runs on one thread); the script prints both wall times and their ratio. Target: >= 1.6x with
2 workers on 2 idle cores. The sweep needs 8 compiled programs (the learning rate is a static
field of the ODE, the strength a value): with ``group=compile_group`` the two points of one
program prefer one worker, so each worker compiles about half of them. ``--workers 1`` runs the
serial part alone (where ``distributed`` is not installed).

    python benchmarks/05_sweep_parallel.py [--tau-max 100] [--workers 2]
"""

from __future__ import annotations

import argparse
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

from singleloc import load_config  # noqa: E402
from singleloc._distributed import run_points  # noqa: E402
from singleloc._sweep import compile_group, compute_point, grid_points, parse_grid  # noqa: E402  # noqa: E402

GRIDS = ["model.heads=1,2", "problem.F=1,2", "sgd.lr=0.3,0.5", "problem.strength=2.5,3.5"]


def timed_run(tasks, workers: int) -> tuple[float, dict]:
    results: dict = {}
    t0 = time.perf_counter()
    report = run_points(tasks, compute_point, results.__setitem__, workers=workers, progress=False, group=compile_group)
    seconds = time.perf_counter() - t0
    if report.errors:
        raise RuntimeError(f"failed points: {report.errors}")
    return seconds, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tau-max", type=float, default=100.0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    base = load_config("default", [f"sgd.tau_max={args.tau_max}"])
    points = grid_points(base, [parse_grid(g) for g in GRIDS])
    tasks = [(i, ("theory", cfg.to_dict())) for i, (_, cfg) in enumerate(points)]
    t_serial, serial = timed_run(tasks, 1)
    if args.workers == 1:
        print(f"{len(tasks)}-point theory sweep to tau = {args.tau_max:g}: serial {t_serial:.1f} s")
        return
    t_par, parallel = timed_run(tasks, args.workers)
    same = all(np.array_equal(serial[i][k], parallel[i][k]) for i in serial for k in serial[i])
    close = all(np.allclose(serial[i][k], parallel[i][k], rtol=1e-9, atol=1e-12) for i in serial for k in serial[i])
    print(f"{len(tasks)}-point theory sweep to tau = {args.tau_max:g}: serial {t_serial:.1f} s, "
          f"{args.workers} workers {t_par:.1f} s (cluster start included): speed-up {t_serial / t_par:.2f}x; "
          f"results {'identical' if same else 'equal to 1e-9' if close else 'DIFFERENT'}")
    if not close:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
