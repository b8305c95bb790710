"""Online SGD: the one rule behind the simulator, the ODE and the SDE (docs/model.md sections 5, 11).

Step ``t`` (time ``tau = t / D``) of plain online SGD draws one fresh sequence and updates the keys and biases,

    k_h <- k_h - lr grad_{k_h} l_D,        b_h <- b_h - (lr / D) dl_D/db_h   (when biases train),

:meth:`OnlineSGD.step`, the finite-D update the simulator applies. In order parameters
(docs/model.md section 5.2) the step changes ``(M, Q, b)`` by ``U / D`` with, to leading order
in ``1/D``,

    U = ( -lr sum_l c_l nu_l^T,   -lr sum_l (c_l g_l^T + g_l c_l^T) + lr^2 sum_l c_l c_l^T,   -lr sum_l c_l )

(``c = dl_inf/ds`` (H, L) the gradient of the limit loss at the scores, ``g`` (L, H) the head
fields and ``nu`` (L, F) the spike fields of the sequence; the ``lr^2`` term is the Gram matrix
of the step): :meth:`OnlineSGD.update`, one sequence's update. Over ``d tau`` there are
``D d tau`` independent steps, so the order parameters follow

    drift = E[U]            (:meth:`OnlineSGD.drift`, the ODE's vector field),
    Sigma = Cov(U)          (:meth:`OnlineSGD.update_covariance`, the SDE's),

``Sigma`` being the per-step update covariance times ``D^2`` (the diffusion per unit time is
``Sigma / D``). ``U`` is linear in the products ``c nu^T``, ``c g^T``, ``c``, ``c c^T``, so the
drift is the same map applied to their field averages, :class:`GradientMoments`, which the ODE
computes on either route (the Sobol rule, or the exact risk's gradient plus the rule's Gram
term: :meth:`~singleloc.OrderParameterODE.gradient_moments`).

Every view takes the time ``tau`` (``learning_rate(tau)``, the schedule's rate), so that the
ODE, the SDE and the simulator see the same rate at the same time.

Training variants (docs/model.md section 11) are fields of the one rule, read by
:func:`sgd_rule` from the ``sgd`` section, and they compose; each enters the views it changes:

* ``batch = B``: a step follows the mean gradient of ``B`` fresh sequences, and time counts
  sequences, ``tau = t B / D``. To leading order in ``1/D`` the gradients of different
  sequences of a batch do not interact (their cross Gram terms are ``O(D^{-1/2})`` and average
  out), so a step is ``B`` steps of one sequence at the rate per sequence ``r = lr / B``
  (:meth:`OnlineSGD.rate`): ``U``, its mean and its covariance are those above at ``r``;
* ``weight_decay = wd``, ``bias_decay = bd``: the penalty ``(wd / 2) tr Q + (bd / 2) |b|^2`` on
  the loss (the risk's scale), so ``k <- k - lr (grad + (wd / D) k)``, ``b <- b - (lr / D)
  (grad + bd b)``, and ``U`` gains ``(-r wd M, -2 r wd Q, -r bd b)``;
* ``schedule``: :class:`LearningRateSchedule`, the factor of ``learning_rate(tau)``;
* ``gradient_flow``: ``U`` without its ``r^2`` term and no covariance: the limit ``lr -> 0`` in
  the time ``lr tau``, the gradient flow of the (penalised) population risk;
* ``train_head_weights`` (``model.head_weights = "trained"``): the head weights ``v`` of ``a_l =
  sum_h v_h A_hl`` step like the biases, ``v <- v - (lr / D) dl/dv``, so ``U`` gains the block
  ``-r dl/dv`` and the state is :class:`WeightedOrderParameters` (no ``r^2`` term: ``v`` moves by
  ``O(1/D)`` per step, docs/model.md section 11.5). The SDE does not take this variant.

The simulator (:mod:`~singleloc._simulation`), the ODE (:mod:`~singleloc._theory`) and the
SDE (:mod:`~singleloc._fluctuations`) call the rule and nothing else, so the cross-checks (the
SDE's covariance against single SGD steps, ``tests/test_fluctuations.py``; the ODE against the
simulation, ``tests/test_simulation.py``, ``tests/test_training_variants.py``) test every
variant.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from ._config import Config, require_config


class OrderParameters(NamedTuple):
    """``M`` (H, F) head-spike overlaps, ``Q`` (H, H) head-head overlaps, ``b`` (H,) biases."""

    M: jax.Array
    Q: jax.Array
    b: jax.Array


class WeightedOrderParameters(NamedTuple):
    """The state of a layer with trained head weights (``model.head_weights = "trained"``,
    docs/model.md section 11.5): :class:`OrderParameters` and the head weights ``v`` (H,) of
    ``a_l = sum_h v_h A_hl``, an ``O(1)`` vector like the biases."""

    M: jax.Array
    Q: jax.Array
    b: jax.Array
    v: jax.Array


def flat_drift(drift: OrderParameters) -> jax.Array:
    """All entries of ``(dM, dQ, db)`` (and ``dv`` with trained head weights; leading batch axes
    kept) as one vector."""
    return jnp.concatenate([jnp.reshape(x, (*x.shape[: x.ndim - k], -1)) for x, k in zip(drift, (2, 2, 1, 1))], axis=-1)


class GradientMoments(NamedTuple):
    """Field averages of the limit loss's gradient ``c`` (H, L) that the drift of online SGD is made
    of: ``cnu = E[sum_l c_l nu_l^T]`` (H, F), ``cg = E[sum_l c_l g_l^T]`` (H, H), ``c =
    E[sum_l c_l]`` (H,) and ``cc = E[sum_l c_l c_l^T]`` (H, H); with trained head weights ``v``,
    ``cv = E[dl/dv]`` (H,) (``None`` otherwise). For one sequence (no average) they are the
    products themselves."""

    cnu: jax.Array
    cg: jax.Array
    c: jax.Array
    cc: jax.Array
    cv: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class LearningRateSchedule:
    """The learning rate's factor ``w(tau) s(tau)`` of ``sgd.schedule`` (the SGD spec's docstring
    gives each ``kind``): ``tau`` is ``sgd.schedule_tau``, ``factor`` ``sgd.decay_factor`` and
    ``warmup`` ``sgd.warmup_tau``. Hashable (a static part of the rule: a schedule's programs are
    its own)."""

    kind: str = "constant"
    tau: float = 10.0
    factor: float = 0.1
    warmup: float = 0.0

    @property
    def constant(self) -> bool:
        """Whether the rate is constant (``lr`` itself, untouched, is then the rate)."""
        return self.kind in ("constant", "warmup") and self.warmup == 0

    def __call__(self, lr, tau):
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


class OnlineSGD(eqx.Module):
    """Online SGD (module docstring): plain, one fresh sequence per step at the constant
    learning rate ``lr``, by default; ``train_bias``: whether the biases follow their gradient.

    The variants are fields, which compose (docs/model.md section 11): ``batch`` ``B`` sequences
    per step (mean gradient; time counts sequences, ``tau = t B / D``), ``weight_decay`` and
    ``bias_decay`` (the penalty ``(wd / 2) tr Q + (bd / 2) |b|^2`` on the loss), ``schedule``
    (:class:`LearningRateSchedule`) and ``gradient_flow`` (no ``lr^2`` term). They are static:
    a variant's programs are its own, while ODEs that differ only in ``lr`` share theirs.

    ``lr`` is a float for the simulator (its update then rounds as ``k - lr * g`` in the keys'
    precision) and an array in :class:`~singleloc.OrderParameterODE` (a value its compiled
    programs receive).
    """

    lr: float | jax.Array
    train_bias: bool = eqx.field(static=True, default=False)
    batch: int = eqx.field(static=True, default=1)
    weight_decay: float = eqx.field(static=True, default=0.0)
    bias_decay: float = eqx.field(static=True, default=0.0)
    schedule: LearningRateSchedule = eqx.field(static=True, default=LearningRateSchedule())
    gradient_flow: bool = eqx.field(static=True, default=False)
    train_head_weights: bool = eqx.field(static=True, default=False)

    def learning_rate(self, tau) -> float | jax.Array:
        """The learning rate of a step at time ``tau``: ``lr w(tau) s(tau)`` (``lr`` when the
        schedule is constant)."""
        return self.schedule(self.lr, tau)

    def rate(self, tau) -> float | jax.Array:
        """The rate per sequence, ``learning_rate(tau) / batch``: a step of ``B`` sequences moves
        the order parameters as ``B`` steps of one sequence at this rate (docs/model.md section 11.1)."""
        lr = self.learning_rate(tau)
        return lr if self.batch == 1 else lr / self.batch

    def step(self, tau, K: jax.Array, b: jax.Array, gK: jax.Array, gb: jax.Array, D: int, v: jax.Array | None = None,
             gv: jax.Array | None = None) -> tuple[jax.Array, ...]:
        """The finite-D step at time ``tau``: the keys ``K`` (H, D) and biases ``b`` (H,) after one
        step whose loss ``l_D`` (the mean over the batch) has the gradients ``gK``, ``gb``:
        ``K - lr (gK + (wd / D) K)`` and ``b - (lr / D) (gb + bd b)`` (``b`` when the biases do not
        train), in the keys' precision. With trained head weights, ``v`` (H,) and its gradient
        ``gv`` too: ``(K, b, v - (lr / D) gv)``."""
        if self.gradient_flow:
            raise ValueError("sgd.gradient_flow = true has no finite-D step (it is the limit lr -> 0 in the time lr tau)")
        lr = self.learning_rate(tau)
        if not self.schedule.constant:
            lr = jnp.asarray(lr, K.dtype)
        if self.weight_decay:
            gK = gK + (self.weight_decay / D) * K
        K = K - lr * gK
        if self.train_bias:
            if self.bias_decay:
                gb = gb + self.bias_decay * b
            b = b - (lr / D) * gb
        return (K, b) if v is None else (K, b, v - (lr / D) * gv)

    def update(self, tau, M, Q, b, c: jax.Array, g: jax.Array, nu: jax.Array) -> OrderParameters:
        """``U``, ``D`` times the change of ``(M, Q, b)`` by one sequence at time ``tau`` (one step
        of batch 1; ``1 / B`` of a step of ``B``), with loss gradient ``c`` (H, L), head fields
        ``g`` (L, H) and spike fields ``nu`` (L, F), at the state ``(M, Q, b)`` (module docstring
        at the rate per sequence :meth:`rate`, with the decay; the ``b`` block is 0 when the biases
        do not train)."""
        return self._increment(tau, GradientMoments(c @ nu, c @ g, jnp.sum(c, axis=1), c @ c.T), M, Q, b)

    def drift(self, tau, M, Q, b, moments: GradientMoments) -> OrderParameters | WeightedOrderParameters:
        """``E[U] = (dM, dQ, db) / dtau`` at time ``tau`` and state ``(M, Q, b)`` from the field
        averages ``moments`` (docs/model.md sections 5.3 and 11; ``dQ`` symmetrised, ``db = 0``
        unless the biases train); with trained head weights also ``dv / dtau = -r E[dl/dv]``."""
        d = self._increment(tau, moments, M, Q, b)
        return d._replace(Q=(d.Q + d.Q.T) / 2)

    def update_covariance(self, tau, mean: jax.Array, second: jax.Array, cc: jax.Array, xi: jax.Array) -> jax.Array:
        """``Sigma = Cov(U)`` (n, n) at time ``tau`` over the flattened coordinates
        (:func:`~singleloc._theory.flatten_state`), from the averages ``mean = E[U]`` and
        ``second = E[U U^T]`` of :meth:`update` taken with ``nu`` at its conditional mean given the
        head fields, ``cc = E[sum_l c_l c_l^T]`` (H, H) and ``xi`` (F, F), the conditional
        covariance of ``nu``: its part of ``U``, ``-r sum_l c_l xi_l^T`` at the rate per sequence
        ``r``, adds ``r^2 cc (x) xi`` to the ``M`` block (docs/model.md section 5.8). Sequences are
        independent, also within a batch, so this is the covariance per sequence of any batch.
        0 for gradient flow (its noise vanishes in the limit, docs/model.md section 11.4)."""
        if self.gradient_flow:
            return jnp.zeros_like(second)
        r = self.rate(tau)
        n_M = cc.shape[0] * xi.shape[0]
        cov = second - jnp.outer(mean, mean)
        return cov.at[:n_M, :n_M].add(r**2 * jnp.kron(cc, xi))

    def _increment(self, tau, m: GradientMoments, M, Q, b) -> OrderParameters | WeightedOrderParameters:
        """``U`` as the linear map of the products (or of their averages) ``m``, plus the decay."""
        r = self.rate(tau)
        d = self._keys_and_biases(r, m, M, Q, b)
        if not self.train_head_weights:
            return d
        if m.cv is None:
            raise ValueError("model.head_weights = 'trained': this computation gives no head weights v (it is written for "
                             "the head average: the linearisation, the head-symmetric flow, the SDE); pass the state's v "
                             "(OrderParameterODE.drift(M, Q, b, tau, v=v)) or set model.head_weights = 'uniform'")
        return WeightedOrderParameters(*d, -r * m.cv)

    def _keys_and_biases(self, r, m: GradientMoments, M, Q, b) -> OrderParameters:
        """The ``(M, Q, b)`` blocks of ``U`` at the rate per sequence ``r``."""
        dM = -r * m.cnu
        dQ = -r * (m.cg + m.cg.T)
        if not self.gradient_flow:
            dQ = dQ + r**2 * m.cc
        if self.weight_decay:
            dM = dM - (r * self.weight_decay) * M
            dQ = dQ - (2 * r * self.weight_decay) * Q
        if not self.train_bias:
            return OrderParameters(dM, dQ, jnp.zeros_like(b))
        db = -r * m.c
        if self.bias_decay:
            db = db - (r * self.bias_decay) * b
        return OrderParameters(dM, dQ, db)


def sgd_rule(config: Config) -> OnlineSGD:
    """The SGD rule of a configuration: :class:`OnlineSGD` at ``sgd.lr``, the biases training
    with ``model.train_bias``, the head weights with ``model.head_weights``, and the variants of
    the ``sgd`` section; ``sgd.bias_decay`` without trained biases is a ``ValueError``."""
    require_config(config, "sgd_rule")
    sgd, train_bias = config.sgd, config.model.train_bias
    if sgd.bias_decay and not train_bias:
        raise ValueError(f"sgd.bias_decay = {sgd.bias_decay:g} acts on trained biases only; set model.train_bias = true "
                         "or sgd.bias_decay = 0")
    schedule = LearningRateSchedule(sgd.schedule, sgd.schedule_tau, sgd.decay_factor, sgd.warmup_tau)
    return OnlineSGD(sgd.lr, train_bias, sgd.batch, sgd.weight_decay, sgd.bias_decay, schedule, sgd.gradient_flow,
                     config.model.trained_head_weights)
