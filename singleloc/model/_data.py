"""Finite-D data and initial weights (docs/model.md sections 1 and 5), shared by the simulator and
by the theory's initial conditions so that both start from the same point.

Random streams. A run with base seed ``seed`` gives seed number ``s`` the key ``fold_in(PRNGKey(seed), s)``, split
once into ``(spikes, init, train, test)``; the training sample of step ``t`` uses ``fold_in(train, t)``, so results
do not depend on how a run is chunked.

Finite-D runs are in single precision (``SIM_DTYPE``) whether or not JAX's x64 mode is on, so that a seed gives the
same weights in every process; the theory casts the initial overlaps to its own precision.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import ArrayLike, Real

from ..ground._validation import SEED_MAX, integer, number
from ._priors import Prior

SIM_DTYPE = jnp.float32


class SeedKeys(NamedTuple):
    spikes: jax.Array
    init: jax.Array
    train: jax.Array
    test: jax.Array


def seed_keys(seed: int, index: int | jax.Array) -> SeedKeys:
    """The four independent streams of seed number ``index`` of a run with base ``seed`` (both below
    ``2**32``: JAX's key keeps 32 bits of them; ``index`` may be traced)."""
    seed = integer("seed_keys: seed", seed, 0, SEED_MAX, example=0)
    if not isinstance(index, jax.Array):
        index = integer("seed_keys: index", index, 0, SEED_MAX, example=0)
    return SeedKeys(*jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), index), 4))


def make_spikes(key: jax.Array, F: int, D: int) -> jax.Array:
    """``F`` orthogonal spikes (F, D) with ``|k*_f|^2 = D``: ``sqrt(D)`` times QR rows."""
    if F > D:
        raise ValueError(f"simulation.D = {D} must be at least problem.F = {F} (orthogonal spikes)")
    q, _ = jnp.linalg.qr(jax.random.normal(key, (D, F), dtype=SIM_DTYPE))
    return jnp.sqrt(D) * q.T


def init_keys(key: jax.Array, H: int, D: int, init_scale: float) -> jax.Array:
    """Initial keys ``k_h ~ N(0, init_scale^2 I_D)``, shape (H, D)."""
    return init_scale * jax.random.normal(key, (H, D), dtype=SIM_DTYPE)


def overlaps(K: Real[ArrayLike, "H D"], kstar: Real[ArrayLike, "F D"]) -> tuple[jax.Array, jax.Array]:
    """Order parameters ``M = K k*^T / D`` (H, F) and ``Q = K K^T / D`` (H, H) of keys ``K`` (H, D) and
    spikes ``kstar`` (F, D)."""
    D = K.shape[-1]
    return K @ kstar.T / D, K @ K.T / D


def initial_overlaps(seed: int, index: int, F: int, H: int, D: int, init_scale: float) -> tuple[jax.Array, jax.Array]:
    """``(M0, Q0)`` of the D-dimensional initialisation of seed ``index`` (as in the simulator)."""
    init_scale = number("initial_overlaps: init_scale", init_scale, nonneg=True, example=0.5)  # concrete: static when jitted
    keys = seed_keys(seed, index)
    return overlaps(init_keys(keys.init, H, D, init_scale), make_spikes(keys.spikes, F, D))


def sample_sequence(key: jax.Array, prior: Prior, kstar: Real[ArrayLike, "F D"], L: int) -> tuple[jax.Array, jax.Array]:
    """One sequence: tokens X (L, D) and the relevant location ``eps``.

    ``x_l ~ N(0, I_D)`` and ``x_eps = z + (1/sqrt(D)) sum_f theta_f k*_f``.
    """
    k_theta, k_eps, k_x = jax.random.split(key, 3)
    D = kstar.shape[-1]
    theta = prior.sample(k_theta).astype(kstar.dtype)
    eps = jax.random.randint(k_eps, (), 0, L)
    X = jax.random.normal(k_x, (L, D), dtype=kstar.dtype)
    return X.at[eps].add(theta @ kstar / jnp.sqrt(D)), eps
