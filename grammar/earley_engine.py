"""The engine behind EBNF grammars and recursive JSON schemas: Earley over terminal DFAs.

A matcher state is a set of *threads* ``(column, terminal, dfa_state)``: inside ``terminal``,
started after Earley column ``column``. Lexing is not committed: wherever a terminal may end, the
terminals the parser expects next start as new threads (scannerless semantics; ``%ignore``
terminals may appear at any terminal boundary).

Token masks: the tokens that stay inside a thread's terminal are that terminal DFA's state mask
(cached, see :class:`DfaIndex`; computed at compile time where that is cheap, see
:meth:`EarleyEngine._eager_masks`); the tokens that cross a terminal boundary are found by walking
the trie below the boundary nodes with the threads the boundary spawns, one level of spawns at a
time for all new threads of a state, the walks cached per terminal path (column-free).

First visits while serving: most crossing walks start below a few boundary nodes and die within
a byte or two, and narrow terminal states have few trie nodes below them; both are stepped in
Python (:mod:`radixlm.grammar.earley_walk`, under a step budget) instead of numpy's per-depth walk.
"""

from __future__ import annotations

import numpy as np

from radixlm.grammar.ast import Node
from radixlm.grammar.budget import budget_share
from radixlm.grammar.cfg import CFG, lower
from radixlm.grammar.earley import Chart
from radixlm.grammar.earley_crossings import Crossings
from radixlm.grammar.earley_forced import ForcedBytes
from radixlm.grammar.earley_walk import StackedDfas, TableWalker, narrow_states
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.mask_table import MaskTable
from radixlm.grammar.narrow_walk import TrieView, pack_few
from radixlm.grammar.token_index import WIDE_NODES, DfaIndex, RegionCache, pack_tokens
from radixlm.grammar.tokenizer_info import TokenizerInfo

Thread = tuple[int, int, int]
_ROOT = np.zeros(1, dtype=np.int64)
EAGER_TERMINAL_STATES = 4000  # terminal DFA states whose masks are computed at compile time
EAGER_NARROW_STATES = 12_000  # ... and narrow states of larger terminals (see _eager_masks)
EAGER_NARROW_SHARE = 0.25  # ... within this share of the compile budget left
EAGER_MID_LIVE = 16  # live bytes up to which a state past WIDE_NODES is tested for narrowness
STACK_TERMINAL_STATES = 512  # terminals this small join the stacked table (see StackedDfas) ...
STACK_STATES = 8192  # ... up to this many states in all (int32 [STACK_STATES, 256]: 8 MiB)
PY_MASK_COST = 1500  # terminal states with fewer trie nodes below their live bytes: ... too
OWN_CACHE = 2048  # cached ORs of terminal masks (see _own_mask; a row each)
STEP_CACHE = 200_000  # memoized advances (and interned states) before the memos start over
_UNSEEN = object()


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


class EarleyEngine(Crossings, ForcedBytes):
    def __init__(self, cfg: CFG, info: TokenizerInfo, regions: RegionCache) -> None:
        self.cfg = cfg
        self.info = info
        self.trie = info.trie
        self.words = info.mask_words
        self.chart = Chart(cfg)
        self.terms = cfg.terminals
        # NOTE: flat int32 views (state * 256 + byte), not ``trans.tolist()``: those lists cost
        # ~1 ms of compile per thousand terminal states and stayed for every GC pass to traverse
        self.flats = [t.flat for t in self.terms]
        self.accept = [t.accept for t in self.terms]
        self._starts = [t.start for t in self.terms]
        self.index = [DfaIndex(t.trans, self.trie, self.words, regions, t.accept) for t in self.terms]
        self.ignore = frozenset(cfg.ignore)
        self._spawn: dict[tuple[int, int], tuple[frozenset[Thread], bool]] = {}
        self.stacked = StackedDfas(self.terms, STACK_TERMINAL_STATES, STACK_STATES)
        self._crossing: dict[tuple, np.ndarray] = {}  # (t, q, spawned threads) -> crossing token ids
        self._paths: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # path id -> walk, see _walk_crossings
        self._path_ids: dict[tuple, int] = {}
        self._next_path = 0
        self._roots: dict[tuple[int, int], tuple[int, int] | bool] = {}  # see _root
        self._inner: dict[tuple[int, int], np.ndarray] = {}  # see _inner_bounds
        self._owned: dict[frozenset[int], tuple[np.ndarray, list[np.ndarray]]] = {}  # see _own_mask
        self._bound_ids: dict[bytes, int] = {}
        self._view: TrieView | None = None  # Python walks (see _py_walk), built on first use
        self._walkers: dict[int, TableWalker | None] = {}  # terminal (-1: stacked) -> walker
        self._tokens: dict[tuple[EarleyState, bytes], EarleyState | None] = {}  # see advance
        self._states: dict[EarleyState, EarleyState] = {}  # interned states (see _step)
        self._forced: dict[tuple[EarleyState, int], bytes] = {}  # see forced_bytes
        self._live: dict[tuple[int, int], tuple[int, ...]] = {}  # (terminal, state) -> live bytes
        self._eager_masks()
        self._initial = self._start_state()
        if not self._initial.threads and not self._initial.accepting:
            raise GrammarError("the grammar accepts no string")

    def _eager_masks(self) -> None:
        """Terminal state masks at compile time, not on first visit: every state of the terminals
        that fit EAGER_TERMINAL_STATES, then the narrow states of the larger ones (up to
        EAGER_NARROW_STATES).

        NOTE: a narrow state (few trie nodes live below it) costs ~5 us in a batch of thousands
        but ~100 us alone, and a large terminal (an object with many properties) has thousands.
        Wide states (string bodies) stay on first visit: they cost the same either way.
        """
        budget, narrow = EAGER_TERMINAL_STATES, EAGER_NARROW_STATES
        try:
            for idx in self.index:
                n = idx.trans.shape[0]
                if n - 1 <= budget:
                    idx.compute(list(range(1, n)))
                    budget -= n - 1
            with budget_share(EAGER_NARROW_SHARE):  # NOTE: never what the compile needs after
                for idx in self.index:
                    if narrow > 0 and idx.trans.shape[0] - 1 > len(idx.masks):
                        todo = narrow_states(idx, narrow, WIDE_NODES, EAGER_MID_LIVE)
                        idx.compute(todo)
                        narrow -= len(todo)
        except GrammarError:  # NOTE: compile budget spent: the rest on first visit
            pass

    @classmethod
    def from_rules(cls, root: Node, rules: dict[str, Node], info: TokenizerInfo, regions: RegionCache,
                   ignore: list[Node] = ()) -> "EarleyEngine":
        return cls(lower(root, rules, ignore), info, regions)

    # --- threads -------------------------------------------------------------------------------

    def _threads_at(self, col: int) -> frozenset[Thread]:
        starts = self._starts
        terms = self.chart.scan_terms[col]
        if self.ignore:
            terms = terms | self.ignore
        return frozenset([(col, t, starts[t]) for t in terms])

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

    def mask_table(self, stop_row: np.ndarray, compute) -> MaskTable:
        """The grammar's :class:`MaskTable` (rows added on first visit through ``compute``), with
        the initial state's row computed now: every request's first step is a table hit."""
        table = MaskTable(self.words, stop_row, compute)
        table.row_ids([self._initial])
        return table

    def advance(self, state: EarleyState, data: bytes) -> EarleyState | None:
        """The state after ``data`` (None: refused), memoized per ``(state, data)``: a token met
        before from ``state`` costs one dict lookup. New states are interned (equal states are
        one object, so the memo's and the mask table's lookups compare by identity)."""
        key = (state, data)
        got = self._tokens.get(key, _UNSEEN)
        if got is not _UNSEEN:
            return got
        threads = state.threads
        accepting = state.accepting
        flats, accept = self.flats, self.accept
        out: EarleyState | None = state
        for b in data:
            nxt: set[Thread] = set()
            accepting = False
            for col, t, q in threads:
                q2 = flats[t][(q << 8) | b]
                if q2:
                    nxt.add((col, t, q2))
                    if accept[t][q2]:
                        more, acc = self.spawn(col, t)
                        nxt |= more
                        accepting = accepting or acc
            if not nxt:
                out = None
                break
            threads = frozenset(nxt)
        if out is not None and data:
            out = EarleyState(threads, accepting)
            out = self._states.setdefault(out, out)
        if len(self._tokens) >= STEP_CACHE:
            self._tokens.clear()
            self._states.clear()
            self._forced.clear()
        self._tokens[key] = out
        return out

    def accepting(self, state: EarleyState) -> bool:
        return state.accepting

    # --- masks ---------------------------------------------------------------------------------

    def mask(self, state: EarleyState) -> np.ndarray:
        """Packed int32 ``[words]`` mask of ``state`` (stop tokens excluded; maybe a cached array
        shared with other states: never write into it): per thread, the tokens staying inside
        its terminal (the terminal DFA's cached mask, OR-ed per set of ``(terminal, state)``, see
        :meth:`_own_mask`) and the tokens crossing its end into the threads it spawns (cached
        per thread, see :meth:`_crossings`)."""
        own = self._own_mask(state.threads)
        crossing = self._crossings(state.threads)
        if not crossing:
            return own if own is not None else np.zeros(self.words, dtype=np.int32)
        packed = pack_tokens(np.concatenate(crossing), self.trie, self.words)
        return packed if own is None else own | packed

    def _own_mask(self, threads: frozenset[Thread]) -> np.ndarray | None:
        """OR of the terminal masks of ``threads`` (None: no thread). A state's threads in other
        columns often repeat one set of ``(terminal, state)`` pairs (a key position offers every
        property's terminal at its start state at each object of a recursive schema): the OR of
        three or more arrays is cached per set (bounded by OWN_CACHE entries)."""
        parts: dict[int, np.ndarray] = {}  # NOTE: threads of other columns often share (t, q) masks
        for _, t, q in threads:
            idx = self.index[t]
            got = idx.masks.get(q)
            if got is None:
                self._narrow_first_visit(t, q)
                got = idx.mask(q)
            parts[id(got)] = got
        if len(parts) < 3:
            arrays = list(parts.values())
            return None if not arrays else arrays[0] if len(arrays) == 1 else arrays[0] | arrays[1]
        # NOTE: keyed by the arrays' ids; an entry holds its arrays, so while it lives no other
        # array can take one of those ids (equal keys: the very same arrays)
        key = frozenset(parts)
        hit = self._owned.get(key)
        if hit is not None:
            return hit[0]
        arrays = list(parts.values())
        out = arrays[0] | arrays[1]
        for a in arrays[2:]:
            out |= a
        if len(self._owned) >= OWN_CACHE:
            self._owned.clear()
        self._owned[key] = (out, arrays)
        return out

    def _narrow_first_visit(self, t: int, q: int) -> None:
        """Mask and boundary nodes of a narrow terminal state met while serving, by a Python walk
        from the root (:mod:`radixlm.grammar.earley_walk`) into the terminal's :class:`DfaIndex`
        caches; nothing when the state is not narrow enough (the index computes it then).

        NOTE: the index itself walks such a state with numpy (~100 µs) when it tracks boundaries."""
        idx = self.index[t]
        if q in idx.masks or idx.cost[q] >= PY_MASK_COST:
            return
        got = self._py_walk(_ROOT, t, q)
        if got is not None:
            tokens, ends = got
            idx.masks[q] = pack_few(tokens, self.trie, self.words)
            idx.bounds[q] = ends
