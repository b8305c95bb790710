"""The specifications turned into the objects a computation runs on, once.

A configuration holds names and numbers: an activation's name, a prior's parameters, the keys of
the ``sgd`` section, ``theory.route``. Before a computation, :func:`build` turns them into objects,
once: the prior, the SGD rule, and the expectation route's choice with the activation function and
its normalised-exponential form (:class:`Setup`, which keeps the sections beside them). The checks
before a run and its estimates (this folder), the ODE (:meth:`~singleloc.OrderParameterODE.from_setup`),
the solve, the simulation, the SDE, the accuracy probe and the escape prediction take these objects; a config
enters only at the edges (the command line, the Python API's entry points, the run folders), which build it once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..configuration._config import Config
from ..configuration._specs import ON_THE_RULE, SGD, Model, Problem, Simulation, Theory
from ..expectations._routes import RouteChoice, choose_route, route_class
from ..model._activations import Activation
from ..model._priors import Prior
from ..sgd._sgd_rule import AbstractSGDRule, GradientFlow, OnlineSGD
from ..sgd._sgd_variants import LearningRateSchedule, MiniBatch, Momentum, WeightDecay


@dataclasses.dataclass(frozen=True)
class Setup:
    """What one computation runs on (module docstring): a configuration's sections, under the same names, and
    the objects built from them.

    Attributes:
        problem: the data (``L``, ``F``; the prior's specification).
        model: the layer (``heads``; what trains).
        sgd: the ``sgd`` section (rate, horizon, saved times).
        simulation: the finite-D run (dimension, seeds, test samples).
        theory: the numerics of the ODE.
        prior: the prior of ``theta``, built.
        rule: the SGD rule, built (:func:`sgd_rule`).
        route: the expectation route, chosen (:func:`~singleloc.choose_route`): it holds the
            activation function and its form; ``None`` for a simulation alone (``build(..., theory=False)``).
    """

    problem: Problem
    model: Model
    sgd: SGD
    simulation: Simulation
    theory: Theory
    prior: Prior
    rule: AbstractSGDRule
    route: RouteChoice | None

    @property
    def activation(self) -> Activation:
        """The attention activation (scores (H, L) -> weights (H, L))."""
        return self.route.activation

    @property
    def heads(self) -> int:
        return self.model.heads

    @property
    def config(self) -> Config:
        """The sections as one configuration (the keys of the compiled programs' families; a run folder's config)."""
        return Config(self.problem, self.model, self.sgd, self.simulation, self.theory)

    def replace(self, **sections: Mapping[str, Any]) -> Setup:
        """This setup with keys changed as :meth:`~singleloc.Config.replace` changes them (``setup.replace(theory={"points":
        1024})``), and what they build built again: the SGD rule for ``model`` and ``sgd``, the prior and the route
        (decided again) for ``model`` and ``problem``. ``theory`` keeps the route decided (its ``route`` key may only
        name it)."""
        config = self.config.replace(**sections)
        new = dataclasses.replace(self, **{name: getattr(config, name) for name in sections})
        if {"model", "sgd"} & set(sections):
            new = dataclasses.replace(new, rule=sgd_rule(new.sgd, new.model))
        if {"model", "problem"} & set(sections):
            route = None if self.route is None else choose_route(new.problem, new.model, new.theory)
            new = dataclasses.replace(new, prior=new.problem.build_prior(), route=route)
        return new

    def on_rule_route(self, points: int) -> Setup:
        """This setup on the Sobol rule (the rule route, its own Gram term) at ``points`` points, every other key kept:
        the escape prediction's numerics whatever the run's route
        (:func:`~singleloc.analysis._predictions.prediction_setup`, and its estimate)."""
        theory = dataclasses.replace(self.theory, points=points, **ON_THE_RULE)
        return dataclasses.replace(self, theory=theory, route=dataclasses.replace(self.route, route="rule", gram=None))


def build(config: Config, *, theory: bool = True) -> Setup:
    """The objects of ``config`` (module docstring): its prior, SGD rule and route, each built once (``theory=False``, a
    simulation alone: no route, so that a theory key decides nothing there). ``ValueError`` naming the key of a
    specification that cannot be built (an unknown activation, a route that does not exist for this layer, a bias decay
    without trained biases, a Gram key the route has no use for: :func:`check_gram`)."""
    route = None
    if theory:  # the route decided
        route = choose_route(config.problem, config.model, config.theory)
        check_gram(config.theory, config.model.activation, route.route)
    return Setup(config.problem, config.model, config.sgd, config.simulation, config.theory, config.problem.build_prior(),
                 sgd_rule(config.sgd, config.model), route)


def sgd_rule(sgd: SGD, model: Model) -> AbstractSGDRule:
    """The SGD rule of a configuration's ``sgd`` section for its layer ``model``:
    :class:`~singleloc.OnlineSGD` (or :class:`~singleloc.GradientFlow`) at ``sgd.lr``, the biases training
    with ``model.train_bias``, the head weighting of ``model.head_weights``, and the chain of the variants
    that are on, in the order schedule, batch, decay, momentum (the decay enters the velocity)."""
    schedule = LearningRateSchedule(sgd.schedule, sgd.schedule_tau, sgd.decay_factor, sgd.warmup_tau)
    chain = [] if schedule.constant else [schedule]
    if sgd.batch > 1:
        chain.append(MiniBatch(sgd.batch))
    if sgd.weight_decay or sgd.bias_decay:
        chain.append(WeightDecay(sgd.weight_decay, sgd.bias_decay))
    if sgd.momentum:
        chain.append(Momentum(sgd.momentum))
    rule = GradientFlow if sgd.gradient_flow else OnlineSGD
    return rule(sgd.lr, model.train_bias, tuple(chain), weighting=model.weighting)


def check_gram(th: Theory, activation: str, route: str) -> None:
    """``ValueError`` for ``theory.gram`` other than ``"auto"`` and the route's own Gram term (``"sobol"`` on
    the rule route, ``"montecarlo"`` on the Monte Carlo route), or a number of ``theory.gram_points``, on a
    route without the exact route's Gram rule (a key the run would drop silently); ``activation``:
    ``model.activation``, named in the message."""
    gram_points = th.gram_points != "auto"
    own = route_class(route)
    if own.own_gram is not None and (gram_points or th.gram not in ("auto", own.gram_name)):
        key = f"theory.gram = {th.gram!r}" if th.gram != "auto" else f"theory.gram_points = {th.gram_points}"
        why = (f"theory.route = {th.route!r}" if th.route != "auto" else
               f"model.activation = {activation!r} takes the rule route here")
        raise ValueError(f"{key} applies to the exact route's Gram term, but {why}, whose Gram term is {own.own_gram}; e.g. "
                         f"{key.split(' = ')[0]} = 'auto', or theory.route = 'exact' for a normalised-exponential "
                         "activation")
