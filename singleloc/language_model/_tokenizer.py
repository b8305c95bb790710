"""The byte-level BPE tokenizer of a GGUF file (``tokenizer.ggml.model = "gpt2"``).

Encoding, as GPT-2 and its descendants do it:

1. pre-tokenisation: the text is split into pieces by the regular expressions of the file's
   ``tokenizer.ggml.pre`` (:data:`PRE_TOKENIZERS`; SmolLM's ``"smollm"`` first splits every digit
   off on its own, then applies GPT-2's expression: contractions, ``" ?"`` + letters, ``" ?"``
   + digits, ``" ?"`` + other symbols, runs of spaces);
2. each piece's UTF-8 bytes are mapped to printable characters by GPT-2's byte table
   (:func:`byte_table`: a space is ``"Ġ"``, a newline ``"Ċ"``), the vocabulary's alphabet;
3. byte-pair merges: the adjacent pair of symbols with the best (lowest) rank in
   ``tokenizer.ggml.merges`` is merged, everywhere in the piece, until no pair has a rank;
   each final symbol is a token of ``tokenizer.ggml.tokens``.

Special tokens (``<|im_start|>``, ...) in the text are not parsed: the text is tokenised as
text. No beginning-of-sequence token is added unless the file's ``tokenizer.ggml.add_bos_token``
says so (SmolLM2's does not). :meth:`ByteLevelBPE.decode` inverts the encoding exactly for any
text (the byte table is a bijection).
"""

from __future__ import annotations

import dataclasses
import functools

from ._model_file import require_extra

_GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

#: The pre-tokenisers supported, by the name in ``tokenizer.ggml.pre``: the regular expressions
#: applied in turn (each splits the pieces of the previous one, keeping what it matches and what lies between).
PRE_TOKENIZERS = {
    "gpt-2": (_GPT2,),
    "default": (_GPT2,),
    "smollm": (r"\p{N}", _GPT2),
    "starcoder": (r"\p{N}", _GPT2),
    "refact": (r"\p{N}", _GPT2),
}


@functools.lru_cache(maxsize=1)
def byte_table() -> dict[int, str]:
    """GPT-2's map of the 256 byte values to printable characters: the printable Latin-1 bytes
    stand for themselves, the others (controls, space, ...) for ``chr(256 + k)`` in order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _split(pattern, pieces: list[str]) -> list[str]:
    out = []
    for piece in pieces:
        start = 0
        for m in pattern.finditer(piece):
            if m.start() > start:
                out.append(piece[start:m.start()])
            if m.end() > m.start():
                out.append(m.group())
            start = m.end()
        if start < len(piece):
            out.append(piece[start:])
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class ByteLevelBPE:
    """A byte-level BPE tokenizer: ``tokens`` (the vocabulary, byte-level strings, by id),
    ``merges`` (pairs ``"a b"`` by rank), the pre-tokeniser name ``pre``, ``bos_id`` and whether
    to prepend it (``add_bos``). Build it from a GGUF file with :meth:`from_reader`."""

    tokens: tuple[str, ...]
    merges: tuple[str, ...]
    pre: str = "gpt-2"
    bos_id: int | None = None
    add_bos: bool = False
    # derived in __post_init__: the compiled pre-tokeniser, token ids, merge ranks, byte decoder, merged pieces
    _patterns: tuple = dataclasses.field(init=False, repr=False)
    _ids: dict = dataclasses.field(init=False, repr=False)
    _ranks: dict = dataclasses.field(init=False, repr=False)
    _decoder: dict = dataclasses.field(init=False, repr=False)
    _cache: dict = dataclasses.field(init=False, repr=False)

    def __post_init__(self):
        if self.pre not in PRE_TOKENIZERS:
            raise ValueError(f"the tokenizer's pre-tokeniser {self.pre!r} is not supported (supported: "
                             f"{', '.join(PRE_TOKENIZERS)})")
        regex = require_extra("regex")
        ranks = {}
        for rank, merge in enumerate(self.merges):
            left, sep, right = merge.partition(" ")
            if not sep:
                raise ValueError(f"merge {rank} of the tokenizer, {merge!r}, is not a pair 'A B'")
            ranks.setdefault((left, right), rank)
        derived = {"_patterns": tuple(regex.compile(p) for p in PRE_TOKENIZERS[self.pre]),
                   "_ids": {t: i for i, t in enumerate(self.tokens)}, "_ranks": ranks,
                   "_decoder": {c: b for b, c in byte_table().items()}, "_cache": {}}
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    @classmethod
    def from_reader(cls, reader) -> ByteLevelBPE:
        """The tokenizer in the metadata of a ``gguf.GGUFReader`` (``ValueError`` for another model)."""
        from ._gguf_reader import field

        model = field(reader, "tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(f"the GGUF file's tokenizer is {model!r}; only byte-level BPE ('gpt2') is supported")
        bos = field(reader, "tokenizer.ggml.bos_token_id", None)
        return cls(tokens=tuple(field(reader, "tokenizer.ggml.tokens")), merges=tuple(field(reader, "tokenizer.ggml.merges")),
                   pre=str(field(reader, "tokenizer.ggml.pre", "gpt-2")), bos_id=None if bos is None else int(bos),
                   add_bos=bool(field(reader, "tokenizer.ggml.add_bos_token", False)))

    def pre_tokenize(self, text: str) -> list[str]:
        """The pieces of ``text`` (step 1 of the module docstring)."""
        pieces = [text] if text else []
        for pattern in self._patterns:
            pieces = _split(pattern, pieces)
        return pieces

    def _merge(self, piece: str) -> tuple[int, ...]:
        cached = self._cache.get(piece)
        if cached is not None:
            return cached
        table = byte_table()
        word = [table[b] for b in piece.encode("utf-8")]
        while len(word) > 1:
            ranked = [(self._ranks.get(pair, -1), i) for i, pair in enumerate(zip(word[:-1], word[1:]))]
            ranked = [(r, i) for r, i in ranked if r >= 0]
            if not ranked:
                break
            best = min(ranked)[0]
            pair = self.merges[best].partition(" ")[::2]
            merged, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        try:
            ids = tuple(self._ids[s] for s in word)
        except KeyError as err:
            raise ValueError(f"the tokenizer's vocabulary has no token {err.args[0]!r} (needed for {piece!r})") from None
        if len(self._cache) < 100_000:
            self._cache[piece] = ids
        return ids

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text`` (with the beginning-of-sequence id first when ``add_bos``)."""
        ids = [self.bos_id] if self.add_bos and self.bos_id is not None else []
        for piece in self.pre_tokenize(text):
            ids.extend(self._merge(piece))
        return ids

    def decode(self, ids) -> str:
        """The text of the token ids (the inverse of :meth:`encode` for the text's tokens; a
        token outside the byte alphabet, a special one, is written as it is)."""
        out = bytearray()
        for i in ids:
            token = self.tokens[int(i)]
            if all(c in self._decoder for c in token):
                out.extend(self._decoder[c] for c in token)
            else:
                out.extend(token.encode("utf-8"))
        return out.decode("utf-8", errors="replace")

    def pieces(self, ids) -> list[str]:
        """The text of each token on its own (a character split across tokens shows as U+FFFD)."""
        return [self.decode([i]) for i in ids]
