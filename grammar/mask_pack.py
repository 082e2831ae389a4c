"""Packing token sets into int32 bitmasks (bit ``t % 32`` of word ``t // 32`` for token ``t``),
byte-duplicate tokens of the trie included."""

from __future__ import annotations

import numpy as np

from radixlm.grammar.trie import TokenTrie, expand


def pack_tokens(tokens: np.ndarray, trie: TokenTrie, words: int) -> np.ndarray:
    """int32 ``[words]`` bitmask with the given token ids (and their byte-duplicates) set."""
    allowed = np.zeros(words * 32, dtype=bool)
    allowed[tokens] = True
    if trie.dup_token.size:
        allowed[trie.dup_token] |= allowed[trie.dup_of]
    return np.packbits(allowed, bitorder="little").view(np.int32)


def pack_nodes(alive: np.ndarray, trie: TokenTrie, words: int) -> np.ndarray:
    """int32 ``[words]`` bitmask of the tokens whose trie node is set in ``alive`` (bool
    ``[n_nodes]``; the root is ignored). One gather over the vocabulary, byte-duplicates included
    (they share a node): cheaper than :func:`pack_tokens` when most of the trie is alive."""
    node = trie.node_of_tokens()
    allowed = np.zeros(words * 32, dtype=bool)
    root = bool(alive[0])
    alive[0] = False  # NOTE: tokens without a node gather the root (restored below)
    np.take(alive, node, out=allowed[: node.size])
    alive[0] = root
    return np.packbits(allowed, bitorder="little").view(np.int32)


def pack_pairs(src: np.ndarray, tokens: np.ndarray, trie: TokenTrie, rows: int, words: int) -> np.ndarray:
    """int32 ``[rows, words]`` masks from *distinct* ``(row, token)`` pairs (byte-duplicates added;
    a repeated pair would carry into the next bit)."""
    if trie.dup_src.size and tokens.size:
        hit = np.searchsorted(trie.dup_src, tokens)
        lo = hit
        hi = np.searchsorted(trie.dup_src, tokens, side="right")
        cnt = hi - lo
        if cnt.any():
            extra_idx, owner = expand(lo, cnt)
            src = np.concatenate([src, src[owner]])
            tokens = np.concatenate([tokens, trie.dup_dst[extra_idx]])
    tokens = tokens.astype(np.int64)
    flat = src.astype(np.int64) * words + (tokens >> 5)
    bits = np.left_shift(1, tokens & 31).astype(np.float64)
    out = np.bincount(flat, weights=bits, minlength=rows * words)
    return out.astype(np.uint32).view(np.int32).reshape(rows, words)


def pack_ids(tokens: np.ndarray, words: int) -> np.ndarray:
    """int32 ``[words]`` bitmask of *distinct* token ids (int64; a repeated id would carry into the
    next bit), exactly those (no byte-duplicates added): one bincount, no vocabulary-sized
    temporary."""
    bits = np.left_shift(1, tokens & 31).astype(np.float64)  # NOTE: distinct bits: sums are exact
    out = np.bincount(tokens >> 5, weights=bits, minlength=words)
    return out.astype(np.uint32).view(np.int32)
