"""The record of a pruning: the risk of a layer against the number of heads removed.

:func:`~singleloc.prune` and its evaluators (:mod:`~singleloc.pruning._pruning`) return it; a run folder's
``prune.npz`` reads back into it (:func:`~singleloc.load_run`), and the figures take it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from jaxtyping import ArrayLike, Real

from ..ground._arguments import require_finite
from ..ground._validation import number


@dataclasses.dataclass(frozen=True)
class PruningResult:
    """Risk of a layer against the number of heads removed.

    Attributes:
        order: ``"greedy"``, ``"alignment"``, ``"random"`` or ``"given"`` (explicit order).
        removed: ``(draws, H - 1)`` int, the heads removed, in order (indices of the original
            layer); one row unless the order is random.
        risks: ``(draws, H)``, the risk after removing ``k = 0 .. H-1`` heads.
        stderr: ``(draws, H)`` error of each risk: Monte Carlo standard error (weights evaluator), quadrature
            (theory evaluator: on the exact route the difference to the finer exact rule, on the Sobol rule with
            ``theory.replicates > 1`` the replicates' standard error), or ``None`` (one Sobol rule: no estimate).
    """

    order: str
    removed: np.ndarray
    risks: np.ndarray
    stderr: np.ndarray | None = None

    @property
    def heads(self) -> int:
        """``H``, the number of heads of the unpruned layer."""
        return self.risks.shape[1]

    @property
    def n_removed(self) -> np.ndarray:
        """``0 .. H-1``."""
        return np.arange(self.heads)

    @property
    def risk(self) -> np.ndarray:
        """``(H,)`` risk against heads removed (the mean over draws for ``random``)."""
        return self.risks.mean(axis=0)

    @property
    def risk_std(self) -> np.ndarray:
        """``(H,)`` standard deviation over draws (zeros for a single order)."""
        return np.zeros(self.heads) if self.risks.shape[0] < 2 else self.risks.std(axis=0, ddof=1)

    def removable(self, tol: float = 0.01) -> int:
        """How many heads (along this order, on the mean curve) can be removed before the
        risk rises by more than ``tol`` above the unpruned risk."""
        return removable_heads(self.risk, tol)


def removable_heads(risk: Real[ArrayLike, " K"] | Sequence[float], tol: float = 0.01) -> int:
    """The largest ``k`` with ``risk[j] <= risk[0] + tol`` for every ``j <= k``."""
    risk = np.asarray(risk, dtype=float)
    require_finite("removable_heads", risk=risk)  # (else a count from NaN, or -1 from a negative tol)
    tol = number("removable_heads: tol", tol, nonneg=True, example=0.01)
    over = np.nonzero(risk > risk[0] + tol)[0]
    return int(over[0] - 1) if len(over) else len(risk) - 1
