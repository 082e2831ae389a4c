"""The engine behind regex, choices and non-recursive JSON Schema grammars: one byte DFA."""

from __future__ import annotations

import numpy as np

from radixlm.grammar.automaton import ByteDFA
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.mask_table import MaskTable
from radixlm.grammar.token_index import DfaIndex, RegionCache
from radixlm.grammar.tokenizer_info import TokenizerInfo

EAGER_STATES = 4000  # compile-time mask precomputation up to this many DFA states
# NOTE: full-trie walks of (estimated) mask work that make a class trie worth building for a
# precomputed DFA. The estimate counts every wide state as a walk, though most take a region, a
# reference or a shift class instead: at 100, MaskBench objects with undeclared pairs between
# declared ones built a class trie (10-30 ms) that cost more than it saved (compile p90 -15%).
CLASS_TRIE_WALKS = 500


class DfaEngine:
    """Matcher states are DFA state ids (0: dead)."""

    def __init__(self, dfa: ByteDFA, info: TokenizerInfo, regions: RegionCache, eager: bool = True) -> None:
        self.dfa = dfa
        # NOTE: cold states (reachable only through a rarely taken branch, see ast.cold) are left
        # to their first visit; every other state is precomputed when the DFA is small enough.
        # Work here scales with the hot states only (most of a schema's states are cold).
        self.hot = np.arange(1, dfa.n_states) if dfa.hot is None else np.nonzero(dfa.hot)[0]
        self.hot = self.hot[self.hot != 0]
        # NOTE: the class trie (own regions cache) pays off when the masks to come would walk the
        # trie ~CLASS_TRIE_WALKS times (its build costs tens of walks): a DFA too large to
        # precompute (masks computed while serving), or a precomputed one with that much work.
        full = info.trie
        lazy = not eager or self.hot.size > EAGER_STATES
        trie = full
        if lazy or _walk_work(dfa.trans[self.hot], full) > CLASS_TRIE_WALKS * full.n_nodes:
            trie = info.walk_trie(dfa.trans)
        self.index = DfaIndex(dfa.trans, trie, info.mask_words, regions if trie is full else trie.regions)
        self._forced: dict[int, int] = {}  # state -> its one live byte, -1: none (filled lazily)
        self.eager = eager and self.hot.size <= EAGER_STATES
        if self.eager:
            try:
                self.index.compute(self.hot.tolist())
            except GrammarError:  # NOTE: compile budget spent: the rest is computed on first visit
                self.eager = False

    def mask_table(self, stop_row: np.ndarray, compute) -> MaskTable:
        """The grammar's :class:`MaskTable`: rows of the precomputed states (stop tokens added
        where the DFA accepts), cold states left to their first visit through ``compute``. A DFA
        too large to precompute gets a table filled on first visit, the start state's row computed
        now (every request's first step is a table hit)."""
        if not self.eager:
            table = MaskTable(stop_row.size, stop_row, compute)
            table.row_ids([self.dfa.start])
            return table
        masks = self.index.masks
        got = {s: masks[s] for s in self.hot.tolist()}
        return MaskTable.from_states(self.dfa.n_states, got, self.dfa.accept, stop_row, compute)

    def masks(self, states: list[int]) -> list[np.ndarray]:
        """Masks of ``states`` (one batched walk for those not computed yet)."""
        self.index.compute(states)
        return [self.index.masks[s] for s in states]

    def initial(self) -> int:
        return self.dfa.start

    def advance(self, state: int, data: bytes) -> int | None:
        s = self.dfa.step(state, data)
        return s if s else None

    def accepting(self, state: int) -> bool:
        return bool(self.dfa.accept[state])

    def can_continue(self, state: int) -> bool:
        return bool(self.index.costs.live_of(state))

    def mask(self, state: int) -> np.ndarray:
        return self.index.mask(state)

    def forced_bytes(self, state: int, limit: int = 4096) -> bytes:
        out = bytearray()
        flat = self.dfa.flat
        while len(out) < limit:
            b = self._forced.get(state)
            if b is None:
                b = self._forced[state] = _forced_byte(self.dfa, state)
            if b < 0:
                break
            out.append(b)
            state = flat[(state << 8) | b]
        return bytes(out)

    @property
    def n_states(self) -> int:
        return self.dfa.n_states


def _walk_work(rows: np.ndarray, trie) -> float:
    """Trie nodes a mask walk of each DFA row in ``rows`` (int ``[k, 256]``) would visit at most,
    summed (each row capped at the whole trie)."""
    # NOTE: einsum, not ``@``: a float matmul goes to a multi-threaded BLAS, whose threads cost
    # more wall time than the product itself on a busy machine
    per_row = np.einsum("ij,j->i", rows != 0, trie.byte_weight.astype(np.float64))
    return float(np.minimum(per_row, trie.n_nodes).sum())


def _forced_byte(dfa: ByteDFA, state: int) -> int:
    """The one byte that keeps ``state`` alive when it is the only one and ``state`` does not
    accept (the output must go on with it), else -1."""
    if dfa.accept[state]:
        return -1
    live = np.flatnonzero(dfa.trans[state])
    return int(live[0]) if live.size == 1 else -1
