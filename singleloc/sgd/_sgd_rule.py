"""Online SGD: the one rule behind the simulator, the ODE and the SDE (docs/model.md sections 5, 11).

Step ``t`` (time ``tau = t / D``) of plain online SGD draws one fresh sequence and updates the keys and biases,

    k_h <- k_h - lr grad_{k_h} l_D,        b_h <- b_h - (lr / D) dl_D/db_h   (when biases train),

:meth:`AbstractSGDRule.step`, the finite-D update the simulator applies. In order parameters (docs/model.md section 5.2)
the step changes ``(M, Q, b)`` by ``U / D`` with, to leading order in ``1/D``,

    U = ( -lr sum_l c_l nu_l^T,   -lr sum_l (c_l g_l^T + g_l c_l^T) + lr^2 sum_l c_l c_l^T,   -lr sum_l c_l )

(``c = dl_inf/ds`` (H, L) the gradient of the limit loss at the scores, ``g`` (L, H) the head fields and ``nu`` (L, F)
the spike fields of the sequence; the ``lr^2`` term is the Gram matrix of the step): :meth:`AbstractSGDRule.update`, one
sequence's update. Over ``d tau`` there are ``D d tau`` independent steps, so the order parameters follow

    drift = E[U]            (:meth:`AbstractSGDRule.drift`, the ODE's vector field),
    Sigma = Cov(U)          (:meth:`AbstractSGDRule.update_covariance`, the SDE's),

``Sigma`` being the per-step update covariance times ``D^2`` (the diffusion per unit time is ``Sigma / D``). ``U`` is
linear in the products ``c nu^T``, ``c g^T``, ``c``, ``c c^T``, so the drift is the same map applied to their field
averages, :class:`GradientMoments`, which the ODE computes on either route (the Sobol rule, or the exact risk's gradient
plus the rule's Gram term: :meth:`~singleloc.OrderParameterODE.gradient_moments`).

The interface. :class:`AbstractSGDRule` is the seam (``init_state``/``step`` are optax's ``init``/``update``); every
view takes the time ``tau``, so that the ODE, the SDE and the simulator see the same rate at the same time. Two rules
implement it: :class:`OnlineSGD` and its noiseless limit :class:`GradientFlow` (docs/model.md section 11.4: no ``lr^2``
term, no covariance, no finite-D step). What trains is the rule's: the keys always, the biases with ``train_bias``, and
the head weights ``v`` of ``a_l = sum_h v_h A_hl`` as its ``weighting`` says (:mod:`~singleloc.sgd._head_weighting`,
``U`` then gaining the block ``-r dl/dv``), which declares the ODE's state (:attr:`AbstractSGDRule.State`).

Variants. A rule holds a chain of :class:`AbstractVariant` pieces (:mod:`~singleloc.sgd._sgd_variants`), applied in
order to the gradient as optax's ``chain`` applies its transformations; a piece is identity in every hook except those
it overrides. A term a piece adds to the gradient is carried by the pieces after it, so it moves the state at the rate
of its place in the chain (:meth:`AbstractSGDRule.rates`): weight decay before momentum is the coupled decay whose ODE
runs at the momentum's effective rate, after it the decoupled one.

The simulator, the ODE and the SDE call the rule and nothing else, so their cross-checks test every variant.
"""

from __future__ import annotations

import abc
import math
from typing import Annotated, Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import ArrayLike, Real

from ..ground._arguments import check_fields
from ..ground._validation import number
from ._head_weighting import AbstractHeadWeighting, OrderParameters, UniformHeads

#: A start given to the public functions: ``(M0, Q0, b0)`` or ``(M0, Q0, b0, v0)`` as arrays (their leading axes: checked later).
Starts = Annotated[tuple[Real[ArrayLike, "... H F"], Real[ArrayLike, "... H H"], Real[ArrayLike, "... H"]]
                   | tuple[Real[ArrayLike, "... H F"], Real[ArrayLike, "... H H"], Real[ArrayLike, "... H"],
                           Real[ArrayLike, "... H"]],
                   "the starts (M0, Q0, b0) (or (M0, Q0, b0, v0)) as arrays, e.g. singleloc.initial_conditions(config, 1)"]


def flat_drift(drift: OrderParameters) -> jax.Array:
    """All entries of ``(dM, dQ, db)`` (and of the head weighting's per-head parts, e.g. ``dv``; leading
    batch axes kept) as one vector."""
    ks = (2, 2, *(1,) * (len(drift) - 2))
    return jnp.concatenate([jnp.reshape(x, (*x.shape[: x.ndim - k], -1)) for x, k in zip(drift, ks)], axis=-1)


class GradientMoments(NamedTuple):
    """Field averages of the limit loss's gradient ``c`` (H, L) that the drift of online SGD is made of:
    ``cnu = E[sum_l c_l nu_l^T]`` (H, F), ``cg = E[sum_l c_l g_l^T]`` (H, H), ``c = E[sum_l c_l]`` (H,) and
    ``cc = E[sum_l c_l c_l^T]`` (H, H); with trained head weights ``v``, ``cv = E[dl/dv]`` (H,) (``None``
    otherwise). For one sequence (no average) they are the products themselves."""

    cnu: jax.Array
    cg: jax.Array
    c: jax.Array
    cc: jax.Array
    cv: jax.Array | None = None


class LayerParameters(NamedTuple):
    """The parameters of the finite-D layer that SGD moves: the keys ``K`` (H, D), the biases ``b``
    (H,) and the head weights ``v`` (H,) (``None``: the head average, a layer without them). A
    gradient of the loss has the same structure."""

    K: jax.Array
    b: jax.Array
    v: jax.Array | None = None


class AbstractVariant(eqx.Module):
    """A piece of an SGD rule's chain (module docstring; the pieces are in :mod:`~singleloc.sgd._sgd_variants`). Every
    hook is the identity here; a piece overrides those it changes, and declares its finite-D state in :meth:`init`."""

    __post_init__ = check_fields  # its fields' types, before each piece's __check_init__ checks their ranges

    def learning_rate(self, lr, tau):
        """The step size at time ``tau`` given the step size ``lr`` of the pieces before."""
        return lr

    def sequences(self) -> int:
        """Fresh sequences a finite-D step draws (the step follows their mean gradient)."""
        return 1

    def rate(self, r):
        """The rate per sequence at which what enters this piece moves the order parameters, ``r``
        being that of what leaves it (a velocity's echo multiplies it)."""
        return r

    def init(self, params: LayerParameters) -> Any:
        """This piece's finite-D state at the start (``None``: it has none)."""
        return None

    def direction(self, params: LayerParameters, grads: LayerParameters, state: Any, D: int) -> tuple[LayerParameters, Any]:
        """The finite-D step's direction after this piece, and its next state, given the direction
        ``grads`` of the pieces before at the parameters ``params``."""
        return grads, state

    def increment(self, r, d: OrderParameters, M, Q, b) -> OrderParameters:
        """``U`` with this piece's deterministic terms at ``(M, Q, b)``, ``r`` the rate of its place
        in the chain (:meth:`AbstractSGDRule.rates`)."""
        return d


class AbstractSGDRule(eqx.Module):
    """An SGD rule: one object for the simulator's step, the ODE's drift and the SDE's update covariance (module
    docstring). A concrete rule holds ``lr``, what trains (``train_bias``, the head ``weighting``) and its chain of
    ``variants``, and implements :meth:`step`, :meth:`increment` and :meth:`update_covariance`."""

    lr: eqx.AbstractVar[float | jax.Array]
    train_bias: eqx.AbstractVar[bool]
    variants: eqx.AbstractVar[tuple[AbstractVariant, ...]]
    weighting: eqx.AbstractVar[AbstractHeadWeighting]

    def __check_init__(self):
        check_fields(self)
        if not isinstance(self.lr, jax.Array):  # a traced rate is checked where it is concrete
            number(f"{type(self).__name__}: lr", self.lr, positive=True)

    @property
    def State(self) -> type:
        """The type of the ODE's state: ``(M, Q, b)`` and the head weighting's own parts
        (:class:`~singleloc.OrderParameters` for the head average)."""
        return self.weighting.State

    def learning_rate(self, tau) -> float | jax.Array:
        """The step size of a finite-D step at time ``tau``: ``lr`` through the chain's schedules
        (``lr`` itself when there are none)."""
        lr = self.lr
        for piece in self.variants:
            lr = piece.learning_rate(lr, tau)
        return lr

    @property
    def batch(self) -> int:
        """Fresh sequences per finite-D step (``B``; time counts sequences, ``tau = t B / D``)."""
        return math.prod(piece.sequences() for piece in self.variants)

    def rates(self, tau) -> tuple[list, float | jax.Array]:
        """``(per_piece, r)``: the rate per sequence at which a term added to the gradient at each piece's place
        moves the order parameters, and that of the loss gradient itself, ``r =`` :meth:`rate`. A step moves by
        ``learning_rate(tau)`` times its direction and a unit of time holds ``B`` sequences per step, so what
        leaves the chain moves at ``learning_rate(tau) / B``; each piece maps the rate of what leaves it to that of
        what enters it (:meth:`AbstractVariant.rate`)."""
        B, r = self.batch, self.learning_rate(tau)
        r = r if B == 1 else r / B
        per_piece = []
        for piece in reversed(self.variants):
            per_piece.append(r)
            r = piece.rate(r)
        return per_piece[::-1], r

    def rate(self, tau) -> float | jax.Array:
        """The rate per sequence at time ``tau``: one sequence's gradient moves the order parameters as a step of
        plain online SGD at this rate (``learning_rate(tau) / B``, divided by ``1 - beta`` with momentum;
        docs/model.md section 11)."""
        return self.rates(tau)[1]

    def init_state(self, params: LayerParameters) -> tuple:
        """The rule's finite-D state at the parameters ``params``: one entry per piece of the chain
        (:meth:`AbstractVariant.init`; ``None`` for a piece without state), threaded by :meth:`step`."""
        return tuple(piece.init(params) for piece in self.variants)

    def direction(self, params: LayerParameters, grads: LayerParameters, state: tuple, D: int) -> tuple[LayerParameters, tuple]:
        """The chain applied to the loss gradient ``grads``: the step's direction and the next state."""
        states = []
        for piece, s in zip(self.variants, state, strict=True):
            grads, s = piece.direction(params, grads, s, D)
            states.append(s)
        return grads, tuple(states)

    @abc.abstractmethod
    def step(self, tau, params: LayerParameters, grads: LayerParameters, state: tuple, D: int) -> tuple[LayerParameters, tuple]:
        """The finite-D step at time ``tau``: the parameters after one step whose loss ``l_D`` (the
        mean over the batch) has the gradient ``grads``, and the rule's next state."""

    @abc.abstractmethod
    def increment(self, tau, m: GradientMoments, M, Q, b) -> OrderParameters:
        """``U`` (not symmetrised) as the linear map of the products (or of their averages) ``m`` at
        time ``tau`` and state ``(M, Q, b)``, with the chain's terms."""

    @abc.abstractmethod
    def update_covariance(self, tau, mean: jax.Array, second: jax.Array, cc: jax.Array, xi: jax.Array) -> jax.Array:
        """``Sigma = Cov(U)`` (n, n) at time ``tau`` over the flattened coordinates
        (:func:`~singleloc.theory._theory.flatten_state`), from the averages ``mean = E[U]`` and
        ``second = E[U U^T]`` of :meth:`update` taken with ``nu`` at its conditional mean given the head fields,
        ``cc = E[sum_l c_l c_l^T]`` (H, H) and ``xi`` (F, F), the conditional covariance of ``nu``."""

    def update(self, tau, M, Q, b, c: jax.Array, g: jax.Array, nu: jax.Array) -> OrderParameters:
        """``U`` of the module docstring: ``D`` times the change of ``(M, Q, b)`` by one sequence at time ``tau``
        (``1 / B`` of a step of ``B``) with loss gradient ``c`` (H, L), head fields ``g`` (L, H) and spike fields
        ``nu`` (L, F), at the rate per sequence :meth:`rate`, with the chain's terms."""
        return self.increment(tau, GradientMoments(c @ nu, c @ g, jnp.sum(c, axis=1), c @ c.T), M, Q, b)

    def drift(self, tau, M, Q, b, moments: GradientMoments) -> OrderParameters:
        """``E[U] = (dM, dQ, db) / dtau`` at time ``tau`` and state ``(M, Q, b)`` from the field
        averages ``moments`` (docs/model.md sections 5.3 and 11; ``dQ`` symmetrised, ``db = 0``
        unless the biases train), and that of the head weighting's parts (:attr:`State`)."""
        d = self.increment(tau, moments, M, Q, b)
        return d._replace(Q=(d.Q + d.Q.T) / 2)

    def _gradient_increment(self, tau, m: GradientMoments, M, Q, b, gram: bool) -> OrderParameters:
        """``U`` at the rate :meth:`rate` of the loss gradient (with its ``r^2`` Gram term when
        ``gram``), then each piece's terms at the rate of its place, then what does not train
        set to 0 (the ``b`` block); the head weighting adds its parts (:meth:`~singleloc.TrainedHeads.drift`)."""
        per_piece, r = self.rates(tau)
        dQ = -r * (m.cg + m.cg.T)
        d = OrderParameters(-r * m.cnu, dQ + r**2 * m.cc if gram else dQ, -r * m.c)
        for piece, rp in zip(self.variants, per_piece):
            d = piece.increment(rp, d, M, Q, b)
        if not self.train_bias:
            d = d._replace(b=jnp.zeros_like(b))
        return self.weighting.drift(d, r, m.cv)


class OnlineSGD(AbstractSGDRule):
    """Online SGD (module docstring): one fresh sequence per step at the learning rate ``lr``;
    ``train_bias``: whether the biases follow their gradient; ``weighting``: the layer's head weights
    (:class:`~singleloc.UniformHeads`, :class:`~singleloc.TrainedHeads`); ``variants``: the chain of pieces
    (:mod:`~singleloc.sgd._sgd_variants`), e.g. ``OnlineSGD(0.5, True, (MiniBatch(4), WeightDecay(0.1),
    Momentum(0.9)))``, static (a variant's programs are its own; ODEs that differ only in ``lr`` share theirs).

    ``lr`` is a float for the simulator (its update then rounds as ``k - lr * g`` in the keys' precision) and an
    array in :class:`~singleloc.OrderParameterODE` (a value its compiled programs receive).
    """

    lr: float | jax.Array
    train_bias: bool = eqx.field(static=True, default=False)
    variants: tuple[AbstractVariant, ...] = ()
    weighting: AbstractHeadWeighting = UniformHeads()

    def step(self, tau, params: LayerParameters, grads: LayerParameters, state: tuple, D: int) -> tuple[LayerParameters, tuple]:
        """The keys move by ``-learning_rate(tau)`` times the chain's direction ``d`` of ``grads``, the biases
        (when they train) and the head weights (as the weighting steps them) by ``-learning_rate(tau) / D`` times
        theirs: ``(K - lr d_K, b - (lr / D) d_b, v - (lr / D) d_v)``, in the keys' precision (a schedule's rate is
        cast to it); the rule's state is threaded through the chain."""
        lr = self.learning_rate(tau)
        if not isinstance(lr, (int, float)):  # a schedule's rate, an array of the run
            lr = jnp.asarray(lr, params.K.dtype)
        d, state = self.direction(params, grads, state, D)
        b = params.b - (lr / D) * d.b if self.train_bias else params.b
        v = self.weighting.step(params.v, d.v, lr, D)
        return LayerParameters(params.K - lr * d.K, b, v), state

    def increment(self, tau, m: GradientMoments, M, Q, b) -> OrderParameters:
        """``U`` of the module docstring at the rate :meth:`rate`, its ``r^2`` Gram term included."""
        return self._gradient_increment(tau, m, M, Q, b, gram=True)

    def update_covariance(self, tau, mean: jax.Array, second: jax.Array, cc: jax.Array, xi: jax.Array) -> jax.Array:
        """``Cov(U) = second - mean mean^T``, plus the part of the spike fields' conditional covariance ``xi``: it
        adds ``-r sum_l c_l xi_l^T`` to ``U``'s ``M`` block, so ``r^2 cc (x) xi`` to its covariance (docs/model.md
        section 5.8), at the rate per sequence ``r``. Sequences are independent, also within a batch, so this is
        the covariance per sequence of any batch."""
        r = self.rate(tau)
        n_M = cc.shape[0] * xi.shape[0]
        cov = second - jnp.outer(mean, mean)
        return cov.at[:n_M, :n_M].add(r**2 * jnp.kron(cc, xi))


class GradientFlow(AbstractSGDRule):
    """The gradient flow of the (penalised) population risk: :class:`OnlineSGD`'s ``U`` without its
    ``r^2`` term and no covariance, the limit ``lr -> 0`` in the time ``lr tau`` (docs/model.md
    section 11.4); fields and variants as :class:`OnlineSGD`'s. It has no finite-D step."""

    lr: float | jax.Array
    train_bias: bool = eqx.field(static=True, default=False)
    variants: tuple[AbstractVariant, ...] = ()
    weighting: AbstractHeadWeighting = UniformHeads()

    def init_state(self, params: LayerParameters) -> tuple:
        """Refused: gradient flow is a limit, with no finite-D state or step."""
        raise ValueError("sgd.gradient_flow = true has no finite-D simulation (it is the limit lr -> 0 in the time "
                         "lr tau); simulate plain SGD at a small sgd.lr and compare at equal lr tau, or a large "
                         "sgd.batch B at equal steps (tau / B) (docs/model.md section 11.4)")

    def step(self, tau, params: LayerParameters, grads: LayerParameters, state: tuple, D: int) -> tuple[LayerParameters, tuple]:
        """Refused, as :meth:`init_state`."""
        return self.init_state(params)

    def increment(self, tau, m: GradientMoments, M, Q, b) -> OrderParameters:
        """``U``'s ``O(r)`` part at the rate :meth:`rate`, with the chain's terms."""
        return self._gradient_increment(tau, m, M, Q, b, gram=False)

    def update_covariance(self, tau, mean: jax.Array, second: jax.Array, cc: jax.Array, xi: jax.Array) -> jax.Array:
        """0: the noise vanishes in the limit (docs/model.md section 11.4)."""
        return jnp.zeros_like(second)
