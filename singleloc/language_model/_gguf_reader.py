"""A Llama-architecture GGUF file read into NumPy: its hyperparameters and dequantised weights.

Conventions of the file (those of llama.cpp, which the reading keeps):

* a matrix stored with GGUF dimensions ``[n_in, n_out]`` (fastest first) is read as an array
  ``(n_out, n_in)``, so that a layer computes ``y = x @ W.T``; quantised blocks (``Q4_1``,
  ``Q8_0``, ...) are dequantised to float32 by ``gguf.quants.dequantize``;
* the rows of the query and key matrices were permuted by the converter so that the rotary
  embedding rotates the adjacent pairs ``(2i, 2i + 1)`` of each head (the interleaved layout),
  not the two halves of the head as in the Hugging Face checkpoint;
* without ``output.weight`` the output projection is the token embedding (tied weights);
* the key/value heads are shared by groups of ``heads / kv_heads`` consecutive query heads
  (grouped-query attention): query head ``h`` reads key/value head ``h // (heads / kv_heads)``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ._model_file import require_extra

#: The metadata keys of the hyperparameters, after ``ARCH.`` (``llama.block_count``, ...).
_CONFIG_KEYS = {"layers": "block_count", "heads": "attention.head_count", "width": "embedding_length",
                "ffn_width": "feed_forward_length", "context_length": "context_length"}

_MISSING = object()


def field(reader, key: str, default=_MISSING):
    """The value of the metadata ``key`` of a ``gguf.GGUFReader``: a number, a string or a list
    of them (``default`` when absent, else ``ValueError`` naming the key)."""
    entry = reader.fields.get(key)
    if entry is None:
        if default is _MISSING:
            raise ValueError(f"the GGUF file has no metadata {key!r}")
        return default
    values = [entry.parts[i] for i in entry.data]
    kinds = entry.types
    decode = kinds and kinds[-1].name == "STRING"
    items = [bytes(v).decode("utf-8", errors="replace") if decode else v.tolist()[0] for v in values]
    return items if kinds and kinds[0].name == "ARRAY" else items[0]


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """The hyperparameters of a Llama model: ``layers`` blocks, ``heads`` query heads of
    dimension ``head_dim`` sharing ``kv_heads`` key/value heads, residual ``width``
    (``heads * head_dim``), feed-forward ``ffn_width``, rotary base ``rope_base``, RMSNorm
    ``rms_epsilon``, the ``context_length`` it was trained for, ``vocab_size`` tokens and
    the ``name`` in the file's metadata."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    width: int
    ffn_width: int
    rope_base: float
    rms_epsilon: float
    context_length: int
    vocab_size: int
    name: str

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.heads // self.kv_heads

    def parameters(self) -> int:
        """Numbers in the weights (the tied output projection counted once)."""
        attn = self.width * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return self.vocab_size * self.width + self.layers * (attn + 3 * self.width * self.ffn_width + 2 * self.width) + self.width

    def describe(self) -> str:
        return (f"{self.name}: {self.layers} layers, {self.heads} query heads sharing {self.kv_heads} key/value heads of "
                f"dimension {self.head_dim}, width {self.width}, RoPE base {self.rope_base:g}, {self.vocab_size} tokens")


def read_config(reader) -> LlamaConfig:
    """The :class:`LlamaConfig` of a GGUF file of the ``llama`` architecture (``ValueError`` otherwise)."""
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"the GGUF file holds a {arch!r} model; only the 'llama' architecture is supported")
    values = {name: int(field(reader, f"llama.{key}")) for name, key in _CONFIG_KEYS.items()}
    kv_heads = int(field(reader, "llama.attention.head_count_kv", values["heads"]))
    if values["width"] % values["heads"] or values["heads"] % kv_heads:
        raise ValueError(f"the GGUF file's heads do not divide its width: width {values['width']}, {values['heads']} query "
                         f"heads, {kv_heads} key/value heads")
    head_dim = values["width"] // values["heads"]
    rope_dims = int(field(reader, "llama.rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise ValueError(f"the GGUF file rotates {rope_dims} of the {head_dim} dimensions of a head; only a rotary "
                         "embedding over the whole head is supported")
    vocab = field(reader, "llama.vocab_size", None)
    if vocab is None:
        vocab = len(field(reader, "tokenizer.ggml.tokens"))
    return LlamaConfig(heads=values["heads"], kv_heads=kv_heads, head_dim=head_dim, width=values["width"],
                       ffn_width=values["ffn_width"], layers=values["layers"], context_length=values["context_length"],
                       rope_base=float(field(reader, "llama.rope.freq_base", 10000.0)),
                       rms_epsilon=float(field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
                       vocab_size=int(vocab), name=str(field(reader, "general.name", "unnamed model")))


#: The tensors of block ``i`` (``blk.i.NAME.weight``), by the name of :class:`LlamaLayer` field they fill.
_LAYER_TENSORS = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
                  "ffn_norm": "ffn_norm", "w_gate": "ffn_gate", "w_up": "ffn_up", "w_down": "ffn_down"}


@dataclasses.dataclass(frozen=True, eq=False)
class LlamaLayer:
    """The float32 weights of one block: RMSNorm gains ``attn_norm``, ``ffn_norm`` (width,);
    ``wq`` (heads * head_dim, width), ``wk``, ``wv`` (kv_heads * head_dim, width), ``wo``
    (width, heads * head_dim); SwiGLU ``w_gate``, ``w_up`` (ffn_width, width), ``w_down``
    (width, ffn_width)."""

    attn_norm: np.ndarray
    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    ffn_norm: np.ndarray
    w_gate: np.ndarray
    w_up: np.ndarray
    w_down: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class LlamaWeights:
    """The float32 weights of a model: ``embedding`` (vocab, width), the ``layers``, the final
    RMSNorm gain ``output_norm`` (width,) and the ``output`` projection (vocab, width), the
    embedding itself when the file ties them."""

    embedding: np.ndarray
    layers: tuple[LlamaLayer, ...]
    output_norm: np.ndarray
    output: np.ndarray


def _expected_shapes(c: LlamaConfig) -> dict[str, tuple[int, ...]]:
    q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
    return {"attn_norm": (c.width,), "wq": (q, c.width), "wk": (kv, c.width), "wv": (kv, c.width), "wo": (c.width, q),
            "ffn_norm": (c.width,), "w_gate": (c.ffn_width, c.width), "w_up": (c.ffn_width, c.width),
            "w_down": (c.width, c.ffn_width)}


def read_weights(reader, config: LlamaConfig) -> LlamaWeights:
    """Every tensor of the file, dequantised to float32 and checked against ``config``'s shapes and for
    NaN or infinite values (``ValueError`` naming the tensor)."""
    quants = require_extra("gguf").quants
    tensors = {t.name: t for t in reader.tensors}

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in tensors:
            raise ValueError(f"the GGUF file has no tensor {name!r}")
        t = tensors[name]
        array = np.asarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(
            tuple(int(n) for n in reversed(t.shape)))
        if array.shape != shape:
            raise ValueError(f"tensor {name!r} of the GGUF file has shape {array.shape}, expected {shape}")
        bad = array.size - np.count_nonzero(np.isfinite(array))
        if bad:
            raise ValueError(f"tensor {name!r} of the GGUF file has {bad} NaN or infinite value(s) of {array.size}: "
                             "the file is damaged")
        return array

    shapes = _expected_shapes(config)
    layers = tuple(LlamaLayer(**{key: get(f"blk.{i}.{name}.weight", shapes[key]) for key, name in _LAYER_TENSORS.items()})
                   for i in range(config.layers))
    embedding = get("token_embd.weight", (config.vocab_size, config.width))
    output = get("output.weight", embedding.shape) if "output.weight" in tensors else embedding
    return LlamaWeights(embedding=embedding, layers=layers, output_norm=get("output_norm.weight", (config.width,)),
                        output=output)


def open_gguf(path: str | Path):
    """A ``gguf.GGUFReader`` of ``path`` (memory-mapped; the tensors are read when used); a file
    that gguf cannot parse is one ``ValueError`` naming it."""
    gguf = require_extra("gguf")
    try:
        return gguf.GGUFReader(str(path))
    except Exception as err:  # gguf raises several types for a damaged file
        raise ValueError(f"model {str(path)!r} is not a readable GGUF file ({' '.join(str(err).split())})") from None
