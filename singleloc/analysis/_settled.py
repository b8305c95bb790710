"""Whether a run has settled at its last saved time: the criterion every run and sweep point states.

Criterion. A trajectory has *settled* at its last saved time ``T`` when, over the last :data:`WINDOW` (a fifth) of
its horizon, the saved times ``tau >= (1 - WINDOW) T`` (at least the last two),

1. its risk stays within :data:`RTOL` (1e-3) of its final value, relative: ``max |r(tau) - r(T)|
   <= RTOL r(T)`` over the window (a dip that climbs back counts, not only the two ends); and
2. every head keeps its class (:func:`~singleloc.analysis._head_classes.classify_heads`) at every
   saved time of the window.

A run of several trajectories (seeds, starts) has settled when each of them has. An unsettled run's
final risk and head classes are whatever its horizon caught: integrate it further (a longer
``sgd.tau_max`` or ``--horizon TAU``). A settled one may still move later (a plateau long enough
passes the test): the criterion says that nothing changed over the last fifth of the run, no more.
"""

from __future__ import annotations

import dataclasses

import numpy as np

#: The fraction of the horizon at its end over which a run must not change.
WINDOW = 0.2

#: The largest relative change of the risk over the window of a settled run.
RTOL = 1e-3


@dataclasses.dataclass(frozen=True)
class Settledness:
    """The criterion of the module docstring for ``S`` trajectories: ``settled`` (S,) whether each has settled,
    ``risk_change`` (S,) the largest relative change of its risk over the window, ``class_change`` (S,) the last
    saved time of the window at which some head changed class (NaN: none), ``changed_heads`` (S,) how many heads
    changed class in it; ``window_start`` the first time of the window and ``times`` the saved times it holds."""

    settled: np.ndarray
    risk_change: np.ndarray
    class_change: np.ndarray
    changed_heads: np.ndarray
    window_start: float
    times: int

    def arrays(self, index: int | None = None) -> dict[str, np.ndarray]:
        """The criterion's verdict as a run folder stores it (in ``theory.npz``, of trajectory ``index``;
        in ``theory_seeds.npz``, of every one): ``settled``, ``risk_change``, ``class_change``."""
        sel = slice(None) if index is None else index
        return {"settled": self.settled[sel], "risk_change": self.risk_change[sel], "class_change": self.class_change[sel]}

    def text(self, name: str = "run") -> str:
        """One line: settled or not, and why (what ``integrate``, ``compare`` and ``plot`` print)."""
        n = len(self.settled)
        window = (f"over the last {WINDOW:.0%} of the horizon (tau >= {self.window_start:.3g}, {self.times} saved times): "
                  f"risk changed by at most {np.max(self.risk_change):.1e} relative (tolerance {RTOL:g})")
        changed = np.isfinite(self.class_change)
        classes = ("; head classes held" if not changed.any() else
                   f"; head classes changed in {int(changed.sum())} of {n} trajectories (last at tau = "
                   f"{np.nanmax(self.class_change):.3g})" if n > 1 else
                   f"; {int(self.changed_heads[0])} head(s) changed class (last at tau = {self.class_change[0]:.3g})")
        if self.settled.all():
            verdict = f"{name} settled"
        else:
            some = f" ({int(np.sum(~self.settled))} of {n} trajectories)" if n > 1 else ""
            verdict = f"{name} NOT settled{some}: its final risk and head classes are what the horizon caught"
        return f"{verdict}: {window}{classes}"


def window_start(tau: np.ndarray, window: float = WINDOW) -> int:
    """The index of the first saved time of the window: ``tau >= (1 - window) tau[-1]``, at most the
    last but one (the window holds at least two saved times)."""
    return min(int(np.searchsorted(tau, (1.0 - window) * tau[-1])), len(tau) - 2) if len(tau) > 1 else 0


def settledness(tau, risk, codes, *, window: float = WINDOW, rtol: float = RTOL) -> Settledness:
    """The criterion of the module docstring for ``tau`` (T,), ``risk`` (S, T) and the head classes' ``codes`` (S,
    T, H) (indices into :data:`~singleloc.analysis._head_classes.HEAD_CLASSES`, as :attr:`HeadClasses.code`)."""
    tau, risk, codes = np.asarray(tau, float), np.atleast_2d(np.asarray(risk, float)), np.asarray(codes)
    if codes.ndim == 2:
        codes = codes[None]
    start = window_start(tau, window)
    last = risk[:, -1:]
    change = np.max(np.abs(risk[:, start:] - last), axis=1) / np.maximum(np.abs(last[:, 0]), 1e-12)
    steps = codes[:, start + 1:] != codes[:, start:-1]  # (S, W - 1, H): a head's class changed between two saved times
    moved = steps.any(axis=-1)
    when = np.array([tau[start + 1:][m][-1] if m.any() else np.nan for m in moved])
    heads = steps.any(axis=1).sum(axis=-1)
    settled = (change <= rtol) & ~moved.any(axis=1)
    return Settledness(settled, change, when, heads, float(tau[start]), len(tau) - start)


def run_settledness(setup, tau, M, Q, b, risk) -> Settledness:
    """:func:`settledness` of the trajectories ``M`` (S, T, H, F), ``Q``, ``b`` and ``risk`` (S, T) of a run of
    ``setup`` (:func:`~singleloc.preflight._build.build`) at ``tau`` (T,), with the head classes of the window's saved
    times (with the heads' attention weights, :func:`~singleloc.analysis._attention_mass.classifying_weights`, so that a
    head switching off counts)."""
    from ..runtime._progress import Phase
    from ._attention_mass import classifying_weights
    from ._head_classes import classify_heads

    tau = np.asarray(tau, float)
    start = window_start(tau)
    M, Q, b, risk = (np.asarray(x, float)[:, start:] for x in (M, Q, b, risk))
    with Phase((f"classifying the heads at the last {len(tau) - start} saved times (whether the run settled)",
                "classified the heads"), quiet=True):
        weights = classifying_weights(setup, M, Q, b)
    return settledness(tau[start:], risk, classify_heads(M, Q, mean=setup.prior.mean(), weights=weights).code)
