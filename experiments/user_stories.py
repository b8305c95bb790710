"""The README's three user stories, run as a user runs them (the command line), their figures copied.

1. Heads specializing over time: ``singleloc integrate softmax1 --set model.heads=4 --set problem.F=3
   --horizon auto`` then ``singleloc plot``: figures/story_specialization.png (the run's theory.png).
2. How many heads each activation needs to come within 0.01 of the Bayes risk: ``singleloc sweep default
   --grid model.activation=softmax1,bsoftmax --grid model.heads=1,2,3,4 --grid problem.F=2,3 --set
   simulation.seeds=1 --set theory.route=rule``: figures/story_heads_needed.png (its heads_needed.png).
3. Pruning the layer of story 1: ``singleloc prune``: figures/story_prune.png (its prune.png).

Prints every command's output and wall time and writes figures/user_stories.json (the commands, their
wall times and the load average). About 25 minutes on a loaded 2-core CPU, most of it the 16-point sweep.
``--cache DIR``: keep the output folders (a story whose folder is complete is not run again);
``--quick``: tiny sizes on the Sobol rule, to check that the script runs.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
import time
from pathlib import Path

from _common import cache_dir, figures_dir, parser, save_json

from singleloc.cli import main as singleloc_command

STORIES = {
    "specialization": [["integrate", "softmax1", "--set", "model.heads=4", "--set", "problem.F=3", "--horizon", "auto",
                        "--out", "{out}/a"], ["plot", "{out}/a"]],
    "heads_needed": [["sweep", "default", "--grid", "model.activation=softmax1,bsoftmax", "--grid", "model.heads=1,2,3,4",
                      "--grid", "problem.F=2,3", "--set", "simulation.seeds=1", "--set", "theory.route=rule",
                      "--out", "{out}/c"]],
    "prune": [["prune", "{out}/a", "--out", "{out}/d"]],
}
FIGURES = {"specialization": "a/theory.png", "heads_needed": "c/heads_needed.png", "prune": "d/prune.png"}
QUICK = ["--set", "theory.route=rule", "--set", "theory.points=256", "--set", "sgd.tau_max=20"]


def main() -> None:
    args = parser(__doc__).parse_args()
    record = {"load_average_start": os.getloadavg()[0], "stories": {}}
    with tempfile.TemporaryDirectory() as tmp:
        out = cache_dir(args, "user_stories") or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        for story, commands in STORIES.items():
            if (out / FIGURES[story]).is_file():
                print(f"{story}: {out / FIGURES[story]} is there (cached)")
                continue
            steps = []
            for command in commands:
                argv = [a.format(out=out) for a in command]
                if args.quick and argv[:2] == ["integrate", "softmax1"]:
                    argv = [a for a in argv if a not in ("--horizon", "auto")] + QUICK
                if args.quick and argv[0] == "sweep":
                    small = {"model.heads=1,2,3,4": "model.heads=1,2", "problem.F=2,3": "problem.F=2"}
                    argv = [small.get(a, a) for a in argv] + ["--set", "theory.points=256", "--horizon", "10"]
                text, seconds = _run(argv)
                steps.append({"command": "singleloc " + " ".join(a.replace(str(out), "runs") for a in argv),
                              "seconds": round(seconds, 1), "output": text.replace(str(out), "runs")})
            record["stories"][story] = steps
        figures = figures_dir(args)
        figures.mkdir(parents=True, exist_ok=True)
        for story, source in FIGURES.items():
            print(f"wrote {shutil.copyfile(out / source, figures / f'story_{story}.png')}")
    record["load_average_end"] = os.getloadavg()[0]
    if record["stories"]:
        print(f"wrote {save_json(figures / 'user_stories.json', record)}")


def _run(argv: list[str]) -> tuple[str, float]:
    """One command, its stdout and wall time (stderr goes to the terminal: progress and notes)."""
    out = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = singleloc_command(argv)
    seconds = time.perf_counter() - start
    print(f"$ singleloc {' '.join(argv)}\n{out.getvalue()}({seconds:.0f} s)", flush=True)
    if code != 0:
        raise SystemExit(f"singleloc {argv[0]} failed")
    return out.getvalue(), seconds


if __name__ == "__main__":
    main()
