"""The attention layer and its losses (docs/model.md sections 2 and 3), on one sequence (``jax.vmap`` them over
samples): the theory engine differentiates :func:`limit_loss`, the simulator :func:`finite_loss`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import ArrayLike, Integer, Real

from ._activations import Activation


def token_weights(activation: Activation, scores: Real[ArrayLike, "*S H L"], v: Real[ArrayLike, " H"] | None = None) -> jax.Array:
    """Aggregated weights ``a`` (L,) from scores (H, L): the head average of ``act(scores)``, or
    its mixture ``sum_h v_h act(scores)_h`` with head weights ``v`` (H,)."""
    return jnp.mean(activation(scores), axis=-2) if v is None else v @ activation(scores)


def limit_loss(activation: Activation, scores: Real[ArrayLike, "H L"], eps: Integer[ArrayLike, ""],
               v: Real[ArrayLike, " H"] | None = None) -> jax.Array:
    """``|e_eps - a|^2 = (1 - a_eps)^2 + sum_{l != eps} a_l^2``: the loss as ``D -> infinity``
    (head weights ``v``: :func:`token_weights`)."""
    a = token_weights(activation, scores, v)
    target = jax.nn.one_hot(eps, a.shape[-1], dtype=a.dtype)
    return jnp.sum((target - a) ** 2, axis=-1)


def scores(K: jax.Array, b: jax.Array, X: jax.Array) -> jax.Array:
    """``s_hl = <k_h, x_l> / sqrt(D) + b_h`` for keys K (H, D), biases b (H,), tokens X (L, D)."""
    return K @ X.T / jnp.sqrt(X.shape[-1]) + b[:, None]


def finite_loss(activation: Activation, K: Real[ArrayLike, "H D"], b: Real[ArrayLike, " H"], X: Real[ArrayLike, "L D"],
                eps: Integer[ArrayLike, ""], v: Real[ArrayLike, " H"] | None = None) -> jax.Array:
    """The finite-D loss ``|x_eps - sum_l a_l x_l|^2 / D`` of one sequence (head weights ``v``:
    :func:`token_weights`)."""
    a = token_weights(activation, scores(K, b, X), v)
    residual = X[eps] - a @ X
    return jnp.sum(residual**2) / X.shape[-1]
