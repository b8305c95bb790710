"""Benchmark 04: a repeated sweep is served from the cache.

Runs a 12-point sweep (model.heads = 1..4 x model.activation = softmax, softmax1, bsoftmax;
small ODE settings on the Sobol rule route) twice into a fresh folder, in one process, and prints
both wall times and their ratio. Acceptance: the second run is at least 10x faster (it computes nothing: the
cache holds every point; what remains is reading 12 .npz files, the phase analysis, the CSV
and the figures). Both runs write the CSV and the phase diagrams, as the command does; a third
run without figures times the cache path alone. About 3 minutes on 2 idle CPU cores (2026-11-29),
18 minutes at a load average of 7 on them (2026-12-01), nearly all of it the first run's
compilations.

    python benchmarks/04_sweep_cache.py [--save PATH]

``--save PATH`` also writes the numbers as JSON (``benchmarks/_common.py``).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

from _common import add_save_option, save  # noqa: E402

import singleloc as sl  # noqa: E402

# the rule route (the default before the exact route, issue 20), whose 64 points keep the first run at minutes; on the
# exact route it had not finished after 15 minutes on the shared 2-core machine (load average 5-6)
BASE = ['theory.route="rule"', "theory.points=64", "sgd.tau_max=10.0", "sgd.n_save=21", "simulation.seeds=2"]
GRIDS = ["model.heads=1,2,3,4", "model.activation=softmax,softmax1,bsoftmax"]


def main() -> None:
    args = add_save_option(argparse.ArgumentParser(description=__doc__.split("\n")[0])).parse_args()
    base = sl.load_config("default", BASE)
    grids = [sl.parse_grid(g) for g in GRIDS]
    with tempfile.TemporaryDirectory(prefix="singleloc-bench04-") as tmp:
        out = Path(tmp)
        t0 = time.perf_counter()
        rows, s1 = sl.sweep(base, grids, out, horizon="config", progress=False)
        t1 = time.perf_counter() - t0
        t0 = time.perf_counter()
        rows2, s2 = sl.sweep(base, grids, out, horizon="config", progress=False)
        t2 = time.perf_counter() - t0
        t0 = time.perf_counter()
        _, s3 = sl.sweep(base, grids, out, horizon="config", progress=False, figures=False)
        t3 = time.perf_counter() - t0
        n_fig = len(list(out.glob("phase_*.png")))
    assert repr(rows2) == repr(rows) and s2.computed == s3.computed == 0 and s2.cached == len(rows) == 12
    print(f"sweep of {len(rows)} points: first run {t1:.2f} s ({s1.computed} computed), second run {t2:.3f} s "
          f"({s2.cached} from the cache, CSV and {n_fig} figures included); speed-up {t1 / t2:.0f}x "
          f"(without the figures: {t3:.3f} s, {t1 / t3:.0f}x)")
    save(args, __file__, {"base": BASE, "grids": GRIDS, "points": len(rows), "first_s": t1, "computed": s1.computed,
                          "second_s": t2, "cached": s2.cached, "figures": n_fig, "speedup": t1 / t2,
                          "without_figures_s": t3, "speedup_without_figures": t1 / t3})


if __name__ == "__main__":
    main()
