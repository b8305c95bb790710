"""What the theory predicts about a configuration before its phases are read: when the heads leave the unspecialized
plateau, how long to integrate to see it, and how much of the attention each head carries (docs/model.md section 5;
docs/phases.md).

**The predicted escape** (:func:`predicted_escape`). The head-symmetric flow
(:func:`~singleloc.analysis._stability.symmetric_path`) is integrated from the ``D -> infinity`` limit of a random start
(``M = 0``, ``R_orth = init_scale^2 I``, ``b = bias_init``) up to ``tau_flow`` (default 1000).

* ``tau_0`` (``tau_plateau``), the time the flow reaches its plateau: the first saved time at
  which the risk has come within ``plateau_fraction = 0.05`` of its whole drop,
  ``R(tau) - R_end <= 0.05 (R(0) - R_end)`` (``R_end`` the risk at the end of the flow).
* ``A(tau)``: the Jacobian of the drift at the symmetric state reached at time ``tau``, restricted to the
  perturbations antisymmetric between two heads (:func:`~singleloc.analysis._stability.symmetric_jacobian`), at
  ``tau = 0`` and ``n_rates - 1 = 15`` times log-spaced from the flow's first saved time to its end; ``lambda(tau)``
  its escape rate (:func:`~singleloc.analysis._stability.escape_rate`), reported as ``path_rate``.
* The predicted escape ``tau_esc`` is the time at which the symmetry-breaking part of a random start,
  ``|(M - mean_h M) P|_F`` (``P``: orthogonal to the prior's mean), grows to 1 under the flow linearised along
  the symmetric path (the tangent-linear model, :func:`~singleloc.analysis._stability.tangent_escape`): from
  the start's covariance (keys ``N(0, init_scale^2 I_D)``: ``M`` entries of variance ``init_scale^2 / D``, the
  ``Q`` entries' differences of order ``init_scale^2 D^{-1/2}``;
  :func:`~singleloc.analysis._stability.start_variances`), by the products of the exponentials of ``A``.
  The reported ``rate`` is the effective rate along the plateau, ``lambda = log(D) / (2 (tau_esc - tau_0))``,
  so that ``tau_esc = tau_0 + log(D) / (2 lambda)`` holds exactly (where the escape comes after ``tau_0``;
  before it, the rate at the last state evaluated).

  It counts the growth and decay on the way down to the plateau and a start whose size grows with the heads
  (``init_scale sqrt((H - 1) F / D)``). On softmax1 with ``F = 3, L = 8`` (rule route, 512 points, four
  ``D = 1000`` starts) it comes 0.75, 0.95 and 0.97 times the median time at which the integrated ODE's
  symmetry-breaking amplitude reaches 1 at ``H = 2, 4, 8``; its amplitude follows the runs' within their
  spread up to about 0.3 at ``H = 2``, where the nonlinear terms slow the growth and the model comes early.

  No unstable symmetry-breaking direction (``H = 1``; ``F = 1`` with a non-zero mean, where
  the only spike is the mean direction; or a rate that stays non-positive) gives
  ``predicted_escape = inf`` and ``rate`` NaN (no mode) or the last, non-positive rate.
  Trained head weights (``model.head_weights = "trained"``) have no head-symmetric flow here:
  every number of the prediction is NaN (not predicted) and the horizon is the ``fallback``. A flow that stops
  as a solve would (:func:`~singleloc.analysis._stability.symmetric_path`: stiff at a learning rate past
  stability, an invalid state) says so in a warning and predicts from the flow up to there (nothing, as for
  trained weights, when it stopped before its first saved time).

**Its rule** (:func:`prediction_setup`). Whatever the run's route, the flow and the rates are on the Sobol rule (the
rule route) of :meth:`~singleloc.configuration._specs.Theory.prediction_points` points: the run's ``theory.points`` on
the rule route (``"auto"`` as the run resolves it; elsewhere the rule route's default, 4096), but at most ``2^18 / (L
H)`` (never fewer than 256). The prediction only chooses the horizon and must land within 1.5x of the measured escape,
not carry the run's accuracy: the rule moves it by 2-8% from the exact route's, inside the model's own spread, at a
fraction of the cost (docs/phases.md, "What the prediction costs").

**The horizon** (:func:`escape_horizon`): ``multiple = 5`` times the predicted escape (the escape of the first
direction: the later directions' escapes and the settling come after it; at 2.5 times the README sweep left its bsoftmax
points with two heads or more unsettled), rounded up to two significant digits and capped at ``cap = 3000``; without a
predicted escape, ``fallback = 300`` (at the default problem the symmetric risk changes by less than ``1e-4`` after tau
= 200). ``singleloc sweep`` and ``singleloc integrate --horizon auto`` integrate each point up to its horizon on a log
grid (:func:`resolve_horizon`)."""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping

import numpy as np

from ..configuration._config import Config, gather_specs
from ..configuration._specs import SGD, Model, Problem, Simulation, Theory
from ..ground._choices import check_horizon
from ..ground._validation import number
from ..preflight._build import Setup, build
from ..runtime._progress import Phase
from ..theory._accuracy import resolve_points
from ..theory._starts import initial_conditions
from ..theory._theory import OrderParameterODE
from ._stability import (
    start_variances,
    symmetric_escape_rate,
    symmetric_jacobian,
    symmetric_path,
    symmetric_start,
    tangent_escape,
)

#: Defaults of the horizon rule (:func:`escape_horizon`).
HORIZON_MULTIPLE = 5.0
HORIZON_CAP = 3000.0
HORIZON_FALLBACK = 300.0

#: Saved times of the symmetric flow: 0 and this many log-spaced from ``tau_flow * 1e-4``.
_PATH_POINTS = 240


@dataclasses.dataclass(frozen=True)
class EscapePrediction:
    """The predicted escape of a configuration (module docstring).

    ``rate``: the effective escape rate along the plateau (NaN without a symmetry-breaking mode);
    ``tau_plateau``: ``tau_0``; ``plateau_risk``: the symmetric flow's risk at its end;
    ``predicted_escape``: the tangent-linear model's escape, ``tau_0 + log(D) / (2 rate)`` (``inf`` without an
    escape); ``horizon``: the integration horizon; ``D``; ``path_tau``, ``path_rate``: the times along the symmetric
    flow where the linearisation was evaluated and its escape rates there.
    """

    rate: float
    tau_plateau: float
    plateau_risk: float
    predicted_escape: float
    horizon: float
    D: int
    path_tau: np.ndarray
    path_rate: np.ndarray

    @property
    def escapes(self) -> bool:
        """Whether an escape is predicted at all."""
        return bool(np.isfinite(self.predicted_escape))

    def arrays(self) -> dict[str, np.ndarray]:
        """The fields as arrays (an entry of the sweep cache)."""
        return {f.name: np.asarray(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_arrays(cls, data) -> EscapePrediction:
        """Inverse of :meth:`arrays`."""
        scalars = {"D": int(data["D"])} | {k: float(data[k]) for k in ("rate", "tau_plateau", "plateau_risk",
                                                                         "predicted_escape", "horizon")}
        return cls(**scalars, path_tau=np.asarray(data["path_tau"], float), path_rate=np.asarray(data["path_rate"], float))


def plateau_time(tau, risk, fraction: float = 0.05) -> float:
    """First ``tau`` at which ``risk - risk[-1] <= fraction * (risk[0] - risk[-1])``: the time
    a decreasing curve reaches its plateau (``tau[0]`` if it does not decrease)."""
    tau, risk = np.asarray(tau, float), np.asarray(risk, float)
    return float(tau[np.argmax(risk - risk[-1] <= fraction * max(risk[0] - risk[-1], 0.0))])


def escape_horizon(predicted: float, *, multiple: float = HORIZON_MULTIPLE, cap: float = HORIZON_CAP,
                   fallback: float = HORIZON_FALLBACK) -> float:
    """The integration horizon of a point: ``multiple * predicted`` rounded up to two significant digits, at most
    ``cap``; ``fallback`` (at most ``cap``) without a predicted escape (``predicted`` NaN, ``+inf`` or 0). A negative
    ``predicted`` is refused (an escape time is ``>= 0``)."""
    multiple, cap, fallback = (number(f"escape_horizon: {name}", value, positive=True)
                               for name, value in (("multiple", multiple), ("cap", cap), ("fallback", fallback)))
    if predicted < 0:
        raise ValueError(f"escape_horizon: predicted must be >= 0 (a time), NaN or inf (no escape predicted), got {predicted}")
    if not np.isfinite(predicted):
        return float(min(cap, fallback))
    x = min(multiple * float(predicted), cap)  # an overflow to inf is the cap
    if x == 0:
        return float(min(cap, fallback))
    unit = 10.0 ** (math.floor(math.log10(x)) - 1)
    return float(min(cap, math.ceil(round(x / unit, 9)) * unit))


def predicted_escape(config: Config | Setup | None = None, *, problem: Problem | None = None, model: Model | None = None,
                     sgd: SGD | None = None, theory: Theory | None = None, simulation: Simulation | None = None,
                     multiple: float = HORIZON_MULTIPLE, cap: float = HORIZON_CAP,
                     fallback: float = HORIZON_FALLBACK, tau_flow: float = 1000.0, plateau_fraction: float = 0.05,
                     n_rates: int = 16, method: str = "finite-difference") -> EscapePrediction:
    """The predicted escape from the unspecialized plateau and the integration horizon of ``config`` (module docstring)
    on its rule (:func:`prediction_setup`). ``method``: the Jacobian's, as in :func:`~singleloc.analysis._stability.linearize`;
    central differences by default, one program, the drift's, which the symmetric start needs anyway (its ``Q`` has
    repeated eigenvalues), within about 1e-10 of autodiff, which would compile a second. Jacobians are evaluated in
    time order and only until the tangent-linear amplitude reaches 1. The run is a
    :class:`~singleloc.preflight._build.Setup`, ``config`` or the specifications by keyword (``simulation``: the
    dimension ``D`` of the escape)."""
    if not isinstance(config, Setup):
        config = gather_specs("predicted_escape", config, problem=problem, model=model, sgd=sgd, theory=theory,
                              simulation=simulation)
    nan, empty = math.nan, np.zeros(0)
    not_predicted = EscapePrediction(rate=nan, tau_plateau=nan, plateau_risk=nan, predicted_escape=nan,
                                     horizon=escape_horizon(nan, multiple=multiple, cap=cap, fallback=fallback),
                                     D=config.simulation.D, path_tau=empty, path_rate=empty)
    if not config.model.weighting.head_average:  # no head-symmetric flow of the weighted layer: no prediction
        return not_predicted
    H, F, D = config.model.heads, config.problem.F, config.simulation.D
    setup = prediction_setup(config if isinstance(config, Setup) else build(config))
    ode, mean = OrderParameterODE.from_setup(setup), setup.prior.mean()
    x0 = symmetric_start(H, F, setup.sgd.init_scale, setup.model.bias_init)
    ts = np.concatenate([[0.0], np.geomspace(tau_flow * 1e-4, tau_flow, _PATH_POINTS)])
    with Phase((f"following the head-symmetric flow of {H} heads to tau = {tau_flow:g} (Sobol rule, "
                f"{setup.theory.points} points; then at most {n_rates} linearizations along it)",
                "followed the head-symmetric flow")):
        xs, risk, stop = symmetric_path(ode, x0, H, F, ts, rtol=setup.theory.rtol, atol=setup.theory.atol)
    ts = ts[:len(risk)]  # the saved times the flow reached
    if stop is not None:
        warnings.warn(f"{stop}; the escape is predicted from the flow up to there" if len(ts) > 1 else
                      f"{stop}; no escape predicted (the horizon is {not_predicted.horizon:g})", stacklevel=2)
        if len(ts) <= 1:
            return not_predicted
    tau_0 = plateau_time(ts, risk, plateau_fraction)
    path_tau, path_rate, jacobians, tau_esc = [], [], [], math.inf
    if H > 1:
        variances = start_variances(H, F, setup.sgd.init_scale, D, bool(ode.train_bias))
        along = np.unique(np.concatenate([[0], np.searchsorted(ts, np.geomspace(ts[1], ts[-1], n_rates - 1) * (1 - 1e-12))]))
        for k, i in enumerate(along):  # until the tangent-linear amplitude reaches 1: "k of at most n"
            path_tau.append(float(ts[i]))
            jacobians.append(symmetric_jacobian(ode, xs[i], H, F, method=method,
                                                count=f"{k + 1} of at most {len(along)} along the flow"))
            path_rate.append(symmetric_escape_rate(ode, xs[i], H, F, mean=mean, jacobian=jacobians[-1]))
            tau_esc, amplitude = tangent_escape(path_tau, jacobians, variances, H, F, mean=mean)
            if amplitude[-1] >= 1.0:
                break
    rate = math.nan if not np.isfinite(path_rate).any() else float(np.asarray(path_rate)[np.isfinite(path_rate)][-1])
    if np.isfinite(tau_esc) and tau_esc > tau_0:  # the effective rate along the plateau (module docstring)
        rate = 0.5 * math.log(D) / (tau_esc - tau_0)
    return EscapePrediction(rate=rate, tau_plateau=tau_0, plateau_risk=float(risk[-1]), predicted_escape=tau_esc,
                            horizon=escape_horizon(tau_esc, multiple=multiple, cap=cap, fallback=fallback), D=D,
                            path_tau=np.asarray(path_tau, float), path_rate=np.asarray(path_rate, float))


def prediction_setup(setup: Setup) -> Setup:
    """The numerics of the escape prediction of a run built as ``setup`` (module docstring, "Its rule"): the rule
    route (its own Gram term) at :meth:`~singleloc.configuration._specs.Theory.prediction_points` of the run's points
    on the rule route (``"auto"`` as the run resolves it, :func:`~singleloc.resolve_points`), of the rule route's
    default count on another (whose ``theory.points`` is its own: the exact route resolves ``"auto"`` to as few as 64)."""
    points = resolve_points(setup).theory.points if setup.route.on_sobol_rule else None
    return setup.on_rule_route(setup.theory.prediction_points(setup.problem.L, setup.heads, points))


def compute_prediction(setup: Setup) -> dict[str, np.ndarray]:
    """The predicted escape and horizon (:func:`predicted_escape`) of a run built as ``setup``, as arrays; with
    ``theory.points = "auto"`` also the ``points`` chosen once for the point at the initial overlaps of every seed
    (:func:`~singleloc.resolve_points`), which the point's theory then uses (:func:`resolve_horizon`)."""
    if setup.theory.points != "auto":
        return predicted_escape(setup).arrays()
    setup = resolve_points(setup, initial_conditions(setup.config))
    return predicted_escape(setup).arrays() | {"points": np.asarray(setup.theory.points)}


#: Least number of saved times of a point integrated to a predicted or given horizon.
HORIZON_N_SAVE = 201


def resolve_horizon(run: Config | Setup, prediction: Mapping[str, np.ndarray] | None, horizon: str | float = "auto"
                    ) -> Config | Setup:
    """The configuration (or the setup) a point is integrated with (module docstring): ``theory.points = "auto"``
    replaced by the number its ``prediction`` entry chose (:func:`compute_prediction`); then ``"auto"``: up to the
    prediction's horizon; a number: up to it; both on a log grid of ``max(sgd.n_save, HORIZON_N_SAVE)`` times;
    ``"config"``: the horizon and grid of ``run``."""
    check_horizon(horizon)
    keys = {}
    if run.theory.points == "auto" and prediction is not None and "points" in prediction:
        keys["theory"] = {"points": int(prediction["points"])}
    if horizon != "config":
        tau_max = float(prediction["horizon"]) if horizon == "auto" else float(horizon)
        keys["sgd"] = {"tau_max": tau_max, "spacing": "log", "n_save": max(run.sgd.n_save, HORIZON_N_SAVE)}
    return run.replace(**keys)
