"""How the layer mixes its heads, ``a_l = sum_h v_h A_hl`` (``A = act(s)`` (H, L)): one object that the layer, the
routes, the SGD rule and the ODE's state read (docs/model.md section 11.5).

A head weighting declares, as a diffrax solver declares its term structure, the ODE's ``State`` (``(M, Q, b)``, followed
by the layer's weights ``v`` when they move, with their start: the simulator steps and the results store that same
``v``), the ``v`` the layer uses at a state, the drift of ``v``, the finite-D layer's ``v`` and its step, and whether it
is the ``head_average`` (the exact route's joint layer, its exact Gram term and the computations written for the
head-symmetric flow take only that one). :class:`UniformHeads` is the head average, ``v_h = 1/H``; :class:`TrainedHeads`
learns ``v`` like the biases, ``v <- v - (lr / D) dl/dv``: it moves by ``O(1/D)`` per step, so ``dv/dtau = -r E[dl/dv]``
(no ``r^2`` term). A new weighting is one class here and its entry in :data:`HEAD_WEIGHTINGS`, whose names
``model.head_weights`` takes; ``tests/test_head_weighting.py`` runs every entry through one contract.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp


class OrderParameters(NamedTuple):
    """``M`` (H, F) head-spike overlaps, ``Q`` (H, H) head-head overlaps, ``b`` (H,) biases."""

    M: jax.Array
    Q: jax.Array
    b: jax.Array


class WeightedOrderParameters(NamedTuple):
    """The state of a layer with trained head weights (:class:`TrainedHeads`): :class:`OrderParameters`
    and the head weights ``v`` (H,) of ``a_l = sum_h v_h A_hl``, an ``O(1)`` vector like the biases."""

    M: jax.Array
    Q: jax.Array
    b: jax.Array
    v: jax.Array


class AbstractHeadWeighting(eqx.Module):
    """How the layer mixes its heads (module docstring): its ``name`` (a value of ``model.head_weights``), its
    ODE ``State``, whether it is the ``head_average``, and the views below."""

    name: eqx.AbstractClassVar[str]
    State: eqx.AbstractClassVar[type]
    head_average: eqx.AbstractClassVar[bool]

    def start(self, b: jax.Array) -> tuple:
        """The start of the weighting's own part of the state (``v``; none: ``()``), given the biases ``b`` (..., H)."""
        return ()

    @abc.abstractmethod
    def weights(self, y) -> jax.Array | None:
        """The head weights ``v`` (..., H) of the layer at the state ``y`` (any leading axes; ``None``: the head
        average)."""

    @abc.abstractmethod
    def drift(self, d: OrderParameters, r, cv: jax.Array | None):
        """The state's drift (a ``State``) from the drift ``d`` of ``(M, Q, b)``, the rate per sequence ``r`` and
        ``cv = E[dl/dv]`` (``None`` where a computation gives none)."""

    @abc.abstractmethod
    def layer_start(self, H: int, dtype) -> jax.Array | None:
        """The finite-D layer's head weights at the start (``None``: the head average)."""

    @abc.abstractmethod
    def step(self, v: jax.Array | None, dv: jax.Array | None, lr, D: int) -> jax.Array | None:
        """The finite-D layer's head weights after a step of size ``lr`` along the direction ``dv``."""

    def state(self, y0: Sequence) -> tuple:
        """The start ``y0`` as this weighting's ``State``: ``(M0, Q0, b0)`` gains the weighting's parts at
        their :meth:`start`, a full state is taken as it is, and anything else is ``ValueError``."""
        fields = self.State._fields
        if len(y0) == len(fields):
            return self.State(*y0)
        if len(y0) == 3:
            return self.State(*y0, *self.start(jnp.asarray(y0[2])))
        raise ValueError(f"the start has {len(y0)} parts but model.head_weights = {self.name!r} takes ({', '.join(fields)})"
                         f"{' or (M, Q, b)' if len(fields) > 3 else ''}; pass those, or set model.head_weights to the "
                         f"weighting of that start (one of {', '.join(map(repr, HEAD_WEIGHTINGS))})")


class UniformHeads(AbstractHeadWeighting):
    """The head average, ``v_h = 1/H`` fixed (``model.head_weights = "uniform"``): no state of its own."""

    name: ClassVar[str] = "uniform"
    State: ClassVar[type] = OrderParameters
    head_average: ClassVar[bool] = True

    def weights(self, y) -> None:
        return None

    def drift(self, d: OrderParameters, r, cv) -> OrderParameters:
        return d

    def layer_start(self, H: int, dtype) -> None:
        return None

    def step(self, v, dv, lr, D: int) -> None:
        return v


class TrainedHeads(AbstractHeadWeighting):
    """Head weights that learn (``model.head_weights = "trained"``): ``v`` starts at ``1/H`` and steps like the
    biases, ``v <- v - (lr / D) dl/dv``, so ``dv/dtau = -r E[dl/dv]`` (module docstring); the state is
    :class:`WeightedOrderParameters`."""

    name: ClassVar[str] = "trained"
    State: ClassVar[type] = WeightedOrderParameters
    head_average: ClassVar[bool] = False

    def start(self, b: jax.Array) -> tuple[jax.Array]:
        return (jnp.full(b.shape, 1.0 / b.shape[-1], dtype=jnp.result_type(float)),)

    def weights(self, y: WeightedOrderParameters) -> jax.Array:
        return y.v

    def drift(self, d: OrderParameters, r, cv) -> WeightedOrderParameters:
        if cv is None:
            raise ValueError("model.head_weights = 'trained': this computation gives no head weights v (it is written for "
                             "the head average: the linearisation, the head-symmetric flow, the SDE); pass the state's v "
                             "(OrderParameterODE.drift(M, Q, b, tau, v=v)) or set model.head_weights = 'uniform'")
        return WeightedOrderParameters(*d, -r * cv)

    def layer_start(self, H: int, dtype) -> jax.Array:
        return jnp.full((H,), 1.0 / H, dtype=dtype)

    def step(self, v, dv, lr, D: int) -> jax.Array:
        return v - (lr / D) * dv


#: The head average (the default of the functions that take a weighting).
HEAD_AVERAGE = UniformHeads()
#: The weightings by their name, the values of ``model.head_weights``.
HEAD_WEIGHTINGS: dict[str, type[AbstractHeadWeighting]] = {cls.name: cls for cls in (UniformHeads, TrainedHeads)}
