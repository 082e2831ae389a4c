"""The engine behind EBNF grammars and recursive JSON schemas: Earley over terminal DFAs.

A matcher state is a set of *threads* ``(column, terminal, dfa_state)``: inside ``terminal``,
started after Earley column ``column``. Lexing is not committed: wherever a terminal may end, the
terminals the parser expects next start as new threads (scannerless semantics; ``%ignore``
terminals may appear at any terminal boundary).

Token masks: the tokens that stay inside a thread's terminal are that terminal DFA's state mask
(cached, see :class:`DfaIndex`); the tokens that cross a terminal boundary are found by walking
the trie below the boundary nodes with the threads the boundary spawns, vectorized per thread.
"""

from __future__ import annotations

import numpy as np

from radixlm.grammar.ast import Node
from radixlm.grammar.cfg import CFG, lower
from radixlm.grammar.earley import Chart
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.token_index import DfaIndex, RegionCache, pack_tokens, walk_from
from radixlm.grammar.tokenizer_info import TokenizerInfo

Thread = tuple[int, int, int]
EAGER_TERMINAL_STATES = 4000  # terminal DFA states whose masks are computed at compile time
CROSSING_CACHE = 100_000  # cached crossing walks (per thread, per terminal path)


class EarleyState:
    """Immutable matcher state (hashable)."""

    __slots__ = ("threads", "accepting", "_hash")

    def __init__(self, threads: frozenset[Thread], accepting: bool) -> None:
        self.threads = threads
        self.accepting = accepting
        self._hash = hash((threads, accepting))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, EarleyState) and self.accepting == other.accepting
                and self.threads == other.threads)


class EarleyEngine:
    def __init__(self, cfg: CFG, info: TokenizerInfo, regions: RegionCache) -> None:
        self.cfg = cfg
        self.info = info
        self.trie = info.trie
        self.words = info.mask_words
        self.chart = Chart(cfg)
        self.terms = cfg.terminals
        self.rows = [t.rows for t in self.terms]
        self.accept = [t.accept for t in self.terms]
        self.index = [DfaIndex(t.trans, self.trie, self.words, regions, t.accept) for t in self.terms]
        self.ignore = frozenset(cfg.ignore)
        self._spawn: dict[tuple[int, int], tuple[frozenset[Thread], bool]] = {}
        self._crossing: dict[Thread, np.ndarray] = {}  # thread -> token ids crossing its end
        self._paths: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}  # see _below
        budget = EAGER_TERMINAL_STATES  # NOTE: terminal masks at compile time, not on first visit
        for idx in self.index:
            n = idx.trans.shape[0]
            if n - 1 <= budget:
                try:
                    idx.compute(list(range(1, n)))
                except GrammarError:  # NOTE: compile budget spent: the rest on first visit
                    break
                budget -= n - 1
        self._initial = self._start_state()
        if not self._initial.threads and not self._initial.accepting:
            raise GrammarError("the grammar accepts no string")

    @classmethod
    def from_rules(cls, root: Node, rules: dict[str, Node], info: TokenizerInfo, regions: RegionCache,
                   ignore: list[Node] = ()) -> "EarleyEngine":
        return cls(lower(root, rules, ignore), info, regions)

    # --- threads -------------------------------------------------------------------------------

    def _threads_at(self, col: int) -> frozenset[Thread]:
        terms = self.chart.scan_terms[col] | self.ignore
        return frozenset((col, t, self.terms[t].start) for t in terms)

    def _start_state(self) -> EarleyState:
        return EarleyState(self._threads_at(0), self.chart.accepting[0])

    def spawn(self, col: int, term: int) -> tuple[frozenset[Thread], bool]:
        """Threads (and accepting flag) right after ``term`` ends, having started at ``col``."""
        key = (col, term)
        got = self._spawn.get(key)
        if got is None:
            nxt = col if term in self.ignore else self.chart.advance(col, term)
            got = (frozenset(), False) if nxt is None else (self._threads_at(nxt), self.chart.accepting[nxt])
            self._spawn[key] = got
        return got

    def initial(self) -> EarleyState:
        return self._initial

    def advance(self, state: EarleyState, data: bytes) -> EarleyState | None:
        threads = state.threads
        accepting = state.accepting
        for b in data:
            nxt: set[Thread] = set()
            accepting = False
            for col, t, q in threads:
                q2 = self.rows[t][q][b]
                if q2:
                    nxt.add((col, t, q2))
                    if self.accept[t][q2]:
                        more, acc = self.spawn(col, t)
                        nxt |= more
                        accepting = accepting or acc
            if not nxt:
                return None
            threads = frozenset(nxt)
        return EarleyState(threads, accepting)

    def accepting(self, state: EarleyState) -> bool:
        return state.accepting

    # --- masks ---------------------------------------------------------------------------------

    def mask(self, state: EarleyState) -> np.ndarray:
        """Packed int32 ``[words]`` mask of ``state`` (stop tokens excluded): per thread, the
        tokens staying inside its terminal (the terminal DFA's cached mask) and the tokens
        crossing its end into the threads it spawns (cached per thread)."""
        out = np.zeros(self.words, dtype=np.int32)
        crossing: list[np.ndarray] = []
        for th in state.threads:
            col, t, q = th
            out |= self.index[t].mask(q)
            got = self._crossing.get(th)
            if got is None:
                got = self._crossing_nodes(col, t, q)
                if len(self._crossing) > CROSSING_CACHE:
                    self._crossing.clear()
                self._crossing[th] = got
            if got.size:
                crossing.append(got)
        if crossing:
            out |= pack_tokens(np.concatenate(crossing), self.trie, self.words)
        return out

    def _crossing_nodes(self, col: int, t: int, q: int) -> np.ndarray:
        """Token ids that end past the end of terminal ``t`` (from state ``q``, started at ``col``)."""
        nodes = self.index[t].boundary(q)
        found: list[np.ndarray] = []
        if nodes.size:
            more, _ = self.spawn(col, t)
            if more:
                self._below(more, (t, q), nodes, found, 0)
        return np.unique(np.concatenate(found)) if found else np.zeros(0, np.int64)

    def _below(self, threads: frozenset[Thread], path: tuple, nodes: np.ndarray, out: list[np.ndarray],
               depth: int) -> None:
        """Append the tokens strictly below ``nodes`` under ``threads``.

        NOTE: the walk below ``nodes`` depends only on the terminal path that produced them
        (``path``: the first thread's ``(terminal, state)``, then each spawned ``(terminal,
        state)``), never on Earley columns; columns only decide which threads are spawned. So walks
        are cached per path and shared by every column, state and request of the grammar.
        """
        if depth > self.trie.max_depth:
            return
        for col, t, q in threads:
            key = path + (t, q)
            got = self._paths.get(key)
            if got is None:
                term = self.terms[t]
                _, found, states = walk_from(term.trans, self.trie, nodes, np.full(nodes.size, q))
                tok = self.trie.node_token[found]
                got = (np.unique(tok[tok >= 0]), np.unique(found[term.accept[states]]))
                if len(self._paths) > CROSSING_CACHE:
                    self._paths.clear()
                self._paths[key] = got
            tokens, ends = got
            if tokens.size:
                out.append(tokens)
            if ends.size:
                more, _ = self.spawn(col, t)
                if more:
                    self._below(more, key, ends, out, depth + 1)

    def forced_bytes(self, state: EarleyState, limit: int = 4096) -> bytes:
        out = bytearray()
        while len(out) < limit and not state.accepting:
            options: set[int] = set()
            for _, t, q in state.threads:
                row = self.terms[t].trans[q]
                options.update(np.nonzero(row)[0].tolist())
                if len(options) > 1:
                    break
            if len(options) != 1:
                break
            b = options.pop()
            nxt = self.advance(state, bytes([b]))
            if nxt is None:
                break
            out.append(b)
            state = nxt
        return bytes(out)
