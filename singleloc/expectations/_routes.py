"""Which expectation route a computation takes, decided once, with the budgets that decide it.

``theory.route`` names a route (:data:`~singleloc.ground._choices.ROUTE_CLASSES`) or ``"auto"``;
:func:`choose_route` (:func:`decide`) turns the problem, the layer and the numerics into a :class:`RouteChoice`.
``"auto"`` takes the exact route (:class:`~singleloc.LaplaceExpectation`) for a normalised exponential (softmax,
softmax1, bsoftmax, ssmax, or an activation declaring its form: :func:`~singleloc.exponential_form`), else the Sobol
rule (:class:`~singleloc.SobolExpectation`); a joint layer (bsoftmax) only while its exact rule is affordable
(:data:`JOINT_EXACT_MAX` for a solve, :data:`JOINT_RISK_MAX` for one risk) and never with trained head weights (its
head mixture is not a normalised exponential). ``"exact"`` takes it whatever its cost (within memory:
:meth:`~singleloc.LaplaceExpectation.rule_bytes`), an error where it does not exist; any other name, that route.

The exact route's ``lr^2`` (Gram) term (``theory.gram``, :class:`~singleloc.Theory`): ``"auto"`` takes it exactly for
one head and for two from ``L * H >=`` :data:`GRAM_EXACT_FROM` on. A new route is a module with a class of
:class:`~singleloc.expectations._expectation.AbstractExpectation` and one line in
:data:`~singleloc.ground._choices.ROUTE_CLASSES`.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import TYPE_CHECKING

from ..ground._choices import ROUTE_CLASSES, ROUTES
from ..sgd._head_weighting import HEAD_AVERAGE, AbstractHeadWeighting

if TYPE_CHECKING:  # imported when a route is chosen
    from ..configuration._specs import Model, Problem, Theory
    from ..model._activations import Activation, ExponentialForm
    from ..model._priors import Prior

#: ``theory.route = "auto"`` integrates a joint layer (bsoftmax) on the exact route up to this
#: :func:`~singleloc.expectations._laplace_joint.joint_rule_size` (nodes x heads x atoms), and on the rule route beyond:
#: its conditional product form then costs more than a few seconds a drift on a 2-core CPU (29 to 37 CPU microseconds
#: per unit, docs/benchmarks/11); ``H = 4`` with two spikes (76640) and ``H = 5`` with one (100980) are the largest it
#: takes.
JOINT_EXACT_MAX = 2**17
#: The same for one risk (:func:`~singleloc.population_risk`, :func:`~singleloc.bayes_risk` with
#: ``route = "auto"``), computed once on the exact rule and once on its refined copy: about a minute
#: to a quarter of an hour on a 2-core CPU (the Bayes point of four spikes, 786432; six trained bsoftmax
#: heads on one spike, 829440; eight binary atoms are beyond it).
JOINT_RISK_MAX = 2**20
#: Bytes per unit of a joint layer's refined rule (:func:`~singleloc.expectations._laplace_joint.joint_rule_size`) at
#: its peak: 0.53 kB measured (binary prior, F = 2, K = H = 4: 472 MB over the process's baseline).
JOINT_UNIT_BYTES = 640

#: ``theory.gram = "auto"`` takes the exact Gram term of two heads from this many fields ``L * H`` on:
#: there it costs less than the Sobol rule's share of a drift (docs/model.md section 4.6), whose points
#: shrink from ``L * H > 256`` on to fit its memory budget.
GRAM_EXACT_FROM = 64


@dataclasses.dataclass(frozen=True)
class RouteChoice:
    """The route of one computation (module docstring): ``route`` (a key of
    :data:`~singleloc.ground._choices.ROUTE_CLASSES`), the ``activation`` and its
    normalised-exponential ``form`` (``None`` if it has none), and on the exact route ``gram``:
    ``"exact"``, ``"sobol"`` or ``"montecarlo"`` (``None`` elsewhere)."""

    route: str
    activation: Activation
    form: ExponentialForm | None
    gram: str | None = None

    @property
    def route_class(self) -> type:
        """The route's class (:func:`route_class`), which answers for it."""
        return route_class(self.route)

    @property
    def on_sobol_rule(self) -> bool:
        """Whether this is the Sobol rule's route, whose ``theory.points`` an escape prediction's rule shares."""
        return self.route == "rule"

    def two_head_exact_gram(self, H: int) -> bool:
        """Whether the ``H`` heads take the exact Gram term of two heads: a program of its own, about twice the
        default's, with ``L`` traced (one for every ``L``), and a drift flat in ``L`` (the estimates' cost class)."""
        return self.gram == "exact" and H == 2


def route_class(name: str) -> type:
    """The expectation class of the route ``name`` (:data:`~singleloc.ground._choices.ROUTE_CLASSES`)."""
    module, _, attr = ROUTE_CLASSES[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def exact_route_exists(form: ExponentialForm | None, weighting: AbstractHeadWeighting = HEAD_AVERAGE) -> bool:
    """Whether a layer whose activation has the normalised-exponential ``form`` (``None``: none) and whose heads
    mix by ``weighting`` has an exact route: a normalised exponential, and not a joint layer with other weights
    than the head average (a joint layer's head mixture is not one)."""
    return form is not None and not (form.joint and not weighting.head_average)


def decide(activation_name: str, L: int, H: int, prior: Prior, route: str, *, weighting: AbstractHeadWeighting = HEAD_AVERAGE,
           gram: str = "auto", budget: int = JOINT_EXACT_MAX, key: str = "theory.route") -> RouteChoice:
    """The route (module docstring) of a layer of ``H`` heads with the activation ``activation_name`` on
    sequences of ``L`` tokens under ``prior``, its heads mixed by ``weighting``; ``route`` and ``gram`` as ``theory.route`` and
    ``theory.gram``; ``budget``: the largest joint-layer rule ``"auto"`` takes exactly; ``key``: the
    name of ``route`` in messages. ``ValueError`` for a route that does not exist for this layer."""
    from ..model._activations import exponential_form, get_activation

    if route not in ROUTES:
        raise ValueError(f"{key} must be one of {', '.join(map(repr, ROUTES))}, got {route!r}")
    activation = get_activation(activation_name)
    form = exponential_form(activation, L)
    exact = exact_route_exists(form, weighting)
    if route == "exact" and not exact:
        if form is not None:
            raise ValueError(f"{key} = 'exact': activation {activation_name!r} with model.head_weights = "
                             f"{weighting.name!r} has no exact route (a joint layer's head mixture is not a normalised "
                             "exponential); use 'auto' or 'rule'")
        raise ValueError(f"{key} = 'exact': activation {activation_name!r} is not a normalised exponential (softmax, "
                         "softmax1, bsoftmax, ssmax or one declaring exponential_form); use 'auto' or 'rule'")
    if route == "auto":
        from ._laplace_joint import joint_rule_size

        route = "exact" if exact and (not form.joint or joint_rule_size(H, prior) <= budget) else "rule"
    if route != "exact":  # (a config that asks for the exact Gram term here is refused as it is built: check_gram)
        return RouteChoice(route, activation, form)
    possible = (H == 1 or (H == 2 and not form.joint)) and weighting.head_average  # the Laplace form's (module docstring)
    if gram == "exact" and not possible:
        why = f"{weighting.name} head weights" if not weighting.head_average else "a joint layer" if form.joint else f"H = {H}"
        raise ValueError(f"theory.gram = 'exact': the exact Gram term takes one head, or two heads of a per-head layer "
                         f"with the head average, not {why}; use 'auto' or 'sobol'")
    if gram == "montecarlo":
        return RouteChoice("exact", activation, form, "montecarlo")
    auto = H == 1 or L * H >= GRAM_EXACT_FROM
    exact_gram = possible and (gram == "exact" or (gram == "auto" and auto))
    return RouteChoice("exact", activation, form, "exact" if exact_gram else "sobol")


def choose_route(problem: Problem, model: Model, theory: Theory) -> RouteChoice:
    """The route of a solve of ``problem`` by ``model`` with the numerics ``theory`` (module
    docstring; :func:`decide` with the solve's budget :data:`JOINT_EXACT_MAX`)."""
    return decide(model.activation, problem.L, model.heads, problem.build_prior(), theory.route,
                  weighting=model.weighting, gram=theory.gram)
