"""Benchmark 05: a 16-point theory sweep serially and on Dask workers, batched and not.

The points: the default preset with ``model.heads = 1, 2`` x ``problem.F = 1, 2`` x ``sgd.lr =
0.3, 0.5`` x ``problem.strength = 2.5, 3.5`` and ``sgd.tau_max = 100`` (the configuration's own
grid, as ``singleloc sweep --horizon config``): 4 shapes (H, F), 4 points of each that differ in
values only. Each point is the theory of a sweep point, computed as ``singleloc sweep`` computes
it (:func:`singleloc.sweeps._sweep_compute.compute_points` through :func:`singleloc.runtime._distributed.run_points`,
``group=compile_group``):

* unbatched: one task per point (the learning rate is a traced value, so the points of one shape
  share one compiled program: 4 programs);
* batched: one task per shape group, one vmapped solve of its 4 points (4 programs);

each serially in one process (no Dask) and on a local cluster of ``--workers`` (default 2)
single-threaded worker processes, started and closed inside the timing. A serial process keeps
more than one core busy (XLA's threads), so on a machine with as many cores as workers the
speed-up over it is bounded by ``cores / (cores one serial process uses)``; the ``serial-1thread``
runs are serial with a worker's environment (:data:`singleloc.runtime._distributed.WORKER_ENV`: XLA on one
thread), the baseline that measures what the workers themselves add. The ``-warm`` runs find
their compilation cache filled by an untimed run of the same sweep just before (as a user's
second sweep over new values of the same shapes finds it): they time loading the programs and
solving, not compiling. Every run is a fresh
Python process with its own empty compilation cache folder (``SINGLELOC_CACHE_DIR``, turned on
as the command line does), so no run finds a program compiled by another. The script prints per
run the load average at its start (other work on the machine), the wall time (of the points,
the sum of the tasks' own times, and of the whole process with its imports), the CPU time of the run's processes (workers
included), the number of XLA compilations of the solve and in all (JAX's backend-compile event, which also
counts a program loaded from the compilation cache), and the largest deviation of the risks from the serial
unbatched run; then the ratios. Target: >= 1.6x with 2 workers on 2 idle cores.

    python benchmarks/05_sweep_parallel.py [--tau-max 100] [--workers 2] [--modes serial,workers,...] [--save PATH]

``--save PATH`` also writes the numbers as JSON (``benchmarks/_common.py``; the risks themselves are not saved).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import add_save_option, save

from singleloc.runtime._distributed import worker_env

GRIDS = ["model.heads=1,2", "problem.F=1,2", "sgd.lr=0.3,0.5", "problem.strength=2.5,3.5"]
MODES = {"serial": (1, False), "workers": (2, False), "serial-batched": (1, True), "workers-batched": (2, True),
         "serial-1thread": (1, False), "serial-1thread-batched": (1, True),
         "serial-batched-warm": (1, True), "workers-batched-warm": (2, True)}  # (workers, batched)
SOLVES = ("jit(_run_points)", "jit(_trajectories)", "jit(call)")  # the solve in XLA's compile events (call: a stored program)
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def counted_points(kind, *configs):
    """:func:`~singleloc.sweeps._sweep_compute.compute_points`, the XLA compilations it caused in this process
    (names, counted by a ``jax.monitoring`` listener registered once per process) and its wall time."""
    import jax

    from singleloc.sweeps._sweep_compute import compute_points

    names = getattr(jax.monitoring, "_benchmark05_compilations", None)
    if names is None:
        names = jax.monitoring._benchmark05_compilations = []
        jax.monitoring.register_event_duration_secs_listener(
            lambda event, seconds, fun_name="", **kw: names.append(fun_name) if event == COMPILE_EVENT else None)
    before, t0 = len(names), time.perf_counter()
    results = compute_points(kind, *configs)
    return results, names[before:], time.perf_counter() - t0


def run(mode: str, tau_max: float, workers: int, out: Path) -> None:
    """One run, in this (fresh) process: the points as tasks, their results saved to ``out``."""
    import jax

    jax.config.update("jax_enable_x64", True)
    from singleloc import enable_compilation_cache, load_config
    from singleloc.runtime._distributed import run_points
    from singleloc.sweeps._grid import grid_points, parse_grid
    from singleloc.sweeps._sweep_compute import compile_group

    enable_compilation_cache()
    n_workers, batch = MODES[mode]
    n_workers = workers if n_workers > 1 else 1
    base = load_config("default", [f"sgd.tau_max={tau_max}"])
    configs = [cfg.to_dict() for _, cfg in grid_points(base, [parse_grid(g) for g in GRIDS])]
    groups: dict[str, list[int]] = {}
    for i, cfg in enumerate(configs):
        groups.setdefault(compile_group("theory", cfg) if batch else str(i), []).append(i)
    tasks = [(tuple(members), ("theory", *(configs[i] for i in members))) for members in groups.values()]
    risks, compilations, in_tasks = {}, [], []

    def collect(members, result):
        arrays, names, seconds = result
        compilations.extend(names)
        in_tasks.append(seconds)
        for i, a in zip(members, arrays):
            if isinstance(a, BaseException):
                raise a
            risks[f"risk{i}"] = a["risk"]

    t0 = time.perf_counter()
    report = run_points(tasks, counted_points, collect, workers=n_workers, progress=False, group=compile_group)
    seconds = time.perf_counter() - t0
    if report.errors:
        raise RuntimeError(f"failed points: {report.errors}")
    np.savez(out / f"{mode}.npz", **risks)
    solves = sum(name in SOLVES for name in compilations)
    print(json.dumps({"mode": mode, "wall": seconds, "in_tasks": sum(in_tasks), "tasks": len(tasks), "points": len(configs),
                      "solve_compilations": solves, "compilations": len(compilations)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tau-max", type=float, default=100.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--modes", default=",".join(MODES), help=f"runs, in order (of {', '.join(MODES)})")
    parser.add_argument("--run", default=None, help=argparse.SUPPRESS)  # one run, in a child process
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = add_save_option(parser).parse_args()
    if args.run:
        run(args.run, args.tau_max, args.workers, Path(args.out))
        return
    modes = [m for m in args.modes.split(",") if args.workers > 1 or not m.startswith("workers")]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"--modes: unknown run(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench05-") as tmp:
        for mode in modes:
            cache = Path(tmp) / f"cache-{mode}"  # a fresh, empty compilation cache for every run
            env = {**os.environ, "SINGLELOC_CACHE_DIR": str(cache)}
            if "1thread" in mode:
                env.update(worker_env())
            command = [sys.executable, __file__, "--run", mode, "--out", tmp, "--tau-max", str(args.tau_max),
                       "--workers", str(args.workers)]
            if mode.endswith("-warm"):  # an untimed run first fills the compilation cache
                subprocess.run(command, env=env, capture_output=True, check=True)
            load = os.getloadavg()[0]
            cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            if done.returncode:
                raise SystemExit(f"{mode} failed:\n{done.stderr[-3000:]}")
            r = json.loads(done.stdout.strip().splitlines()[-1])
            r.update(load=load, process_wall=wall, cpu=(cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime))
            r["risks"] = dict(np.load(Path(tmp) / f"{mode}.npz"))
            results[mode] = r
    ref = results[modes[0]]["risks"]
    print(f"16-point theory sweep to tau = {args.tau_max:g} (default preset, {' x '.join(GRIDS)}) on {os.cpu_count()} cores")
    print(f"{'run':<22} {'load':>5} {'tasks':>5} {'wall s':>7} {'in tasks s':>10} {'process s':>9} {'CPU s':>7} "
          f"{'solve comp.':>11} {'all comp.':>9} {'max |risk - ' + modes[0] + '|':>22}")
    for mode, r in results.items():
        dev = r["max_risk_deviation"] = max(float(np.max(np.abs(r["risks"][k] - ref[k]))) for k in ref)
        print(f"{mode:<22} {r['load']:>5.1f} {r['tasks']:>5} {r['wall']:>7.1f} {r['in_tasks']:>10.1f} {r['process_wall']:>9.1f} "
              f"{r['cpu']:>7.1f} {r['solve_compilations']:>11} {r['compilations']:>9} {dev:>22.1e}")
    speedup = lambda a, b: results[a]["wall"] / results[b]["wall"] if a in results and b in results else None  # noqa: E731
    ratio = lambda a, b: "-" if speedup(a, b) is None else f"{speedup(a, b):.2f}x"  # noqa: E731
    print(f"speed-up of {args.workers} workers over serial: unbatched {ratio('serial', 'workers')}, batched "
          f"{ratio('serial-batched', 'workers-batched')}; batched over unbatched: serial {ratio('serial', 'serial-batched')}, "
          f"{args.workers} workers {ratio('workers', 'workers-batched')}; serial unbatched over {args.workers} workers batched "
          f"{ratio('serial', 'workers-batched')}")
    print(f"with the compilation cache filled by an earlier run (a sweep repeated at new values): 2 workers batched over "
          f"serial batched {ratio('serial-batched-warm', 'workers-batched-warm')}")
    print(f"over one serial process on one XLA thread (what a worker gets): unbatched {ratio('serial-1thread', 'workers')}, "
          f"batched {ratio('serial-1thread-batched', 'workers-batched')}; CPU / wall of the serial process: "
          + (f"{results['serial']['cpu'] / results['serial']['process_wall']:.2f} cores" if "serial" in results else "-"))
    pairs = {"workers_over_serial": ("serial", "workers"), "workers_over_serial_batched": ("serial-batched", "workers-batched"),
             "batched_over_unbatched_serial": ("serial", "serial-batched"),
             "batched_over_unbatched_workers": ("workers", "workers-batched"),
             "workers_batched_over_serial": ("serial", "workers-batched"),
             "warm_workers_batched_over_serial_batched": ("serial-batched-warm", "workers-batched-warm"),
             "workers_over_serial_1thread": ("serial-1thread", "workers"),
             "workers_batched_over_serial_1thread_batched": ("serial-1thread-batched", "workers-batched")}
    runs = {mode: {k: v for k, v in r.items() if k != "risks"} for mode, r in results.items()}
    save(args, __file__, {"grids": GRIDS, "tau_max": args.tau_max, "workers": args.workers, "cpu_count": os.cpu_count(),
                          "reference": modes[0], "runs": runs, "speedups": {name: speedup(*ab) for name, ab in pairs.items()}})


if __name__ == "__main__":
    main()
