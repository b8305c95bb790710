"""Speed of the theory: ``integrate`` and ``compare`` as a user runs them, against the floor of any such command.

1. ``singleloc integrate default --set sgd.tau_max=300 --out DIR`` in a fresh process against the
   **floor**: a fresh process that imports JAX, equinox and diffrax, turns on the same persistent
   compilation cache and runs a trivial Tsit5 solve (``dy/dt = -y`` on ten numbers, the same saved
   times, tolerances and step-size controller). Cold (each process with an empty cache folder:
   everything traced and compiled) and warm (the cache filled by a run before: the stored programs
   are loaded), the two commands in turn, A B A B, and the ratio pair by pair (the machine may be
   shared: a ratio of neighbours holds when its speed drifts); wall and CPU time (user + sys of the
   child) and the load average with every number. Targets (issue 49): cold <= 3x the floor, warm
   <= 1.5x.
2. ``singleloc compare default --out DIR`` (simulation and theory of the default problem, four
   seeds, the figure), once cold and then warm. Target: warm <= 30 s on a 2-core CPU.
3. Where a cold and a warm ``integrate`` spend their time, in one process running the command's own
   entry point (``singleloc.cli.main``): importing JAX, equinox and diffrax (the floor's imports),
   importing the package's modules the command needs, building the quadrature rules and the start,
   compiling or loading the stored solve, solving, drawing the figure and writing the folder; and
   JAX's own counts of tracing, lowering, XLA compiling and reading the cache.
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
   cost per unit tau times ``tau_max`` against the warm ``integrate`` call of step 3: the
   cost of the computation itself, without Python's and JAX's start-up, which is paid once).

6. ``singleloc compare showcase`` cold (the README's main job: bsoftmax H = 4 on the Sobol rule, 4 seeds, D = 1000),
   its phases as the command says them (compiling and running the simulation; compiling, solving and stating the
   error of the theory): the theory's seconds over the simulation's, in one process. Target (issue 58): <= 1.
   With ``--before DIR`` (a checkout of an earlier commit, e.g. ``git archive REV | tar -x -C DIR``) the command
   of that code too, the two in turn (``PYTHONPATH``), ``--cold-repeat`` pairs, each with an empty cache folder.
7. ``integrate_points`` (``sweep``'s theory) of four points of one shape (the showcase at ``sgd.lr`` = 0.4 ... 1.0,
   one start each, tau 20) in one process without the persistent cache: its program with the points vmapped
   (the code before) and in turn on one CPU device (``_batched``), each compiled, then run alternately
   ``--repeat`` times; the two programs' largest difference, and each point's against its own ``integrate``.

Run: ``python benchmarks/03_theory_speed.py [--tau-max 300] [--repeat 3] [--cold-repeat 2] [--skip pieces,simulation]
[--before DIR] [--save PATH]`` (``--save``: the numbers as JSON, ``benchmarks/_common.py``). About 10 minutes on a quiet 2-core
CPU with every step.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from _common import add_save_option, save

SIM_TAU = 3.0
STEPS = ("pieces", "simulation", "showcase", "points")  # the steps --skip can leave out (1 to 3 always run)
#: The processes run as a user's (the environment as it is: no variable chooses the theory's route).
USER = dict(os.environ)

# One ``singleloc integrate`` in this process through the command's entry point, timed by phase (the
# solve's own record of its phases, timers around drawing and writing, and JAX's monitoring events).
SPLIT = """
import json, sys, time
t0 = time.perf_counter()
import jax, equinox, diffrax
t1 = time.perf_counter()
from jax import monitoring
spent = {}
monitoring.register_event_duration_secs_listener(lambda e, d, **k: spent.__setitem__(e, spent.get(e, 0.0) + d))
import singleloc.cli, singleloc.theory._ode, singleloc.io._run_folders, singleloc.plots
from singleloc.preflight import _estimates
t2 = time.perf_counter()
phases, timed = {}, {"figure": 0.0, "writing": 0.0}
record = _estimates.TheorySolve._record
def spy(self, phase):
    phases.update(rules=getattr(self, "_prepared", 0.0) or 0.0, solve=phase.seconds[-1],
                  **{"compile or load": phase.seconds[0] if len(phase.seconds) == 2 else 0.0})
    return record(self, phase)
_estimates.TheorySolve._record = spy
def clock(module, name, key):
    inner = getattr(module, name)
    def wrapped(*a, **k):
        t = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            timed[key] += time.perf_counter() - t
    setattr(module, name, wrapped)
clock(singleloc.plots, "plot_compare", "figure")
clock(singleloc.io._run_folders, "save_run", "writing")
code = singleloc.cli.main(["integrate", "default", "--set", f"sgd.tau_max={sys.argv[1]}", "--out", sys.argv[2], "--no-progress"])
t3 = time.perf_counter()
assert code == 0, code
names = {"trace": "/jax/core/compile/jaxpr_trace_duration", "lower": "/jax/core/compile/jaxpr_to_mlir_module_duration",
         "XLA compile": "/jax/core/compile/backend_compile_duration",
         "cache read": "/jax/compilation_cache/cache_retrieval_time_sec"}
command = t3 - t2
rest = command - sum(phases.values()) - sum(timed.values())
print(json.dumps({"import jax, equinox, diffrax": t1 - t0, "import the package": t2 - t1, "command": command,
                  **phases, **timed, "other (config, checks, initial overlaps' start-up, risks' summary)": rest,
                  "jax events": {k: spent.get(v, 0.0) for k, v in names.items()}}))
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
from singleloc.preflight._build import build
jax.config.update("jax_enable_x64", True)
cfg = sl.load_config("default", [f"sgd.tau_max={sys.argv[1]}"])
dynamics, evaluation, y0, ts, rtol, atol, budget = _problem(build(cfg), None, None).args
def first(ode):  # replicate 0 of an ODE stack (its SGD rule is shared, not stacked)
    rules = eqx.tree_at(lambda o: o.sgd, ode, None, is_leaf=lambda x: x is None)
    one = jax.tree.map(lambda x: x[0] if eqx.is_array(x) else x, rules)
    return eqx.tree_at(lambda o: o.sgd, one, ode.sgd, is_leaf=lambda x: x is None)
dyn, ev, y = first(dynamics), first(evaluation), jax.tree.map(lambda x: x[0], y0)
pieces = {
    "drift": (lambda o, y: o.state_drift(y, tau=0.0), dyn, y),
    "solve": (lambda o, y: _solve(o, y, ts, rtol, atol, budget, 100_000, False), dyn, y),
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


# integrate_points' program of four points of one shape, vmapped against in turn, alternated in one process.
POINTS = """
import json, sys, time
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
import singleloc as sl
from singleloc.preflight._build import build
from singleloc.runtime._compilation import filter_jit
from singleloc.theory import _ode
from singleloc.theory._starts import initial_conditions
configs = [sl.load_config("showcase", ["simulation.seeds=1", "sgd.tau_max=20", "sgd.n_save=21", f"sgd.lr={lr}"])
           for lr in (0.4, 0.6, 0.8, 1.0)]
prepared = [_ode._problem(build(c), initial_conditions(c), None) for c in configs]
args = jax.tree.map(lambda *x: jnp.stack(x), *(p.args for p in prepared))
one = lambda *a: _ode._trajectories(*a, _ode.MAX_STEPS, False)
fns = {"vmapped": lambda *a: jax.vmap(one)(*a), "in turn": lambda *a: _ode._batched(one, (0,) * 7, 4)(*a)}
compiled, out, outs = {}, {"compile_s": {}, "run_s": {k: [] for k in fns}}, {}
for name in (list(fns) if int(sys.argv[1]) % 2 == 0 else list(fns)[::-1]):
    t = time.perf_counter(); compiled[name] = filter_jit(fns[name]).lower(*args).compile()  # integrate's options
    out["compile_s"][name] = time.perf_counter() - t
for _ in range(int(sys.argv[1])):
    for name, c in compiled.items():
        t = time.perf_counter(); outs[name] = jax.device_get(c(*args)); out["run_s"][name].append(time.perf_counter() - t)
single = [jax.device_get(_ode._run(*p.args, _ode.MAX_STEPS, False)) for p in prepared]
gap = lambda a, b: max(float(np.nanmax(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(a, b))
out["vmapped_vs_in_turn"] = gap(jax.tree.leaves(outs["vmapped"][:2]), jax.tree.leaves(outs["in turn"][:2]))
out["against_integrate"] = {k: max(gap(jax.tree.leaves(jax.tree.map(lambda x: x[j], o[:2])), jax.tree.leaves(single[j][:2]))
                                   for j in range(4)) for k, o in outs.items()}
print(json.dumps(out))
"""


def load() -> float:
    """The load average of the last minute (the machine may be shared: said with every number)."""
    return os.getloadavg()[0]


def timed(cmd: list[str], env: dict) -> dict:
    """Wall and CPU (user + sys) seconds of a child process, and the load average as it ended."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall_s": wall, "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), "load": load()}


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def said(runs: list[dict]) -> str:
    """``median wall (CPU), load a-b`` of some runs."""
    loads = [r["load"] for r in runs]
    return (f"{median(runs, 'wall_s'):.1f} s wall ({median(runs, 'cpu_s'):.1f} s CPU; median of {len(runs)}, load "
            f"{min(loads):.1f}-{max(loads):.1f})")


def against_floor(command, floor, env_of, runs: int) -> dict:
    """``command`` and ``floor`` (argument: the run's index) in turn, ``runs`` pairs, each process with the
    environment ``env_of(name, i)``; the pairs' ratios (wall and CPU) and their medians."""
    pairs = [(timed(command(i), env_of("integrate", i)), timed(floor(i), env_of("floor", i))) for i in range(runs)]
    out = {"command": [a for a, _ in pairs], "floor": [b for _, b in pairs],
           "ratio_wall": [a["wall_s"] / b["wall_s"] for a, b in pairs], "ratio_cpu": [a["cpu_s"] / b["cpu_s"] for a, b in pairs]}
    out.update(ratio_wall_median=statistics.median(out["ratio_wall"]), ratio_cpu_median=statistics.median(out["ratio_cpu"]))
    return out


def split(tau_max: float, env: dict, out: str) -> dict:
    done = subprocess.run([sys.executable, "-c", SPLIT, str(tau_max), out], check=True, capture_output=True, text=True, env=env)
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "load": load()}


def components(tau_max: float) -> dict:
    out = subprocess.run([sys.executable, "-c", COMPONENTS, str(tau_max)], check=True, capture_output=True, text=True,
                         env=USER)
    return json.loads(out.stdout.strip().splitlines()[-1])


#: The phases ``compare`` says on stderr, and which side each belongs to.
PHASES = {"simulation": (r"compiled the simulation in", r"simulated \d+ SGD steps in"),
          "theory": (r"compiled the solve in", r"solved in", r"stated the quadrature's error in")}


# ``singleloc compare showcase`` with every phase said, the quiet ones too (the error statement is quiet: under
# ``QUIET_AFTER`` seconds it says nothing, and its seconds would be missed).
SHOWCASE = """
import sys
from singleloc.runtime import _progress
enter = _progress.Phase.__enter__
def said(self):
    self.quiet = False
    return enter(self)
_progress.Phase.__enter__ = said
from singleloc.cli import main
sys.exit(main(["compare", "showcase", "--out", sys.argv[1], "--no-progress"]))
"""


def points(repeat: int) -> dict:
    done = subprocess.run([sys.executable, "-c", POINTS, str(repeat)], check=True, capture_output=True, text=True,
                          env={**USER, "SINGLELOC_CACHE_DIR": ""})
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "load": load()}


def showcase(env: dict, out: str) -> dict:
    """``compare showcase`` in a fresh process with ``env``: wall and CPU, and the seconds of each side's phases."""
    import re
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", SHOWCASE, out], check=True, capture_output=True, text=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = lambda m: float(m[1]) * (60.0 if m[2] == "min" else 1.0)
    phases = {p.split(" in")[0]: seconds(re.search(p + r" ([\d.]+) (s|min)", done.stderr)) for ps in PHASES.values()
              for p in ps}
    sides = {side: sum(phases[p.split(" in")[0]] for p in ps) for side, ps in PHASES.items()}
    return {"wall_s": time.perf_counter() - t0, "load": load(), **{f"{k}_s": v for k, v in sides.items()}, "phases": phases,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "theory_over_simulation": sides["theory"] / sides["simulation"]}


def verdict(value: float, target: float) -> str:
    return f"met (target <= {target:g})" if value <= target else f"NOT met: {value / target:.2f} times the target {target:g}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tau-max", type=float, default=300.0)
    parser.add_argument("--repeat", type=int, default=3, help="warm pairs and warm compare runs (medians reported)")
    parser.add_argument("--cold-repeat", type=int, default=2, help="cold pairs (each with empty cache folders)")
    parser.add_argument("--skip", default="", help=f"steps to leave out, comma-separated: {', '.join(STEPS)}")
    parser.add_argument("--before", metavar="DIR", help="step 6: also the command of the earlier code checked out at DIR")
    args = add_save_option(parser).parse_args()
    skip = {s for s in args.skip.split(",") if s}
    if skip - set(STEPS):
        parser.error(f"--skip: unknown step(s) {', '.join(sorted(skip - set(STEPS)))}; choose from {', '.join(STEPS)}")
    results = {"tau_max": args.tau_max, "repeat": args.repeat, "cold_repeat": args.cold_repeat, "load_at_start": load()}
    print(f"load average {load():.1f} on {os.cpu_count()} cores at the start")
    cli = [sys.executable, "-m", "singleloc"]
    with tempfile.TemporaryDirectory() as tmp:
        integrate = lambda i: [*cli, "integrate", "default", "--set", f"sgd.tau_max={args.tau_max:g}", "--out", f"{tmp}/i",
                               "--no-progress"]
        floor = lambda i: [sys.executable, "-c", FLOOR, str(args.tau_max)]
        env_cold = lambda name, i: {**USER, "SINGLELOC_CACHE_DIR": f"{tmp}/cold-{name}-{i}"}
        env_warm = lambda name, i: {**USER, "SINGLELOC_CACHE_DIR": f"{tmp}/cold-{name}-0"}  # filled by cold pair 0
        cold = against_floor(integrate, floor, env_cold, args.cold_repeat)
        warm = against_floor(integrate, floor, env_warm, args.repeat)
        for label, runs, target in (("cold", cold, 3.0), ("warm", warm, 1.5)):
            print(f"integrate default, tau_max = {args.tau_max:g}, {label}: {said(runs['command'])}; "
                  f"floor {said(runs['floor'])}; "
                  f"integrate / floor pair by pair {', '.join(f'{r:.2f}' for r in runs['ratio_wall'])} (wall), median "
                  f"{runs['ratio_wall_median']:.2f}: {verdict(runs['ratio_wall_median'], target)}; in CPU time "
                  f"{runs['ratio_cpu_median']:.2f}")
        results.update(integrate_cold=cold, integrate_warm=warm, target_cold=3.0, target_warm=1.5)

        compare = [*cli, "compare", "default", "--out", f"{tmp}/c", "--no-progress"]
        env_compare = {**USER, "SINGLELOC_CACHE_DIR": f"{tmp}/compare"}
        compare_cold = timed(compare, env_compare)
        compare_warm = [timed(compare, env_compare) for _ in range(args.repeat)]
        print(f"compare default: cold {compare_cold['wall_s']:.1f} s wall ({compare_cold['cpu_s']:.1f} s CPU, load "
              f"{compare_cold['load']:.1f}); warm {said(compare_warm)}: {verdict(median(compare_warm, 'wall_s'), 30.0)}")
        results.update(compare_cold=compare_cold, compare_warm=compare_warm,
                       compare_warm_wall_median=median(compare_warm, "wall_s"), target_compare_warm_s=30.0)

        env_split = {**USER, "SINGLELOC_CACHE_DIR": f"{tmp}/split"}
        results["phases"] = {}
        for label in ("cold", "warm"):
            phases = split(args.tau_max, env_split, f"{tmp}/split-{label}")
            results["phases"][label] = phases
            events = phases.pop("jax events")
            print(f"  integrate {label} in one process, wall s by phase (load {phases.pop('load'):.1f}): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
                  + "; JAX's events: " + ", ".join(f"{k} {v:.2f}" for k, v in events.items()))
            phases["jax events"] = events
        warm_solve = results["phases"]["warm"]["solve"]

        if "pieces" not in skip:
            pieces = components(args.tau_max)  # no persistent cache: everything compiled
            results["compile_by_piece"] = pieces
            print(f"  compiled one by one (trace+lower / XLA compile, s; load {load():.1f}): " + ", ".join(
                f"{k} {v['trace+lower']:.1f} / {v['compile']:.1f}" for k, v in pieces.items()))

        if "simulation" not in skip:
            sim = [*cli, "simulate", "default", "--set", "simulation.D=10000", "--set", "simulation.seeds=1", "--set",
                   "sgd.n_save=4", "--out", f"{tmp}/s", "--no-progress"]
            env = env_warm("integrate", 0)
            r1 = timed([*sim, "--set", f"sgd.tau_max={SIM_TAU}"], env)
            r2 = timed([*sim, "--set", f"sgd.tau_max={2 * SIM_TAU}"], env)
            (t1, c1), (t2, c2) = (r1["wall_s"], r1["cpu_s"]), (r2["wall_s"], r2["cpu_s"])
            per_tau, cpu_per_tau = (t2 - t1) / SIM_TAU, (c2 - c1) / SIM_TAU
            t_sim, c_sim = t1 + per_tau * (args.tau_max - SIM_TAU), c1 + cpu_per_tau * (args.tau_max - SIM_TAU)
            w_wall, w_cpu = median(warm["command"], "wall_s"), median(warm["command"], "cpu_s")
            print(f"simulate D = 1e4, 1 seed (load {r2['load']:.1f}): {t1:.1f} s to tau = {SIM_TAU:g}, {t2:.1f} s to tau = "
                  f"{2 * SIM_TAU:g}: {per_tau:.1f} s per unit tau -> {t_sim:.0f} s wall ({c_sim:.0f} s CPU) to tau = "
                  f"{args.tau_max:g} (extrapolated)")
            print(f"ratio simulate / warm integrate, whole processes: {t_sim / w_wall:.0f}x wall, {c_sim / w_cpu:.0f}x CPU")
            print(f"ratio in one process (no imports, no compilation on either side): simulation {per_tau * args.tau_max:.0f} s "
                  f"(its cost per unit tau times tau_max) / the warm solve {warm_solve:.2f} s = "
                  f"{per_tau * args.tau_max / warm_solve:.0f}x")
            results.update(simulate={"D": 10_000, "seeds": 1, "tau": [SIM_TAU, 2 * SIM_TAU], "runs": [r1, r2],
                                     "wall_s_per_tau": per_tau, "extrapolated_wall_s": t_sim, "extrapolated_cpu_s": c_sim},
                           ratio_processes_wall=t_sim / w_wall, ratio_processes_cpu=c_sim / w_cpu,
                           ratio_in_process=per_tau * args.tau_max / warm_solve)

        if "showcase" not in skip:
            codes = {"now": {}} | ({"before": {"PYTHONPATH": os.path.abspath(args.before)}} if args.before else {})
            for i in range(args.cold_repeat if args.before else 1):
                for code, env in codes.items():
                    sc = showcase({**USER, **env, "SINGLELOC_CACHE_DIR": f"{tmp}/showcase-{code}-{i}"}, f"{tmp}/sc")
                    results.setdefault("showcase_cold" if code == "now" else "showcase_cold_before", []).append(sc)
                    print(f"compare showcase ({code}), cold (load {sc['load']:.1f}): {sc['wall_s']:.1f} s wall; the simulation "
                          f"{sc['simulation_s']:.1f} s, the theory {sc['theory_s']:.1f} s (compiling and running each): "
                          f"theory / simulation {sc['theory_over_simulation']:.2f}: "
                          f"{verdict(sc['theory_over_simulation'], 1.0)}; by phase, s: "
                          + ", ".join(f"{k} {v:.1f}" for k, v in sc["phases"].items()))

        if "points" not in skip:
            pts = results["points"] = points(args.repeat)
            ratios = [a / b for a, b in zip(pts["run_s"]["vmapped"], pts["run_s"]["in turn"])]
            print(f"integrate_points, 4 showcase points of one shape (load {pts['load']:.1f}): compiled in "
                  + ", ".join(f"{k} {v:.1f} s" for k, v in pts["compile_s"].items()) + "; run vmapped / in turn "
                  + ", ".join(f"{r:.2f}" for r in ratios) + f"; largest difference {pts['vmapped_vs_in_turn']:.1e}, against "
                  "each point's integrate " + ", ".join(f"{k} {v:.1e}" for k, v in pts["against_integrate"].items()))
    results["load_at_end"] = load()
    save(args, __file__, results)


if __name__ == "__main__":
    main()
