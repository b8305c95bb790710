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
import os

from ._version import __version__ as __version__

# Before any module imports equinox: its runtime checks as NaN, not host callbacks, so that
# compiled programs can be cached across processes (singleloc._compilation).
os.environ.setdefault("EQX_ON_ERROR", "nan")

# The public API: private module -> the names it exports ("NAME as PUBLIC" renames).
_EXPORTS = {
    "_activations": ("Activation", "ExponentialForm", "activation_names", "bsoftmax", "exponential_form", "get_activation",
                     "register_activation", "scalable_softmax", "softmax", "softmax1", "ssmax"),
    "_bayes": ("RiskEstimate", "bayes_point", "bayes_risk", "log_weight", "population_risk", "posterior"),
    "_config": ("Config", "load_config", "preset_names"),
    "_data": ("initial_overlaps", "make_spikes", "overlaps", "sample_sequence", "seed_keys"),
    "_diagnose": ("AttentionDiagnosis", "diagnose_attention"),
    "_diagnostics": ("CriticalTopN", "TopN", "VanishingAttention", "context_vector", "critical_top_n", "effective_logit_bound",
                     "geometric_separability", "ks_critical_n", "logits_from_weights", "representation_distance", "select_top_n",
                     "top_n_diagnostics", "vanishing_attention"),
    "_sensitivity": ("FD_EPSILONS", "finite_difference_sensitivity", "random_directions", "softmax_jacobian",
                     "softmax_jacobian_norm"),
    "_accuracy": ("PointsChoice", "choose_points", "relative_drift_error"),
    "_compilation": ("enable_compilation_cache",),
    "_fields": ("LocalFields", "replicate_rules"),
    "_laplace": ("LaplaceRule", "exact_rule"),
    "_io": ("Run", "add_to_run", "config_hash", "load_npz", "load_run", "save_figure", "save_json", "save_npz", "save_run"),
    "_numerics": ("psd_sqrt",),
    "_layer": ("finite_loss", "limit_loss", "token_weights"),
    "_ode": ("TheoryResult", "initial_conditions", "integrate", "resolve_points"),
    "_fluctuations": ("SDEResult", "integrate_sde"),
    "_priors": ("Prior", "binary", "discrete", "flipped", "gaussian", "spikes"),
    "_simulation": ("SimulationResult", "simulate"),
    "_grid": ("Grid", "parse_grid"),
    "_sweep": ("SweepStats", "sweep"),
    "_sweep_dataset": ("load_sweep",),
    "_specs": ("SGD", "Model", "Problem", "Simulation", "Theory"),
    "_sgd_rule": ("GradientMoments", "OnlineSGD", "sgd_rule"),
    "_theory": ("OrderParameterODE", "OrderParameters", "r_orth"),
    "_pruning": ("ORDERS as PRUNING_ORDERS", "PruningResult", "TheoryRisk", "WeightsRisk", "finetune", "keep_heads", "prune",
                 "prune_theory", "prune_weights", "removable_heads"),
    "_phase_analysis": ("HEAD_CLASSES", "HeadClasses", "PhaseAnalysis", "Plateau", "analyze", "classify_heads", "escape_times",
                        "halfway_time", "plateaus"),
    "_predictions": ("EscapePrediction", "escape_horizon", "head_weights", "predicted_escape"),
    "_stability": ("FixedPoint", "Linearization", "escape_mode", "escape_rate", "escape_rate_along", "escape_subspace",
                   "linear_escape_time", "linearize", "predicted_escape_slope", "subspace_amplitude", "unspecialized_point",
                   "unstable_modes"),
}

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
