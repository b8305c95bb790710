"""Frozen, validated specifications: what is learned, by what layer, with what SGD.

Each section of a config file is one of these dataclasses, with the same key names: ``[problem]`` -> :class:`Problem`,
``[model]`` -> :class:`Model`, ``[sgd]`` -> :class:`SGD`, ``[simulation]`` -> :class:`Simulation`, ``[theory]`` ->
:class:`Theory`. Construction validates every value and raises ``ValueError`` naming the offending ``section.key``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..ground._choices import GRAM_ROUTES, ROUTES, RULE_AXES, SCHEDULES
from ..ground._extensions import import_reference, is_reference
from ..ground._validation import INT32_MAX, SEED_MAX, integer, number, representable
from ..model._activations import get_activation
from ..model._priors import PRIOR_FACTORIES, Prior, check_prior
from ..sgd._head_weighting import HEAD_WEIGHTINGS, AbstractHeadWeighting

#: Largest ``|model.bias_init|``: float32 (the simulation's precision) spaces numbers near 1000 by
#: 6e-5, so O(1) scores keep four digits beside the bias; near 1e30 they vanish entirely.
BIAS_MAX = 1000.0


#: ``theory.gram_points = "auto"``: at most this many points, and nodes of at most ``GRAM_NODE_BUDGET`` fields
#: (``points * L * H``; the rank-aware rule's nodes hold twice as many numbers, 64 MB), so that long sequences keep
#: the cost and memory of ``theory.points`` (:meth:`Theory.gram_rule_points`).
GRAM_POINTS_MAX = 16384
GRAM_NODE_BUDGET = 2**22

#: An escape prediction on the rule route: nodes of at most this many fields (``points * L * H``;
#: :meth:`Theory.prediction_points`).
PREDICTION_NODE_BUDGET = 2**18
#: The theory keys of a run moved onto the Sobol rule (the escape prediction's numerics, ``"auto"``'s way on where the
#: exact route's rule no longer resolves the fields): the exact route's Gram keys reset, as the rule takes its own.
ON_THE_RULE = {"route": "rule", "gram": "auto", "gram_points": "auto"}

def _fitting_points(budget: int, L: int, H: int) -> int:
    """The largest power of two of points whose nodes over ``L * H`` fields take at most ``budget`` numbers (1 at least)."""
    return 1 << max(int(budget // (L * H)).bit_length() - 1, 0)


#: Most Sobol points of a rule (``theory.points``, ``theory.gram_points``): its ``2 points`` nodes are
#: counted in 32 bits (:data:`~singleloc.ground._validation.INT32_MAX`).
SOBOL_POINTS_MAX = 2**30

#: Smallest ``theory.rtol``: the relative spacing of float64 numbers.
RTOL_MIN = float(np.finfo(np.float64).eps)


def _fail(section: str, key: str, message: str):
    raise ValueError(f"{section}.{key}: {message}")


def _count(section: str, key: str, value: Any, minimum: int, example: int) -> int:
    """A count that sizes or indexes arrays: an integer in ``[minimum, INT32_MAX]``
    (:data:`~singleloc.ground._validation.INT32_MAX`, JAX's integer without its x64 mode); ``example`` is
    suggested when it is refused."""
    return integer(f"{section}.{key}", value, minimum, INT32_MAX, example=example)


def _real(section: str, key: str, value: Any, example: float, *, squared: bool = False, **sign: bool) -> float:
    """A finite float (``sign``: ``positive`` or ``nonneg``) in the range of float64 (its square too, ``squared``);
    ``example`` is suggested when it is refused. The simulation's float32 is checked where it runs."""
    name = f"{section}.{key}"
    value = number(name, value, example=example, **sign)
    representable(name, value, "float64", squared=squared, example=example)
    return value


def _sobol_points(section: str, key: str, value: Any) -> int | str:
    """A number of Sobol points (a power of two, at least 16) or ``"auto"``."""
    if value == "auto":
        return value
    if isinstance(value, str):
        _fail(section, key, f"must be a power of two or 'auto', got {value!r}; e.g. {section}.{key} = 4096")
    pts = integer(f"{section}.{key}", value, 16, SOBOL_POINTS_MAX, example=4096)
    if pts & (pts - 1):
        _fail(section, key, f"must be a power of two (Sobol points) or 'auto', got {pts}; e.g. {section}.{key} = "
                            f"{1 << (pts.bit_length() - 1)}")
    return pts


def _bool(section: str, key: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        _fail(section, key, f"must be true or false, got {value!r}; e.g. {section}.{key} = false")
    return bool(value)


def _matrix(section: str, key: str, value: Any, ndim: int | tuple[int, ...]):
    """A table of the prior (``problem.support``, ``probs``, ``mean``, ``cov``): numeric, of ``ndim``
    dimensions, finite, and small enough that the prior's moments are float64 numbers."""
    default = f"; e.g. leave {section}.{key} out (its default: {MATRIX_DEFAULTS[key]})"
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        _fail(section, key, f"must be numeric, got {value!r}{default}")
    ndims = (ndim,) if isinstance(ndim, int) else ndim
    if arr.ndim not in ndims:
        _fail(section, key, f"must have {' or '.join(map(str, ndims))} dimension(s), got shape {arr.shape}{default}")
    if not np.all(np.isfinite(arr)):
        _fail(section, key, f"must be finite{default}")
    top = float(np.finfo(np.float64).max) ** (0.5 if key in ("support", "mean") else 1.0)  # the theory squares atoms
    if arr.size and np.max(np.abs(arr)) > top:
        _fail(section, key, f"has entries up to {np.max(np.abs(arr)):.3g}, out of range: the prior's moments must be float64 "
                            f"numbers, so its entries must be at most {top:.3g} in magnitude{default}")
    return arr.tolist()


#: The defaults of the prior's optional tables, for the messages (:class:`Problem`).
MATRIX_DEFAULTS = {"support": "strength * I_F", "probs": "uniform", "mean": "0", "cov": "strength^2 I_F"}


@dataclasses.dataclass(frozen=True)
class Problem:
    """The data (docs/model.md section 1): sequence length, spikes, and the prior of ``theta``.

    ``prior`` is a name (``spikes``, ``flipped``, ``binary``, ``discrete``, ``gaussian``) whose parameters are the other
    keys, a reference ``"package.module:function"`` to a function ``problem -> Prior``
    (:mod:`~singleloc.ground._extensions`; it reads the keys it needs from this section), or a :class:`~singleloc.Prior`
    object. Defaults of the optional keys: ``discrete`` takes ``support = strength * I_F`` and uniform ``probs``;
    ``gaussian`` takes ``mean = 0`` and ``cov = strength^2 I_F`` (isotropic).
    """

    L: int = 4
    F: int = 2
    prior: str | Prior = "spikes"
    strength: float = 2.5
    p: float = 0.5
    support: list | None = None
    probs: list | None = None
    mean: list | None = None
    cov: Any = None

    def __post_init__(self):
        s = "problem"
        object.__setattr__(self, "L", _count(s, "L", self.L, 2, 4))
        object.__setattr__(self, "F", _count(s, "F", self.F, 1, 2))
        object.__setattr__(self, "strength", _real(s, "strength", self.strength, 2.5, squared=True, positive=True))
        object.__setattr__(self, "p", number(f"{s}.p", self.p, example=0.5))
        if not 0.0 < self.p < 1.0:
            _fail(s, "p", f"must lie in (0, 1), got {self.p!r}; e.g. problem.p = 0.5")
        for key, nd in (("support", 2), ("probs", 1), ("mean", 1), ("cov", (0, 1, 2))):
            if getattr(self, key) is not None:
                object.__setattr__(self, key, _matrix(s, key, getattr(self, key), nd))
        if isinstance(self.prior, Prior):
            if self.prior.F != self.F:
                _fail(s, "F", f"is {self.F} but the prior object has F = {self.prior.F}; e.g. problem.F = {self.prior.F}")
        elif not isinstance(self.prior, str):
            _fail(s, "prior", f"must be a prior name ({', '.join(PRIOR_FACTORIES)}) or a Prior, got {self.prior!r}")
        elif self.prior not in PRIOR_FACTORIES and not is_reference(self.prior):
            _fail(s, "prior", f"unknown prior {self.prior!r} (known: {', '.join(PRIOR_FACTORIES)}, or a reference "
                              "'package.module:function' to a function problem -> Prior)")
        prior = self.build_prior()
        if prior.F != self.F:
            _fail(s, "F", f"is {self.F} but the {prior.name} prior's parameters have dimension {prior.F}; "
                          f"e.g. problem.F = {prior.F}")

    def build_prior(self) -> Prior:
        """The :class:`Prior` this problem describes."""
        if isinstance(self.prior, Prior):
            return self.prior
        if is_reference(self.prior):  # a user's factory, problem -> Prior (configuration._extensions, ._user_code)
            prior = import_reference(self.prior, "problem.prior")(self)
            check_prior(prior, self.prior)
            return prior
        try:
            return PRIOR_FACTORIES[self.prior](self)  # a named prior of this section's keys (singleloc.model._priors)
        except ValueError as err:
            msg = str(err)
            raise ValueError(msg if msg.startswith("problem.") else f"problem.prior: {msg}") from None


@dataclasses.dataclass(frozen=True)
class Model:
    """The predictor (docs/model.md section 2): ``heads`` keys, an activation, optional biases.

    ``head_weights``: how the layer mixes its heads, ``a_l = sum_h v_h A_hl``, by the name of its head weighting
    (:attr:`weighting`): ``"uniform"`` (the default), ``v_h = 1/H`` fixed, the head average; ``"trained"``: ``v`` starts
    at ``1/H`` and learns by SGD like the biases, ``v <- v - (lr / D) dl/dv`` (docs/model.md section 11.5).
    """

    heads: int = 2
    activation: str = "softmax"
    train_bias: bool = False
    bias_init: float = 0.0
    head_weights: str = "uniform"

    def __post_init__(self):
        s = "model"
        object.__setattr__(self, "heads", _count(s, "heads", self.heads, 1, 2))
        if not isinstance(self.activation, str):
            _fail(s, "activation", f"must be a name, got {self.activation!r}")
        get_activation(self.activation)  # raises "model.activation: unknown ..."
        object.__setattr__(self, "train_bias", _bool(s, "train_bias", self.train_bias))
        object.__setattr__(self, "bias_init", number(f"{s}.bias_init", self.bias_init, example=0.0))
        if abs(self.bias_init) > BIAS_MAX:
            _fail(s, "bias_init", f"must lie in [-{BIAS_MAX:g}, {BIAS_MAX:g}], got {self.bias_init:g}: the scores are O(1) "
                  "and the simulation runs in float32, whose spacing near a larger bias erases them; e.g. model.bias_init = 0")
        if self.head_weights not in HEAD_WEIGHTINGS:
            _fail(s, "head_weights", f"must be one of {', '.join(map(repr, HEAD_WEIGHTINGS))}, got {self.head_weights!r}")

    @property
    def weighting(self) -> AbstractHeadWeighting:
        """The head weighting named by ``head_weights`` (:class:`~singleloc.UniformHeads`,
        :class:`~singleloc.TrainedHeads`)."""
        return HEAD_WEIGHTINGS[self.head_weights]()


@dataclasses.dataclass(frozen=True)
class SGD:
    """Online SGD (docs/model.md sections 5 and 11) and the grid of saved times ``tau``.

    Time is ``tau = (sequences seen) / D``: ``t B / D`` after ``t`` steps of ``batch = B`` sequences (``t / D`` for the
    default ``B = 1``), so that runs of different batch sizes at one ``tau`` have seen the same data.

    ``spacing = "linear"`` saves at ``linspace(0, tau_max, n_save)``; ``"log"`` saves at ``tau = 0`` and ``n_save - 1``
    points log-spaced from ``tau_max / 1000`` to ``tau_max``.

    Training variants (docs/model.md section 11; the defaults are plain online SGD):

    * ``batch``: ``B`` fresh sequences per step, the step follows their mean gradient;
    * ``weight_decay``, ``bias_decay``: the L2 penalty ``(wd / 2) tr Q + (bd / 2) |b|^2`` added to
      the loss, so ``k_h <- k_h - lr (grad + (wd / D) k_h)`` and ``b_h <- b_h - (lr / D) (grad +
      bd b_h)``; ``bias_decay`` needs ``model.train_bias``;
    * ``schedule``: the learning rate ``lr(tau) = lr w(tau) s(tau)`` with the warm-up ramp
      ``w = min(1, tau / warmup_tau)`` (``1`` when ``warmup_tau = 0``) and ``s``: ``"constant"``
      1; ``"step"`` ``decay_factor ** floor(tau / schedule_tau)``; ``"cosine"`` from 1 to
      ``decay_factor`` along half a cosine over ``[0, schedule_tau]``, then ``decay_factor``;
      ``"inverse"`` ``1 / (1 + tau / schedule_tau)``; ``"warmup"`` 1 after the ramp (it needs
      ``warmup_tau > 0``);
    * ``gradient_flow``: the ODE without its ``lr^2`` term (the limit ``lr -> 0`` in the time
      ``lr tau``); it has no finite-D simulation;
    * ``momentum``: heavy-ball momentum ``beta`` in ``[0, 1)``, a velocity ``u <- beta u + grad`` per
      parameter and the step along it; its ODE and SDE are plain SGD's at the rate ``lr / (1 - beta)``
      (``None``, the default, is plain SGD and is not written to ``config.json``).

    :func:`~singleloc.sgd_rule` turns the section into the SGD rule.
    """

    lr: float = 0.5
    init_scale: float = 0.5
    tau_max: float = 30.0
    n_save: int = 61
    spacing: str = "linear"
    batch: int = 1
    weight_decay: float = 0.0
    bias_decay: float = 0.0
    schedule: str = "constant"
    schedule_tau: float = 10.0
    decay_factor: float = 0.1
    warmup_tau: float = 0.0
    gradient_flow: bool = False
    momentum: float | None = None

    def __post_init__(self):
        s = "sgd"
        object.__setattr__(self, "lr", _real(s, "lr", self.lr, 0.5, squared=True, positive=True))
        object.__setattr__(self, "init_scale", _real(s, "init_scale", self.init_scale, 0.5, squared=True, nonneg=True))
        object.__setattr__(self, "tau_max", _real(s, "tau_max", self.tau_max, 30.0, positive=True))
        object.__setattr__(self, "n_save", _count(s, "n_save", self.n_save, 2, 61))
        if self.spacing not in ("linear", "log"):
            _fail(s, "spacing", f"must be 'linear' or 'log', got {self.spacing!r}")
        object.__setattr__(self, "batch", _count(s, "batch", self.batch, 1, 1))
        object.__setattr__(self, "weight_decay", _real(s, "weight_decay", self.weight_decay, 0.0, squared=True, nonneg=True))
        object.__setattr__(self, "bias_decay", _real(s, "bias_decay", self.bias_decay, 0.0, squared=True, nonneg=True))
        if self.schedule not in SCHEDULES:
            _fail(s, "schedule", f"must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        object.__setattr__(self, "schedule_tau", _real(s, "schedule_tau", self.schedule_tau, 10.0, positive=True))
        object.__setattr__(self, "decay_factor", _real(s, "decay_factor", self.decay_factor, 0.1, nonneg=True))
        if self.decay_factor > 1:
            _fail(s, "decay_factor", f"must lie in [0, 1] (the rate's factor at each drop, or at the end of the cosine), "
                  f"got {self.decay_factor!r}; e.g. sgd.decay_factor = 0.1")
        object.__setattr__(self, "warmup_tau", _real(s, "warmup_tau", self.warmup_tau, 1.0, nonneg=True))
        if self.schedule == "warmup" and self.warmup_tau == 0:
            _fail(s, "warmup_tau", "must be > 0 with sgd.schedule = 'warmup' (the length of the linear ramp of the rate); "
                  "e.g. sgd.warmup_tau = 1")
        object.__setattr__(self, "gradient_flow", _bool(s, "gradient_flow", self.gradient_flow))
        if self.momentum is not None:  # None (the default, plain SGD) stays out of config.json and the hashes
            object.__setattr__(self, "momentum", number(f"{s}.momentum", self.momentum, nonneg=True, below=1.0))

    @property
    def rate(self) -> float:
        """The rate per sequence at the start, ``lr / batch``, over ``1 - momentum`` with momentum (the time
        estimates' and the step budget's measure of how fast the ODE moves)."""
        return self.lr / self.batch / (1.0 - (self.momentum or 0.0))

    def step_keys(self) -> str:
        """The keys that set the step, for a divergence message: ``"sgd.lr (now 0.5)"``, with momentum
        ``"sgd.momentum (now 0.999: the rate lr / (1 - momentum) = 500) or sgd.lr (now 0.5)"``."""
        lr = f"sgd.lr (now {self.lr:g})"
        if not self.momentum:
            return lr
        return f"sgd.momentum (now {self.momentum:g}: the rate lr / (1 - momentum) = {self.lr / (1 - self.momentum):.3g}) or {lr}"

    def save_times(self) -> np.ndarray:
        """The requested saved times (before rounding to whole SGD steps)."""
        if self.spacing == "linear":
            return np.linspace(0.0, self.tau_max, self.n_save)
        if self.n_save == 2:  # geomspace of one point gives its start, tau_max / 1000: the grid ends at tau_max
            return np.array([0.0, self.tau_max])
        return np.concatenate([[0.0], np.geomspace(self.tau_max * 1e-3, self.tau_max, self.n_save - 1)])


@dataclasses.dataclass(frozen=True)
class Simulation:
    """Finite-D simulation: dimension, number of seeds, base seed, test-set size."""

    D: int = 1000
    seeds: int = 4
    seed: int = 0
    test_samples: int = 4096

    def __post_init__(self):
        s = "simulation"
        object.__setattr__(self, "D", integer(f"{s}.D", self.D, 1, example=1000))  # a dimension only: int64 (XLA's shapes)
        object.__setattr__(self, "seeds", _count(s, "seeds", self.seeds, 1, 4))
        object.__setattr__(self, "seed", integer(f"{s}.seed", self.seed, 0, SEED_MAX, example=0))
        object.__setattr__(self, "test_samples", _count(s, "test_samples", self.test_samples, 1, 4096))


@dataclasses.dataclass(frozen=True)
class Theory:
    """Numerics of the order-parameter ODE.

    ``points``: number of scrambled-Sobol quadrature points over the Gaussian local fields (a power of two; the rule
    also uses their antithetic mirrors), or ``"auto"``: the smallest power of two whose estimated relative drift error
    at the start is at most ``tol`` with a margin (see :func:`~singleloc.choose_points`; the choice is stored with the
    result). ``replicates``: ``R`` independent scramblings (seeds ``qmc_seed + r``), each driving its own trajectory;
    the result is their mean, with standard errors (``R = 1``: one rule, no error estimate). ``rtol``/``atol``: the
    tolerances of diffrax's adaptive step-size controller. ``qmc_seed``: the scrambling seed, fixed so that the rule is
    deterministic.

    ``route``: how the risk and the ``O(lr)`` drift are computed. ``"auto"`` (default): exactly
    (:mod:`~singleloc.expectations._laplace`, the Laplace form of the normaliser) when the activation is a normalised
    exponential (softmax, softmax1, bsoftmax, ssmax), else by the Sobol rule, and for a joint layer (bsoftmax) only
    while its exact rule is affordable (:data:`~singleloc.expectations._routes.JOINT_EXACT_MAX`: up to ``H = 4`` heads
    with one or two spikes, ``H = 3`` with three or four; the exact rule's work grows like a power of ``H``);
    ``"exact"``: the exact route whatever its cost (within memory), and an error for any other activation; ``"rule"``:
    the Sobol rule for everything. ``gram``: the ``lr^2`` (Gram) term on the exact route: ``"exact"`` in the Laplace
    form (:mod:`~singleloc.expectations._laplace_gram`; one head, or two heads of a per-head layer, with the head
    average; else an error), ``"sobol"`` on the rank-aware Sobol rule (unwhitened: unbiased), ``"montecarlo"`` by plain
    Monte Carlo with its standard error (:mod:`~singleloc.expectations._monte_carlo_gram`; any layer), ``"auto"``
    (default) exactly where it costs less than the Sobol rule: one head, and two heads of a per-head layer from ``L * H
    >= 64`` on (at ``L = 4`` the exact term doubles a solve's time); else the rule. The rule route has the Gram term on
    its own rule, the Monte Carlo route (``route = "montecarlo"``) by its own draws: a ``gram`` other than ``"auto"``
    and that one is refused there. ``nodes``: the normal rule of the exact route's token expectations (``2 nodes``
    trapezoidal nodes of its Laplace variable, ``nodes`` per unit of the activation's scale for a pair's first field and
    for the tables of its second field's conditional expectations). ``gram_points``: the Sobol points of the exact
    route's Gram term (its rank-aware rule; the antithetic pairs of the Monte Carlo term), a power of two or ``"auto"``
    (:meth:`gram_rule_points`). ``axes``: the coordinates of the rule route's Sobol rule
    (:class:`~singleloc.LocalFields`; docs/model.md section 4.4). ``"heads"`` (default): ``g_l = w_l Q^{1/2}`` on a rule
    closed under the cyclic shifts of the heads: continuous in ``Q`` everywhere and exactly equivariant under those
    shifts, which the analyses at head-symmetric states need (fixed points, their Jacobians, escape predictions).
    ``"principal"`` (rank-aware; for trajectories whose heads become copies): fields ``g_l = w_l S`` with the rank-aware
    factor ``S`` (2H, H) of ``Q`` (:mod:`~singleloc.expectations._fields`), so that (near) copies put their variance on
    the leading coordinates: several to tens of times less risk and drift error at the same points
    (``benchmarks/07_rank_aware_rule.py``); exactly equivariant only where every principal direction is determined.
    """

    points: int | str = 4096
    rtol: float = 1e-6
    atol: float = 1e-8
    qmc_seed: int = 0
    replicates: int = 1
    tol: float = 1e-3
    route: str = "auto"
    nodes: int = 64
    gram_points: int | str = "auto"
    gram: str = "auto"
    axes: str = "heads"

    def __post_init__(self):
        s = "theory"
        if self.axes not in RULE_AXES:
            _fail(s, "axes", f"must be one of {', '.join(RULE_AXES)}, got {self.axes!r}")
        if self.gram not in GRAM_ROUTES:
            _fail(s, "gram", f"must be one of {', '.join(GRAM_ROUTES)}, got {self.gram!r}")
        object.__setattr__(self, "gram_points", _sobol_points(s, "gram_points", self.gram_points))
        if self.route not in ROUTES:
            _fail(s, "route", f"must be one of {', '.join(ROUTES)}, got {self.route!r}")
        object.__setattr__(self, "nodes", integer(f"{s}.nodes", self.nodes, 8, 1024, example=64))
        object.__setattr__(self, "points", _sobol_points(s, "points", self.points))
        object.__setattr__(self, "rtol", number(f"{s}.rtol", self.rtol, positive=True, example=1e-6))
        if self.rtol < RTOL_MIN:
            _fail(s, "rtol", f"must be >= {RTOL_MIN!r} (the relative spacing of float64 numbers), got {self.rtol!r}; "
                             "e.g. theory.rtol = 1e-12")
        object.__setattr__(self, "atol", _real(s, "atol", self.atol, 1e-8, positive=True))
        object.__setattr__(self, "qmc_seed", integer(f"{s}.qmc_seed", self.qmc_seed, 0, SEED_MAX, example=0))
        object.__setattr__(self, "replicates", _count(s, "replicates", self.replicates, 1, 1))
        object.__setattr__(self, "tol", _real(s, "tol", self.tol, 1e-3, positive=True))

    def gram_rule_points(self, L: int, H: int, points: int) -> int:
        """The Sobol points of the exact route's Gram term for ``L`` tokens, ``H`` heads and the resolved
        ``theory.points``: ``gram_points``, or for ``"auto"`` the largest power of two up to :data:`GRAM_POINTS_MAX`
        whose nodes over ``L * H`` fields take at most :data:`GRAM_NODE_BUDGET` numbers, and never fewer than
        ``points``. The Gram term is the drift's only Sobol integral there and costs a fraction of the exact gradient,
        so it gets more points than the rule route's default: at the default problem (L = 4, H = 2, tau = 300) its
        stated relative error falls from 6.4e-3 at 4096 points to 1.0e-3 at 16384, and the final risk moves by 1.2e-5
        between them (by 9e-7 from 16384 to 65536)."""
        if self.gram_points != "auto":
            return int(self.gram_points)
        return max(int(points), min(GRAM_POINTS_MAX, _fitting_points(GRAM_NODE_BUDGET, L, H)))

    def prediction_points(self, L: int, H: int, points: int | None) -> int:
        """The Sobol points of an escape prediction's rule on the rule route
        (:func:`~singleloc.analysis._predictions.predicted_escape`) for ``L`` tokens, ``H`` heads and ``points``, the
        run's resolved ``theory.points`` on the rule route (``None`` on another, whose points are its own: the rule
        route's default, 4096), but at most the largest power of two whose nodes over ``L * H`` fields are
        at most :data:`PREDICTION_NODE_BUDGET` (never fewer than 256), so that the prediction costs a fraction of
        the run's solve where the rule is large (docs/phases.md, "What the prediction costs")."""
        points = type(self)().points if points is None else points
        return min(int(points), max(256, _fitting_points(PREDICTION_NODE_BUDGET, L, H)))

    @property
    def rank_aware(self) -> bool:
        """Whether the rule route draws its fields on the rank-aware layout (``axes = "principal"``:
        ``2 L H`` Sobol coordinates, :meth:`~singleloc.LocalFields.make`)."""
        return self.axes == "principal"

    @property
    def evaluation_seed(self) -> int:
        """Scrambling seed of the rule that evaluates the risk of a trained state (of replicate
        ``r``: ``evaluation_seed + r``): independent of the rules that drove the dynamics
        (seeds ``qmc_seed .. qmc_seed + replicates - 1``), whose errors a trained state fits."""
        return self.qmc_seed + self.replicates
