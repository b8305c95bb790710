"""Plateaus and escapes of a risk curve (docs/model.md section 5; docs/phases.md).

Plain NumPy arrays ``tau`` (T,) and ``risk`` (T,), from a theory trajectory or a simulation. The
rules (the numbers are the keyword defaults):

* **Plateaus.** With ``u = log tau`` (saved points with ``tau > 0``), the normalised rate
  ``sigma(u) = |dR/du| / (max R - min R)`` (``np.gradient`` on the saved grid). A plateau is
  a local minimum of ``sigma`` below ``plateau_tol = 0.1`` that is *prominent*: on each side
  ``sigma`` rises to at least ``prominence = 2`` times the minimum before the next local
  minimum (or the end of the curve). The two ends of the curve are plateaus when ``sigma`` is
  below ``plateau_tol`` there (the start ``tau -> 0`` always is, in ``log tau``). A plateau's
  value is the risk at its minimum of ``sigma``.
* **Escape.** The escape time from a plateau is the first ``tau`` after its centre at which
  the risk has fallen halfway from the plateau value to the next plateau's value (the final
  risk after the last plateau), linearly interpolated between saved points.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from jaxtyping import ArrayLike, Real

from ..ground._arguments import require_finite
from ..ground._validation import number
from ..runtime._numerics import first_crossing


@dataclasses.dataclass(frozen=True)
class Plateau:
    """A plateau of a risk curve: its centre (the saved time of least slope), its extent
    (first and last saved times with ``sigma < plateau_tol`` around the centre) and value."""

    tau: float
    start: float
    end: float
    risk: float


def _log_slope(tau: np.ndarray, risk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the saved points with ``tau > 0`` and the normalised rate ``sigma`` there."""
    idx = np.flatnonzero(tau > 0)
    r = risk[idx]
    span = float(np.ptp(risk))
    return idx, (np.zeros(len(idx)) if len(idx) < 3 or span <= 0 else np.abs(np.gradient(r, np.log(tau[idx]))) / span)


def plateaus(tau: Real[ArrayLike, " T"] | Sequence[float], risk: Real[ArrayLike, " T"] | Sequence[float], *,
             plateau_tol: float = 0.1, prominence: float = 2.0) -> list[Plateau]:
    """Plateaus of one risk curve, in time order (see the module docstring for the rule)."""
    tau, risk = np.asarray(tau, float), np.asarray(risk, float)
    if tau.ndim != 1 or risk.shape != tau.shape:
        raise ValueError(f"plateaus expects tau (T,) and risk (T,), got {tau.shape} and {risk.shape}")
    require_finite("plateaus", tau=tau, risk=risk)
    plateau_tol, prominence = (number(f"plateaus: {name}", value, positive=True)
                               for name, value in (("plateau_tol", plateau_tol), ("prominence", prominence)))
    idx, sigma = _log_slope(tau, risk)
    n = len(sigma)
    if n == 0:
        return []
    if n < 3 or np.all(sigma == 0):
        return [Plateau(float(tau[idx[0]]), float(tau[idx[0]]), float(tau[idx[-1]]), float(risk[idx[-1]]))]
    # candidate centres: interior local minima and the two ends
    cands = [0] + [i for i in range(1, n - 1) if sigma[i] <= sigma[i - 1] and sigma[i] < sigma[i + 1]] + [n - 1]
    out: list[Plateau] = []
    for j, i in enumerate(cands):
        left = sigma[cands[j - 1] : i + 1].max() if j > 0 else np.inf
        right = sigma[i : cands[j + 1] + 1].max() if j + 1 < len(cands) else np.inf
        need = prominence * max(sigma[i], 1e-3 * plateau_tol)
        if sigma[i] >= plateau_tol or not (left >= need and right >= need):
            continue
        a = b = i
        while a > 0 and sigma[a - 1] < plateau_tol:
            a -= 1
        while b < n - 1 and sigma[b + 1] < plateau_tol:
            b += 1
        if not out or tau[idx[a]] > out[-1].end:  # extents that overlap (a flat stretch with a wiggle): the first kept
            out.append(Plateau(float(tau[idx[i]]), float(tau[idx[a]]), float(tau[idx[b]]), float(risk[idx[i]])))
    return out


def halfway_time(tau: Real[ArrayLike, " T"] | Sequence[float], risk: Real[ArrayLike, " T"] | Sequence[float], after: float,
                 r_from: float, r_to: float) -> float:
    """First ``tau >= after`` at which ``risk`` has moved halfway from ``r_from`` to ``r_to``
    (linear interpolation between saved points); NaN if it never does."""
    tau, risk = np.asarray(tau, float), np.asarray(risk, float)
    require_finite("halfway_time", tau=tau, risk=risk, after=after, r_from=r_from, r_to=r_to)
    sign = 1.0 if r_to <= r_from else -1.0
    y, level = -sign * risk, -sign * 0.5 * (r_from + r_to)  # y rises through level where the risk is halfway
    reached = y >= level
    start = int(np.searchsorted(tau, after, side="left"))
    lo = max(start - 1, 0)  # a crossing may begin at the last saved point before `after`
    below = lo + np.flatnonzero(~reached[lo:])  # the saved points from there on not yet halfway
    if below.size and reached[below[0]:].any():  # the risk gets halfway after the first of them
        return first_crossing(tau[below[0]:], y[below[0]:], level)
    halfway_at_start = start == 0 and tau.size > 0 and reached[0]
    return float(tau[0]) if halfway_at_start else float("nan")


def escape_times(tau: Real[ArrayLike, " T"] | Sequence[float], risk: Real[ArrayLike, " T"] | Sequence[float],
                 plateau_list: Sequence[Plateau] | None = None, **kwargs) -> np.ndarray:
    """Escape time from every plateau but the last (module docstring): an array of length
    ``len(plateaus) - 1`` if the curve ends on a plateau, else ``len(plateaus)``."""
    tau, risk = np.asarray(tau, float), np.asarray(risk, float)
    ps = plateaus(tau, risk, **kwargs) if plateau_list is None else list(plateau_list)
    out = []
    for k, p in enumerate(ps):
        nxt = ps[k + 1].risk if k + 1 < len(ps) else float(risk[-1])
        if k + 1 == len(ps) and p.end >= tau[-1]:
            break  # the final plateau: nothing to escape to
        out.append(halfway_time(tau, risk, p.tau, p.risk, nxt))
    return np.asarray(out, float)
