"""What a run will cost, said before it starts: the record of an estimate (:class:`Cost`) and the cost
model of ``diagnose`` (:func:`diagnose_cost`), so that the command line can say how long a run will
take and refuse one of days without ``--force`` (:func:`singleloc._commands._common.check_cost`).
The theory's and the simulation's times are measured on the device that runs them
(:mod:`singleloc.preflight._estimates`, :mod:`singleloc.simulation._simulation_estimate`); the memory a run may use is
checked in :mod:`singleloc.preflight._resources`.
"""

from __future__ import annotations

import dataclasses
import math

from ..runtime._progress import cpu_count, duration
from ._resources import _gb

#: Seconds of ``diagnose``'s cost model, measured on a 2-core CPU (scaled by 2 / the CPUs of this
#: machine): its finite differences and Jacobians cost ``DIAGNOSE_UNIT (L / 256) (1 + E K) / 13`` per
#: analysed row and temperature (``E`` perturbation sizes, ``K`` directions). Estimates within a
#: factor of about 2; they tell a run of minutes from one of days.
DIAGNOSE_UNIT = 0.33e-3
MEASURED_CPUS = 2


@dataclasses.dataclass(frozen=True)
class Cost:
    """What a run will cost: ``work`` in words (steps, sizes), the estimated ``seconds`` and
    peak ``memory`` in bytes, the ``keys`` that drive it (for the message) and the ``basis`` of
    the time (what it was estimated from, when it says more than the model above)."""

    work: str
    seconds: float
    memory: float
    keys: str
    basis: str = ""

    def describe(self) -> str:
        basis = f" ({self.basis})" if self.basis else ""
        return f"{self.work}: about {duration(self.seconds)}{basis} and {_gb(self.memory)} of memory (estimated)"


def speed() -> float:
    """The 2-core CPU's time over this machine's: the CPUs the cost models were measured with over this
    process's (:func:`~singleloc.runtime._progress.cpu_count`)."""
    return MEASURED_CPUS / max(1, min(cpu_count(), 64))


def diagnose_cost(shape: tuple, max_rows: int, temperatures: int, epsilons: int, directions: int) -> Cost:
    """The cost of ``diagnose`` of weights of ``shape`` (model above; a shape that
    :func:`~singleloc.diagnose_attention` refuses costs nothing, and is refused there)."""
    L = shape[-1] if shape else 0
    heads = int(math.prod(shape[:-2])) if len(shape) >= 2 else 1
    queries = shape[-2] if len(shape) >= 2 else 1
    rows = heads * (min(max_rows, queries) if max_rows else queries)
    seconds = rows * temperatures * DIAGNOSE_UNIT * (L / 256) * (1 + epsilons * directions) / 13 * speed()
    work = (f"{rows} rows of L = {L} tokens x {temperatures} temperatures x {epsilons} perturbation sizes x {directions} "
            "directions")
    return Cost(work, seconds, 8.0 * rows * L * (4 + temperatures), "--temperature, --epsilon, --directions or --max-rows")
