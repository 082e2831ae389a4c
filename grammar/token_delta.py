"""Token masks of a DFA state from the mask of a *similar* state (differential masks).

Many wide states differ from a neighbour in only a few first bytes: inside the key of an
undeclared property (``"na`` must not close as ``"name"`` when ``name`` is declared) every byte but
``m`` leads to the same plain string-body state as from that body state itself. For a state ``s``
and a reference ``g`` whose mask is known, a token whose first byte ``b`` has
``trans[s, b] == trans[g, b]`` reaches the same DFA state after its first byte from both, so it is
allowed from ``s`` exactly when it is allowed from ``g``. Hence (exact, for any DFA)::

    mask(s) = (mask(g) & ~first_byte(X)) | walk(s, tokens whose first byte is in X)
    X = {b : trans[s, b] != trans[g, b]}

where ``first_byte(X)`` is the packed set of tokens starting with a byte of ``X``. Only the trie
subtrees of ``X`` are walked, instead of the whole vocabulary (a dense walk from a string-body-like
state touches every trie node).
"""

from __future__ import annotations

import numpy as np

from radixlm.grammar.trie import TokenTrie

MIN_SHARED = 128  # the reference must agree with the state on at least this many bytes
MAX_SHARE = 4  # ... and the differing subtrees may hold at most 1/MAX_SHARE of the walk's nodes


class FirstByteMasks:
    """Packed int32 ``[words]`` masks of the tokens whose bytes start with a given byte, built
    per byte on first use and kept for the trie's lifetime (byte-duplicate token ids included)."""

    def __init__(self, trie: TokenTrie, words: int) -> None:
        self.trie = trie
        self.words = words
        self.depth1 = np.full(256, -1, dtype=np.int64)
        lo, hi = int(trie.depth_start[1]), int(trie.depth_start[2]) if trie.depth_start.size > 2 else 1
        self.depth1[trie.node_byte[lo:hi]] = np.arange(lo, hi)
        self._top: np.ndarray | None = None
        self._masks: dict[int, np.ndarray] = {}

    def top_byte(self) -> np.ndarray:
        """int16 ``[n_nodes]``: the first byte of every node's bytes (root: -1)."""
        if self._top is None:
            trie = self.trie
            top = np.full(trie.n_nodes, -1, dtype=np.int16)
            ds = trie.depth_start
            if ds.size > 2:
                top[ds[1] : ds[2]] = trie.node_byte[ds[1] : ds[2]]
                for d in range(2, ds.size - 1):
                    lo, hi = int(ds[d]), int(ds[d + 1])
                    top[lo:hi] = top[trie.parent[lo:hi]]
            self._top = top
        return self._top

    def union(self, byte_values: np.ndarray) -> np.ndarray:
        """OR of the masks of ``byte_values`` (int array of bytes)."""
        out = np.zeros(self.words, dtype=np.int32)
        for b in byte_values.tolist():
            got = self._masks.get(b)
            if got is None:
                got = self._masks[b] = self._build(b)
            out |= got
        return out

    def _build(self, b: int) -> np.ndarray:
        trie = self.trie
        tokens = trie.node_token[(self.top_byte() == b) & (trie.node_token >= 0)]
        allowed = np.zeros(self.words * 32, dtype=bool)
        allowed[tokens] = True
        if trie.dup_token.size:
            allowed[trie.dup_token] |= allowed[trie.dup_of]
        return np.packbits(allowed, bitorder="little").view(np.int32)


def _first_bytes(trie: TokenTrie, words: int) -> FirstByteMasks:
    got = getattr(trie, "_first_byte_masks", None)
    if got is None or got.words != words:
        got = FirstByteMasks(trie, words)
        trie._first_byte_masks = got  # NOTE: one per tokenizer trie, shared by every grammar
    return got


def reference_state(trans: np.ndarray, cost: np.ndarray, byte_weight: np.ndarray, s: int) -> int:
    """The state ``g`` to derive ``s``'s mask from: the most common non-dead target of ``s``
    other than ``s``, when it agrees with ``s`` on >= ``MIN_SHARED`` bytes and the differing
    bytes' subtrees are small against ``s``'s walk; 0 when there is no good reference."""
    row = trans[s]
    counts = np.bincount(row, minlength=max(s, int(row.max())) + 1)
    counts[0] = 0
    counts[s] = 0
    g = int(counts.argmax())
    if g == 0 or counts[g] == 0:
        return 0
    differ = row != trans[g]
    if 256 - int(differ.sum()) < MIN_SHARED:
        return 0
    if int(byte_weight[differ].sum()) * MAX_SHARE > int(cost[s]):
        return 0
    return g


def delta_mask(trans: np.ndarray, trie: TokenTrie, words: int, s: int, g: int, base: np.ndarray,
               walk) -> np.ndarray:
    """``mask(s)`` from ``base = mask(g)`` (see the module docstring).

    Args:
        trans: int32 ``[n_states, 256]`` DFA transitions (0 dead).
        walk: :func:`radixlm.grammar.token_index.walk_from` (passed in to avoid an import cycle).
    Returns:
        int32 ``[words]`` packed mask of ``s`` (stop tokens excluded, like ``base``).
    """
    fb = _first_bytes(trie, words)
    differ = np.nonzero(trans[s] != trans[g])[0]
    out = base & ~fb.union(differ)
    nodes = fb.depth1[differ]
    nxt = trans[s, differ].astype(np.int64)
    live = (nodes >= 0) & (nxt != 0)
    nodes, nxt = nodes[live], nxt[live]
    if nodes.size == 0:
        return out
    _, below, _ = walk(trans, trie, nodes, nxt)
    tok = trie.node_token[np.concatenate([nodes, below])]
    tok = np.unique(tok[tok >= 0]).astype(np.int64)
    if tok.size == 0:
        return out
    allowed = np.zeros(words * 32, dtype=bool)
    allowed[tok] = True
    if trie.dup_token.size:
        allowed[trie.dup_token] |= allowed[trie.dup_of]
    return out | np.packbits(allowed, bitorder="little").view(np.int32)
