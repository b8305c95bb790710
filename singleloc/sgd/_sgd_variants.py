"""Training variants: the pieces of an SGD rule's chain (docs/model.md section 11).

A rule (:class:`~singleloc.OnlineSGD`, :class:`~singleloc.GradientFlow`) applies its pieces to the loss gradient in
order, as optax's ``chain`` does, and each piece enters only the views it changes
(:class:`~singleloc.sgd._sgd_rule.AbstractVariant`): the step size, the sequences per step, the rate of what passes
through it, its finite-D state and direction, its deterministic terms of ``U``. Writing a variant is writing one such
piece; a stateful one declares its state in ``init`` and threads it in ``direction``, and the simulator carries it
without knowing it. :func:`~singleloc.sgd_rule` (:mod:`~singleloc.preflight._build`) builds the chain of a config in the
order ``LearningRateSchedule, MiniBatch, WeightDecay, Momentum``.

* :class:`MiniBatch` ``B``: a step follows the mean gradient of ``B`` fresh sequences, and time
  counts sequences, ``tau = t B / D``. To leading order in ``1/D`` the gradients of different
  sequences of a batch do not interact (their cross Gram terms are ``O(D^{-1/2})`` and average
  out), so a step is ``B`` steps of one sequence at the rate per sequence ``r = lr / B``: ``U``,
  its mean and its covariance are those of one sequence at ``r`` (docs/model.md section 11.1).
* :class:`WeightDecay` ``wd``, ``bd``: the penalty ``(wd / 2) tr Q + (bd / 2) |b|^2`` on the loss
  (the risk's scale), so ``k <- k - lr (grad + (wd / D) k)``, ``b <- b - (lr / D) (grad + bd b)``,
  and ``U`` gains ``(-r wd M, -2 r wd Q, -r bd b)`` (section 11.2).
* :class:`LearningRateSchedule`: the factor ``w(tau) s(tau)`` of the step size (section 11.3).
* :class:`Momentum` ``beta`` (heavy ball): a velocity ``u`` per parameter, ``u <- beta u + d``,
  the step along ``u``; its online limit is plain SGD at the rate ``r / (1 - beta)`` (below,
  section 11.6).

Momentum's online limit. With ``u(0) = 0`` the keys after ``T`` steps are ``k_T = k_0 - lr sum_s g_s (1 - beta^(T - s))
/ (1 - beta)``: each gradient ``g_s`` moves the keys by its geometric echo, ``-lr g_s / (1 - beta)`` in total, spread
over ``O(1 / (1 - beta))`` steps, which at fixed ``beta`` is ``O(1)`` steps while ``tau`` advances by ``1/D`` per step.
The terms of ``U`` linear in the gradient are then plain SGD's at ``lr / (1 - beta)``: the echo lands within ``O(1 / ((1
- beta) D))`` of ``tau`` of the state the gradient was taken at (an ``O(1/D)`` correction). The Gram term: per step ``D
dQ = -lr (k u^T + u k^T) + lr^2 u u^T`` with ``u = sum_s beta^(t - s) g_s``; the terms quadratic in one sequence's
gradient, summed over the steps ``t >= s`` its echo lasts, are ``lr^2 g_s g_s^T / (1 - beta^2)`` from ``u u^T`` and ``2
lr^2 g_s g_s^T beta / ((1 - beta)(1 - beta^2))`` from ``k_t`` (which holds ``-lr g_s (1 - beta^(t - s)) / (1 - beta)``
of the echo) against ``u``; their sum is ``lr^2 g_s g_s^T / (1 - beta)^2``, the Gram term of one step at ``lr / (1 -
beta)``. Products of two different sequences' gradients have mean ``O(1/D)`` and zero-mean fluctuations ``O(D^{-1/2})``
(section 11.1), and an echo overlaps ``O(1 / (1 - beta))`` others, so they vanish as ``D -> oo``. Each sequence's total
update is therefore that of plain SGD at ``lr / (1 - beta)``, independent of the others: the ODE and the SDE are plain
SGD's at the effective rate ``r / (1 - beta)`` (:meth:`Momentum.rate`), the decay terms (which enter the velocity with
the gradient) included. It needs ``(1 - beta) D >> 1``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from equinox import field

from ..ground._choices import SCHEDULES
from ..ground._validation import integer, number
from ._sgd_rule import AbstractVariant, LayerParameters, OrderParameters


class LearningRateSchedule(AbstractVariant):
    """The step size's factor ``w(tau) s(tau)`` of ``sgd.schedule`` (the SGD spec's docstring
    gives each ``kind``): ``tau`` is ``sgd.schedule_tau``, ``factor`` ``sgd.decay_factor`` and
    ``warmup`` ``sgd.warmup_tau``. Static (a schedule's programs are its own)."""

    kind: str = field(static=True, default="constant")
    tau: float = field(static=True, default=10.0)
    factor: float = field(static=True, default=0.1)
    warmup: float = field(static=True, default=0.0)

    def __check_init__(self):
        if self.kind not in SCHEDULES:
            raise ValueError(f"LearningRateSchedule: kind must be one of {', '.join(SCHEDULES)}, got {self.kind!r}")
        number("LearningRateSchedule: tau", self.tau, positive=True)
        if not 0 <= self.factor <= 1:
            raise ValueError(f"LearningRateSchedule: factor must lie in [0, 1], got {self.factor!r}")
        number("LearningRateSchedule: warmup", self.warmup, nonneg=True)

    @property
    def constant(self) -> bool:
        """Whether the rate is constant (``lr`` itself, untouched, is then the rate)."""
        return self.kind in ("constant", "warmup") and self.warmup == 0

    def learning_rate(self, lr, tau):
        """``lr w(tau) s(tau)``; ``lr`` itself when the schedule is constant."""
        if self.constant:
            return lr
        tau = jnp.asarray(tau)
        if self.kind == "step":
            s = self.factor ** jnp.floor(tau / self.tau)
        elif self.kind == "cosine":
            s = self.factor + (1 - self.factor) * (1 + jnp.cos(jnp.pi * jnp.clip(tau / self.tau, 0.0, 1.0))) / 2
        elif self.kind == "inverse":
            s = 1 / (1 + tau / self.tau)
        else:  # constant or warmup
            s = jnp.ones_like(tau)
        if self.warmup > 0:
            s = s * jnp.clip(tau / self.warmup, 0.0, 1.0)
        return lr * s


class MiniBatch(AbstractVariant):
    """``size`` fresh sequences per step, the step along their mean gradient: the rate per sequence
    is the step size over ``size`` (the rule's ``rate`` divides by the product of its batches)."""

    size: int = field(static=True)

    def __check_init__(self):
        integer("MiniBatch: size", self.size, 1)

    def sequences(self) -> int:
        return self.size


class WeightDecay(AbstractVariant):
    """The penalty ``(weight_decay / 2) tr Q + (bias_decay / 2) |b|^2`` on the loss: the direction
    gains ``((weight_decay / D) K, bias_decay b)`` (the biases' decay acts when they train), ``U``
    gains ``(-r wd M, -2 r wd Q, -r bd b)`` at the rate ``r`` of its place (module docstring)."""

    weight_decay: float = field(static=True, default=0.0)
    bias_decay: float = field(static=True, default=0.0)

    def __check_init__(self):
        number("WeightDecay: weight_decay", self.weight_decay, nonneg=True)
        number("WeightDecay: bias_decay", self.bias_decay, nonneg=True)

    def direction(self, params: LayerParameters, grads: LayerParameters, state, D: int) -> tuple[LayerParameters, None]:
        gK, gb = grads.K, grads.b
        if self.weight_decay:
            gK = gK + (self.weight_decay / D) * params.K
        if self.bias_decay:
            gb = gb + self.bias_decay * params.b
        return grads._replace(K=gK, b=gb), state

    def increment(self, r, d: OrderParameters, M, Q, b) -> OrderParameters:
        dM, dQ, db = d.M, d.Q, d.b
        if self.weight_decay:
            dM = dM - (r * self.weight_decay) * M
            dQ = dQ - (2 * r * self.weight_decay) * Q
        if self.bias_decay:
            db = db - (r * self.bias_decay) * b
        return d._replace(M=dM, Q=dQ, b=db)


class Momentum(AbstractVariant):
    """Heavy-ball momentum ``beta`` in ``[0, 1)`` (``sgd.momentum``, the ``mu`` of docs/model.md section 11.6): a
    velocity ``u`` per parameter (its state, zero at the start), ``u <- beta u + d`` with ``d`` the direction of the
    pieces before (the gradient, and the decay when it comes first), and the step along ``u`` (so ``k <- k - lr u``, ``b
    <- b - (lr / D) u_b``). Its online limit is plain SGD at ``r / (1 - beta)`` (module docstring)."""

    beta: float = field(static=True)

    def __check_init__(self):
        number("Momentum: beta", self.beta, nonneg=True, below=1.0)

    def rate(self, r):
        """A direction that enters the velocity moves the state by its echo, ``1 / (1 - beta)`` times."""
        return r / (1 - self.beta)

    def init(self, params: LayerParameters) -> LayerParameters:
        """The velocity, zero (``None`` where the layer has no head weights)."""
        return jax.tree.map(jnp.zeros_like, params)

    def direction(self, params: LayerParameters, grads: LayerParameters, velocity: LayerParameters, D: int
                  ) -> tuple[LayerParameters, LayerParameters]:
        velocity = jax.tree.map(lambda u, g: self.beta * u + g, velocity, grads)
        return velocity, velocity
