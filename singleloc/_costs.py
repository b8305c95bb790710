"""What a run will cost, estimated before it starts: seconds and peak memory of a simulation
(:func:`simulation_cost`) and of ``diagnose`` (:func:`diagnose_cost`), so that the command line can
say how long a run will take and refuse one of days without ``--force``
(:func:`singleloc._commands._common.check_cost`). The memory a run may use is checked in
:mod:`singleloc._resources`.
"""

from __future__ import annotations

import dataclasses
import math

from . import _resources
from ._config import Config
from ._resources import OVERHEAD, _gb, simulation_bytes

#: Seconds of the cost model, measured on a 2-core CPU (scaled by 2 / the CPUs of this machine):
#: a simulation's SGD step costs ``L D (SIM_TOKEN + SIM_HEAD H)`` per seed; the finite
#: differences and Jacobians of ``diagnose`` ``DIAGNOSE_UNIT (L / 256) (1 + E K) / 13`` per
#: analysed row and temperature (``E`` perturbation sizes, ``K`` directions). Estimates within a
#: factor of about 2; they tell a run of minutes from one of days.
SIM_TOKEN, SIM_HEAD, DIAGNOSE_UNIT = 40e-9, 4.8e-9, 0.33e-3
MEASURED_CPUS = 2


@dataclasses.dataclass(frozen=True)
class Cost:
    """What a run will cost: ``work`` in words (steps, sizes), the estimated ``seconds`` and
    peak ``memory`` in bytes, and the ``keys`` that drive it (for the message)."""

    work: str
    seconds: float
    memory: float
    keys: str

    def describe(self) -> str:
        return f"{self.work}: about {duration(self.seconds)} and {_gb(self.memory)} of memory (estimated)"


def duration(seconds: float) -> str:
    """``"40 s"``, ``"12 min"``, ``"6.4 h"``, ``"3.1 days"``."""
    if seconds < 90:
        return f"{seconds:.2g} s"
    if seconds < 5400:
        return f"{seconds / 60:.2g} min"
    return f"{seconds / 3600:.2g} h" if seconds < 72 * 3600 else f"{seconds / 86400:.2g} days"


def _speed() -> float:
    return MEASURED_CPUS / max(1, min(_resources.cpu_count(), 64))


def simulation_cost(config: Config) -> Cost:
    """The cost of :func:`~singleloc.simulate` (model above)."""
    pb, H, sim = config.problem, config.model.heads, config.simulation
    steps = round(config.sgd.tau_max * sim.D)
    seconds = steps * sim.seeds * pb.L * sim.D * (SIM_TOKEN + SIM_HEAD * H) * _speed()
    work = (f"{steps:.3g} SGD steps (sgd.tau_max x simulation.D) x {sim.seeds} seeds of model.heads = {H} keys in simulation.D "
            f"= {sim.D} dimensions")
    return Cost(work, seconds, OVERHEAD + simulation_bytes(config), "sgd.tau_max, simulation.D, simulation.seeds or model.heads")


def diagnose_cost(shape: tuple, max_rows: int, temperatures: int, epsilons: int, directions: int) -> Cost:
    """The cost of ``diagnose`` of weights of ``shape`` (model above; a shape that
    :func:`~singleloc.diagnose_attention` refuses costs nothing, and is refused there)."""
    L = shape[-1] if shape else 0
    heads = int(math.prod(shape[:-2])) if len(shape) >= 2 else 1
    queries = shape[-2] if len(shape) >= 2 else 1
    rows = heads * (min(max_rows, queries) if max_rows else queries)
    seconds = rows * temperatures * DIAGNOSE_UNIT * (L / 256) * (1 + epsilons * directions) / 13 * _speed()
    work = (f"{rows} rows of L = {L} tokens x {temperatures} temperatures x {epsilons} perturbation sizes x {directions} "
            "directions")
    return Cost(work, seconds, 8.0 * rows * L * (4 + temperatures), "--temperature, --epsilon, --directions or --max-rows")
