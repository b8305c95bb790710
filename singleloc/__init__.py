"""singleloc: multi-head attention in the high-dimensional single-location model.

Exact order-parameter dynamics (an ODE for ``(M, Q, b)`` whose drift JAX derives from the
loss), finite-D online SGD simulations, the Bayes-optimal baseline, pruning and the
normalization diagnostics. The conventions are those of ``docs/model.md``.

The public names below are imported from their private modules on first use (module-level
``__getattr__``, PEP 562), so that ``import singleloc`` and the command line's ``--help`` do
not load JAX; ``from singleloc import X``, ``singleloc.X`` and ``dir(singleloc)`` work as for
eager imports. Figures live in :mod:`singleloc.plots` (imported explicitly).
"""

from __future__ import annotations

import importlib
import types
from typing import TYPE_CHECKING

from ._version import __version__ as __version__

# The public API, read by type checkers and IDEs; at run time each name is imported on first use (below).
if TYPE_CHECKING:
    from .analysis._attention_mass import attention_mass as attention_mass
    from .analysis._fixed_point import FixedPoint as FixedPoint
    from .analysis._fixed_point import unspecialized_point as unspecialized_point
    from .analysis._head_classes import HEAD_CLASSES as HEAD_CLASSES
    from .analysis._head_classes import HeadClasses as HeadClasses
    from .analysis._head_classes import classify_heads as classify_heads
    from .analysis._phase_analysis import PhaseAnalysis as PhaseAnalysis
    from .analysis._phase_analysis import analyze as analyze
    from .analysis._plateaus import Plateau as Plateau
    from .analysis._plateaus import escape_times as escape_times
    from .analysis._plateaus import halfway_time as halfway_time
    from .analysis._plateaus import plateaus as plateaus
    from .analysis._predictions import EscapePrediction as EscapePrediction
    from .analysis._predictions import escape_horizon as escape_horizon
    from .analysis._predictions import predicted_escape as predicted_escape
    from .analysis._stability import Linearization as Linearization
    from .analysis._stability import escape_mode as escape_mode
    from .analysis._stability import escape_rate as escape_rate
    from .analysis._stability import escape_rate_along as escape_rate_along
    from .analysis._stability import escape_subspace as escape_subspace
    from .analysis._stability import linear_escape_time as linear_escape_time
    from .analysis._stability import linearize as linearize
    from .analysis._stability import predicted_escape_slope as predicted_escape_slope
    from .analysis._stability import subspace_amplitude as subspace_amplitude
    from .analysis._stability import unstable_modes as unstable_modes
    from .attention._attention_diagnosis import AttentionDiagnosis as AttentionDiagnosis
    from .attention._attention_diagnosis import diagnose_attention as diagnose_attention
    from .attention._attention_rows import logits_from_weights as logits_from_weights
    from .attention._sensitivity import FD_EPSILONS as FD_EPSILONS
    from .attention._sensitivity import finite_difference_sensitivity as finite_difference_sensitivity
    from .attention._sensitivity import random_directions as random_directions
    from .attention._sensitivity import softmax_jacobian as softmax_jacobian
    from .attention._sensitivity import softmax_jacobian_norm as softmax_jacobian_norm
    from .attention._top_n import CriticalTopN as CriticalTopN
    from .attention._top_n import TopN as TopN
    from .attention._top_n import critical_top_n as critical_top_n
    from .attention._top_n import ks_critical_n as ks_critical_n
    from .attention._top_n import select_top_n as select_top_n
    from .attention._top_n import top_n_diagnostics as top_n_diagnostics
    from .attention._vanishing_attention import VanishingAttention as VanishingAttention
    from .attention._vanishing_attention import effective_logit_bound as effective_logit_bound
    from .attention._vanishing_attention import vanishing_attention as vanishing_attention
    from .bayes._bayes import bayes_point as bayes_point
    from .bayes._bayes import bayes_risk as bayes_risk
    from .bayes._bayes import bayes_route as bayes_route
    from .bayes._bayes import log_weight as log_weight
    from .bayes._bayes import posterior as posterior
    from .bayes._population_risk import RiskEstimate as RiskEstimate
    from .bayes._population_risk import population_risk as population_risk
    from .configuration._config import Config as Config
    from .configuration._config import config_hash as config_hash
    from .configuration._config import load_config as load_config
    from .configuration._config import preset_names as preset_names
    from .configuration._specs import SGD as SGD
    from .configuration._specs import Model as Model
    from .configuration._specs import Problem as Problem
    from .configuration._specs import Simulation as Simulation
    from .configuration._specs import Theory as Theory
    from .expectations._expectation import AbstractExpectation as AbstractExpectation
    from .expectations._expectation import AbstractGramTerm as AbstractGramTerm
    from .expectations._expectation import relative_drift_error as relative_drift_error
    from .expectations._fields import LocalFields as LocalFields
    from .expectations._fields import replicate_rules as replicate_rules
    from .expectations._laplace import LaplaceRule as LaplaceRule
    from .expectations._laplace import exact_rule as exact_rule
    from .expectations._laplace_expectation import LaplaceExpectation as LaplaceExpectation
    from .expectations._laplace_expectation import LaplaceGram as LaplaceGram
    from .expectations._monte_carlo_expectation import MonteCarloExpectation as MonteCarloExpectation
    from .expectations._routes import RouteChoice as RouteChoice
    from .expectations._routes import choose_route as choose_route
    from .expectations._sobol_expectation import SobolExpectation as SobolExpectation
    from .expectations._sobol_expectation import SobolGram as SobolGram
    from .ground._choices import PRUNING_ORDERS as PRUNING_ORDERS
    from .io._run_folders import Run as Run
    from .io._run_folders import add_to_run as add_to_run
    from .io._run_folders import load_npz as load_npz
    from .io._run_folders import load_run as load_run
    from .io._run_folders import save_figure as save_figure
    from .io._run_folders import save_json as save_json
    from .io._run_folders import save_npz as save_npz
    from .io._run_folders import save_run as save_run
    from .io._run_folders import save_simulation as save_simulation
    from .io._run_folders import save_theory as save_theory
    from .model._activations import Activation as Activation
    from .model._activations import ExponentialForm as ExponentialForm
    from .model._activations import activation_names as activation_names
    from .model._activations import bsoftmax as bsoftmax
    from .model._activations import exponential_form as exponential_form
    from .model._activations import get_activation as get_activation
    from .model._activations import register_activation as register_activation
    from .model._activations import scalable_softmax as scalable_softmax
    from .model._activations import softmax as softmax
    from .model._activations import softmax1 as softmax1
    from .model._activations import ssmax as ssmax
    from .model._data import initial_overlaps as initial_overlaps
    from .model._data import make_spikes as make_spikes
    from .model._data import overlaps as overlaps
    from .model._data import sample_sequence as sample_sequence
    from .model._data import seed_keys as seed_keys
    from .model._layer import finite_loss as finite_loss
    from .model._layer import limit_loss as limit_loss
    from .model._layer import token_weights as token_weights
    from .model._priors import Prior as Prior
    from .model._priors import binary as binary
    from .model._priors import discrete as discrete
    from .model._priors import flipped as flipped
    from .model._priors import gaussian as gaussian
    from .model._priors import spikes as spikes
    from .preflight._build import Setup as Setup
    from .preflight._build import build as build
    from .preflight._build import sgd_rule as sgd_rule
    from .preflight._run_checks import warn_if_risk_rose as warn_if_risk_rose
    from .pruning._pruning import TheoryRisk as TheoryRisk
    from .pruning._pruning import WeightsRisk as WeightsRisk
    from .pruning._pruning import finetune as finetune
    from .pruning._pruning import keep_heads as keep_heads
    from .pruning._pruning import prune as prune
    from .pruning._pruning import prune_run as prune_run
    from .pruning._pruning import prune_theory as prune_theory
    from .pruning._pruning import prune_weights as prune_weights
    from .pruning._pruning_result import PruningResult as PruningResult
    from .pruning._pruning_result import removable_heads as removable_heads
    from .runtime._compilation import enable_compilation_cache as enable_compilation_cache
    from .runtime._numerics import psd_sqrt as psd_sqrt
    from .runtime._progress import set_progress as set_progress
    from .sgd._head_weighting import AbstractHeadWeighting as AbstractHeadWeighting
    from .sgd._head_weighting import OrderParameters as OrderParameters
    from .sgd._head_weighting import TrainedHeads as TrainedHeads
    from .sgd._head_weighting import UniformHeads as UniformHeads
    from .sgd._head_weighting import WeightedOrderParameters as WeightedOrderParameters
    from .sgd._sgd_rule import AbstractSGDRule as AbstractSGDRule
    from .sgd._sgd_rule import AbstractVariant as AbstractVariant
    from .sgd._sgd_rule import GradientFlow as GradientFlow
    from .sgd._sgd_rule import GradientMoments as GradientMoments
    from .sgd._sgd_rule import LayerParameters as LayerParameters
    from .sgd._sgd_rule import OnlineSGD as OnlineSGD
    from .sgd._sgd_variants import LearningRateSchedule as LearningRateSchedule
    from .sgd._sgd_variants import MiniBatch as MiniBatch
    from .sgd._sgd_variants import Momentum as Momentum
    from .sgd._sgd_variants import WeightDecay as WeightDecay
    from .simulation._simulation import simulate as simulate
    from .simulation._simulation_result import SimulationResult as SimulationResult
    from .sweeps._grid import Grid as Grid
    from .sweeps._grid import parse_grid as parse_grid
    from .sweeps._sweep import sweep as sweep
    from .sweeps._sweep_cache import SweepStats as SweepStats
    from .sweeps._sweep_dataset import load_sweep as load_sweep
    from .theory._accuracy import PointsChoice as PointsChoice
    from .theory._accuracy import choose_points as choose_points
    from .theory._accuracy import resolve_points as resolve_points
    from .theory._fluctuations import SDEResult as SDEResult
    from .theory._fluctuations import integrate_sde as integrate_sde
    from .theory._ode import integrate as integrate
    from .theory._starts import initial_conditions as initial_conditions
    from .theory._theory import OrderParameterODE as OrderParameterODE
    from .theory._theory import r_orth as r_orth
    from .theory._theory_result import TheoryResult as TheoryResult
    from .theory._trajectory import Trajectory as Trajectory


def _public_names() -> dict[str, tuple[str, str]]:
    """public name -> (module, name in the module): the ``TYPE_CHECKING`` imports above, read from this file
    (one list for the type checkers and for ``__getattr__``, as ``lazy_loader.attach_stub`` reads a stub)."""
    import ast

    with open(__file__, encoding="utf-8") as file:
        tree = ast.parse(file.read())
    block = next(node for node in tree.body if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING")
    return {alias.asname or alias.name: (node.module, alias.name) for node in block.body for alias in node.names}


_ORIGIN = _public_names()
__all__ = sorted(_ORIGIN)
#: Public functions given to the package as values (activations, called in its traced code): not wrapped.
UNCHECKED = frozenset({"softmax", "softmax1", "ssmax", "bsoftmax"})


def __getattr__(name: str):
    if name not in _ORIGIN:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _ORIGIN[name]
    value = getattr(importlib.import_module(f".{module}", __name__), attr)
    if isinstance(value, types.FunctionType) and name not in UNCHECKED:  # arguments checked at the door; not the package's calls
        value = importlib.import_module(".ground._arguments", __name__).checked(value)
        value.__module__, value.__qualname__ = __name__, name  # pickled by reference as singleloc.NAME, this object
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
