"""The rule's own error: estimates from independent scramblings, and the number of points.

Relative drift error. For the drift ``d`` of a rule (all entries of ``dM``, ``dQ``, ``db``) and the exact drift ``d*``,
the relative error is ``max_i |d_i - d*_i| / max_i |d*_i|``.

Estimate. ``R >= 2`` independently scrambled rules (seeds ``qmc_seed + r``) give unbiased drifts ``d_r`` with
independent errors. Each one is compared with the mean of the others: ``d_r - mean_{r' != r} d_r'`` has the per-entry
variance ``R / (R - 1)`` times that of one rule's error, so ``sqrt((R - 1) / R) max_i |d_ri - mean_{r' != r} d_r'i|`` is
distributed like the maximal error of one rule; its mean over ``r``, divided by ``max_i |mean_r d_ri|``, estimates one
rule's relative error. The mean of ``R`` rules has ``1 / sqrt(R)`` of it.

Automatic points (``theory.points = "auto"``). :func:`choose_points` evaluates the drift at the start on ``max(R, 4)``
rules of ``n`` points, and takes the smallest power of two ``n`` (from 64, or the number of Gaussian coordinates, to
``2**20``; searched by halving or doubling from 1024) at which the estimated relative error of the mean of the ``R``
rules that drive the solve is at most ``theory.tol / 1.5``: the error of one scrambling scatters by about 30 % around
the estimate (and the estimate from four scramblings by about as much), and the margin keeps the error of the rule
actually used below ``theory.tol`` in most cases. The error is estimated at the start only: later states, with larger
overlaps and sharper attention, can need many more points (``benchmarks/02_drift_accuracy.py``; ``theory.replicates >=
2`` reports the spread along the trajectory). In the work-precision measurements the estimate was within about 30 % of
the error against a reference of 16 x the points.
"""

from __future__ import annotations

import dataclasses
import warnings

import equinox as eqx
import jax
import numpy as np

from ..expectations._expectation import relative_drift_error
from ..ground._arguments import beyond_the_door
from ..preflight._build import Setup
from ..preflight._resources import MIN_POINTS, auto_points, check_run
from ..sgd._sgd_rule import Starts, flat_drift
from ._starts import batched_starts, initial_conditions
from ._theory import OrderParameterODE, OrderParameters

MAX_POINTS = 2**20
PROBE_REPLICATES = 4
MARGIN = 1.5


@eqx.filter_jit
def start_drifts(ode: OrderParameterODE, y0: OrderParameters) -> jax.Array:
    """Flattened drifts (S, P) of one rule at the starts ``y0`` (leading axis ``S``)."""
    return flat_drift(jax.vmap(ode.state_drift)(y0))


@dataclasses.dataclass(frozen=True)
class PointsChoice:
    """The outcome of :func:`choose_points`: the ``points`` chosen, its estimated relative drift ``error`` (of the mean
    of the ``replicates`` rules) and every ``(points, error)`` tried."""

    points: int
    error: float
    replicates: int
    tried: tuple[tuple[int, float], ...]


def drift_error(setup: Setup, y0: OrderParameters, points: int, replicates: int) -> float:
    """Estimated relative drift error at the starts ``y0`` (worst start) of the mean of
    ``replicates`` rules of ``points`` points, from ``max(replicates, 4)`` scramblings of ``setup``'s rule."""
    seeds = setup.theory.qmc_seed + np.arange(max(replicates, PROBE_REPLICATES))
    theories = (dataclasses.replace(setup.theory, qmc_seed=int(seed), points=points) for seed in seeds)
    drifts = [start_drifts(OrderParameterODE.from_setup(dataclasses.replace(setup, theory=th)), y0) for th in theories]
    return float(np.max(relative_drift_error(np.stack(drifts, axis=-2)))) / np.sqrt(replicates)


def choose_points(setup: Setup, y0: Starts) -> PointsChoice:
    """The smallest power of two of points whose estimated relative drift error at the
    starts ``y0`` (a weighting's state with a leading axis ``S``) is at most ``theory.tol / MARGIN``
    (module docstring), probed on the route ``setup`` (:func:`~singleloc.build`) decided."""
    tol, R = setup.theory.tol / MARGIN, setup.theory.replicates
    tried: dict[int, float] = {}

    def error(n: int) -> float:
        try:  # the memory check of the same count given explicitly
            check_run(setup.replace(theory={"points": n}), theory_starts=int(y0.M.shape[0]))
        except MemoryError as err:
            why = "" if not tried else f" (at {max(tried)} points its estimated relative drift error is {tried[max(tried)]:.2g})"
            raise MemoryError(f"theory.points = 'auto' would try {n} points{why}, and {err}") from None
        tried[n] = drift_error(setup, y0, n, R)
        return tried[n]

    pb = setup.problem
    dim = pb.L * setup.heads + (0 if setup.prior.is_discrete else pb.F)
    low, n = max(MIN_POINTS, 1 << (dim - 1).bit_length()), auto_points(pb.L, setup.heads, setup.prior)  # points >= dim
    if error(n) <= tol:
        while n > low and error(n // 2) <= tol:
            n //= 2
    else:
        while tried[n] > tol and n < MAX_POINTS:
            n *= 2
            error(n)
        if tried[n] > tol:
            warnings.warn(f"theory.points = 'auto': {n} points reach an estimated relative drift error of {tried[n]:.2g} "
                          f"only (theory.tol = {setup.theory.tol:g}); raise theory.replicates or theory.tol",
                          stacklevel=beyond_the_door(2))
    return PointsChoice(n, tried[n], R, tuple(sorted(tried.items())))


def resolve_points(setup: Setup, y0: Starts | None = None) -> Setup:
    """``setup`` (:func:`~singleloc.build`) with ``theory.points = "auto"`` replaced by the number of points
    :func:`choose_points` picks at the starts ``y0`` (leading axis ``S``; default the start :func:`integrate` uses,
    the simulator's initial overlaps of seed 0) on its route as decided; ``setup`` itself when ``theory.points`` is a
    number. Resolved once, before anything is built, the ODEs of one computation share one rule
    (:func:`integrate` resolves it at its own starts)."""
    if setup.theory.points != "auto":
        return setup
    starts = initial_conditions(setup.config, 1) if y0 is None else batched_starts(setup.model.weighting.state(y0))
    return setup.replace(theory={"points": choose_points(setup, starts).points})
