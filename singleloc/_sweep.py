"""Parameter sweeps with an on-disk cache: ``singleloc sweep CONFIG --grid section.key=v1,v2``.

A sweep takes a base configuration and one or more grids ``section.key = v1, v2, ...``; the
points are their Cartesian product. At each point it integrates the ODE from the simulator's
initial overlaps of every seed (``simulation.seeds`` starts, one batched, vmapped solve) and,
optionally, runs the finite-D simulation; then it analyses the phases
(:func:`singleloc._phase_analysis.analyze`) of the limit risk: the theory's ``risk`` and the
simulation's ``risk_limit`` (the limit loss of the trained weights on the test sequences).

Cache. Every computed point is stored as ``CACHE/<kind>-<key>.npz`` (kind ``theory`` or
``simulation``), where ``key`` is the SHA-256 (first 24 hex digits) of the canonical JSON of
the resolved configuration, the package version, :data:`CACHE_VERSION` and the kind. A
repeated sweep therefore recomputes nothing, and changing one value of the base configuration
recomputes only the points whose resolved configuration changed. A theory entry holds ``tau``,
``M``, ``Q``, ``b`` and ``risk`` as :class:`~singleloc.TheoryResult`; a simulation entry the
same names as :class:`~singleloc.SimulationResult` (``risk`` the empirical finite-D risk,
``risk_limit`` the limit loss). Files are written atomically (:mod:`singleloc._io`); a failed
point (the ODE left the valid set) is not cached, and an unreadable entry is recomputed.

Output: ``DIR/sweep.csv`` with one row per point (the grid values, then ``activation``,
``heads``, ``F``, ``status``, ``final_risk``, ``n_specialized``, ``n_directions``,
``redundant_pairs``, ``shared_profiles``, ``escape_time``, ``first_specialization`` (means over
the seeds of :meth:`PhaseAnalysis.summary`), the same for the simulation with a ``sim_``
prefix, and the cache ``key``), and one phase diagram over ``(H, F)`` per activation (and per value of
the other grid keys): ``DIR/phase_<activation>[_<key>=<value>...].png``.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import itertools
import json
import math
import re
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ._config import SECTIONS, Config, parse_override
from ._io import load_npz, save_figure, save_npz, save_text
from ._ode import initial_conditions, integrate
from ._phase_analysis import analyze
from ._simulation import simulate as simulate_sgd
from ._version import __version__
from .plots import plot_phase_diagram

#: Layout of the cache entries; part of every cache key, so that entries of an earlier layout
#: are never read. 2: a simulation entry's ``risk`` is the empirical risk (1: the limit risk).
CACHE_VERSION = 2

#: The risk the phase analysis reads in an entry of each kind: the limit risk in both.
PHASE_RISK = {"theory": "risk", "simulation": "risk_limit"}


@dataclasses.dataclass(frozen=True)
class Grid:
    """One swept key: ``section.key`` and its values."""

    section: str
    key: str
    values: tuple

    @property
    def name(self) -> str:
        return f"{self.section}.{self.key}"


def _split_top_level(text: str) -> list[str]:
    """Split at commas that are not inside brackets or quotes."""
    parts, depth, quote, cur = [], 0, None, []
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return parts


def parse_grid(text: str) -> Grid:
    """``"model.heads=1,2,4"`` -> :class:`Grid`. Each value is read as TOML (a bare word as a
    string); commas inside brackets belong to the value (``problem.mean=[1,0],[0,1]``)."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ValueError(f"--grid expects section.key=v1,v2,..., got {text!r}")
    lhs, rhs = text.split("=", 1)
    raw = [v.strip() for v in _split_top_level(rhs)]
    if not rhs.strip() or any(not v for v in raw):
        raise ValueError(f"--grid {text!r}: empty value in the list")
    values = tuple(parse_override(f"{lhs.strip()}={v}")[2] for v in raw)
    section, key, _ = parse_override(f"{lhs.strip()}={raw[0]}")
    fields = {f.name for f in dataclasses.fields(SECTIONS[section])}
    if key not in fields:
        raise ValueError(f"--grid {text!r}: unknown key {section}.{key} (known: {', '.join(sorted(fields))})")
    if len(set(map(repr, values))) != len(values):
        raise ValueError(f"--grid {text!r}: repeated value")
    return Grid(section, key, values)


def grid_points(base: Config, grids: Sequence[Grid]) -> list[tuple[dict[str, Any], Config]]:
    """The Cartesian product of the grids applied to ``base``: ``[(values, config), ...]``.
    Every point is validated before anything runs; an invalid one raises ``ValueError``."""
    names = [g.name for g in grids]
    if len(set(names)) != len(names):
        raise ValueError(f"--grid: a key is swept twice ({', '.join(names)})")
    points = []
    for combo in itertools.product(*(g.values for g in grids)):
        changes: dict[str, dict] = {}
        for g, v in zip(grids, combo):
            changes.setdefault(g.section, {})[g.key] = v
        try:
            cfg = base.replace(**changes)
        except ValueError as err:
            where = ", ".join(f"{n}={v}" for n, v in zip(names, combo))
            raise ValueError(f"grid point {where}: {err}") from None
        points.append((dict(zip(names, combo)), cfg))
    return points


def cache_key(config: Config, kind: str) -> str:
    """SHA-256 of the canonical JSON of the resolved config, the package version, the cache
    layout version and the kind."""
    data = {"singleloc_version": __version__, "cache_version": CACHE_VERSION, "kind": kind, "config": config.to_dict()}
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


# The two expensive steps; module-level so that tests can count or replace them.
def compute_theory(config: Config) -> dict[str, np.ndarray]:
    """ODE trajectories from the initial overlaps of every seed (one batched solve)."""
    r = integrate(config, initial_conditions(config), progress=False)
    return {"tau": r.tau, "M": r.M, "Q": r.Q, "b": r.b, "risk": r.risk}


def compute_simulation(config: Config) -> dict[str, np.ndarray]:
    """Finite-D SGD for every seed: ``risk`` (empirical) and ``risk_limit`` as in :class:`~singleloc.SimulationResult`."""
    r = simulate_sgd(config, progress=False)
    return {"tau": r.tau, "M": r.M, "Q": r.Q, "b": r.b, "risk": r.risk, "risk_limit": r.risk_limit}


def compute(config: Config, kind: str) -> dict[str, np.ndarray]:
    """The entry of ``kind`` (``"theory"`` or ``"simulation"``) for ``config``, computed."""
    if kind not in ("theory", "simulation"):
        raise ValueError(f"kind must be 'theory' or 'simulation', got {kind!r}")
    return compute_theory(config) if kind == "theory" else compute_simulation(config)


@dataclasses.dataclass
class SweepStats:
    """Counts of one sweep: points computed, loaded from the cache, failed; wall time."""

    computed: int = 0
    cached: int = 0
    failed: int = 0
    seconds: float = 0.0


def cached_run(config: Config, kind: str, cache_dir: Path, stats: SweepStats | None = None) -> dict[str, np.ndarray]:
    """Load ``kind`` for ``config`` from the cache, or compute and store it."""
    path = Path(cache_dir) / f"{kind}-{cache_key(config, kind)}.npz"
    if path.is_file():
        try:
            data = load_npz(path)
            if stats:
                stats.cached += 1
            return data
        except (OSError, ValueError, EOFError, zipfile.BadZipFile):  # a damaged file: recompute
            pass
    data = compute(config, kind)
    save_npz(path, data)
    if stats:
        stats.computed += 1
    return data


def _summary(config: Config, data: dict[str, np.ndarray], kind: str) -> dict[str, float]:
    a = analyze(data["tau"], data["M"], data["Q"], data[PHASE_RISK[kind]], mean=config.problem.build_prior().mean())
    return a.summary()


SUMMARY_KEYS = ("final_risk", "n_specialized", "n_directions", "redundant_pairs", "shared_profiles", "escape_time",
                "first_specialization")


def sweep(base: Config, grids: Sequence[Grid], out: str | Path, *, simulate: bool = False, cache_dir: str | Path | None = None,
          progress: bool = True, figures: bool = True) -> tuple[list[dict[str, Any]], SweepStats]:
    """Run (or load) every grid point, write ``OUT/sweep.csv`` and the phase diagrams.

    Returns the CSV rows (dicts) and the :class:`SweepStats`.
    """
    t0 = time.perf_counter()
    out = Path(out)
    cache = out / "cache" if cache_dir is None else Path(cache_dir)
    points = grid_points(base, grids)
    stats = SweepStats()
    rows = []
    for values, cfg in tqdm(points, desc="sweep", unit="point", disable=not progress, leave=False):
        row: dict[str, Any] = dict(values)
        row.update(activation=cfg.model.activation, heads=cfg.model.heads, F=cfg.problem.F, status="ok")
        kinds = ["theory"] + (["simulation"] if simulate else [])
        for kind in kinds:
            prefix = "" if kind == "theory" else "sim_"
            try:
                summ = _summary(cfg, cached_run(cfg, kind, cache, stats), kind)
            except FloatingPointError as err:
                stats.failed += 1
                row["status"] = f"{kind} failed: {str(err).split(';')[0]}"
                summ = {k: math.nan for k in SUMMARY_KEYS}
            row.update({prefix + k: summ[k] for k in SUMMARY_KEYS})
        row["key"] = cache_key(cfg, "theory")
        rows.append(row)
    write_csv(out / "sweep.csv", rows)
    if figures:
        other = [g.name for g in grids if g.name not in ("model.heads", "problem.F", "model.activation")]
        groups: dict[tuple, list] = {}
        for r in rows:
            groups.setdefault((r["activation"],) + tuple(r[k] for k in other), []).append(r)
        for gkey, grows in groups.items():
            tag = "".join(f"_{k.split('.')[-1]}={_slug(v)}" for k, v in zip(other, gkey[1:]))
            title = f"{gkey[0]}" + "".join(f", {k}={v}" for k, v in zip(other, gkey[1:]))
            fig = plot_phase_diagram(grows, title=title, simulate=simulate)
            save_figure(out / f"phase_{_slug(gkey[0])}{tag}.png", fig)
    stats.seconds = time.perf_counter() - t0
    return rows, stats


def _slug(v: Any) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", str(v)).strip("-") or "x"


def write_csv(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    """Write rows (dicts with the same keys) as CSV atomically."""
    if not rows:
        raise ValueError("no rows to write")
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0].keys()), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: f"{v:.6g}" if isinstance(v, float) else json.dumps(v) if isinstance(v, (list, dict)) else v
                    for k, v in r.items()})
    return save_text(path, buf.getvalue())
