"""The files of ``singleloc attention``, written as the blocks are computed, and what a run costs.

Files in the output folder, written together (all of them or none,
:func:`singleloc.ground._atomic_files.written_together`):

* ``attention.npy`` (layers, heads, L, L) float32: ``[l, h, q, j]`` = weight of query token ``q``
  of head ``h`` of the ``l``-th kept block on token ``j`` (0 for ``j > q``; rows sum to 1),
  streamed to the file one block at a time, so that only one block's maps are in memory;
* ``queries.npy``, ``keys.npy``, ``values.npy`` (layers, heads, L, head_dim) float32: per query
  head (shared keys and values repeated), queries and keys after the rotary embedding;
* ``attention.json``: the model, the text (tokens and characters kept), the kept blocks, the
  shapes and axes, the token ids and their text, the weight on the first token (attention sink)
  of each kept block, and the five most probable next tokens.

``ATTN = attention.npy`` with ``--values values.npy`` is what ``singleloc diagnose`` reads.

Costs, checked before the run: memory (:func:`memory_parts`), disk (:func:`disk_bytes`) and time
(:func:`forward_cost`). Peak memory, fitted to the peak resident memory of CPU runs of SmolLM2
(JAX 0.10: 1.38 GB at L = 1024 keeping 30 blocks, 2.01 GB at L = 2048 keeping one; the estimate
is 5-10 % above): ``5.5`` bytes per weight (the float32 arrays, the file's metadata and the
runtime), ``28 heads L^2`` bytes for one block's scores and weights (seven float32 copies: the
scores, the masked scores, their exponentials, the weights on the device and on the host, ...),
``12 layers heads L head_dim`` for the kept queries, keys and values, plus
:data:`singleloc.preflight._resources.OVERHEAD`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from .._version import __version__
from ..attention._attention_diagnosis import FIGURES
from ..ground._atomic_files import OUTPUT_KEY, atomic_write, png_has_text, written_together
from ..io._run_folders import save_json
from ..preflight._resources import Cost, cpu_speed
from ._gguf_reader import LlamaConfig

#: The arrays of an output folder, in the order they are written.
ARRAYS = ("attention", "queries", "keys", "values")

#: Floating-point operations per second of the forward pass, measured on a loaded 2-core CPU
#: (JAX 0.10, L = 256 to 2048: 0.7 TFLOP of SmolLM2-135M at L = 2048 in about 40 s); estimates
#: within a factor of about 2.
FORWARD_FLOPS = 1.8e10


def layer_flops(config: LlamaConfig, L: int) -> float:
    """Operations of one block on ``L`` tokens: the projections ``2 L (width (2 heads + 2 kv_heads)
    head_dim + 3 width ffn_width)``, the scores and the weighted values ``4 heads L^2 head_dim``
    and the softmax (about ``10 heads L^2``)."""
    c = config
    projections = 2 * L * (c.width * c.head_dim * (2 * c.heads + 2 * c.kv_heads) + 3 * c.width * c.ffn_width)
    return projections + 4 * c.heads * L * L * c.head_dim + 10 * c.heads * L * L


def forward_cost(config: LlamaConfig, L: int, kept: int) -> Cost:
    """What running every block on ``L`` tokens and keeping ``kept`` blocks' arrays costs."""
    seconds = config.layers * layer_flops(config, L) / FORWARD_FLOPS * cpu_speed()
    memory = sum(memory_parts(config, L, kept).values())
    return Cost(f"the forward pass of {config.layers} blocks on L = {L} tokens (--max-tokens), keeping {kept} (--layers)",
                seconds, memory, "--max-tokens or --layers")


def memory_parts(config: LlamaConfig, L: int, kept: int) -> dict[str, int]:
    """Peak bytes of the run, by part (for :func:`singleloc.preflight._resources.check_memory`)."""
    c = config
    return {f"the model's float32 weights ({c.parameters() / 1e6:.0f} M numbers)": int(5.5 * c.parameters()),
            f"one block's scores and weights (7 x {c.heads} heads x L^2 float32, L = {L} from --max-tokens)":
                28 * c.heads * L * L,
            f"the kept queries, keys and values (3 x {kept} blocks from --layers x {c.heads} heads x L x {c.head_dim})":
                12 * kept * c.heads * L * c.head_dim}


def disk_bytes(config: LlamaConfig, L: int, kept: int) -> int:
    """Bytes of the arrays of an output folder (the JSON is small)."""
    return 4 * kept * config.heads * L * (L + 3 * config.head_dim)


def check_disk(folder: Path, needed: int) -> None:
    """Refuse (``OSError``, one line) when the nearest existing folder of ``folder`` has less
    than ``needed`` bytes free."""
    place = Path(folder).absolute()
    while not place.exists() and place != place.parent:
        place = place.parent
    free = shutil.disk_usage(place).free
    if needed > free:
        raise OSError(f"the arrays need {needed / 1e9:.3g} GB on disk (attention.npy: layers x heads x L^2 float32), more "
                      f"than the {free / 1e9:.3g} GB free in {str(place)!r}; lower --max-tokens or keep fewer --layers")


def _stream_npy(fh, shape: tuple[int, ...], blocks: Iterable[np.ndarray]) -> None:
    """An ``.npy`` file of float32 ``shape`` whose first-axis slices are the ``blocks``, written one by one."""
    np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False, "shape": shape})
    count = 0
    for block in blocks:
        block = np.ascontiguousarray(block, dtype="<f4")
        if block.shape != shape[1:]:
            raise ValueError(f"block {count} has shape {block.shape}, expected {shape[1:]}")
        fh.write(memoryview(block).cast("B"))
        count += 1
    if count != shape[0]:
        raise ValueError(f"{count} blocks written, expected {shape[0]}")


def diagnose_outputs(folder: Path, stem: str = "attention") -> list[Path]:
    """The files of an earlier ``singleloc diagnose`` of ``folder/STEM.npy`` (its JSON and its
    marked figures), which describe arrays that a new run replaces."""
    found = [p for p in (folder / f"{stem}_{name}.png" for name in FIGURES) if png_has_text(p, OUTPUT_KEY, f"diagnose {stem}")]
    report = folder / f"{stem}_diagnostics.json"
    try:
        if Path(json.loads(report.read_text()).get("attn", "")).name == f"{stem}.npy":
            found.append(report)
    except (OSError, ValueError, AttributeError):
        pass
    return found


def save_attention(out: str | Path, model, ids: Sequence[int], layers: Sequence[int], record: dict,
                   progress: bool = True) -> tuple[list[Path], dict]:
    """Run ``model`` on the token ids and write the files of the module docstring into ``out``,
    keeping the blocks ``layers``; ``record`` (the text's description) goes into
    ``attention.json`` with the rest. Returns the files written and the record written. An
    earlier ``diagnose`` of the folder's ``attention.npy`` is removed with the arrays it described."""
    from tqdm.auto import tqdm

    out, c, L = Path(out), model.config, len(ids)
    shape = (len(layers), c.heads, L, c.head_dim)
    kept = {name: np.empty(shape, np.float32) for name in ARRAYS[1:]}
    sink = {"last_query": [], "all_queries": []}
    logits: list[np.ndarray] = []
    bar = tqdm(total=c.layers, desc="attention", unit="layer", disable=not progress, leave=False)

    def blocks():
        for n, block in enumerate(model.layers(ids, layers, on_logits=logits.append, on_block=lambda _: bar.update())):
            for name, array in kept.items():
                array[n] = getattr(block, name)
            sink["last_query"].append(float(block.attention[:, -1, 0].mean()))
            sink["all_queries"].append(float(block.attention[:, 1:, 0].mean()) if L > 1 else 1.0)
            yield block.attention

    with written_together(out, stale=lambda _: diagnose_outputs(out)) as files:
        try:
            atomic_write(out / "attention.npy", lambda fh: _stream_npy(fh, (len(layers), c.heads, L, L), blocks()))
        finally:
            bar.close()
        for name, array in kept.items():
            atomic_write(out / f"{name}.npy", lambda fh, a=array: np.save(fh, a))
        record = {"singleloc_version": __version__, **record, "layers": list(layers),
                  "arrays": {"attention.npy": {"shape": [len(layers), c.heads, L, L], "axes": ["layer", "head", "query", "key"]},
                             **{f"{name}.npy": {"shape": list(shape), "axes": ["layer", "head", "token", "dimension"]}
                                for name in kept}},
                  "first_token_weight": {"about": "mean over heads of the weight on token 0: of the last query, and of every "
                                                  "query after the first", **sink},
                  "tokens": {"ids": [int(i) for i in ids], "text": model.tokenizer.pieces(ids)},
                  "next_token": model.top_tokens(logits[0])}
        save_json(out / "attention.json", record)
    return files, record
