"""The forward pass of a Llama model in JAX, one block at a time, returning its attention.

For token ids ``t_1..t_L`` (positions ``p = 0..L-1``), ``x = E[t]`` (L, width), and in each block

* ``h = RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g_attn``;
* queries ``q_h = R_p (h W_q^T)_h`` for the ``heads`` query heads, keys ``k_g = R_p (h W_k^T)_g``
  and values ``v_g = (h W_v^T)_g`` for the ``kv_heads`` key/value heads (dimension ``d`` =
  ``head_dim`` each); ``R_p`` is the interleaved rotary embedding: the pair ``(2i, 2i + 1)`` of a
  head is rotated by the angle ``p * base^(-2i/d)``;
* attention of query head ``h`` (key/value head ``g = h // (heads / kv_heads)``):
  ``a_h[q, j] = softmax_j(q_h[q] . k_g[j] / sqrt(d))`` over ``j <= q`` (causal: 0 above the
  diagonal), ``o_h = a_h v_g``; ``x <- x + concat_h(o_h) W_o^T``;
* ``h = RMSNorm(x) g_ffn``, ``x <- x + (silu(h W_gate^T) * (h W_up^T)) W_down^T``;

and the next-token logits are ``RMSNorm(x[L-1]) g_out W_out^T``. Everything runs in float32 (the
precision of the dequantised weights), whatever JAX's default, with full float32 products on
GPUs too (``Precision.HIGHEST``: no TensorFloat-32); one compiled program per ``L``
serves every block. :func:`run_layers` yields each block's attention ``(heads, L, L)`` with the
queries, keys and values it used, ``(heads, L, d)`` each (keys and values repeated for the query
heads that share them; queries and keys after the rotation, so that
``a_h = softmax(q_h k_h^T / sqrt(d))`` exactly).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._gguf_reader import LlamaConfig, LlamaLayer, LlamaWeights


class LayerAttention(NamedTuple):
    """One block's output: its index ``layer``, the attention rows ``attention`` (heads, L, L)
    (rows = queries, columns = keys; each row sums to 1 over the keys ``j <= q``, zeros above
    the diagonal) and the rotated ``queries``, rotated ``keys`` and ``values`` (heads, L, head_dim),
    all float32 NumPy arrays."""

    layer: int
    attention: np.ndarray
    queries: np.ndarray
    keys: np.ndarray
    values: np.ndarray


def rope_angles(length: int, head_dim: int, base: float) -> tuple[jax.Array, jax.Array]:
    """``cos`` and ``sin`` of the rotary angles ``p * base^(-2i/d)``, (length, head_dim / 2), float32."""
    inverse = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(length, dtype=np.float64)[:, None] * inverse[None, :]
    return jnp.asarray(np.cos(angles), jnp.float32), jnp.asarray(np.sin(angles), jnp.float32)


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """The interleaved rotary embedding of ``x`` (..., L, d): pairs ``(x_2i, x_2i+1)`` rotated by the angles."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return jnp.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1).reshape(x.shape)


def rms_norm(x: jax.Array, gain: jax.Array, eps: float) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * gain


_HIGHEST = jax.lax.Precision.HIGHEST


def _mm(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.matmul(a, b, precision=_HIGHEST)


def _heads(x: jax.Array, count: int) -> jax.Array:
    """(L, count * d) -> (count, L, d)."""
    return x.reshape(x.shape[0], count, -1).transpose(1, 0, 2)


def block(layer: LlamaLayer, x: jax.Array, cos: jax.Array, sin: jax.Array, *, heads: int, kv_heads: int, eps: float):
    """One block (module docstring): the new ``x`` and the attention, queries, keys and values."""
    h = rms_norm(x, layer.attn_norm, eps)
    q = rotate(_heads(_mm(h, layer.wq.T), heads), cos, sin)
    k = jnp.repeat(rotate(_heads(_mm(h, layer.wk.T), kv_heads), cos, sin), heads // kv_heads, axis=0)
    v = jnp.repeat(_heads(_mm(h, layer.wv.T), kv_heads), heads // kv_heads, axis=0)
    length = x.shape[0]
    scores = jnp.einsum("hqd,hkd->hqk", q, k, precision=_HIGHEST) / jnp.sqrt(jnp.float32(q.shape[-1]))
    causal = jnp.tril(jnp.ones((length, length), dtype=bool))
    scores = jnp.where(causal, scores, -jnp.inf)
    attention = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("hqk,hkd->qhd", attention, v, precision=_HIGHEST).reshape(length, -1)
    x = x + _mm(out, layer.wo.T)
    h = rms_norm(x, layer.ffn_norm, eps)
    x = x + _mm(jax.nn.silu(_mm(h, layer.w_gate.T)) * _mm(h, layer.w_up.T), layer.w_down.T)
    return x, attention, q, k, v


@functools.partial(jax.jit, static_argnames=("heads", "kv_heads", "eps"))
def _block(arrays: tuple, x, cos, sin, *, heads: int, kv_heads: int, eps: float):
    """:func:`block`, and whether all of its outputs are finite."""
    out = block(LlamaLayer(*arrays), x, cos, sin, heads=heads, kv_heads=kv_heads, eps=eps)
    return out, jnp.all(jnp.asarray([jnp.isfinite(a).all() for a in out]))


@jax.jit
def _logits(x_last: jax.Array, gain: jax.Array, output: jax.Array, eps: jax.Array) -> jax.Array:
    return _mm(rms_norm(x_last, gain, eps), output.T)


def _arrays(layer: LlamaLayer) -> tuple:
    """The arrays of a block in field order, as float32 device arrays."""
    return tuple(jnp.asarray(getattr(layer, f.name), jnp.float32) for f in dataclasses.fields(layer))


def check_ids(ids: Sequence[int], config: LlamaConfig) -> np.ndarray:
    """The token ids as an int array, each in ``[0, vocab_size)``, at least one (``ValueError``)."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
        raise ValueError(f"token ids must be a non-empty 1-D integer sequence, got shape {ids.shape} ({ids.dtype})")
    if ids.min() < 0 or ids.max() >= config.vocab_size:
        raise ValueError(f"token ids must lie in [0, {config.vocab_size}), got {ids.min()}..{ids.max()}")
    return ids.astype(np.int64)


def run_layers(weights: LlamaWeights, config: LlamaConfig, ids: Sequence[int], keep: Sequence[int] | None = None,
               on_logits: Callable[[np.ndarray], object] | None = None,
               on_block: Callable[[int], object] | None = None, source: str = "the model") -> Iterator[LayerAttention]:
    """Run every block on the tokens ``ids``, yielding a :class:`LayerAttention` for each block
    in ``keep`` (default: all), in order; ``on_block(index)`` (if given) is called after each
    block (a progress bar), and once the last block has run ``on_logits`` (if given) receives
    the next-token logits after the last token, (vocab,) float32. A block whose outputs are not finite
    is a ``ValueError`` naming it and ``source`` (the model's file)."""
    ids = check_ids(ids, config)
    keep = set(range(config.layers) if keep is None else keep)
    cos, sin = rope_angles(len(ids), config.head_dim, config.rope_base)
    x = jnp.asarray(weights.embedding[ids], jnp.float32)
    static = dict(heads=config.heads, kv_heads=config.kv_heads, eps=config.rms_epsilon)
    for index, layer in enumerate(weights.layers):
        (x, attention, q, k, v), finite = _block(_arrays(layer), x, cos, sin, **static)
        if not finite:
            raise ValueError(f"{source}: the activations of block {index} (tensors blk.{index}.*) are NaN or infinite "
                             "(float32 overflow: weights too large); nothing was written")
        if on_block is not None:
            on_block(index)
        if index in keep:
            yield LayerAttention(index, *(np.asarray(a) for a in (attention, q, k, v)))
    if on_logits is not None:
        on_logits(np.asarray(_logits(x[-1], jnp.asarray(weights.output_norm, jnp.float32),
                                     jnp.asarray(weights.output, jnp.float32), jnp.float32(config.rms_epsilon))))
