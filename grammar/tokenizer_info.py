"""What the grammar engine needs from a tokenizer: every token's bytes, which ids are special, EOS.

Byte-level BPE vocabularies (GPT-2, DeepSeek, Llama-3: ``Ġ`` for a space) are mapped back through
GPT-2's byte-to-unicode table; SentencePiece vocabularies (``▁`` for a space, byte-fallback pieces
``<0x0A>``) through their decoder rules. Special tokens (and any id the tokenizer does not define)
get no bytes and are never allowed by a mask; stop tokens are allowed exactly where the grammar
accepts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable

import numpy as np

from radixlm.grammar.trie import TokenTrie

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's ``bytes_to_unicode`` inverted: printable stand-in char -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _decoder_kind(tokenizer: Any) -> str:
    """``"byte_level"`` or ``"sentencepiece"``, read from the fast tokenizer's decoder config."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        text = json.dumps(json.loads(backend.to_str()).get("decoder"))
        if '"ByteLevel"' in text:
            return "byte_level"
        if '"ByteFallback"' in text or "\u2581" in text or '"Metaspace"' in text:
            return "sentencepiece"
    vocab = tokenizer.get_vocab()
    if any("\u2581" in t for t in list(vocab)[:5000]):
        return "sentencepiece"
    return "byte_level"


def _token_bytes(piece: str, kind: str) -> bytes:
    if kind == "byte_level":
        dec = _byte_decoder()
        try:
            return bytes(dec[c] for c in piece)
        except KeyError:
            return piece.encode("utf-8")
    m = _BYTE_FALLBACK.match(piece)
    if m:
        return bytes([int(m.group(1), 16)])
    return piece.replace("\u2581", " ").encode("utf-8")


@dataclass(eq=False)
class TokenizerInfo:
    """The vocabulary as bytes.

    Attributes:
        token_bytes: bytes per token id (``len == tokenizer_size``); None for special or undefined
            ids, which no mask ever allows.
        vocab_size: width of the logits / bitmask in tokens (>= tokenizer_size; ids past the
            tokenizer are never allowed).
        stop_token_ids: ids allowed exactly in accepting states (EOS).
        special_ids: ids excluded from text.
    """

    token_bytes: list[bytes | None]
    vocab_size: int
    stop_token_ids: tuple[int, ...]
    special_ids: frozenset[int] = frozenset()
    _trie: TokenTrie | None = field(default=None, repr=False)
    _class_tries: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.vocab_size < len(self.token_bytes):
            raise ValueError(f"vocab_size {self.vocab_size} < tokenizer size {len(self.token_bytes)}")
        if not self.stop_token_ids:
            raise ValueError("the tokenizer has no EOS / stop token")
        for t in self.stop_token_ids:
            if not 0 <= t < self.vocab_size:
                raise ValueError(f"stop token {t} outside the vocabulary")

    @classmethod
    def from_huggingface(
        cls, tokenizer: Any, vocab_size: int | None = None,
        stop_token_ids: Iterable[int] | None = None,
    ) -> "TokenizerInfo":
        """Build from a transformers tokenizer (fast or slow).

        Args:
            tokenizer: e.g. ``AutoTokenizer.from_pretrained(path)``.
            vocab_size: logits width if larger than ``len(tokenizer)``; default ``len(tokenizer)``.
            stop_token_ids: default ``[tokenizer.eos_token_id]``.
        """
        kind = _decoder_kind(tokenizer)
        n = len(tokenizer)
        pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
        special: set[int] = set(getattr(tokenizer, "all_special_ids", []) or [])
        for tid, added in getattr(tokenizer, "added_tokens_decoder", {}).items():
            if getattr(added, "special", False):
                special.add(int(tid))
        if stop_token_ids is None:
            eos = tokenizer.eos_token_id
            stop_token_ids = [] if eos is None else [eos]
        stops = tuple(dict.fromkeys(int(t) for t in stop_token_ids))
        special |= set(stops)
        token_bytes: list[bytes | None] = []
        for tid, piece in enumerate(pieces):
            if tid in special or piece is None:
                token_bytes.append(None)
            else:
                b = _token_bytes(piece, kind)
                token_bytes.append(b if b else None)
        return cls(token_bytes, max(vocab_size or n, n), stops, frozenset(special))

    @property
    def tokenizer_size(self) -> int:
        return len(self.token_bytes)

    @property
    def mask_words(self) -> int:
        """int32 words per bitmask row: ``ceil(vocab_size / 32)``."""
        return (self.vocab_size + 31) // 32

    @property
    def trie(self) -> TokenTrie:
        """The byte trie of all non-special tokens (built once, on first use)."""
        if self._trie is None:
            self._trie = TokenTrie(self.token_bytes)
        return self._trie

    def walk_trie(self, trans: np.ndarray) -> TokenTrie:
        """The trie to walk the DFA ``trans`` (int ``[n_states, 256]``) against: the trie through
        the DFA's byte classes when that is much smaller (:mod:`radixlm.grammar.class_trie`; it
        carries its own ``regions`` cache), else :attr:`trie`. Cached per byte partition."""
        from radixlm.grammar.class_trie import ClassTries

        if self._class_tries is None:
            self._class_tries = ClassTries()
        return self._class_tries.get(self.trie, trans)

    def stop_mask(self) -> np.ndarray:
        """Packed int32 mask with only the stop tokens set."""
        m = np.zeros(self.mask_words * 32, dtype=bool)
        m[list(self.stop_token_ids)] = True
        return np.packbits(m, bitorder="little").view(np.int32)
