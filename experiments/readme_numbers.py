"""The README's main job and its three questions, run as a user runs them (the command line), and the numbers
the README quotes read from their run folders; the story figures copied from the same runs.

0. The main job (``compare showcase``): what the heads of each theory start and each simulated seed have learned
   at the end (:func:`~singleloc.analysis._head_classes.final_outcomes`), counted, with the final risks.
1. When do the heads specialize: the predicted escape of ``integrate --horizon auto`` (``theory.npz``'s
   ``predicted_escape``), the horizon it chose and the run's wall time.
2. How many heads: the sweep's ``heads_needed`` (with ``heads_needed_low``/``_high``, the counts with the gaps
   moved by their errors) per activation and spike count, the gaps to the Bayes risk at four heads, the
   sweep's wall time.
3. Which heads can go: the heads greedy pruning removes within 0.01 of the theory's risk, ``prune``'s wall time.

The three questions' commands: ``singleloc integrate softmax1 --set model.heads=4 --set problem.F=3 --horizon auto``
then ``singleloc plot`` (figures/story_specialization.png), the 16-point sweep ``singleloc sweep default --grid
model.activation=softmax1,bsoftmax --grid model.heads=1,2,3,4 --grid problem.F=2,3 --set simulation.seeds=1`` on the
default route (figures/story_heads_needed.png) and ``singleloc prune`` of the first run
(figures/story_prune.png).

Prints them and writes figures/readme_numbers.json (the numbers, and every command with its wall time and what it
printed), which tests/test_readme_numbers.py compares with the README (without rerunning; its slow test reruns the
cheapest question, pruning, on the cached run).
About 25 minutes on a loaded 2-core CPU. ``--cache DIR``: keep the run folders (a question whose folder
is complete is not run again); ``--quick``: tiny sizes, to check that the script runs; ``--story NAME``
(``showcase`` or ``questions``, repeatable): run those only, keeping the saved numbers of the others.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
from _common import cache_dir, figures_dir, parser, save_json

import singleloc as sl
from singleloc.cli import main as singleloc_command

jax.config.update("jax_enable_x64", True)

#: The rise of the risk within which ``prune`` counts a head as removable (its ``--tol`` default).
PRUNE_TOL = 0.01
#: The three questions' commands (``{out}``: the run folders) and the figure each story's README section shows.
STORIES = {
    "specialization": [["integrate", "softmax1", "--set", "model.heads=4", "--set", "problem.F=3", "--horizon", "auto",
                        "--out", "{out}/a"], ["plot", "{out}/a"]],
    "heads_needed": [["sweep", "default", "--grid", "model.activation=softmax1,bsoftmax", "--grid", "model.heads=1,2,3,4",
                      "--grid", "problem.F=2,3", "--set", "simulation.seeds=1", "--out", "{out}/c"]],
    "prune": [["prune", "{out}/a", "--out", "{out}/d"]],
}
FIGURES = {"specialization": "a/theory.png", "heads_needed": "c/heads_needed.png", "prune": "d/prune.png"}
QUICK = ["--set", "theory.route=rule", "--set", "theory.points=256", "--set", "sgd.tau_max=20"]
#: The main job, as the README's first command runs it, and the file that says it is complete.
SHOWCASE = {"showcase": [["compare", "showcase", "--out", "{out}/s"]]}
COMPLETE = {**FIGURES, "showcase": "s/compare.png"}


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


def run_stories(out: Path, quick: bool, stories) -> tuple[dict[str, float], dict[str, list[dict]]]:
    """Run the commands of each of ``stories`` not yet complete in ``out``; their wall times (s) by story, and
    each command as a user typed it (``runs/``), its wall time and what it printed."""
    seconds, outputs = {}, {}
    for story, commands in {**SHOWCASE, **STORIES}.items():
        if story not in stories:
            continue
        if (out / COMPLETE[story]).is_file():
            print(f"{story}: {out / COMPLETE[story]} is there (cached)")
            continue
        seconds[story] = 0.0
        for command in commands:
            argv = [a.format(out=out) for a in command]
            if quick and argv[:2] == ["integrate", "softmax1"]:
                argv = [a for a in argv if a not in ("--horizon", "auto")] + QUICK
            if quick and argv[0] == "compare":
                argv += ["--set", "sgd.tau_max=4", "--set", "simulation.D=100"]
            if quick and argv[0] == "sweep":
                small = {"model.heads=1,2,3,4": "model.heads=1,2", "problem.F=2,3": "problem.F=2"}
                argv = [small.get(a, a) for a in argv] + ["--set", "theory.points=256", "--horizon", "10"]
            load = os.getloadavg()[0]
            text, took = _run(argv)
            seconds[story] += round(took, 1)
            outputs.setdefault(story, []).append({"command": "singleloc " + " ".join(argv).replace(str(out), "runs"),
                                                  "seconds": round(took, 1), "load_average": [load, os.getloadavg()[0]],
                                                  "output": text.replace(str(out), "runs")})
    return seconds, outputs


def showcase(out: Path) -> dict:
    """The main job's heads at the end, per theory start and per simulated seed (``s``: its run folder)."""
    from collections import Counter

    from singleloc.analysis._head_classes import final_outcomes
    from singleloc.preflight._build import build

    run = sl.load_run(out / "s")
    theory = SimpleNamespace(**{k: run.extra["theory_seeds"][k] for k in ("M", "Q", "b")})
    simulation = SimpleNamespace(**{k: run.data["simulation"][k] for k in ("M", "Q", "b")})
    words = final_outcomes(build(run.config), theory, simulation)
    return {"horizon": float(run.data["simulation"]["tau"][-1]),
            "theory": dict(Counter(words[0]).most_common()), "simulation": dict(Counter(words[1]).most_common()),
            "theory_final_risk": [float(r) for r in run.extra["theory_seeds"]["risk"][:, -1]],
            "simulation_final_risk": [float(r) for r in run.data["simulation"]["risk"][:, -1]]}


def amplitude_escape(tau, M, mean) -> float:
    """The first saved time at which ``|(M - mean_h M) P|_F`` reaches 1 (``P``: orthogonal to the prior's ``mean``):
    what the tangent-linear prediction predicts (docs/phases.md); NaN if it never does."""
    P = np.eye(M.shape[-1])
    if np.linalg.norm(mean) > 1e-12:
        P -= np.outer(mean, mean) / np.dot(mean, mean)
    amplitude = np.linalg.norm((M - M.mean(axis=-2, keepdims=True)) @ P, axis=(-2, -1))
    hit = np.flatnonzero(amplitude >= 1.0)
    return float(tau[hit[0]]) if len(hit) else float("nan")


def sweep_escapes(folder: Path) -> dict:
    """Every sweep point's predicted escape beside three measures of its theory run: ``first_learned`` (the sweep's),
    ``escape_time`` (the risk's halfway drop from the plateau before it) and :func:`amplitude_escape`."""
    import xarray as xr

    ds, out = xr.open_dataset(folder / "sweep.nc"), {}
    for point in ds["predicted_escape"].stack(p=ds["predicted_escape"].dims).p.values:
        q = ds.sel(dict(zip(ds["predicted_escape"].dims, point))).isel(seed=0, missing_dims="ignore")
        act, H, F = str(q["activation"].values), int(q["heads"]), int(q["F"])
        mean = sl.load_config("default").replace(model={"activation": act, "heads": H},
                                                 problem={"F": F}).problem.build_prior().mean()
        M = q["M"].values[:, :H, :F]
        keep = np.isfinite(M).all(axis=(-2, -1))
        out[f"{act}, H={H}, F={F}"] = {k: float(q[k]) for k in ("predicted_escape", "tau_plateau", "first_learned",
                                                                 "escape_time")} | {
            "amplitude_escape": amplitude_escape(q["tau"].values[keep], M[keep], mean)}
    return out


def questions(out: Path) -> dict:
    """The three questions' numbers, read from the run folders in ``out`` (``a``: integrate, ``c``: sweep, ``d``:
    prune)."""
    from singleloc.analysis._phase_analysis import analyze

    run = sl.load_run(out / "a")
    theory = run.data["theory"]
    escape = float(theory["predicted_escape"]) if "predicted_escape" in theory else float("nan")
    mean = run.config.problem.build_prior().mean()
    measured = analyze(theory["tau"], theory["M"], theory["Q"], theory["risk"], mean=mean)
    with open(out / "c" / "sweep.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    needed, gaps = {}, {}
    for row in rows:
        key = f"{row['activation']}, F={row['problem.F']}"
        needed[key] = {k: int(float(row[k])) if row[k] not in ("", "nan") else None
                       for k in ("heads_needed", "heads_needed_low", "heads_needed_high")}
        gaps.setdefault(key, {})[f"H={row['model.heads']}"] = [float(row["gap_to_bayes"]), float(row["gap_to_bayes_error"])]
    pruning = sl.load_run(out / "d").pruning["theory"]
    return {"specialization": {"heads": run.config.model.heads, "F": run.config.problem.F, "predicted_escape": escape,
                               "measured_escape": float(measured.escape_time[0]), "amplitude_escape": amplitude_escape(
                                   theory["tau"], theory["M"], mean), "settled": bool(theory["settled"]),
                               "horizon": float(theory["tau"][-1]), "final_risk": float(theory["risk"][-1])},
            "heads_needed": {"needed": needed, "gap_to_bayes": gaps, "escapes": sweep_escapes(out / "c")},
            "prune": {"heads": pruning.heads, "removable": pruning.removable(PRUNE_TOL), "tol": PRUNE_TOL,
                      "risks": [float(r) for r in np.asarray(pruning.risk)]}}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--story", action="append", choices=["showcase", "questions"],
                   help="run the main job or the three questions only (repeatable)")
    args = p.parse_args()
    stories = [*(["showcase"] if args.story is None or "showcase" in args.story else []),
               *(STORIES if args.story is None or "questions" in args.story else [])]
    questions_too = any(story in STORIES for story in stories)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        out = cache_dir(args, "readme_numbers") or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        seconds, outputs = run_stories(out, args.quick, stories)
        numbers = {**({"showcase": showcase(out)} if "showcase" in stories else {}), **(questions(out) if questions_too else {})}
        record = {"numbers": numbers, "seconds": seconds, "outputs": outputs, "load_average": [load, os.getloadavg()[0]]}
        figures = figures_dir(args)
        for story, source in FIGURES.items():
            if story in stories:
                print(f"wrote {shutil.copyfile(out / source, figures / f'story_{story}.png')}")
    saved = figures / "readme_numbers.json"
    if saved.is_file():  # a cached or unrun story keeps what was saved with it
        before = json.loads(saved.read_text())
        for key in ("numbers", "seconds", "outputs"):
            record[key] = {**before.get(key, {}), **record[key]}
        if not any(story in seconds for story in STORIES):  # the load at which the questions' wall times were measured
            record["load_average"] = before.get("load_average", record["load_average"])
    for story, values in record["numbers"].items():
        print(f"{story}: {values}")
    print(f"wrote {save_json(saved, record)}")


if __name__ == "__main__":
    main()
