"""The record of a finite-D simulation (:func:`~singleloc.simulate`) and its run folder."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..theory._trajectory import Trajectory


@dataclasses.dataclass(frozen=True)
class SimulationResult(Trajectory):
    """Saved trajectory of a simulation over ``S`` seeds and ``T`` saved times (a :class:`~singleloc.Trajectory`).

    ``tau`` (T,), ``M`` (S, T, H, F), ``Q`` (S, T, H, H), ``b`` (S, T, H), ``risk`` (S, T) the empirical test risk,
    ``risk_limit`` (S, T) the limit risk on the same test sequences; ``K`` (S, H, D) and ``kstar`` (S, F, D) are
    the final keys and the spikes (kept in memory, not written to ``simulation.npz``: ``None`` in a run read back
    by :func:`~singleloc.load_run`); ``v`` (S, T, H): the trained head weights (else ``None``).
    """

    risk_limit: np.ndarray
    K: np.ndarray | None
    kstar: np.ndarray | None
    v: np.ndarray | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays stored in ``simulation.npz`` (``v`` with trained head weights)."""
        return {k: getattr(self, k) for k in ("tau", "M", "Q", "b", "risk", "risk_limit", "v") if getattr(self, k) is not None}
