"""The answers a sweep gives beside its columns: how far each point ends from the Bayes risk of
its problem, and how many heads each activation needs to come within a gap of it.

* ``bayes_risk``, ``bayes_risk_error``: the Bayes risk of the point's problem (the best any
  estimator of the relevant token can do, docs/model.md section 6; exact for a discrete prior of
  up to four atoms, on a Sobol rule with its standard error otherwise), one cache entry per problem
  (:func:`singleloc.sweeps._sweep_compute.bayes_config`), so a sweep over heads or activations computes it
  once per spike count.
* ``gap_to_bayes`` = ``final_risk - bayes_risk`` (the theory's final risk, mean over its seeds);
  ``sim_gap_to_bayes`` the same for the simulation's limit risk.
* ``heads_needed``: for the points of one activation and one spike count (and one value of every
  other grid key), the smallest ``model.heads`` whose ``gap_to_bayes`` is at most ``gap_tol``;
  NaN when no point of the group comes that close. ``gap_tol`` (``singleloc sweep --gap``,
  default 0.01) is a column of its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: ``--gap``: the default largest gap to the Bayes risk at which a layer counts as having reached it.
GAP_TOL = 0.01

#: The grid keys a heads-needed group does not fix: the heads it counts, and what every row names
#: by itself (``activation``, ``F``).
SPANNED = ("model.heads", "model.activation", "problem.F")


def bayes_columns(row: Mapping[str, Any], entry: Mapping[str, np.ndarray] | None, simulate: bool) -> dict[str, float]:
    """``bayes_risk``, ``bayes_risk_error``, ``gap_to_bayes`` (and ``sim_gap_to_bayes`` with
    ``simulate``) of a row with the phase summary's ``final_risk`` (and ``sim_final_risk``); NaN
    where the Bayes entry is missing (its computation failed)."""
    bayes = float(entry["bayes_risk"]) if entry is not None else math.nan
    out = {"bayes_risk": bayes, "bayes_risk_error": float(entry["bayes_risk_error"]) if entry is not None else math.nan,
           "gap_to_bayes": row["final_risk"] - bayes}
    if simulate:
        out["sim_gap_to_bayes"] = row["sim_final_risk"] - bayes
    return out


def group_key(row: Mapping[str, Any], grid_keys: Sequence[str]) -> tuple:
    """The heads-needed group of a row: its activation, spike count and other grid values."""
    return (row["activation"], int(row["F"]), *(row[k] for k in grid_keys if k not in SPANNED))


def heads_needed(rows: Sequence[Mapping[str, Any]], grid_keys: Sequence[str], gap_tol: float) -> dict[tuple, float]:
    """``{group: H}``: the smallest ``heads`` of the rows of each :func:`group_key` whose
    ``gap_to_bayes`` is at most ``gap_tol`` (NaN if none)."""
    groups: dict[tuple, float] = {}
    for row in rows:
        key = group_key(row, grid_keys)
        gap = row["gap_to_bayes"]
        reached = np.isfinite(gap) and gap <= gap_tol
        best = groups.setdefault(key, math.nan)
        if reached and not (best <= row["heads"]):
            groups[key] = float(row["heads"])
    return groups


def add_heads_needed(rows: Sequence[dict[str, Any]], grid_keys: Sequence[str], gap_tol: float) -> None:
    """Add ``heads_needed`` and ``gap_tol`` to every row (module docstring)."""
    needed = heads_needed(rows, grid_keys, gap_tol)
    for row in rows:
        row["heads_needed"] = needed[group_key(row, grid_keys)]
        row["gap_tol"] = float(gap_tol)


def heads_needed_table(rows: Sequence[Mapping[str, Any]], grid_keys: Sequence[str]) -> str:
    """The heads-needed summary as text, one line per group (what ``singleloc sweep`` prints)."""
    if not rows:
        return ""
    gap_tol = rows[0]["gap_tol"]
    lines = [f"heads needed to come within gap_tol = {gap_tol:g} of the Bayes risk (gap_to_bayes = final_risk - bayes_risk):"]
    others = [k for k in grid_keys if k not in SPANNED]
    seen = set()
    for row in rows:
        key = group_key(row, grid_keys)
        if key in seen:
            continue
        seen.add(key)
        group = [r for r in rows if group_key(r, grid_keys) == key]
        gaps = ", ".join(f"H={r['heads']}: {r['gap_to_bayes']:.3g}" for r in sorted(group, key=lambda r: r["heads"]))
        n = row["heads_needed"]
        largest = max(r["heads"] for r in group)
        answer = f"{int(n)}" if np.isfinite(n) else f"more than {largest}"
        where = "".join(f", {k}={row[k]}" for k in others)
        lines.append(f"  {row['activation']}, F={row['F']}{where}: {answer} (gap_to_bayes {gaps})")
    return "\n".join(lines)
