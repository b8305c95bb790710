"""Parameter sweeps with an on-disk cache: ``singleloc sweep CONFIG --grid section.key=v1,v2``.

The points are the Cartesian product of the grids ``section.key = v1, v2, ...`` over a base
configuration. At each point a sweep

1. predicts the escape from the unspecialized plateau and the horizon
   (:func:`singleloc.analysis._predictions.predicted_escape`); with ``theory.points = "auto"`` it
   first chooses the point's number of points (:func:`~singleloc.resolve_points`), used by every
   later step of the point. With a fixed horizon (a number, or ``"config"``) and a number of points no
   prediction is needed to run: it is made after the runs, for the points that have not escaped by their
   horizon (their status says when they would), and read from the cache where an earlier sweep made it;
2. resolves the configuration it integrates (:func:`~singleloc.analysis._predictions.resolve_horizon`:
   ``horizon="auto"``, a number, or ``"config"``);
3. integrates the ODE from the simulator's initial overlaps of every seed (one batched solve)
   and, optionally, runs the finite-D simulation;
4. analyses the phases (:func:`singleloc.analysis._phase_analysis.analyze`) of the limit risk with
   the heads' attention weights (:func:`singleloc.attention_mass`), which classify every head.

The Bayes risk of every problem of the grid gives each point its ``gap_to_bayes`` and each activation and spike
count its ``heads_needed`` (:mod:`singleloc.analysis._sweep_answers`). Each step is a pure function of its
configuration (:func:`singleloc.sweeps._sweep_compute.compute`), so the points can run in this process or on a Dask
cluster, and every entry is cached on disk under a hash of its configuration
(:mod:`singleloc.sweeps._sweep_cache`): a repeated sweep recomputes nothing. :func:`compute_sweep` runs (or loads)
every point, :func:`write_sweep_outputs` writes the CSV (columns: :data:`singleloc.sweeps._sweep_dataset.COLUMNS`),
the Dataset and the figures, and :func:`sweep` (``singleloc.sweep``) does both.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis._attention_mass import classifying_weights
from ..analysis._head_classes import HEAD_CLASSES
from ..analysis._phase_analysis import analyze
from ..analysis._predictions import EscapePrediction, resolve_horizon
from ..analysis._sweep_answers import GAP_TOL, add_heads_needed, bayes_columns
from ..configuration._config import Config
from ..expectations._laplace_expectation import DRIFT_UNCHECKED
from ..expectations._routes import route_class
from ..ground._atomic_files import OUTPUT_KEY, png_has_text, written_together
from ..ground._choices import ROUTE_WORDS, check_horizon
from ..io._run_folders import save_figure, save_text
from ..preflight._build import build
from ..preflight._resources import check_run
from ..runtime._distributed import open_cluster
from ..runtime._numerics import require_x64
from ..runtime._progress import Bar
from ..theory._theory_result import STATEMENT_FIELDS
from ._grid import Grid, grid_points
from ._sweep_cache import SweepStats, cached_run, fill_cache
from ._sweep_compute import bayes_config, compile_group
from ._sweep_dataset import write_sweep
from ._sweep_entries import _entry_path, cache_key
from ._sweep_estimate import sweep_costs

#: The figure of the heads each activation needs (:func:`~singleloc.plots.plot_heads_needed`).
HEADS_FIGURE = "heads_needed.png"

#: The risk the phase analysis reads in an entry of each kind: the limit risk in both.
PHASE_RISK = {"theory": "risk", "simulation": "risk_limit"}


def check_gap(gap: float) -> None:
    """``ValueError`` unless ``gap`` (``--gap``, the largest gap to the Bayes risk that counts as
    reaching it) is a finite number >= 0."""
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not math.isfinite(gap) or gap < 0:
        raise ValueError(f"gap must be a finite number >= 0, got {gap!r}")


def check_sweep(base: Config, grids: Sequence[Grid], *, simulate: bool = False, batch: bool = True) -> None:
    """Refuse a sweep that cannot run, before its first point does (``ValueError`` or ``MemoryError`` naming the
    keys): :func:`~singleloc.preflight._resources.check_run` of every point, for its simulation (``simulate``) and its
    theory's starts, those of every point of its :func:`~singleloc.runtime._compilation.compile_group` with ``batch``
    (one solve)."""
    points = [point for _, point in grid_points(base, grids)]
    groups = [compile_group("theory", point.to_dict()) for point in points]
    sizes = Counter(groups)
    for point, group in zip(points, groups):
        check_run(build(point), simulation=simulate, theory_starts=point.simulation.seeds * (sizes[group] if batch else 1))


def summarize(config: Config, data: dict[str, np.ndarray], kind: str) -> dict[str, float]:
    """:meth:`PhaseAnalysis.summary` of an entry, with the heads' attention weights (:func:`classifying_weights`) on
    the route it ran on (a theory entry's own: the exact route's point may have gone on on the Sobol rule, whose fields
    the exact rule does not resolve)."""
    if "route" in data:
        config = config.replace(theory={"route": str(data["route"])})
    weights = classifying_weights(build(config), data["M"], data["Q"], data["b"])
    return analyze(data["tau"], data["M"], data["Q"], data[PHASE_RISK[kind]], mean=config.problem.build_prior().mean(),
                   weights=weights).summary()


#: The columns of a phase summary, in the order of the CSV.
SUMMARY_KEYS = ("final_risk", "escaped", "escape_time", "first_learned", "first_specialization",
                *(f"n_{c}" for c in HEAD_CLASSES), "leaning_angle_spike", "leaning_angle_mean", "n_directions", "shared_profiles",
                "settled", "risk_change")


def statement_columns(entry: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The quadrature statement of a theory entry (:data:`~singleloc.theory._theory_result.STATEMENT_FIELDS`)
    as CSV values: text for the routes, numbers for the errors and points; ``""`` and NaN where the
    entry does not carry it (cached by an earlier version, or the point failed)."""
    text = ("route", "gram_route")
    return {k: (str(entry[k]) if k in entry else "") if k in text else (float(entry[k]) if k in entry else math.nan)
            for k in STATEMENT_FIELDS}


def quadrature_summary(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line on the routes of a sweep's theory points and their largest stated errors (what
    ``singleloc sweep`` prints; the per-point values are :func:`statement_columns`')."""
    def largest(points, key, none="not computed"):
        values = [r[key] for r in points if np.isfinite(r[key])]
        return f"{max(values):.1e}" if values else none

    def points(n):
        return f"{n} point{'' if n == 1 else 's'}"

    parts, stated = [], 0
    for name, words in ROUTE_WORDS.items():  # each route as its class states its error
        at = [r for r in rows if r.get("route") == name]
        stated += len(at)
        if at and route_class(name).refined_error:
            parts.append(f"{words} route at {points(len(at))} (largest stated risk error {largest(at, 'risk_error')}, "
                         f"relative O(lr) drift error {largest(at, 'exact_drift_error', DRIFT_UNCHECKED)}, lr^2 Gram term "
                         f"{largest(at, 'gram_error')})")
        elif at:
            sizes = sorted({int(r["points"]) for r in at if np.isfinite(r["points"])})
            nodes = f"theory.points = {'/'.join(map(str, sizes))}; " if sizes else ""
            parts.append(f"{words} route at {points(len(at))} ({nodes}largest standard error of the risk "
                         f"{largest(at, 'risk_error')}, estimated relative drift error {largest(at, 'drift_error')})")
    if len(rows) > stated:
        parts.append(f"not stated at {points(len(rows) - stated)} (failed, or cached before entries carried it)")
    return "theory quadrature: " + "; ".join(parts)


def settled_summary(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line on the points whose theory has not settled at its horizon (:mod:`singleloc.analysis._settled`;
    what ``singleloc sweep`` prints); empty when every point has."""
    from ..analysis._settled import RTOL, WINDOW

    unsettled = [r for r in rows if np.isfinite(r["settled"]) and r["settled"] < 1]
    if not unsettled:
        return ""
    where = ", ".join(f"{r['activation']} H={r['heads']} F={r['F']}" for r in unsettled[:8])
    where += ", ..." if len(unsettled) > 8 else ""
    return (f"not settled at the horizon: {len(unsettled)} of {len(rows)} points ({where}): over the last {WINDOW:.0%} of "
            f"the horizon the risk changed by more than {RTOL:g} relative or a head changed class (columns settled, "
            "risk_change); their final_risk and classes are what the horizon caught: rerun with a longer --horizon")


def _failure(kind: str, err: BaseException) -> str:
    text = str(err).split(";")[0] if isinstance(err, FloatingPointError) else f"{type(err).__name__}: {err}"
    return f"{kind} failed: {' '.join(text.split())}"


@dataclasses.dataclass
class SweepOutcome:
    """What :func:`compute_sweep` found, for :func:`write_sweep_outputs`: the base configuration,
    the grids, the CSV ``rows``, the cache ``entries`` of every point (kind -> arrays, the points'
    trajectories), whether it simulated, and the :class:`SweepStats`."""

    base: Config
    grids: Sequence[Grid]
    rows: list[dict[str, Any]]
    entries: list[dict[str, dict[str, np.ndarray]]]
    simulate: bool
    stats: SweepStats


def sweep(base: Config, grids: Sequence[Grid], out: str | Path | None = None, *, horizon: str | float = "auto",
          simulate: bool = False, cache_dir: str | Path | None = None, progress: bool = True, figures: bool = True,
          workers: int = 1, scheduler: str | None = None, batch: bool = True,
          gap: float = GAP_TOL) -> tuple[list[dict[str, Any]], SweepStats]:
    """Run (or load) every grid point (:func:`compute_sweep`) and, with ``out``, write its files
    (:func:`write_sweep_outputs`; ``figures=False``: the CSV and the Dataset only). Returns the CSV rows (dicts) and
    the :class:`SweepStats`.

    ``horizon``: ``"auto"`` (each point to its predicted horizon), ``"config"`` (``sgd.tau_max``) or a number
    (module docstring). ``cache_dir``: the cache folder (default ``OUT/cache``; one of the two is needed). ``gap``:
    the largest ``gap_to_bayes`` that counts as reaching the Bayes risk in ``heads_needed``
    (:mod:`singleloc.analysis._sweep_answers`). The other arguments as :func:`compute_sweep`'s.
    """
    t0 = time.perf_counter()
    if cache_dir is None and out is None:
        raise ValueError("sweep needs out (its cache goes to OUT/cache) or cache_dir")
    cache = Path(out) / "cache" if cache_dir is None else Path(cache_dir)
    outcome = compute_sweep(base, grids, cache, horizon=horizon, simulate=simulate, progress=progress, workers=workers,
                            scheduler=scheduler, batch=batch, gap=gap)
    if out is not None:
        write_sweep_outputs(out, outcome, figures=figures)
    outcome.stats.seconds = time.perf_counter() - t0
    return outcome.rows, outcome.stats


def compute_sweep(base: Config, grids: Sequence[Grid], cache: str | Path, *, horizon: str | float = "auto",
                  simulate: bool = False, progress: bool = True, workers: int = 1, scheduler: str | None = None,
                  batch: bool = True, gap: float = GAP_TOL) -> SweepOutcome:
    """Run (or load from the cache folder ``cache``) every grid point; write nothing else.

    The entries missing from the cache are computed in rounds (the escape predictions where needed and the Bayes
    risks, the runs to their horizons, then the predictions of the points not escaped by a fixed horizon) by
    :func:`~singleloc.sweeps._sweep_cache.fill_cache` on one cluster (:func:`~singleloc.runtime._distributed.open_cluster`
    of ``workers`` and ``scheduler``, started only when some entry is missing); a point that fails is reported in its
    row and does not stop the others. ``batch``: the theory points of one
    :func:`~singleloc.runtime._compilation.compile_group` are one batched solve. ``gap``: as :func:`sweep`'s.
    """
    check_horizon(horizon)
    check_gap(gap)
    t0 = time.perf_counter()
    points = grid_points(base, grids)
    check_sweep(base, grids, simulate=simulate, batch=batch)  # every point can run, before the first one does
    cache = Path(cache)
    kinds = ["theory"] + (["simulation"] if simulate else [])
    costs = sweep_costs(points, None, kinds, cache, horizon)  # said before anything runs; a point over the limit refused
    cache.mkdir(parents=True, exist_ok=True)
    recomputed = SweepStats()

    def read(config: Config, kind: str) -> dict[str, np.ndarray]:
        """An entry that :func:`fill_cache` left in the cache; one found damaged inside is recomputed here."""
        before = recomputed.computed
        data = cached_run(config, kind, cache, recomputed)
        if recomputed.computed > before:
            computed.add(_entry_path(cache, config, kind).name)
        return data

    problems = [bayes_config(cfg) for _, cfg in points]
    # a fixed horizon needs no prediction to run (made after the runs, where a point did not escape), but for
    # theory.points = "auto", whose prediction entry chooses the points
    needed = [horizon == "auto" or cfg.theory.points == "auto" for _, cfg in points]
    predictions, run_cfgs = {}, {}

    loaded: list[dict[str, dict[str, np.ndarray]]] = [{} for _ in points]  # per point, its theory/simulation entries
    summaries: dict[tuple[int, str], dict[str, float]] = {}

    def summary(i: int, kind: str) -> dict[str, float]:
        """The phase summary of the point's entry of ``kind`` (read and summarized once)."""
        if (i, kind) not in summaries:
            loaded[i][kind] = read(run_cfgs[i], kind)
            summaries[i, kind] = summarize(run_cfgs[i], loaded[i][kind], kind)
        return summaries[i, kind]

    def predicted(i: int, cfg: Config) -> dict[str, np.ndarray] | None:
        """The point's prediction entry where it is in the cache, also in :attr:`predictions`."""
        path = _entry_path(cache, cfg, "prediction")
        if path.name in errors or not path.is_file():
            return None
        entry = read(cfg, "prediction")
        predictions[i] = EscapePrediction.from_arrays(entry)
        return entry

    with open_cluster(workers, scheduler) as cluster:  # one cluster for every round, started only if needed
        if cluster.where == "serial":  # the points run in this process, whose JAX settings are the caller's
            require_x64("singleloc.sweep with workers = 1 (the points run in this process)")
        run = dict(cluster=cluster, progress=progress, batch=batch)
        first = [(cfg, "prediction") for (_, cfg), need in zip(points, needed) if need] + [(p, "bayes") for p in problems]
        computed, errors = fill_cache(first, cache, desc="escape predictions and Bayes risks" if any(needed) else
                                      "Bayes risks", costs=costs, **run)
        for i, (_, cfg) in enumerate(points):
            entry = predicted(i, cfg)
            if entry is not None or not needed[i]:
                run_cfgs[i] = resolve_horizon(cfg, entry, horizon)
        auto = horizon == "auto"
        costs = sweep_costs(points, run_cfgs, kinds, cache, horizon, stage=f"the runs to the {'predicted ' * auto}horizons",
                            quiet=not computed)  # said again, with the horizons the predictions set
        done, run_errors = fill_cache([(run_cfgs[i], kind) for i in run_cfgs for kind in kinds], cache, desc="sweep",
                                      costs=costs, **run)
        computed |= done
        errors.update(run_errors)
        late = {i: cfg for i, (_, cfg) in enumerate(points) if not auto and i in run_cfgs and i not in predictions
                and _entry_path(cache, run_cfgs[i], "theory").name not in errors
                and summary(i, "theory")["escaped"] < 1}
        if late:  # only these say when they would escape
            costs = sweep_costs(points, late, ["prediction"], cache, horizon,
                                stage="escape predictions of the points not escaped by the horizon")
            done, late_errors = fill_cache([(cfg, "prediction") for cfg in late.values()], cache,
                                           desc="escape predictions", costs=costs, **run)
            computed |= done
            errors.update(late_errors)
            for i, cfg in late.items():
                predicted(i, cfg)
    stats = SweepStats()
    rows = []
    with Bar(len(points), "summarizing the points (phases and head classes: the heads' attention masses on their "
                          "routes)", "point", done="summarized {n} points") as bar:
        for i, (values, cfg) in enumerate(points):
            row: dict[str, Any] = dict(values)
            row.update(activation=cfg.model.activation, heads=cfg.model.heads, F=cfg.problem.F, status="ok")
            names, failures = [_entry_path(cache, cfg, "prediction").name], []
            row.update(horizon=run_cfgs[i].sgd.tau_max if i in run_cfgs else math.nan,
                       **{k: math.nan for k in ("lambda", "tau_plateau", "predicted_escape")})
            if i in predictions:
                pred = predictions[i]
                row.update(**{"lambda": pred.rate}, tau_plateau=pred.tau_plateau, predicted_escape=pred.predicted_escape)
            elif names[0] in errors:
                failures.append(_failure("prediction", errors[names[0]]))
            bayes_name = _entry_path(cache, problems[i], "bayes").name
            bayes = None if bayes_name in errors else read(problems[i], "bayes")
            if bayes is None:
                failures.append(_failure("Bayes risk", errors[bayes_name]))
            for kind in kinds:
                prefix = "" if kind == "theory" else "sim_"
                summ = {k: math.nan for k in SUMMARY_KEYS}
                if i in run_cfgs:
                    name = _entry_path(cache, run_cfgs[i], kind).name
                    names.append(name)
                    if name in errors:
                        failures.append(_failure(kind, errors[name]))
                    else:
                        summ = summary(i, kind)
                row.update({prefix + k: summ[k] for k in SUMMARY_KEYS})
                if kind == "theory":
                    row.update(bayes_columns(row, bayes, loaded[i].get("theory", {}), simulate=False))
                    row.update(statement_columns(loaded[i].get("theory", {})))
            if simulate:
                row["sim_gap_to_bayes"] = bayes_columns(row, bayes, {}, simulate=True)["sim_gap_to_bayes"]
            if failures:  # every failure of the point: prediction, Bayes risk, theory and simulation
                row["status"] = "; ".join(failures)
                stats.failed += 1
            if failures or computed.intersection(names):
                stats.computed += 1
            else:
                stats.cached += 1
            if row["status"] == "ok" and i in predictions and predictions[i].escapes and row["escaped"] < 1:
                row["status"] = f"not yet (predicted escape at tau = {predictions[i].predicted_escape:.3g})"
            row["key"] = cache_key(run_cfgs[i], "theory") if i in run_cfgs else ""
            rows.append(row)
            bar.update()
    add_heads_needed(rows, [g.name for g in grids], gap)
    stats.seconds = time.perf_counter() - t0
    return SweepOutcome(base, list(grids), rows, loaded, simulate, stats)


def write_sweep_outputs(out: str | Path, outcome: SweepOutcome, *, figures: bool = True) -> Path:
    """Write the files of a sweep into ``out``: ``sweep.csv`` (:func:`write_csv`), ``sweep.nc``
    (:func:`~singleloc.sweeps._sweep_dataset.write_sweep`) and, with ``figures``, one phase diagram per activation
    (and per value of the other grid keys), ``phase_<activation>[_<key>=<value>...].png``, and ``heads_needed.png``,
    all of them or none (:func:`~singleloc.ground._atomic_files.written_together`); figures of an earlier sweep into
    ``out`` that this one does not draw are removed. Returns ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows, grids = outcome.rows, outcome.grids
    mark = {OUTPUT_KEY: "sweep"}

    def own_figures(written):  # figures of an earlier sweep into OUT that this one does not draw
        return [p for p in [*out.glob("phase_*.png"), out / HEADS_FIGURE]
                if p.is_file() and p not in written and png_has_text(p, OUTPUT_KEY, "sweep")]

    with written_together(out, stale=own_figures):  # the CSV, the Dataset and the figures: all of them, or none
        write_csv(out / "sweep.csv", rows)
        write_sweep(out, outcome.base, grids, rows, outcome.entries)
        if figures:
            from ..plots import plot_heads_needed, plot_phase_diagram  # matplotlib is imported only when a figure is drawn

            other = [g.name for g in grids if g.name not in ("model.heads", "problem.F", "model.activation")]
            groups: dict[tuple, list] = {}
            for r in rows:
                groups.setdefault((r["activation"],) + tuple(r[k] for k in other), []).append(r)
            for gkey, grows in groups.items():
                tag = "".join(f"_{k.split('.')[-1]}={_slug(v)}" for k, v in zip(other, gkey[1:]))
                title = f"{gkey[0]}" + "".join(f", {k}={v}" for k, v in zip(other, gkey[1:]))
                fig = plot_phase_diagram(grows, title=title, simulate=outcome.simulate)
                save_figure(out / f"phase_{_slug(gkey[0])}{tag}.png", fig, mark)
            save_figure(out / HEADS_FIGURE, plot_heads_needed(rows, other), mark)
    return out


def _slug(v: Any) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", str(v)).strip("-") or "x"


def write_csv(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    """Write rows (dicts with the same keys) as CSV atomically."""
    if not rows:
        raise ValueError("no rows to write")
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0].keys()), lineterminator="\n")
    w.writeheader()
    w.writerows({k: f"{v:.6g}" if isinstance(v, float) else json.dumps(v) if isinstance(v, (list, dict)) else v
                 for k, v in r.items()} for r in rows)
    return save_text(path, buf.getvalue())
