"""Speed of the theory: ``integrate`` as a user runs it, and its ratio to a simulation.

1. ``singleloc integrate default --set sgd.tau_max=300 --out DIR`` in a fresh process, cold (an
   empty cache folder: everything traced and compiled) and warm (the same command again: the
   stored program and executables are loaded), whole-process wall time and CPU time (user + sys
   of the child: the machine may be shared, and CPU time is what a quiet machine's wall time
   would be). Targets: warm < 6 s, cold < 12 s (rule route); 5 s / 2 s (exact route, issue 20).
2. The floor of any such command here: a fresh process that imports JAX, equinox and diffrax, turns
   on the same persistent compilation cache and runs a trivial Tsit5 solve (``dy/dt = -y`` on ten
   numbers, the same saved times, tolerances and step-size controller), cold and warm, timed the
   same way. What ``integrate`` takes beyond it is the package's; a target below it cannot be met
   by any program on this machine.
3. Where a warm and a cold run spend their time, in one process: imports, the initial overlaps,
   tracing (jaxpr), lowering, XLA compiling, reading the cache, and the solve itself.
4. What the cold run compiles, piece by piece, in one process: the drift alone, the solve around it
   (Tsit5, the step-size controller, the event), the risk on the evaluation rule and on the finer
   check rule, and the Gram term's stated error, each lowered and compiled as its own program at the
   start of ``integrate default``, against the whole solve program (``integrate``'s). The floor of
   a cold run is the imports plus the solve's compilation, whatever else is trimmed.
5. The ratio of ``simulate`` (D = 1e4, 1 seed) to the warm ``integrate`` over the same tau range
   (target >= 1000x). The simulation is run as a fresh process to ``SIM_TAU`` and to ``2 SIM_TAU``;
   the difference gives its cost per unit tau (constant: one fresh sample and one gradient per step),
   which extrapolates the first run (compilation included) to ``tau_max``. Two ratios: whole
   processes (what a user waits for, imports included), and in one process (the simulation's
   cost per unit tau times ``tau_max`` against the warm ``integrate`` call of step 2: the
   cost of the computation itself, without Python's and JAX's start-up, which is paid once).

Run: ``python benchmarks/03_theory_speed.py [--tau-max 300] [--repeat 3] [--save PATH]`` (``--save``: the numbers
as JSON, ``benchmarks/_common.py``).
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

from _common import add_save_option, save

SIM_TAU = 3.0

# One integrate in this process, timed by phase (JAX's monitoring events).
SPLIT = """
import json, sys, time
t0 = time.perf_counter()
from jax import monitoring
spent = {}
monitoring.register_event_duration_secs_listener(lambda e, d, **k: spent.__setitem__(e, spent.get(e, 0.0) + d))
import jax
import singleloc as sl
from singleloc import _ode  # the modules integrate needs: JAX, equinox, diffrax, SciPy
jax.config.update("jax_enable_x64", True)
sl.enable_compilation_cache()
t1 = time.perf_counter()
cfg = sl.load_config("default", [f"sgd.tau_max={sys.argv[1]}"])
y0 = sl.initial_conditions(cfg, 1)
t2 = time.perf_counter()
sl.integrate(cfg, y0)
t3 = time.perf_counter()
names = {"trace": "/jax/core/compile/jaxpr_trace_duration", "lower": "/jax/core/compile/jaxpr_to_mlir_module_duration",
         "compile": "/jax/core/compile/backend_compile_duration", "cache read": "/jax/compilation_cache/cache_retrieval_time_sec"}
print(json.dumps({"imports": t1 - t0, "initial overlaps": t2 - t1, "integrate": t3 - t2,
                  **{k: spent.get(v, 0.0) for k, v in names.items()}}))
"""

# The floor: a trivial diffrax program in a fresh process, set up as integrate's (x64, persistent cache).
FLOOR = """
import os, sys
import jax
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_compilation_cache_dir", os.environ["SINGLELOC_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
import diffrax, equinox as eqx, jax.numpy as jnp
tau_max = float(sys.argv[1])
@eqx.filter_jit
def solve(y0):
    term = diffrax.ODETerm(lambda t, y, args: -y)
    saveat = diffrax.SaveAt(ts=jnp.linspace(0.0, tau_max, 61))
    return diffrax.diffeqsolve(term, diffrax.Tsit5(), 0.0, tau_max, 0.01, y0, saveat=saveat,
                               stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-8), max_steps=100_000).ys
print(float(solve(jnp.ones(10))[-1, 0]))
"""

# Each piece of integrate's program compiled on its own, in one process (jax.stages: lower, then compile).
COMPONENTS = """
import json, sys, time
import equinox as eqx, jax
import singleloc as sl
from singleloc.theory._ode import _problem, _run, _solve
jax.config.update("jax_enable_x64", True)
cfg = sl.load_config("default", [f"sgd.tau_max={sys.argv[1]}"])
dynamics, evaluation, y0, ts, rtol, atol = _problem(cfg, None, None).args
def first(ode):  # replicate 0 of an ODE stack (its SGD rule is shared, not stacked)
    rules = eqx.tree_at(lambda o: o.sgd, ode, None, is_leaf=lambda x: x is None)
    one = jax.tree.map(lambda x: x[0] if eqx.is_array(x) else x, rules)
    return eqx.tree_at(lambda o: o.sgd, one, ode.sgd, is_leaf=lambda x: x is None)
dyn, ev, y = first(dynamics), first(evaluation), jax.tree.map(lambda x: x[0], y0)
pieces = {
    "drift": (lambda o, y: o.state_drift(y, tau=0.0), dyn, y),
    "solve": (lambda o, y: _solve(o, y, ts, rtol, atol, 100_000, False), dyn, y),
    "risk": (lambda o, y: o.state_risk(y), ev, y),
    "risk check": (lambda o, y: o.risk_check(*y), ev, y),
    "gram error": (lambda o, e, y: o.expectation.gram_error(e.expectation, *y), dyn, ev, y),
}
out = {}
for name, (fn, *args) in pieces.items():
    t0 = time.perf_counter()
    lowered = eqx.filter_jit(fn).lower(*args)
    t1 = time.perf_counter()
    lowered.compile()
    out[name] = {"trace+lower": t1 - t0, "compile": time.perf_counter() - t1}
t0 = time.perf_counter()
lowered = _run.lower(dynamics, evaluation, y0, ts, rtol, atol, 100_000, False)
t1 = time.perf_counter()
lowered.compile()
out["whole program"] = {"trace+lower": t1 - t0, "compile": time.perf_counter() - t1}
print(json.dumps(out))
"""


def timed(cmd: list[str], env: dict) -> tuple[float, float]:
    """Wall and CPU (user + sys) seconds of a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def split(tau_max: float, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", SPLIT, str(tau_max)], check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def components(tau_max: float) -> dict:
    out = subprocess.run([sys.executable, "-c", COMPONENTS, str(tau_max)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tau-max", type=float, default=300.0)
    parser.add_argument("--repeat", type=int, default=3, help="warm runs (the median is reported)")
    args = add_save_option(parser).parse_args()
    results = {"tau_max": args.tau_max, "repeat": args.repeat}
    cli = [sys.executable, "-m", "singleloc"]
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "SINGLELOC_CACHE_DIR": f"{tmp}/cache"}
        integrate = [*cli, "integrate", "default", "--set", f"sgd.tau_max={args.tau_max}", "--out", f"{tmp}/i"]
        cold = timed(integrate, env)
        warm = sorted(timed(integrate, env) for _ in range(args.repeat))[args.repeat // 2]
        print(f"integrate default, tau_max = {args.tau_max:g}, whole process: cold {cold[0]:.1f} s wall ({cold[1]:.1f} s CPU), "
              f"warm {warm[0]:.1f} s wall ({warm[1]:.1f} s CPU; median of {args.repeat}); load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        results.update(cold_wall_s=cold[0], cold_cpu_s=cold[1], warm_wall_s=warm[0], warm_cpu_s=warm[1],
                       load_average=os.getloadavg()[0], phases={})
        env_floor = {**os.environ, "SINGLELOC_CACHE_DIR": f"{tmp}/floor"}
        floor_cmd = [sys.executable, "-c", FLOOR, str(args.tau_max)]
        floor_cold = timed(floor_cmd, env_floor)
        floor_warm = sorted(timed(floor_cmd, env_floor) for _ in range(args.repeat))[args.repeat // 2]
        print(f"  floor (a trivial Tsit5 solve in a fresh process): cold {floor_cold[0]:.1f} s wall ({floor_cold[1]:.1f} s CPU), "
              f"warm {floor_warm[0]:.1f} s wall ({floor_warm[1]:.1f} s CPU); integrate / floor: cold "
              f"{cold[0] / floor_cold[0]:.1f}x, warm {warm[0] / floor_warm[0]:.1f}x")
        results.update(floor_cold_wall_s=floor_cold[0], floor_cold_cpu_s=floor_cold[1], floor_warm_wall_s=floor_warm[0],
                       floor_warm_cpu_s=floor_warm[1], ratio_floor_cold=cold[0] / floor_cold[0],
                       ratio_floor_warm=warm[0] / floor_warm[0])
        env_split = {**os.environ, "SINGLELOC_CACHE_DIR": f"{tmp}/split"}
        for label in ("cold", "warm"):
            phases = split(args.tau_max, env_split)
            warm_integrate = phases["integrate"]
            results["phases"][label] = phases
            print(f"  {label}, wall s by phase: " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))
        pieces = components(args.tau_max)  # no persistent cache: everything compiled
        results["compile_by_piece"] = pieces
        print("  compiled one by one (trace+lower / XLA compile, s): " + ", ".join(
            f"{k} {v['trace+lower']:.1f} / {v['compile']:.1f}" for k, v in pieces.items()))
        sim = [*cli, "simulate", "default", "--set", "simulation.D=10000", "--set", "simulation.seeds=1", "--set", "sgd.n_save=4",
               "--out", f"{tmp}/s", "--no-progress"]
        t1, c1 = timed([*sim, "--set", f"sgd.tau_max={SIM_TAU}"], env)
        t2, c2 = timed([*sim, "--set", f"sgd.tau_max={2 * SIM_TAU}"], env)
    per_tau, cpu_per_tau = (t2 - t1) / SIM_TAU, (c2 - c1) / SIM_TAU
    t_sim, c_sim = t1 + per_tau * (args.tau_max - SIM_TAU), c1 + cpu_per_tau * (args.tau_max - SIM_TAU)
    print(f"simulate D = 1e4, 1 seed: {t1:.1f} s to tau = {SIM_TAU:g}, {t2:.1f} s to tau = {2 * SIM_TAU:g}: {per_tau:.1f} s per "
          f"unit tau -> {t_sim:.0f} s wall ({c_sim:.0f} s CPU) to tau = {args.tau_max:g} (extrapolated)")
    print(f"ratio simulate / warm integrate, whole processes: {t_sim / warm[0]:.0f}x wall, {c_sim / warm[1]:.0f}x CPU")
    print(f"ratio in one process (no imports, no compilation on either side): simulation {per_tau * args.tau_max:.0f} s "
          f"(its cost per unit tau times tau_max) / integrate {warm_integrate:.2f} s (the warm call, program loaded from "
          f"the cache) = {per_tau * args.tau_max / warm_integrate:.0f}x")
    results.update(simulate={"D": 10_000, "seeds": 1, "tau": [SIM_TAU, 2 * SIM_TAU], "wall_s": [t1, t2], "cpu_s": [c1, c2],
                             "wall_s_per_tau": per_tau, "extrapolated_wall_s": t_sim, "extrapolated_cpu_s": c_sim},
                   ratio_processes_wall=t_sim / warm[0], ratio_processes_cpu=c_sim / warm[1],
                   ratio_in_process=per_tau * args.tau_max / warm_integrate)
    save(args, __file__, results)


if __name__ == "__main__":
    main()
