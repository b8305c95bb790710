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
from typing import TYPE_CHECKING

from ._version import __version__ as __version__

# The public API: private module -> the names it exports ("NAME as PUBLIC" renames).
_EXPORTS = {
    "_activations": ("Activation", "ExponentialForm", "activation_names", "bsoftmax", "exponential_form", "get_activation",
                     "register_activation", "scalable_softmax", "softmax", "softmax1", "ssmax"),
    "_bayes": ("bayes_point", "bayes_risk", "bayes_route", "log_weight", "posterior"),
    "_population_risk": ("RiskEstimate", "population_risk"),
    "_choices": ("PRUNING_ORDERS",),
    "_config": ("Config", "load_config", "preset_names", "sgd_rule"),
    "_data": ("initial_overlaps", "make_spikes", "overlaps", "sample_sequence", "seed_keys"),
    "_attention_diagnosis": ("AttentionDiagnosis", "diagnose_attention"),
    "_attention_rows": ("logits_from_weights",),
    "_vanishing_attention": ("VanishingAttention", "effective_logit_bound", "vanishing_attention"),
    "_top_n": ("CriticalTopN", "TopN", "context_vector", "critical_top_n", "geometric_separability", "ks_critical_n",
               "representation_distance", "select_top_n", "top_n_diagnostics"),
    "_sensitivity": ("FD_EPSILONS", "finite_difference_sensitivity", "random_directions", "softmax_jacobian",
                     "softmax_jacobian_norm"),
    "_accuracy": ("PointsChoice", "choose_points", "relative_drift_error"),
    "_compilation": ("enable_compilation_cache",),
    "_fields": ("LocalFields", "replicate_rules"),
    "_expectation": ("AbstractExpectation", "AbstractGramTerm"),
    "_sobol_expectation": ("SobolExpectation", "SobolGram"),
    "_laplace_expectation": ("LaplaceExpectation", "LaplaceGram"),
    "_monte_carlo_expectation": ("MonteCarloExpectation",),
    "_routes": ("RouteChoice", "choose_route"),
    "_laplace": ("LaplaceRule", "exact_rule"),
    "_run_folders": ("Run", "add_to_run", "config_hash", "load_npz", "load_run", "save_figure", "save_json", "save_npz",
                     "save_run", "save_simulation", "save_theory"),
    "_numerics": ("psd_sqrt",),
    "_layer": ("finite_loss", "limit_loss", "token_weights"),
    "_ode": ("integrate", "resolve_points"),
    "_progress": ("set_progress",),
    "_starts": ("initial_conditions",),
    "_theory_result": ("TheoryResult",),
    "_fluctuations": ("SDEResult", "integrate_sde"),
    "_priors": ("Prior", "binary", "discrete", "flipped", "gaussian", "spikes"),
    "_simulation": ("simulate",),
    "_simulation_result": ("SimulationResult",),
    "_run_checks": ("warn_if_risk_rose",),
    "_grid": ("Grid", "parse_grid"),
    "_sweep": ("SweepStats", "sweep"),
    "_sweep_dataset": ("load_sweep",),
    "_specs": ("SGD", "Model", "Problem", "Simulation", "Theory"),
    "_sgd_rule": ("AbstractSGDRule", "AbstractVariant", "GradientFlow", "GradientMoments", "LayerParameters", "OnlineSGD"),
    "_sgd_variants": ("LearningRateSchedule", "MiniBatch", "Momentum", "WeightDecay"),
    "_theory": ("OrderParameterODE", "OrderParameters", "WeightedOrderParameters", "r_orth"),
    "_pruning_result": ("PruningResult", "removable_heads"),
    "_pruning": ("TheoryRisk", "WeightsRisk", "finetune", "keep_heads", "prune", "prune_run", "prune_theory",
                 "prune_weights"),
    "_phase_analysis": ("PhaseAnalysis", "analyze"),
    "_plateaus": ("Plateau", "escape_times", "halfway_time", "plateaus"),
    "_head_classes": ("HEAD_CLASSES", "HeadClasses", "classify_heads"),
    "_predictions": ("EscapePrediction", "escape_horizon", "predicted_escape"),
    "_attention_mass": ("attention_mass",),
    "_fixed_point": ("FixedPoint", "unspecialized_point"),
    "_stability": ("Linearization", "escape_mode", "escape_rate", "escape_rate_along", "escape_subspace", "linear_escape_time",
                   "linearize", "predicted_escape_slope", "subspace_amplitude", "unstable_modes"),
}

# What a type checker or an IDE reads (runtime imports stay lazy, above); tests/test_public_api.py checks
# that it names exactly the exports of _EXPORTS.
if TYPE_CHECKING:
    from ._accuracy import PointsChoice as PointsChoice
    from ._accuracy import choose_points as choose_points
    from ._accuracy import relative_drift_error as relative_drift_error
    from ._activations import Activation as Activation
    from ._activations import ExponentialForm as ExponentialForm
    from ._activations import activation_names as activation_names
    from ._activations import bsoftmax as bsoftmax
    from ._activations import exponential_form as exponential_form
    from ._activations import get_activation as get_activation
    from ._activations import register_activation as register_activation
    from ._activations import scalable_softmax as scalable_softmax
    from ._activations import softmax as softmax
    from ._activations import softmax1 as softmax1
    from ._activations import ssmax as ssmax
    from ._attention_diagnosis import AttentionDiagnosis as AttentionDiagnosis
    from ._attention_diagnosis import diagnose_attention as diagnose_attention
    from ._attention_mass import attention_mass as attention_mass
    from ._attention_rows import logits_from_weights as logits_from_weights
    from ._bayes import bayes_point as bayes_point
    from ._bayes import bayes_risk as bayes_risk
    from ._bayes import bayes_route as bayes_route
    from ._bayes import log_weight as log_weight
    from ._bayes import posterior as posterior
    from ._choices import PRUNING_ORDERS as PRUNING_ORDERS
    from ._compilation import enable_compilation_cache as enable_compilation_cache
    from ._config import Config as Config
    from ._config import load_config as load_config
    from ._config import preset_names as preset_names
    from ._config import sgd_rule as sgd_rule
    from ._data import initial_overlaps as initial_overlaps
    from ._data import make_spikes as make_spikes
    from ._data import overlaps as overlaps
    from ._data import sample_sequence as sample_sequence
    from ._data import seed_keys as seed_keys
    from ._expectation import AbstractExpectation as AbstractExpectation
    from ._expectation import AbstractGramTerm as AbstractGramTerm
    from ._fields import LocalFields as LocalFields
    from ._fields import replicate_rules as replicate_rules
    from ._fixed_point import FixedPoint as FixedPoint
    from ._fixed_point import unspecialized_point as unspecialized_point
    from ._fluctuations import SDEResult as SDEResult
    from ._fluctuations import integrate_sde as integrate_sde
    from ._grid import Grid as Grid
    from ._grid import parse_grid as parse_grid
    from ._head_classes import HEAD_CLASSES as HEAD_CLASSES
    from ._head_classes import HeadClasses as HeadClasses
    from ._head_classes import classify_heads as classify_heads
    from ._laplace import LaplaceRule as LaplaceRule
    from ._laplace import exact_rule as exact_rule
    from ._laplace_expectation import LaplaceExpectation as LaplaceExpectation
    from ._laplace_expectation import LaplaceGram as LaplaceGram
    from ._layer import finite_loss as finite_loss
    from ._layer import limit_loss as limit_loss
    from ._layer import token_weights as token_weights
    from ._monte_carlo_expectation import MonteCarloExpectation as MonteCarloExpectation
    from ._numerics import psd_sqrt as psd_sqrt
    from ._ode import integrate as integrate
    from ._ode import resolve_points as resolve_points
    from ._phase_analysis import PhaseAnalysis as PhaseAnalysis
    from ._phase_analysis import analyze as analyze
    from ._plateaus import Plateau as Plateau
    from ._plateaus import escape_times as escape_times
    from ._plateaus import halfway_time as halfway_time
    from ._plateaus import plateaus as plateaus
    from ._population_risk import RiskEstimate as RiskEstimate
    from ._population_risk import population_risk as population_risk
    from ._predictions import EscapePrediction as EscapePrediction
    from ._predictions import escape_horizon as escape_horizon
    from ._predictions import predicted_escape as predicted_escape
    from ._priors import Prior as Prior
    from ._priors import binary as binary
    from ._priors import discrete as discrete
    from ._priors import flipped as flipped
    from ._priors import gaussian as gaussian
    from ._priors import spikes as spikes
    from ._progress import set_progress as set_progress
    from ._pruning import TheoryRisk as TheoryRisk
    from ._pruning import WeightsRisk as WeightsRisk
    from ._pruning import finetune as finetune
    from ._pruning import keep_heads as keep_heads
    from ._pruning import prune as prune
    from ._pruning import prune_run as prune_run
    from ._pruning import prune_theory as prune_theory
    from ._pruning import prune_weights as prune_weights
    from ._pruning_result import PruningResult as PruningResult
    from ._pruning_result import removable_heads as removable_heads
    from ._routes import RouteChoice as RouteChoice
    from ._routes import choose_route as choose_route
    from ._run_checks import warn_if_risk_rose as warn_if_risk_rose
    from ._run_folders import Run as Run
    from ._run_folders import add_to_run as add_to_run
    from ._run_folders import config_hash as config_hash
    from ._run_folders import load_npz as load_npz
    from ._run_folders import load_run as load_run
    from ._run_folders import save_figure as save_figure
    from ._run_folders import save_json as save_json
    from ._run_folders import save_npz as save_npz
    from ._run_folders import save_run as save_run
    from ._run_folders import save_simulation as save_simulation
    from ._run_folders import save_theory as save_theory
    from ._sensitivity import FD_EPSILONS as FD_EPSILONS
    from ._sensitivity import finite_difference_sensitivity as finite_difference_sensitivity
    from ._sensitivity import random_directions as random_directions
    from ._sensitivity import softmax_jacobian as softmax_jacobian
    from ._sensitivity import softmax_jacobian_norm as softmax_jacobian_norm
    from ._sgd_rule import AbstractSGDRule as AbstractSGDRule
    from ._sgd_rule import AbstractVariant as AbstractVariant
    from ._sgd_rule import GradientFlow as GradientFlow
    from ._sgd_rule import GradientMoments as GradientMoments
    from ._sgd_rule import LayerParameters as LayerParameters
    from ._sgd_rule import OnlineSGD as OnlineSGD
    from ._sgd_variants import LearningRateSchedule as LearningRateSchedule
    from ._sgd_variants import MiniBatch as MiniBatch
    from ._sgd_variants import Momentum as Momentum
    from ._sgd_variants import WeightDecay as WeightDecay
    from ._simulation import simulate as simulate
    from ._simulation_result import SimulationResult as SimulationResult
    from ._sobol_expectation import SobolExpectation as SobolExpectation
    from ._sobol_expectation import SobolGram as SobolGram
    from ._specs import SGD as SGD
    from ._specs import Model as Model
    from ._specs import Problem as Problem
    from ._specs import Simulation as Simulation
    from ._specs import Theory as Theory
    from ._stability import Linearization as Linearization
    from ._stability import escape_mode as escape_mode
    from ._stability import escape_rate as escape_rate
    from ._stability import escape_rate_along as escape_rate_along
    from ._stability import escape_subspace as escape_subspace
    from ._stability import linear_escape_time as linear_escape_time
    from ._stability import linearize as linearize
    from ._stability import predicted_escape_slope as predicted_escape_slope
    from ._stability import subspace_amplitude as subspace_amplitude
    from ._stability import unstable_modes as unstable_modes
    from ._starts import initial_conditions as initial_conditions
    from ._sweep import SweepStats as SweepStats
    from ._sweep import sweep as sweep
    from ._sweep_dataset import load_sweep as load_sweep
    from ._theory import OrderParameterODE as OrderParameterODE
    from ._theory import OrderParameters as OrderParameters
    from ._theory import WeightedOrderParameters as WeightedOrderParameters
    from ._theory import r_orth as r_orth
    from ._theory_result import TheoryResult as TheoryResult
    from ._top_n import CriticalTopN as CriticalTopN
    from ._top_n import TopN as TopN
    from ._top_n import context_vector as context_vector
    from ._top_n import critical_top_n as critical_top_n
    from ._top_n import geometric_separability as geometric_separability
    from ._top_n import ks_critical_n as ks_critical_n
    from ._top_n import representation_distance as representation_distance
    from ._top_n import select_top_n as select_top_n
    from ._top_n import top_n_diagnostics as top_n_diagnostics
    from ._vanishing_attention import VanishingAttention as VanishingAttention
    from ._vanishing_attention import effective_logit_bound as effective_logit_bound
    from ._vanishing_attention import vanishing_attention as vanishing_attention

# public name -> (module, name in the module)
_ORIGIN = {public: (module, name) for module, names in _EXPORTS.items()
           for name, _, alias in (entry.partition(" as ") for entry in names) for public in (alias or name,)}

__all__ = sorted(_ORIGIN)


def __getattr__(name: str):
    if name not in _ORIGIN:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _ORIGIN[name]
    value = getattr(importlib.import_module(f".{module}", __name__), attr)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
