"""The record of SGD in order parameters, however it was computed: the ODE (:class:`~singleloc.TheoryResult`), the
finite-``D`` simulation (:class:`~singleloc.SimulationResult`) and the SDE (:class:`~singleloc.SDEResult`) all
return one, with what each adds beside it (stated errors; the empirical risk and the final keys; nothing), and what
reads a trajectory (figures, phases, pruning) reads this record. The state an SGD rule declares beyond
``(M, Q, b)`` (trained head weights ``v`` (S, T, H)) is a field of the results that carry it.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Trajectory:
    """Order parameters at saved times (docs/model.md sections 3-5): ``tau`` (T,) the time in units of ``D`` steps,
    and for ``S`` starts (initial conditions or seeds) ``M`` (S, T, H, F) the overlaps of the keys with the spikes,
    ``Q`` (S, T, H, H) the keys' Gram matrix, ``b`` (S, T, H) the biases and ``risk`` (S, T) the risk of each state."""

    tau: np.ndarray
    M: np.ndarray
    Q: np.ndarray
    b: np.ndarray
    risk: np.ndarray

    @property
    def starts(self) -> int:
        """``S``, the starts (initial conditions or seeds)."""
        return int(np.shape(self.M)[0])

    def r_orth(self) -> np.ndarray:
        """``R_orth = Q - M M^T`` (S, T, H, H): the keys' Gram matrix orthogonal to the spikes,
        positive semi-definite along any exact trajectory (docs/model.md section 3)."""
        M = np.asarray(self.M, float)
        return np.asarray(self.Q, float) - M @ np.swapaxes(M, -1, -2)

    def state(self, start: int = 0, time: int = -1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(M, Q, b)`` of one start at one saved time (by default the first start's last state:
        what :func:`~singleloc.prune_theory` and :func:`~singleloc.integrate` from it take)."""
        return tuple(np.asarray(x[start, time]) for x in (self.M, self.Q, self.b))
