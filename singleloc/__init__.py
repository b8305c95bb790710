"""singleloc: multi-head attention in the high-dimensional single-location model.

Exact order-parameter dynamics (an ODE for ``(M, Q, b)`` whose drift JAX derives from the
loss), finite-D online SGD simulations, the Bayes-optimal baseline, pruning and the
normalization diagnostics. The conventions are those of ``MODEL.md``.
"""

__version__ = "0.1.0"

from ._activations import (
    Activation,
    activation_names,
    bsoftmax,
    get_activation,
    register_activation,
    softmax,
    softmax1,
)
from ._bayes import RiskEstimate, bayes_point, bayes_risk, log_weight, population_risk, posterior
from ._config import Config, load_config, preset_names
from ._data import initial_overlaps, make_spikes, sample_sequence, seed_keys
from ._diagnose import AttentionDiagnosis, diagnose_attention
from ._diagnostics import (
    CriticalTopN,
    TopN,
    VanishingAttention,
    context_vector,
    critical_top_n,
    effective_logit_bound,
    geometric_separability,
    ks_critical_n,
    logits_from_weights,
    representation_distance,
    select_top_n,
    top_n_diagnostics,
    vanishing_attention,
)
from ._sensitivity import FD_EPSILONS, finite_difference_sensitivity, random_directions, softmax_jacobian, softmax_jacobian_norm
from ._activations import scalable_softmax, ssmax
from ._fields import LocalFields
from ._numerics import psd_sqrt
from ._layer import finite_loss, limit_loss, token_weights
from ._ode import TheoryResult, initial_conditions, integrate
from ._priors import Prior, binary, discrete, flipped, gaussian, spikes
from ._simulation import SimulationResult, simulate
from ._specs import SGD, Model, Problem, Simulation, Theory
from ._theory import OrderParameterODE, OrderParameters, r_orth
from ._pruning import ORDERS as PRUNING_ORDERS, PruningResult, TheoryRisk, WeightsRisk, finetune, keep_heads, prune, prune_theory, prune_weights, removable_heads
from ._phases import PhaseAnalysis, analyze, escape_rate, linearize, unspecialized_point
