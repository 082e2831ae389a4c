"""Small trie walks of the Earley engine's crossing tokens, stepped in Python.

A crossing walk (:meth:`radixlm.grammar.earley_engine.EarleyEngine._walk_paths`) starts below a
few boundary nodes (where the previous terminal ended) in a spawned terminal's start state, and
most die within a byte or two (``,`` ``:`` ``"`` against a key or a value's first byte). The
vectorized :func:`~radixlm.grammar.trie_walks.walk_from` spends ~20 numpy calls per trie depth on
them (40-200 µs a walk); stepping the few live ``(node, state)`` pairs one by one costs well under
a microsecond each. A walk gives up past a step budget and the caller walks it with numpy, so the
worst case stays bounded; both give the same nodes.
"""

from __future__ import annotations

import numpy as np

from radixlm.grammar.narrow_walk import TrieView

STEP_BUDGET = 1500  # (pair, child) steps before a walk hands over to the vectorized one
SCAN_CHILDREN = 24  # nodes with more children are looked up by the state's live bytes instead
_EMPTY = np.zeros(0, np.int64)


def distinct(x: np.ndarray) -> np.ndarray:
    """Sorted distinct values of ``x`` (1-D). NOTE: np.unique hashes and costs ~20x a sort here."""
    if x.size < 2:
        return x
    x = np.sort(x)
    return x[np.concatenate(([True], x[1:] != x[:-1]))]


def narrow_states(idx, limit: int, wide_nodes: int, mid_live: int) -> list[int]:
    """Up to ``limit`` states of DfaIndex ``idx`` that its sparse walk serves: fewer than
    ``wide_nodes`` trie nodes below their first byte, or below their first two bytes when they
    have at most ``mid_live`` live bytes (NOTE: testing the two-byte count of every state costs
    more than the masks; wide states have many live bytes). At most ``limit`` two-byte tests."""
    states = np.arange(1, idx.trans.shape[0])
    cheap = idx.cost[1:] < wide_nodes
    out = states[cheap][:limit].tolist()
    few = states[~cheap & (idx.n_live[1:] <= mid_live)][: limit - len(out)].tolist()
    return out + [s for s in few if idx.cost2(s) < wide_nodes]


class StackedDfas:
    """The small terminals' DFAs (``terms``: ByteDFAs; those of at most ``max_terminal`` states,
    up to ``max_states`` in all) stacked into one table (``trans`` int32 ``[n, 256]``, ``accept``
    bool ``[n]``; state 0 dead), so walks in many terminals go through the trie together: local
    state ``q >= 1`` of terminal ``t`` is ``q + offset[t]`` (``offset[t] == -1``: not stacked)."""

    def __init__(self, terms: list, max_terminal: int, max_states: int) -> None:
        self.offset = [-1] * len(terms)
        total = 1
        for i, term in enumerate(terms):
            n = term.trans.shape[0]
            if n <= max_terminal and total + n - 1 <= max_states:
                self.offset[i] = total - 1
                total += n - 1
        self.trans = np.zeros((total, 256), dtype=np.int32)
        self.accept = np.zeros(total, dtype=bool)
        for term, off in zip(terms, self.offset):
            if off >= 0:
                n = term.trans.shape[0]
                local = term.trans[1:]
                self.trans[1 + off : n + off] = np.where(local != 0, local + off, 0)
                self.accept[1 + off : n + off] = term.accept[1:]


class TableWalker:
    """Python walks of one byte DFA (int32 ``trans [n, 256]``, bool ``accept [n]``, state 0
    dead) below given trie nodes.

    Raises:
        ValueError: a table too large for ``state << 8 | byte`` indexing in int32 (callers use
            the vectorized walk for those).
    """

    def __init__(self, trans: np.ndarray, accept: np.ndarray, view: TrieView) -> None:
        if trans.shape[0] >= 1 << 23:
            raise ValueError("table too large for a Python walk")
        self.trans = trans
        self.rows = memoryview(np.ascontiguousarray(trans.reshape(-1), dtype=np.int32))
        self.acc = accept.tolist()
        self.view = view
        self._live: dict[int, list[int]] = {}  # state -> live bytes

    def _live_bytes(self, q: int) -> list[int]:
        got = self._live.get(q)
        if got is None:
            got = self._live[q] = np.flatnonzero(self.trans[q]).tolist()
        return got

    def walk(self, nodes: list[int], q: int, budget: int = STEP_BUDGET,
             leaves: bool = True) -> tuple[np.ndarray, np.ndarray] | None:
        """Walk below each of ``nodes`` (trie node ids) from DFA state ``q``: ``(tokens, accept
        nodes)`` as :func:`~radixlm.grammar.trie_walks.walk_from` would find them (tokens int64,
        maybe repeated; accept nodes int64, sorted and distinct: live descendants where the DFA
        accepts; with ``leaves`` False only those with children), or None past ``budget`` steps."""
        view, rows, acc = self.view, self.rows, self.acc
        lo_, cnt_, byte_, token_ = view.lo, view.cnt, view.byte, view.token
        tokens: list[int] = []
        ends: list[int] = []
        stack = [(n, q) for n in nodes]
        steps = 0
        push, add_token, add_end = stack.append, tokens.append, ends.append
        while stack:
            node, s = stack.pop()
            cnt = cnt_[node]
            if not cnt:
                continue
            base = s << 8
            if cnt > SCAN_CHILDREN:
                live = self._live_bytes(s)
                if len(live) < cnt:
                    kids = view.kid_map(node)
                    steps += len(live)
                    if steps > budget:
                        return None
                    for b in live:  # NOTE: live bytes: every child found here is alive
                        c = kids.get(b)
                        if c is not None:
                            ns = rows[base | b]
                            tok = token_[c]
                            if tok >= 0:
                                add_token(tok)
                            if acc[ns] and (leaves or cnt_[c]):
                                add_end(c)
                            push((c, ns))
                    continue
            lo = lo_[node]
            steps += cnt
            if steps > budget:
                return None
            for c in range(lo, lo + cnt):
                ns = rows[base | byte_[c]]
                if ns:
                    tok = token_[c]
                    if tok >= 0:
                        add_token(tok)
                    if acc[ns] and (leaves or cnt_[c]):
                        add_end(c)
                    push((c, ns))
        tok_arr = np.asarray(tokens, dtype=np.int64) if tokens else _EMPTY
        end_arr = np.asarray(sorted(set(ends)), dtype=np.int64) if ends else _EMPTY
        return tok_arr, end_arr
