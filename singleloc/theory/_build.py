"""The specifications turned into the objects a computation runs on, once.

A configuration holds names and numbers: an activation's name, a prior's parameters, the keys of
the ``sgd`` section, ``theory.route``. Before a computation, :func:`build` turns them into objects,
once: the prior, the SGD rule, and the expectation route's choice with the activation function and
its normalised-exponential form (:class:`Setup`). The ODE
(:meth:`~singleloc.OrderParameterODE.from_setup`), the solve, the SDE and the escape prediction take
these objects; a config enters only at the edges (the command line, the Python API's entry points).
"""

from __future__ import annotations

import dataclasses

from ..configuration._config import Config, require_config, sgd_rule
from ..configuration._specs import Model, Problem, Theory
from ..expectations._routes import RouteChoice, route_of
from ..model._activations import Activation
from ..model._priors import Prior
from ..sgd._sgd_rule import AbstractSGDRule


@dataclasses.dataclass(frozen=True)
class Setup:
    """What one computation runs on (module docstring).

    Attributes:
        problem: the data (``L``, ``F``; the prior's specification).
        model: the layer (``heads``; what trains).
        theory: the numerics of the ODE.
        prior: the prior of ``theta``, built.
        sgd: the SGD rule, built (:meth:`~singleloc.SGD.build_rule`).
        route: the expectation route, chosen (:func:`~singleloc.choose_route`): it holds the
            activation function and its form.
    """

    problem: Problem
    model: Model
    theory: Theory
    prior: Prior
    sgd: AbstractSGDRule
    route: RouteChoice

    @property
    def activation(self) -> Activation:
        """The attention activation (scores (H, L) -> weights (H, L))."""
        return self.route.activation

    @property
    def heads(self) -> int:
        return self.model.heads


def build(config: Config) -> Setup:
    """The objects of ``config`` (module docstring): its prior, SGD rule and route, each built once.
    ``ValueError`` naming the key of a specification that cannot be built (an unknown activation, a
    route that does not exist for this layer, a bias decay without trained biases)."""
    require_config(config, "build")
    route = route_of(config)  # the activation resolved, the route decided
    return Setup(config.problem, config.model, config.theory, config.problem.build_prior(), sgd_rule(config), route)

