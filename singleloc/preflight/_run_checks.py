"""Warnings about a run that completes but did not go as its config says (a surprise, not an error): saved times closer
than one SGD step, which fall on the same step (:func:`warn_if_times_dropped`: the simulator saves at the steps
``round(tau D / sgd.batch)``), and a risk that rose during training, as online SGD at too large a learning rate makes it
(:func:`warn_if_risk_rose`: :func:`~singleloc.simulate` and :func:`~singleloc.integrate` call it on their results). Both
warn with ``UserWarning``; the command line prints each as one line ``singleloc COMMAND: warning: ...``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from ..ground._arguments import beyond_the_door
from ._build import Setup


def warn_if_times_dropped(n_save: int, D: int, kept: int, *, stacklevel: int = 2) -> None:
    """Warn when only ``kept`` distinct SGD steps carry the ``sgd.n_save`` saved times of a
    simulation in ``simulation.D`` dimensions (module docstring; ``kept`` is the length of
    :func:`~singleloc.simulation._simulation.save_steps`)."""
    if kept < n_save:
        warnings.warn(f"sgd.n_save = {n_save} saved times fall on {kept} distinct SGD steps (tau = t / D with "
                      f"simulation.D = {D}); the simulation saves {kept}", stacklevel=beyond_the_door(stacklevel + 1))


def warn_if_risk_rose(setup: Setup, *, simulation=None, theory=None, stacklevel: int = 2) -> None:
    """Warn when the mean final risk of a simulation or a theory run exceeds the mean initial risk by more than three
    times its error.

    The error is the standard error over the seeds (the starts) of the rise, or a floor if larger. The simulation's
    floor is the test-set noise: the limit loss of one sequence lies in [0, 2] (weights non-negative, summing to at most
    one), so its standard deviation is at most 1 and a rise compares two independent test sets of
    ``simulation.test_samples`` sequences per seed: ``sqrt(2 / (test_samples * seeds))``. The theory's floor is the
    solver's tolerance on the initial risk, ``theory.rtol * R0 + theory.atol``. The warning names ``sgd.lr``.

    Args:
        setup: the run's :class:`~singleloc.Setup` (its ``sgd``, ``simulation`` and ``theory``).
        simulation: a :class:`~singleloc.SimulationResult` (its limit risk ``risk_limit`` is read).
        theory: a :class:`~singleloc.TheoryResult` (its ``risk`` is read).
        stacklevel: as for :func:`warnings.warn`, counted from the caller of this function.
    """
    sim, th = setup.simulation, setup.theory
    checks = []
    if simulation is not None:
        checks.append(("simulation's limit", np.asarray(simulation.risk_limit, dtype=float),
                       math.sqrt(2.0 / (sim.test_samples * sim.seeds))))
    if theory is not None:
        risk = np.asarray(theory.risk, dtype=float)
        checks.append(("theory", risk, th.rtol * float(np.abs(risk[:, 0]).max()) + th.atol))
    for what, risk, floor in checks:
        rise = risk[:, -1] - risk[:, 0]
        spread = float(rise.std(ddof=1) / math.sqrt(len(rise))) if len(rise) > 1 else 0.0
        error = max(spread, floor)
        if rise.mean() > 3 * error:
            warnings.warn(f"the {what} risk rose during training ({risk[:, 0].mean():.4g} -> {risk[:, -1].mean():.4g}, more "
                          f"than 3 x its error {error:.2g}): sgd.lr = {setup.sgd.lr:g} may be too large",
                          stacklevel=beyond_the_door(stacklevel + 1))
