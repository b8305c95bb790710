"""The answers a sweep gives beside its columns: how far each point ends from the Bayes risk of
its problem, and how many heads each activation needs to come within a gap of it (the columns'
descriptions: :data:`singleloc.sweeps._sweep_dataset.COLUMNS`).

* ``bayes_risk`` comes from one cache entry per problem (:func:`singleloc.sweeps._sweep_compute.bayes_config`),
  whatever route the point's dynamics take; ``gap_to_bayes = final_risk - bayes_risk`` with the error
  ``sqrt(final_risk_error^2 + bayes_risk_error^2)`` (:func:`final_risk_error`).
* ``heads_needed``: for the points of one activation and one spike count (and one value of every
  other grid key), the smallest ``model.heads`` whose ``gap_to_bayes`` is at most ``gap_tol`` (NaN:
  none). ``heads_needed_low`` and ``heads_needed_high``: the same with every gap moved down, or up,
  by its error (an unstated error counts as 0); where they differ the count is within the error,
  and the table prints the range, "3-4 (within error)".
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


def final_risk_error(theory: Mapping[str, np.ndarray]) -> float:
    """The stated error of a theory entry's final risk: the larger of the route's ``risk_error`` (against a
    finer rule on the exact route, a standard error over scramblings or draws on the others) and the largest
    standard error over the replicates (``risk_se``) at the last saved time; NaN where neither is stated (an
    entry cached before entries carried them)."""
    errors = [float(theory["risk_error"])] if "risk_error" in theory else []
    if "risk_se" in theory:
        errors.extend(np.asarray(theory["risk_se"], float)[..., -1].ravel().tolist())
    errors = [e for e in errors if np.isfinite(e)]
    return max(errors) if errors else math.nan


def error_text(error: float) -> str:
    """A final risk's stated error as printed after it: ``" +- 1.2e-05"``, or ``" (error not stated)"``."""
    return f" +- {error:.1e}" if np.isfinite(error) else " (error not stated)"


def bayes_columns(row: Mapping[str, Any], entry: Mapping[str, np.ndarray] | None, theory: Mapping[str, np.ndarray],
                  simulate: bool) -> dict[str, float]:
    """``bayes_risk``, ``bayes_risk_error``, ``final_risk_error``, ``gap_to_bayes``, ``gap_to_bayes_error`` (and
    ``sim_gap_to_bayes`` with ``simulate``) of a row with the phase summary's ``final_risk`` (and
    ``sim_final_risk``) and its ``theory`` entry; NaN where the Bayes entry is missing (its computation failed)."""
    bayes, bayes_error = (math.nan,) * 2 if entry is None else (float(entry["bayes_risk"]), float(entry["bayes_risk_error"]))
    error = final_risk_error(theory)
    out = {"bayes_risk": bayes, "bayes_risk_error": bayes_error, "final_risk_error": error,
           "gap_to_bayes": row["final_risk"] - bayes, "gap_to_bayes_error": math.hypot(error, bayes_error)}
    if simulate:
        out["sim_gap_to_bayes"] = row["sim_final_risk"] - bayes
    return out


def group_key(row: Mapping[str, Any], grid_keys: Sequence[str]) -> tuple:
    """The heads-needed group of a row: its activation, spike count and other grid values."""
    return (row["activation"], int(row["F"]), *(row[k] for k in grid_keys if k not in SPANNED))


def heads_needed(rows: Sequence[Mapping[str, Any]], grid_keys: Sequence[str], gap_tol: float,
                 shift: float = 0.0) -> dict[tuple, float]:
    """``{group: H}``: the smallest ``heads`` of the rows of each :func:`group_key` whose ``gap_to_bayes + shift *
    gap_to_bayes_error`` is at most ``gap_tol`` (NaN if none; an unstated error counts as 0)."""
    groups: dict[tuple, float] = {}
    for row in rows:
        key = group_key(row, grid_keys)
        error = row.get("gap_to_bayes_error", math.nan)
        gap = row["gap_to_bayes"] + (shift * error if shift and np.isfinite(error) else 0.0)
        reached = np.isfinite(gap) and gap <= gap_tol
        best = groups.setdefault(key, math.nan)
        if reached and not (best <= row["heads"]):
            groups[key] = float(row["heads"])
    return groups


def add_heads_needed(rows: Sequence[dict[str, Any]], grid_keys: Sequence[str], gap_tol: float) -> None:
    """Add ``heads_needed``, ``heads_needed_low``, ``heads_needed_high`` and ``gap_tol`` to every
    row (module docstring)."""
    counts = {name: heads_needed(rows, grid_keys, gap_tol, shift)
              for name, shift in (("heads_needed", 0.0), ("heads_needed_low", -1.0), ("heads_needed_high", 1.0))}
    for row in rows:
        row.update({name: needed[group_key(row, grid_keys)] for name, needed in counts.items()})
        row["gap_tol"] = float(gap_tol)


def count_text(row: Mapping[str, Any], largest: int) -> str:
    """The heads-needed answer of a row as text: ``"3"``, ``"3-4 (within error)"`` where the
    count moves with the gaps' errors (module docstring), ``"more than 4"`` where no point comes
    within ``gap_tol``, ``"4 or more than 4 (within error)"`` where only the error decides that."""
    def text(n):
        return f"{int(n)}" if np.isfinite(n) else f"more than {largest}"

    def number(key):  # a row of sweep.csv read back holds text
        value = row.get(key, row["heads_needed"])
        return math.nan if value in (None, "") else float(value)

    n, low, high = (number(k) for k in ("heads_needed", "heads_needed_low", "heads_needed_high"))
    if text(low) == text(high):
        return text(n)
    return f"{text(low)}-{int(high)} (within error)" if np.isfinite(high) else f"{text(low)} or {text(high)} (within error)"


def gap_text(row: Mapping[str, Any]) -> str:
    """A row's gap with its error, ``"0.00992 +- 1e-05"``; ``"(error not stated)"`` where it has none; ``" unsettled"``
    after it where the point's theory has not settled at its horizon (:mod:`singleloc.analysis._settled`)."""
    error = row.get("gap_to_bayes_error", math.nan)
    flag = " unsettled" if row.get("settled", 1.0) < 1 else ""
    return f"{row['gap_to_bayes']:.3g} " + (f"+- {error:.1g}" if np.isfinite(error) else "(error not stated)") + flag


def heads_needed_table(rows: Sequence[Mapping[str, Any]], grid_keys: Sequence[str]) -> str:
    """The heads-needed summary as text, one line per group (what ``singleloc sweep`` prints)."""
    if not rows:
        return ""
    gap_tol = rows[0]["gap_tol"]
    lines = [f"heads needed to come within gap_tol = {gap_tol:g} of the Bayes risk (gap_to_bayes = final_risk - bayes_risk, "
             "+- its stated error):"]
    others = [k for k in grid_keys if k not in SPANNED]
    groups: dict[tuple, list] = {}
    for row in rows:
        groups.setdefault(group_key(row, grid_keys), []).append(row)
    for group in groups.values():
        row = group[0]
        gaps = ", ".join(f"H={r['heads']}: {gap_text(r)}" for r in sorted(group, key=lambda r: r["heads"]))
        answer = count_text(row, max(r["heads"] for r in group))
        where = "".join(f", {k}={row[k]}" for k in others)
        lines.append(f"  {row['activation']}, F={row['F']}{where}: {answer} (gap_to_bayes {gaps})")
    return "\n".join(lines)
