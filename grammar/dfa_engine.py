"""The engine behind regex, choices and non-recursive JSON Schema grammars: one byte DFA."""

from __future__ import annotations

import numpy as np

from radixlm.grammar.automaton import ByteDFA
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.mask_table import MaskTable
from radixlm.grammar.token_index import DfaIndex, RegionCache
from radixlm.grammar.tokenizer_info import TokenizerInfo

EAGER_STATES = 4000  # compile-time mask precomputation up to this many DFA states
CLASS_TRIE_WALKS = 100  # full-trie walks of mask work that make a class trie worth building


class DfaEngine:
    """Matcher states are DFA state ids (0: dead)."""

    def __init__(self, dfa: ByteDFA, info: TokenizerInfo, regions: RegionCache, eager: bool = True) -> None:
        self.dfa = dfa
        live = dfa.trans != 0
        count = live.sum(axis=1)
        # NOTE: cold states (reachable only through a rarely taken branch, see ast.cold) are left
        # to their first visit; every other state is precomputed when the DFA is small enough.
        self.hot = np.arange(1, dfa.n_states) if dfa.hot is None else np.nonzero(dfa.hot)[0]
        self.hot = self.hot[self.hot != 0]
        # NOTE: the class trie (own regions cache) pays off when the masks to come would walk the
        # trie ~CLASS_TRIE_WALKS times (its build costs tens of walks): a DFA too large to
        # precompute (masks computed while serving), or a precomputed one with that much work.
        full = info.trie
        work = np.minimum(live[self.hot] @ full.byte_weight.astype(np.float64), full.n_nodes).sum()
        lazy = not eager or self.hot.size > EAGER_STATES
        trie = info.walk_trie(dfa.trans) if lazy or work > CLASS_TRIE_WALKS * full.n_nodes else full
        self.index = DfaIndex(dfa.trans, trie, info.mask_words, regions if trie is full else trie.regions)
        self._forced = np.where(count == 1, live.argmax(axis=1), -1)
        self._forced[dfa.accept] = -1
        self.eager = eager and self.hot.size <= EAGER_STATES
        if self.eager:
            try:
                self.index.compute(self.hot.tolist())
            except GrammarError:  # NOTE: compile budget spent: the rest is computed on first visit
                self.eager = False

    def mask_table(self, stop_row: np.ndarray, compute) -> MaskTable | None:
        """The grammar's :class:`MaskTable`: rows of the precomputed states (stop tokens added
        where the DFA accepts), cold states left to their first visit through ``compute``; None
        when the DFA is too large to precompute (then every mask is computed on first visit)."""
        if not self.eager:
            return None
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
        return bool(self.index.n_live[state])

    def mask(self, state: int) -> np.ndarray:
        return self.index.mask(state)

    def forced_bytes(self, state: int, limit: int = 4096) -> bytes:
        out = bytearray()
        rows = self.dfa.rows
        while len(out) < limit:
            b = int(self._forced[state])
            if b < 0:
                break
            out.append(b)
            state = rows[state][b]
        return bytes(out)

    @property
    def n_states(self) -> int:
        return self.dfa.n_states
