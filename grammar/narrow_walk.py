"""First-visit masks of narrow DFA states by a plain Python walk of the trie.

A state met for the first time while serving is usually restrictive (inside a property key, after
``{``): a handful of live ``(trie node, state)`` pairs over a few depths. The vectorized sparse
walk (:func:`radixlm.grammar.trie_walks.walk_from`) spends ~20 numpy calls per depth on them
(50-250 µs per state); stepping the few live pairs one by one costs a fraction of a microsecond
each. The walk gives up past a step budget (the state was not that narrow) and the caller falls
back to the vectorized walk, so the worst case stays bounded.
"""

from __future__ import annotations

import numpy as np

from radixlm.grammar.mask_pack import pack_ids
from radixlm.grammar.trie import TokenTrie, expand

STEP_BUDGET = 300  # (pair, byte) steps before the Python walk hands over to the vectorized one
SCAN_CHILDREN = 32  # nodes with up to this many children are scanned, larger ones looked up by byte


class TrieView:
    """Python-side views of one trie (children runs, bytes, tokens), with per-node child maps
    built on first use. Shared by every walker of the trie (:func:`trie_view`); a race between
    threads at most builds one child map twice (same contents)."""

    def __init__(self, trie: TokenTrie) -> None:
        self.lo = memoryview(np.ascontiguousarray(trie.child_lo, dtype=np.int32))
        self.cnt = memoryview(np.ascontiguousarray(trie.child_cnt, dtype=np.int32))
        self.byte = memoryview(np.ascontiguousarray(trie.node_byte, dtype=np.int32))
        self.token = memoryview(np.ascontiguousarray(trie.node_token, dtype=np.int32))
        self._kids: dict[int, dict[int, int]] = {}
        self._dups: dict[int, list[int]] | None = None
        self._dup_src, self._dup_dst = trie.dup_src, trie.dup_dst

    def dups(self) -> dict[int, list[int]]:
        """``{token: its byte-duplicates}`` (built once)."""
        got = self._dups
        if got is None:
            got = {}
            for a, b in zip(self._dup_src.tolist(), self._dup_dst.tolist()):
                got.setdefault(a, []).append(b)
            self._dups = got
        return got

    def kid_map(self, node: int) -> dict[int, int]:
        """``{byte: child}`` of ``node`` (cached)."""
        kids = self._kids.get(node)
        if kids is None:
            lo, byte_ = self.lo[node], self.byte
            kids = self._kids[node] = {byte_[c]: c for c in range(lo, lo + self.cnt[node])}
        return kids


def trie_view(trie: TokenTrie) -> TrieView:
    """The :class:`TrieView` of ``trie``, built once and kept on it: its child maps then serve
    the first visits of every grammar, not only one grammar's (each built a map of the root and
    the wide nodes again on its first walks)."""
    got = getattr(trie, "_py_view", None)
    if got is None:
        got = trie._py_view = TrieView(trie)
    return got


class NarrowWalker:
    """Python walks of one DFA (int32 ``trans [n_states, 256]``) against one trie.

    Per-state live-byte lists and per-node child maps are built on first use and kept (bounded by
    the DFA's states and the trie's nodes). Single-writer: the owning DfaIndex's thread."""

    def __init__(self, trans: np.ndarray, trie: TokenTrie) -> None:
        self.trans = trans
        flat = np.ascontiguousarray(trans.reshape(-1), dtype=np.int32) if trans.shape[0] < 1 << 23 else None
        self._rows = memoryview(flat) if flat is not None else None
        self.view = trie_view(trie)
        self._live: dict[int, list[int]] = {}  # state -> its live bytes
        self._diff: dict[tuple[int, int], list[int]] = {}  # (s, g) -> bytes where their rows differ

    def delta(self, s: int, g: int, budget: int = STEP_BUDGET) -> tuple[list[int], list[int]] | None:
        """The lockstep walk of :func:`radixlm.grammar.token_delta.delta_mask` from ``(s, g)``:
        ``(tokens, live)``, the primary tokens of the nodes where the two reach different states
        and those among them live from ``s``; None past ``budget`` steps."""
        view = self.view
        rows, lo_, cnt_, byte_, token_ = self._rows, view.lo, view.cnt, view.byte, view.token
        if rows is None:
            return None
        if len(self._diff) > 4096:
            self._diff.clear()  # NOTE: bounded; rebuilt on demand
        tokens: list[int] = []
        live: list[int] = []
        stack = [(0, s, g)]
        steps = 0
        while stack:
            node, qs, qg = stack.pop()
            cnt = cnt_[node]
            if not cnt:
                continue
            lo, bs, bg = lo_[node], qs << 8, qg << 8
            diff = None
            if cnt > SCAN_CHILDREN:
                diff = self._diff.get((qs, qg))
                if diff is None:
                    diff = self._diff[(qs, qg)] = np.flatnonzero(self.trans[qs] != self.trans[qg]).tolist()
            if diff is not None and len(diff) < cnt:
                steps += len(diff)
                kids = view.kid_map(node)
                cands = [(kids[b], b) for b in diff if b in kids]
            else:
                steps += cnt
                cands = [(c, byte_[c]) for c in range(lo, lo + cnt)]
            for c, b in cands:
                ns, ng = rows[bs | b], rows[bg | b]
                if ns != ng:  # NOTE: equal (both dead included): the subtree agrees with g
                    if cnt_[c]:
                        stack.append((c, ns, ng))
                    t = token_[c]
                    if t >= 0:
                        tokens.append(t)
                        if ns:
                            live.append(t)
            if steps > budget:
                return None
        return tokens, live

    def tokens(self, starts: list[tuple[int, int]], budget: int = STEP_BUDGET) -> list[int] | None:
        """Primary token ids (``node_token``) of the trie nodes below the ``(node, state)`` pairs
        ``starts`` that stay live (the start nodes excluded; each node once when the start
        nodes are not nested); None when the walk takes more than ``budget`` steps."""
        view = self.view
        rows, lo_, cnt_, byte_, token_ = self._rows, view.lo, view.cnt, view.byte, view.token
        if rows is None:
            return None
        out: list[int] = []
        stack: list[int] = [x for pair in starts for x in pair]  # NOTE: node, state, ...: no tuples (GC)
        steps = 0
        while stack:
            q = stack.pop()
            node = stack.pop()
            cnt = cnt_[node]
            if not cnt:
                continue
            lo, base = lo_[node], q << 8
            live = self._live.get(q) if cnt > SCAN_CHILDREN else None
            if live is None and cnt > SCAN_CHILDREN:
                live = self._live[q] = np.flatnonzero(self.trans[q]).tolist()
            if live is None or cnt <= len(live):  # NOTE: scan the children, or look up live bytes
                steps += cnt
                for c in range(lo, lo + cnt):
                    r = rows[base | byte_[c]]
                    if r:
                        t = token_[c]
                        if t >= 0:
                            out.append(t)
                        if cnt_[c]:  # NOTE: leaves need no visit of their own
                            stack.append(c)
                            stack.append(r)
            else:
                steps += len(live)
                kids = view.kid_map(node)
                for b in live:
                    c = kids.get(b)
                    if c is not None:
                        t = token_[c]
                        if t >= 0:
                            out.append(t)
                        if cnt_[c]:
                            stack.append(c)
                            stack.append(rows[base | b])
            if steps > budget:
                return None
        return out


PY_PACK = 48  # token lists up to this long are set bit by bit in Python (see or_tokens)


def or_tokens(base: np.ndarray | None, tokens: list[int], trie: TokenTrie, words: int) -> np.ndarray:
    """int32 ``[words]``: ``base`` (int32 ``[words]``, or None: empty) with the bits of
    ``tokens`` (primary token ids, repeats allowed) and their byte-duplicates set; a new array.
    Up to ``PY_PACK`` tokens bit by bit in Python (a first visit runs cold code, where the ~15
    numpy calls of :func:`pack_few` cost more than the loop), more through :func:`pack_few`."""
    if len(tokens) > PY_PACK:
        arr = np.unique(np.asarray(tokens, dtype=np.int64))
        got = pack_few(arr, trie, words)
        return got if base is None else base | got
    out = np.zeros(words, dtype=np.int32) if base is None else base.copy()
    bits = memoryview(out.view(np.uint32))
    dups = trie_view(trie).dups()
    for t in tokens:
        bits[t >> 5] |= 1 << (t & 31)
        more = dups.get(t)
        if more is not None:
            for u in more:
                bits[u >> 5] |= 1 << (u & 31)
    return out


def edit_tokens(base: np.ndarray, clear: list[int], add: list[int], trie: TokenTrie, words: int) -> np.ndarray:
    """int32 ``[words]``: ``base & ~pack(clear) | pack(add)`` (``pack``: the tokens' bits and
    their byte-duplicates', as :func:`pack_few`); a new array. Bit by bit in Python up to
    ``PY_PACK`` tokens in all (see :func:`or_tokens`)."""
    if len(clear) + len(add) > PY_PACK:
        out = base & ~pack_few(np.unique(np.asarray(clear, dtype=np.int64)), trie, words) if clear else base.copy()
        return out | pack_few(np.unique(np.asarray(add, dtype=np.int64)), trie, words) if add else out
    out = base.copy()
    bits = memoryview(out.view(np.uint32))
    dups = trie_view(trie).dups()
    for t in clear:
        bits[t >> 5] &= ~(1 << (t & 31)) & 0xFFFFFFFF
        for u in dups.get(t, ()):
            bits[u >> 5] &= ~(1 << (u & 31)) & 0xFFFFFFFF
    for t in add:
        bits[t >> 5] |= 1 << (t & 31)
        for u in dups.get(t, ()):
            bits[u >> 5] |= 1 << (u & 31)
    return out


def pack_few(tokens: np.ndarray, trie: TokenTrie, words: int) -> np.ndarray:
    """int32 ``[words]`` bitmask of a few *distinct* token ids (int64) and their byte-duplicates:
    the same mask as :func:`radixlm.grammar.mask_pack.pack_tokens`, without a vocabulary-sized
    temporary."""
    if trie.dup_src.size and tokens.size:
        lo = np.searchsorted(trie.dup_src, tokens)
        cnt = np.searchsorted(trie.dup_src, tokens, side="right") - lo
        if cnt.any():
            tokens = np.concatenate([tokens, trie.dup_dst[expand(lo, cnt)[0]]])
    return pack_ids(tokens, words)
