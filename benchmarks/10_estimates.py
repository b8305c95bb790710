"""Announced times against measured ones on the README's commands (issue 61, item 4: within 2x).

Each command runs as a user runs it, a whole process (``python -m singleloc.cli ...``, progress in lines),
twice: **cold**, with a fresh ``SINGLELOC_CACHE_DIR`` (nothing compiled, no times recorded: the estimates come
from the CPU's measured speed), then **warm**, with the same folder again (the stored programs and the times the
cold run recorded). Its stderr is read as it comes, each line stamped with its time. An *announcement* is a line
``WHAT: about N s (...)`` said before a computation starts (:func:`singleloc.runtime._progress.announce`); a
*phase* is a line ``... in N s`` said when one ends. A command's **announced total** is the sum of its top-level
announcements (:data:`COMMANDS`: the whole command's, or its steps' one after the other; the others are
refinements said inside them), each measured from its line to the next top-level one, the last to the process's
exit (writing the outputs included). Within 2x: ``0.5 <= announced / measured <= 2``.

The commands are the README's (``compare showcase``, ``integrate ... --horizon auto``, the heads-needed
``sweep``, ``prune`` of the integrated run), the solve of its first story alone (``story``: four softmax1 heads
on three spikes to the horizon ``--horizon auto`` set there) and a long solve (``long``: one head to ``tau = 20000``;
``--full``: two heads with trained weights), by default scaled down (:data:`COMMANDS`) so that the whole benchmark takes
about 14 minutes on a 2-core CPU; ``--full`` runs them as the README writes them (over an hour).

Run: ``python benchmarks/10_estimates.py [--full] [--commands compare,integrate,story,sweep,prune,long] [--save PATH]``.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import add_save_option, save

#: name: (the README's arguments, the scaled ones, the top-level announcements). ``{out}``: the run's output
#: folder; ``{integrate}``: the integrate run's of the same temperature (the README's ``runs/a``).
COMMANDS = {
    "compare": ("compare showcase --out {out}",
                "compare showcase --set sgd.tau_max=20 --set simulation.D=300 --set simulation.seeds=2 --out {out}",
                r"the simulation and the theory"),
    "integrate": ("integrate softmax1 --set model.heads=4 --set problem.F=3 --horizon auto --out {out}",
                  "integrate softmax1 --set model.heads=2 --set problem.F=2 --set simulation.D=30 --horizon auto --out {out}",
                  r"predicting the escape|integrate, "),
    "story": ("integrate softmax1 --set model.heads=4 --set problem.F=3 --horizon 1700 --out {out}",
              "integrate softmax1 --set model.heads=4 --set problem.F=3 --horizon 400 --out {out}",
              r"integrate, "),
    "sweep": ("sweep default --grid model.activation=softmax1,bsoftmax --grid model.heads=1,2,3,4 --grid problem.F=2,3 "
              "--set simulation.seeds=1 --set theory.route=rule --out {out}",
              "sweep default --grid model.activation=softmax1,bsoftmax --grid model.heads=1,2 --grid problem.F=2 "
              "--set simulation.seeds=1 --set theory.route=rule --set simulation.D=100 --out {out}",
              r"points to compute"),
    "prune": ("prune {integrate} --out {out}", "prune {integrate} --out {out}", r"pruning "),
    # a long solve (the head-mixing study's horizon), where the steps grow with the span again and trained weights
    # hold them from the start (singleloc.preflight._estimates.solve_size): not a README command
    "long": ("integrate default --set model.head_weights=trained --set sgd.tau_max=20000 --set sgd.spacing=log --out {out}",
             "integrate default --set model.heads=1 --set sgd.tau_max=20000 --set sgd.spacing=log --out {out}", r"integrate, "),
}
#: An announcement (``: about``) or a phase's end (`` in``); "the most expensive: ..." lists a sweep's points.
LINE = re.compile(r"^singleloc \w+: (?!the most expensive)(?P<what>.+?)(?P<kind>: about| in) (?P<n>[\d.]+) "
                  r"(?P<unit>s|min|h|days)\b")
SECONDS = {"s": 1.0, "min": 60.0, "h": 3600.0, "days": 86400.0}


def run(argv: list[str], cache: Path) -> dict:
    """One process: its stderr lines stamped (seconds from the start), its wall time, the load before and after."""
    env = {**os.environ, "SINGLELOC_CACHE_DIR": str(cache), "SINGLELOC_PROGRESS": "lines", "MPLBACKEND": "Agg"}
    load, lines = os.getloadavg()[0], []
    t0 = time.perf_counter()
    with subprocess.Popen([sys.executable, "-m", "singleloc.cli", *argv], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True) as process:
        for line in process.stderr:
            lines.append((time.perf_counter() - t0, line.rstrip()))
            print(f"     {lines[-1][0]:6.1f} s  {lines[-1][1]}", flush=True)
    wall = time.perf_counter() - t0
    if process.returncode:
        raise SystemExit(f"{shlex.join(argv)} failed (exit {process.returncode})")
    return {"argv": argv, "wall": wall, "load_before": load, "load_after": os.getloadavg()[0], "lines": lines}


def compare(measured: dict, top: str) -> dict:
    """The announcements and phases of a run's lines, and its top-level announcements against their times."""
    parsed = [(t, m["kind"], m["what"], float(m["n"]) * SECONDS[m["unit"]]) for t, text in measured["lines"]
              if (m := LINE.match(text))]
    said = [(t, what, s) for t, kind, what, s in parsed if kind == ": about"]
    tops = [a for a in said if re.search(top, a[1])]
    ends = [t for t, _, _ in tops[1:]] + [measured["wall"]]
    parts = [{"what": what, "announced": s, "measured": end - t} for (t, what, s), end in zip(tops, ends)]
    announced, taken = sum(p["announced"] for p in parts), sum(p["measured"] for p in parts)
    ratio = announced / taken if parts else float("nan")
    return {**measured, "announcements": said, "phases": [(t, what, s) for t, kind, what, s in parsed if kind == " in"],
            "parts": parts, "announced": announced, "measured": taken, "ratio": ratio, "within_2x": 0.5 <= ratio <= 2}


def main():
    parser = add_save_option(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--full", action="store_true", help="the README's commands unscaled (over an hour)")
    parser.add_argument("--commands", default=",".join(COMMANDS), help="which commands, in order (prune needs integrate)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="singleloc-estimates-") as tmp:
        for name in args.commands.split(","):
            full, scaled, top = COMMANDS[name]
            cache = Path(tmp, f"cache-{name}")
            for temperature in ("cold", "warm"):
                out = {"out": f"{tmp}/{name}-{temperature}", "integrate": f"{tmp}/integrate-{temperature}"}
                argv = [a.format(**out) for a in shlex.split(full if args.full else scaled)]
                print(f"{name}, {temperature}: singleloc {shlex.join(argv)}", flush=True)
                row = {"command": name, "run": temperature, **compare(run(argv, cache), top)}
                rows.append(row)
                for p in row["parts"]:
                    print(f"   {p['what'][:60]}: announced {p['announced']:.1f} s, measured {p['measured']:.1f} s")
    print(f"\n{'command':10s} {'run':5s} {'announced':>10s} {'measured':>9s} {'wall':>7s} {'ratio':>6s}  within 2x  load")
    for r in rows:
        print(f"{r['command']:10s} {r['run']:5s} {r['announced']:8.1f} s {r['measured']:7.1f} s {r['wall']:5.1f} s "
              f"{r['ratio']:6.2f}  {'yes' if r['within_2x'] else 'NO':9s}  {r['load_before']:.1f}")
    save(args, __file__, {"rows": rows})


if __name__ == "__main__":
    main()
