"""Phase diagrams over heads H and spikes F on the exact route (docs/phases.md, issue 20 item 6).

The sweep of docs/phases.md, ``singleloc sweep default --grid model.activation=... --grid
model.heads=1,2,4 --grid problem.F=1,2,3`` (spikes of strength 2.5, L = 4, lr = 0.5, 4 starts of
D = 1000, each point to its predicted horizon), run through :func:`singleloc.sweep` one activation
at a time. Every point takes ``theory.route = "auto"`` (the exact route wherever it exists) except
the points of ``RULE_POINTS``: bsoftmax with four heads, whose joint exact rule is beyond
``JOINT_EXACT_MAX`` under three spikes and takes hours a point under one or two (about 9 s a drift;
the four starts of one spike took two hours of one core). They go on the Sobol rule at 65536 points
and two replicates (minutes a point): at four copies of an unspecialized head (one spike) it is
within 9e-5 of the exact route (0.14130 against 0.14121), where the default 4096 points leave it
1.3e-3 low (0.13996). ``--exact-all``: every point on ``"auto"`` (hours).

Writes ``figures/phases_sweep_<activation>.png`` and the rows of the redone activations into
``figures/phases_sweep_exact.csv`` (the rows of the others are kept; a ``route`` column says which
route each point took, blank for rows written before the sweeps stored it). ``--activations``: the
activations to redo (default all three; bsoftmax took about an hour of one core of this 2-core
machine, its six exact points 20 minutes of it). ``--cache DIR``: the sweeps' point cache
(a sweep repeated there recomputes nothing). ``--quick``: H = 1, 2 and F = 1, 2 at a horizon of 30.
"""

from __future__ import annotations

import csv
import tempfile
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

from _common import figures_dir, parser  # noqa: E402

import singleloc as sl  # noqa: E402
from singleloc.plots import plot_phase_diagram  # noqa: E402
from singleloc.sweeps._sweep import write_csv  # noqa: E402

ACTIVATIONS = ("softmax", "softmax1", "bsoftmax")
HEADS, SPIKES = (1, 2, 4), (1, 2, 3)
#: (activation, H, F) on the rule route, with their theory settings (module docstring).
RULE_POINTS = {("bsoftmax", 4, F): {"route": "rule", "points": 65536, "replicates": 2} for F in SPIKES}
CSV_NAME = "phases_sweep_exact.csv"


def grids(activation: str, heads, spikes) -> list[sl.Grid]:
    return [sl.Grid("model", "activation", (activation,)), sl.Grid("model", "heads", tuple(heads)),
            sl.Grid("problem", "F", tuple(spikes))]


def sweep_rows(activation: str, cache: Path, work: Path, *, quick: bool, exact_all: bool) -> list[dict]:
    """The rows of one activation's points, sorted by ``(H, F)``: per head count, one sweep of its
    spikes on the default route and one sweep for each of its points in ``RULE_POINTS``."""
    heads, spikes = ((1, 2), (1, 2)) if quick else (HEADS, SPIKES)
    horizon = 30.0 if quick else "auto"
    base = sl.load_config("default")
    rule = {} if exact_all else {(h, f): theory for (a, h, f), theory in RULE_POINTS.items()
                                 if a == activation and h in heads and f in spikes}
    rows = []
    for h in heads:  # per head count: its spikes on the default route in one sweep, then each rule point
        auto = [f for f in spikes if (h, f) not in rule]
        runs = ([({}, auto)] if auto else []) + [(rule[h, f], [f]) for f in spikes if (h, f) in rule]
        for theory, fs in runs:
            label = ", ".join(f"{k} = {v}" for k, v in theory.items()) or "auto route"
            out = work / f"{activation}_H{h}_F{'-'.join(map(str, fs))}"
            got, stats = sl.sweep(base.replace(theory=theory) if theory else base, grids(activation, [h], fs), out,
                                  horizon=horizon, cache_dir=cache, figures=False)
            print(f"{activation} H = {h}, F = {fs} ({label}): {stats.computed} computed, {stats.cached} from the "
                  f"cache, {stats.failed} failed, {stats.seconds:.0f} s")
            rows += got
    return sorted(rows, key=lambda r: (int(r["heads"]), int(r["F"])))


def merged(old: list[dict], new: list[dict], redone: set[str]) -> list[dict]:
    """``old`` without the rows of the ``redone`` activations, then ``new``, every row on the columns'
    union in order of first appearance (a column a row lacks is left blank)."""
    rows = [r for r in old if r["activation"] not in redone] + new
    columns = list(dict.fromkeys(k for r in rows for k in r))
    return [{k: r.get(k, "") for k in columns} for r in rows]


def main():
    p = parser(__doc__)
    p.add_argument("--activations", default=",".join(ACTIVATIONS), help="comma-separated (default: all three)")
    p.add_argument("--exact-all", action="store_true", help="no point on the rule route but those the exact route refuses")
    args = p.parse_args()
    activations = [a.strip() for a in args.activations.split(",") if a.strip()]
    unknown = [a for a in activations if a not in ACTIVATIONS]
    if unknown:
        p.error(f"--activations: {unknown} not among {ACTIVATIONS}")
    figures = figures_dir(args)
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(args.cache) if args.cache is not None else Path(tmp) / "points"
        new = []
        for activation in activations:
            rows = sweep_rows(activation, cache, Path(tmp), quick=args.quick, exact_all=args.exact_all)
            on_rule = [f"({r['heads']}, {r['F']})" for r in rows if r.get("route") == "rule"]
            title = activation + (f" (rule route at (H, F) = {', '.join(on_rule)})" if on_rule else "")
            fig = plot_phase_diagram(rows, title=title)
            sl.save_figure(figures / f"phases_sweep_{activation}.png", fig)
            print(f"wrote {figures / f'phases_sweep_{activation}.png'}")
            new += rows
    path = figures / CSV_NAME
    old = []
    if path.exists():
        with path.open() as f:
            old = list(csv.DictReader(f))
    rows = merged(old, new, set(activations))
    write_csv(path, rows)
    print(f"wrote {path}: {len(rows)} rows ({len(new)} redone)")


if __name__ == "__main__":
    main()
