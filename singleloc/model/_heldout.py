"""Held-out risk of a finite-D layer, exact in law at a cost independent of D.

A layer with keys ``K`` (H, D) and biases ``b`` (H,) is scored on ``n`` fresh sequences of the model with spikes
``kstar`` (F, D) (docs/model.md section 1): ``x_l ~ N(0, I_D)`` and ``x_eps = z + (1/sqrt(D)) sum_f theta_f k*_f``. The
simulator's test risk and the pruning of finite-D weights (:class:`singleloc.WeightsRisk`) both draw the sequences once
(:func:`draw_heldout`) and evaluate the finite-D and the limit loss of the layer, or of any subset of its heads, on them
(:func:`heldout_losses`).

The reduction. Let ``U`` (r, D) be an orthonormal basis of the span of the keys and spikes (``r = H + F`` rows, from a
QR factorisation; if the keys are linearly dependent ``U`` spans more than needed, which changes nothing below). A token
splits as ``x_l = U^T y_l + x_perp_l`` with ``y_l ~ N(0, I_r)`` (plus ``U k*^T theta / sqrt(D)`` on ``y_eps``) and
``x_perp_l`` a standard Gaussian in the ``(D - r)``-dimensional complement, independent of ``y``. The scores ``s_hl =
<k_h, x_l>/sqrt(D) + b_h = (K U^T / sqrt(D))_h . y_l + b_h`` need ``y`` only, and so do the weights ``a`` and ``w =
e_eps - a``. The finite-D loss is

    |x_eps - sum_l a_l x_l|^2 / D = w^T Gram w / D,     Gram = y y^T + W,

where ``W = (<x_perp_l, x_perp_l'>)`` is Wishart ``(L, D - r)`` and independent of ``w``. By rotation invariance ``w^T W
w`` has the law of ``|w|^2 chi2(D - r)`` given ``w``, so

    finite loss = (|sum_l w_l y_l|^2 + |w|^2 chi2) / D,      limit loss = |w|^2,

with one chi-square per sequence instead of the ``L x D`` token entries: the same law as building the D-dimensional
tokens (``tests/test_simulation.py`` checks it against brute force).

Subsets of heads. The sub-layer of heads ``S`` (docs/model.md section 7) is scored on the same draw: ``U`` spans every
key (common random numbers across subsets). A head mask on the full scores cannot express it for every activation
(bsoftmax normalises jointly with the factor ``H'``; a registered activation may couple heads), so
:func:`heldout_losses` takes the kept heads as an index array, and a jitted caller compiles once per subset size ``H'``.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from ._activations import Activation
from ._layer import token_weights
from ._priors import Prior


class HeldoutSequences(eqx.Module):
    """``n`` fresh sequences of ``L`` tokens, in coordinates on the span of keys and spikes.

    Attributes:
        keys: ``K U^T / sqrt(D)`` (H, r): the scores are ``keys @ y_l + b``.
        y: (n, L, r) token coordinates, the relevant token shifted by ``U k*^T theta / sqrt(D)``.
        theta: (n, F) the latents.
        eps: (n,) the relevant-token indices.
        chi2: (n,) independent ``chi2(D - r)`` variables (the complement of the span).
        D: the dimension."""

    keys: jax.Array
    y: jax.Array
    theta: jax.Array
    eps: jax.Array
    chi2: jax.Array
    D: int = eqx.field(static=True)


def draw_heldout(key: jax.Array, prior: Prior, K: jax.Array, kstar: jax.Array, n: int, L: int) -> HeldoutSequences:
    """Draw ``n`` fresh sequences of ``L`` tokens for keys ``K`` (H, D) and spikes ``kstar`` (F, D), in ``K``'s
    dtype, from four streams of ``key`` (latents, relevant indices, span coordinates, chi-squares); ``D > H + F``."""
    H, D = K.shape
    F = kstar.shape[0]
    r = H + F
    U = jnp.linalg.qr(jnp.concatenate([K, kstar]).T)[0].T  # (r, D), orthonormal rows
    keys, shift = K @ U.T / jnp.sqrt(D), U @ kstar.T / jnp.sqrt(D)  # (H, r), (r, F)
    k_theta, k_eps, k_y, k_chi = jax.random.split(key, 4)
    theta = prior.sample(k_theta, (n,)).astype(K.dtype)
    eps = jax.random.randint(k_eps, (n,), 0, L)
    y = jax.random.normal(k_y, (n, L, r), dtype=K.dtype).at[jnp.arange(n), eps].add(theta @ shift.T)
    chi2 = 2.0 * jax.random.gamma(k_chi, (D - r) / 2.0, shape=(n,), dtype=K.dtype)
    return HeldoutSequences(keys, y, theta, eps, chi2, D)


def heldout_losses(activation: Activation, seqs: HeldoutSequences, b: jax.Array,
                   kept: jax.Array | None = None, *, v: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Finite-D and limit losses, each of shape ``(n,)``, of the layer with biases ``b`` (H,) and head weights
    ``v`` (H,; default the head average) on the sequences ``seqs``; ``kept`` (H',) int: evaluate the sub-layer of
    those heads only (its aggregation renormalised over them: the head average of the kept heads, or their weights
    scaled to the same sum), default all heads."""
    keys = seqs.keys if kept is None else seqs.keys[kept]
    b = b if kept is None else b[kept]
    if v is not None and kept is not None:
        v = v[kept] * (jnp.sum(v) / jnp.sum(v[kept]))
    L = seqs.y.shape[1]
    s = jnp.einsum("hr,nlr->nhl", keys, seqs.y) + b[:, None]

    def one(s, y, eps, chi2):
        w = jax.nn.one_hot(eps, L, dtype=s.dtype) - token_weights(activation, s, v)
        limit = jnp.sum(w**2)
        return (jnp.sum((w @ y) ** 2) + limit * chi2) / seqs.D, limit

    return jax.vmap(one)(s, seqs.y, seqs.eps, seqs.chi2)
