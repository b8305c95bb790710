"""What the theory's compiled program is made of: its size by part, and what XLA's optimisation levels cost (issue 58).

1. **Size by part.** For the default problem (softmax, ``H = 2``, ``L = 4``, ``F = 2``), the same at ``L = 64`` (the exact
   two-head Gram term instead of the Sobol rule's), softmax at ``H`` = 1, 4, 8 and bsoftmax at ``H`` = 2, 3 (a joint
   layer), each in a fresh process with no compilation cache: every part of
   ``integrate``'s program traced, lowered and compiled as a program of its own, with the number of StableHLO
   operations of its lowered text and the seconds of each phase. The parts: the drift (the gradient of the exact
   risk and the ``lr^2`` Gram term, :meth:`~singleloc.OrderParameterODE.state_drift`); the Gram term alone; the risk
   on the evaluation rule (taken at every saved time); the risk check (the finer rule, at the two ends); the Gram
   term's stated error (at the two ends); the solve (Tsit5, the PID controller, the event, around one drift), and
   the whole program (``integrate``'s: the solve, the risks along it, the checks). "Solver machinery" is the solve
   less the drift. Growth faster than linear in ``H`` would be Python loops unrolled into the graph.
2. **Optimisation levels.** The drift and the whole program of the default problem compiled at XLA's default
   level, at ``xla_backend_optimization_level = 1``, with ``jax_disable_most_optimizations`` (LLVM at ``-O0``,
   no expensive passes) and with XLA's loop emitters instead of its MLIR fusion emitters (the package's
   :data:`~singleloc.runtime._compilation.CPU_OPTIONS`): compile seconds (wall and CPU) against the seconds of one
   drift and of the solve to ``tau = 300``,
   in one process, the levels alternated over ``--rounds`` rounds (the median is printed); run seconds are CPU
   seconds (run with XLA's single-threaded ``XLA_FLAGS``, as the page says, they are the work at any load). A level
   pays where its compile saving exceeds the extra run time of what the program is used for.

Tracing of nested ``jax.jit`` functions is cached within a process, so a part traced after another that shares
them traces faster: the seconds of a part are those of a first run of it after the parts listed before it.

Run: ``python benchmarks/09_program_size.py [--quick] [--rounds 2] [--save PATH]`` (``--quick``: the default problem
at ``L`` = 4 and 64 and ``H = 4`` only in section 1). About 6 minutes on a quiet 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from _common import add_save_option, save

#: The problems of section 1: a label and the overrides of the default preset.
PROBLEMS = {
    "default (softmax H=2)": [],
    "default at L=64": ["problem.L=64"],  # from L H >= 64 the exact two-head Gram term (L traced: every L one program)
    "softmax H=1": ["model.heads=1"],
    "softmax H=4": ["model.heads=4"],
    "softmax H=8": ["model.heads=8"],
    "bsoftmax H=2": ["model.activation=bsoftmax"],
    "bsoftmax H=3": ["model.activation=bsoftmax", "model.heads=3"],
}
QUICK = ("default (softmax H=2)", "default at L=64", "softmax H=4")

# One problem's parts, in a fresh process (argv: the overrides as JSON).
PARTS = """
import json, re, sys, time
import equinox as eqx, jax
jax.config.update("jax_enable_x64", True)
import singleloc as sl
from singleloc.theory._ode import MAX_STEPS, _problem, _solve, _trajectories
from singleloc.preflight._build import build
cfg = sl.load_config("default", ["sgd.tau_max=300", *json.loads(sys.argv[1])])
dynamics, evaluation, y0, ts, rtol, atol, budget = _problem(build(cfg), None, None).args
def first(ode):  # replicate 0 of an ODE stack (its SGD rule is shared, not stacked)
    rules = eqx.tree_at(lambda o: o.sgd, ode, None, is_leaf=lambda x: x is None)
    one = jax.tree.map(lambda x: x[0] if eqx.is_array(x) else x, rules)
    return eqx.tree_at(lambda o: o.sgd, one, ode.sgd, is_leaf=lambda x: x is None)
dyn, ev, y = first(dynamics), first(evaluation), jax.tree.map(lambda x: x[0], y0)
OPS = re.compile(r"= \\"?(stablehlo|chlo)\\.|= call @")
def measure(fn, *args):
    arrays, static = eqx.partition(args, eqx.is_array)
    jitted = jax.jit(lambda a: fn(*eqx.combine(a, static)))
    t0 = time.perf_counter(); traced = jitted.trace(arrays)
    t1 = time.perf_counter(); lowered = traced.lower()
    t2 = time.perf_counter(); lowered.compile()
    t3 = time.perf_counter()
    ops = sum(1 for line in lowered.as_text().splitlines() if OPS.search(line))
    return {"ops": ops, "trace": t1 - t0, "lower": t2 - t1, "compile": t3 - t2}
parts = {
    "drift": (lambda o, y: o.state_drift(y, tau=0.0), dyn, y),
    "gram term": (lambda o, y: o.expectation.gram(*y), dyn, y),
    "risk": (lambda o, y: o.state_risk(y), ev, y),
    "risk check": (lambda o, y: o.risk_check(*y), ev, y),
    "gram error": (lambda o, e, y: o.expectation.gram_error(e.expectation, *y), dyn, ev, y),
    "solve": (lambda o, y: _solve(o, y, ts, rtol, atol, budget, MAX_STEPS, False), dyn, y),
    "whole program": (lambda *a: _trajectories(*a, MAX_STEPS, False), dynamics, evaluation, y0, ts, rtol, atol, budget),
}
out = {name: measure(fn, *args) for name, (fn, *args) in parts.items()}
out["solver machinery"] = {"ops": out["solve"]["ops"] - out["drift"]["ops"]}
out["gram"] = dyn.expectation.gram_name
print(json.dumps(out))
"""

# Section 2 in one process: the drift and the whole program at each level, alternated.
LEVELS = """
import json, statistics, sys, time
import equinox as eqx, jax
jax.config.update("jax_enable_x64", True)
import singleloc as sl
from jax._src import compiler
from singleloc.runtime._compilation import CPU_OPTIONS
from singleloc.theory._ode import MAX_STEPS, _problem, _trajectories
from singleloc.preflight._build import build
cfg = sl.load_config("default", ["sgd.tau_max=300"])
args = _problem(build(cfg), None, None).args
plain = eqx.filter_jit(_trajectories)  # XLA's defaults (the package's own programs add CPU_OPTIONS)
dynamics, evaluation, y0 = args[:3]
dyn = jax.tree.map(lambda x: x[0] if eqx.is_array(x) and x.ndim and x.shape[0] == 1 else x, dynamics)
y = jax.tree.map(lambda x: x[0], y0)
LEVEL = {"default": (False, None), "O1": (False, {"xla_backend_optimization_level": 1}),
         "disable_most_optimizations": (True, None), "loop emitters": (False, CPU_OPTIONS)}
def lowered(name):
    if name == "drift":
        return eqx.filter_jit(lambda o, y: o.state_drift(y, tau=0.0)).lower(dyn, y), (dyn, y)
    return plain.lower(*args, MAX_STEPS, False), (*args, MAX_STEPS, False)
def run(compiled, call_args):  # CPU seconds (single-threaded XLA_FLAGS: the work, whatever the load)
    t0 = time.process_time(); jax.block_until_ready(compiled(*call_args)); return time.process_time() - t0
out = {}
for r in range(int(sys.argv[1])):
    for program in ("drift", "whole program"):
        for level, (most, options) in LEVEL.items():
            jax.clear_caches()
            jax.config.update("jax_disable_most_optimizations", most)
            low, call_args = lowered(program)
            t0, c0 = time.perf_counter(), time.process_time()
            compiled = low.compile(compiler_options=options) if options else low.compile()
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
            if program == "drift":
                run(compiled, call_args); ran = statistics.median(run(compiled, call_args) for _ in range(5))
            else:
                ran = run(compiled, call_args)
            entry = out.setdefault(program, {}).setdefault(level, {"compile": [], "compile_cpu": [], "run": []})
            entry["compile"].append(seconds); entry["compile_cpu"].append(cpu); entry["run"].append(ran)
            print(program, level, round(seconds, 2), round(ran, 4), file=sys.stderr, flush=True)
print(json.dumps(out))
"""


def fresh(script: str, *argv: str) -> dict:
    """The JSON that ``script`` prints, run in a fresh process without a compilation cache."""
    env = {**os.environ, "SINGLELOC_CACHE_DIR": "", "JAX_COMPILATION_CACHE_DIR": ""}
    env.pop("JAX_DISABLE_MOST_OPTIMIZATIONS", None)
    done = subprocess.run([sys.executable, "-c", script, *argv], env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"benchmark process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = add_save_option(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--quick", action="store_true", help="section 1 on the default problem (L = 4, 64) and H = 4 only")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of section 2 (levels alternated)")
    parser.add_argument("--sections", default="1,2", help="which sections to run (1: size by part, 2: levels)")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    results: dict = {"load_before": os.getloadavg()[0]}
    if "1" in sections:
        results["parts"] = {}
        names = QUICK if args.quick else tuple(PROBLEMS)
        print(f"1. size by part (StableHLO ops; trace / lower / compile seconds), load {os.getloadavg()[0]:.1f}")
        for label in names:
            print(f"   {label} ...", flush=True)
            parts = fresh(PARTS, json.dumps(PROBLEMS[label]))
            results["parts"][label] = parts
            gram = parts.pop("gram")
            for name, p in parts.items():
                if "compile" in p:
                    print(f"     {name:16s} {p['ops']:6d} ops  {p['trace']:5.2f} / {p['lower']:5.2f} / {p['compile']:6.2f} s")
                else:
                    print(f"     {name:16s} {p['ops']:6d} ops")
            parts["gram"] = gram
            print(f"     (Gram term: {gram}; load {os.getloadavg()[0]:.1f})")
    if "2" in sections:
        print(f"2. optimisation levels, default problem ({args.rounds} rounds alternated), load {os.getloadavg()[0]:.1f}",
              flush=True)
        levels = fresh(LEVELS, str(args.rounds))
        results["levels"] = levels
        for program, by_level in levels.items():
            base = by_level["default"]
            for level, entry in by_level.items():
                c, r = statistics.median(entry["compile"]), statistics.median(entry["run"])
                c0, r0 = statistics.median(base["compile"]), statistics.median(base["run"])
                cc, cc0 = statistics.median(entry["compile_cpu"]), statistics.median(base["compile_cpu"])
                unit = f"{1e3 * r:8.1f} ms" if program == "drift" else f"{r:8.2f} s "
                print(f"   {program:13s} {level:27s} compile {c:6.2f} s ({c / c0:4.2f}x; CPU {cc:6.2f} s, {cc / cc0:4.2f}x)  "
                      f"run {unit} ({r / r0:4.2f}x)")
    results["load_after"] = os.getloadavg()[0]
    save(args, __file__, results)


if __name__ == "__main__":
    main()
