"""The enumerations of the library's options that the command line offers as choices. This module imports no
numerical library, so that building the parser, and ``--help``, loads none (:mod:`singleloc.cli`)."""

from __future__ import annotations

import math

#: The orders of removal of :func:`singleloc.prune` (:mod:`singleloc.pruning._pruning`).
PRUNING_ORDERS = ("greedy", "alignment", "random")

#: Most random orders of :func:`singleloc.prune` (``draws``, ``singleloc prune --draws``): the mean over the
#: orders has a standard error shrinking like ``1/sqrt(draws)``, 1 % of their spread at this many, while the
#: work grows like ``draws``.
PRUNING_DRAWS_MAX = 10000

#: Which tokens belong to a row of :func:`singleloc.diagnose_attention` (``mask``).
MASKS = ("auto", "none", "causal")

#: The samples of the Kolmogorov-Smirnov test of :func:`singleloc.diagnose_attention` (``ks_samples``).
KS_SAMPLES = ("auto", "heads", "rows")

#: The expectation routes (:mod:`singleloc.expectations._routes`) by the name ``theory.route`` gives them: the module and
#: class of each, imported when a route is built. A new route is a module and one line here.
ROUTE_CLASSES = {
    "exact": "singleloc.expectations._laplace_expectation:LaplaceExpectation",
    "rule": "singleloc.expectations._sobol_expectation:SobolExpectation",
    "montecarlo": "singleloc.expectations._monte_carlo_expectation:MonteCarloExpectation",
}

#: The routes in printed lines (``"the Monte Carlo route"``).
ROUTE_WORDS = {"exact": "exact", "rule": "rule", "montecarlo": "Monte Carlo"}

#: Values of ``theory.route``.
ROUTES = ("auto", *ROUTE_CLASSES)

#: ``theory.gram``: how the exact route computes the ``lr^2`` (Gram) term.
GRAM_ROUTES = ("auto", "exact", "sobol", "montecarlo")

#: ``theory.axes``: the coordinates of the Sobol rule's fields.
RULE_AXES = ("heads", "principal")

#: Values of ``sgd.schedule`` (the rates are :class:`~singleloc.LearningRateSchedule`'s).
SCHEDULES = ("constant", "step", "cosine", "inverse", "warmup")

#: Most independent scramblings of a risk's error estimate (``singleloc bayes --replicates``,
#: :func:`singleloc.bayes_risk`, :func:`singleloc.population_risk`): its standard error shrinks like
#: ``1/sqrt(R)`` while the work grows like ``R``; beyond, more points (``theory.points``) are cheaper.
REPLICATES_MAX = 1024

#: The words a sweep's ``horizon`` takes besides a positive number (:func:`singleloc.sweep`).
HORIZON_WORDS = ("auto", "config")


#: The range of a numerical horizon (``tau``). Below: the solve's span would approach its smallest step
#: (``singleloc.theory._step_budget.MIN_STEP = 1e-7``; a horizon of 1e-9 stopped as "too stiff"), and one SGD step
#: of a simulation is ``1 / simulation.D``. Above: more than 3000 times the longest predicted horizon
#: (``HORIZON_CAP = 3000``), a time no solve reaches (its estimate overflowed at 1e300).
HORIZON_RANGE = (1e-3, 1e7)


def check_horizon(horizon) -> None:
    """``ValueError`` unless ``horizon`` is ``"auto"``, ``"config"`` or a number in :data:`HORIZON_RANGE` (the library's
    check, which ``singleloc sweep --horizon`` and ``integrate --horizon`` apply to their parsed value too)."""
    if horizon in HORIZON_WORDS:
        return
    if isinstance(horizon, bool) or not isinstance(horizon, (int, float)) or not math.isfinite(horizon) or horizon <= 0:
        raise ValueError(f"horizon must be 'auto', 'config' or a positive number, got {horizon!r}; e.g. 'auto'")
    low, high = HORIZON_RANGE
    if not low <= horizon <= high:
        raise ValueError(f"horizon must lie in [{low:g}, {high:g}] (a time tau), got {horizon:g}; e.g. 'auto' (the "
                         "predicted escape's horizon)")
