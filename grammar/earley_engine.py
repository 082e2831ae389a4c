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
from radixlm.grammar.earley_forced import ForcedBytes
from radixlm.grammar.earley_walk import StackedDfas, TableWalker, distinct, narrow_states
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.mask_table import MaskTable
from radixlm.grammar.narrow_walk import TrieView, pack_few, trie_view
from radixlm.grammar.token_index import WIDE_NODES, DfaIndex, RegionCache, pack_tokens, walk_from
from radixlm.grammar.tokenizer_info import TokenizerInfo

Thread = tuple[int, int, int]
_ROOT = np.zeros(1, dtype=np.int64)
_NONE = np.zeros(0, dtype=np.int64)
EAGER_TERMINAL_STATES = 4000  # terminal DFA states whose masks are computed at compile time
EAGER_NARROW_STATES = 12_000  # ... and narrow states of larger terminals (see _eager_masks)
EAGER_NARROW_SHARE = 0.25  # ... within this share of the compile budget left
EAGER_MID_LIVE = 16  # live bytes up to which a state past WIDE_NODES is tested for narrowness
CROSSING_CACHE = 100_000  # cached crossings (per thread) and walks (per terminal path)
STACK_TERMINAL_STATES = 512  # terminals this small join the stacked table (see StackedDfas) ...
STACK_STATES = 8192  # ... up to this many states in all (int32 [STACK_STATES, 256]: 8 MiB)
PY_WALK_NODES = 64  # crossing walks below up to this many nodes try a Python walk first
PY_MASK_COST = 1500  # terminal states with fewer trie nodes below their live bytes: ... too
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


class EarleyEngine(ForcedBytes):
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
        self.index = [DfaIndex(t.trans, self.trie, self.words, regions, t.accept) for t in self.terms]
        self.ignore = frozenset(cfg.ignore)
        self._spawn: dict[tuple[int, int], tuple[frozenset[Thread], bool]] = {}
        self.stacked = StackedDfas(self.terms, STACK_TERMINAL_STATES, STACK_STATES)
        self._crossing: dict[tuple, np.ndarray] = {}  # (t, q, spawned threads) -> crossing token ids
        self._paths: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # path id -> walk, see _walk_crossings
        self._path_ids: dict[tuple, int] = {}
        self._next_path = 0
        self._roots: dict[tuple[int, int], tuple[int, int] | bool] = {}  # see _root
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
        its terminal (the terminal DFA's cached mask) and the tokens crossing its end into the
        threads it spawns (cached per thread, see :meth:`_crossings`)."""
        parts: dict[int, np.ndarray] = {}  # NOTE: threads of other columns often share (t, q) masks
        for _, t, q in state.threads:
            idx = self.index[t]
            got = idx.masks.get(q)
            if got is None:
                self._narrow_first_visit(t, q)
                got = idx.mask(q)
            parts[id(got)] = got
        crossing = self._crossings(state.threads)
        arrays = list(parts.values())
        if crossing:
            arrays.append(pack_tokens(np.concatenate(crossing), self.trie, self.words))
        if not arrays:
            return np.zeros(self.words, dtype=np.int32)
        if len(arrays) == 1:
            return arrays[0]
        out = arrays[0] | arrays[1]
        for a in arrays[2:]:
            out |= a
        return out

    def _crossings(self, threads: frozenset[Thread]) -> list[np.ndarray]:
        """Token ids (int64, maybe repeated) crossing the end of each of ``threads``' terminals,
        those not cached computed together (:meth:`_walk_crossings`)."""
        got: list[np.ndarray] = []
        todo: dict[tuple, tuple[int, int, frozenset[Thread]]] = {}
        roots, spawned, cache = self._roots, self._spawn, self._crossing
        for col, t, q in threads:
            root = roots.get((t, q))
            if root is None:
                root = self._root(t, q)
            if root is False:  # NOTE: no token ends the terminal from here
                continue
            more = spawned.get((col, t))
            more = (more if more is not None else self.spawn(col, t))[0]
            if not more:
                continue
            key = (root, more)  # NOTE: depends on the column only through ``more``
            hit = cache.get(key)
            if hit is None:
                todo[key] = (t, q, more)
            elif hit.size:
                got.append(hit)
        if todo:
            new = self._walk_crossings(todo)
            if len(self._crossing) + len(new) > CROSSING_CACHE:
                self._crossing.clear()
            self._crossing.update(new)
            got.extend(v for v in new.values() if v.size)
        return got

    def _root(self, t: int, q: int) -> tuple[int, int] | bool:
        """The path root of thread state ``(t, q)``: ``(-1, id of its boundary nodes)``, False when
        it has none (no token ends the terminal from there). Walks and crossings below a boundary
        depend on its nodes only, and the states of a counting chain (a ``maxLength`` string) far
        from its end share one set of boundary nodes."""
        got = self._roots.get((t, q))
        if got is None:
            idx = self.index[t]
            if q not in idx.bounds:
                self._narrow_first_visit(t, q)
            nodes = idx.boundary(q)
            got = (-1, self._bound_ids.setdefault(nodes.tobytes(), len(self._bound_ids))) if nodes.size else False
            self._roots[(t, q)] = got
        return got

    def _walk_crossings(self, roots: dict[tuple, tuple[int, int, frozenset[Thread]]]) -> dict[tuple, np.ndarray]:
        """Crossing tokens of each root ``(t, q, spawned threads)``, one trie level of the spawn
        tree at a time: every walk of a level not cached yet is done in one batch.

        NOTE: the walk below a boundary depends only on the terminal path that produced it (the
        root's boundary nodes, see :meth:`_root`, then each spawned ``(terminal, start state)``),
        never on Earley columns; columns only decide which threads are spawned. So walks are
        cached per path (numbered: ``(parent path, t, q) -> id``, ids never reused) and shared by
        every column, state and request of the grammar.
        """
        found: dict[tuple, list[np.ndarray]] = {key: [] for key in roots}
        frontier = [(key, key[0], self.index[t].boundary(q), more) for key, (t, q, more) in roots.items()]
        pids, paths, spawned = self._path_ids, self._paths, self._spawn
        depth = 0
        while frontier and depth <= self.trie.max_depth:
            level: dict[int, tuple[np.ndarray, np.ndarray]] = {}
            need: dict[int, tuple[np.ndarray, int, int]] = {}
            subs = []
            for key, parent, nodes, threads in frontier:
                for col, t, q in threads:
                    sub = pids.get((parent, t, q))
                    if sub is None:
                        sub = pids[(parent, t, q)] = self._next_path
                        self._next_path += 1
                    if sub not in level and sub not in need:
                        hit = paths.get(sub)
                        if hit is None:
                            need[sub] = (nodes, t, q)
                        else:
                            level[sub] = hit
                    subs.append((key, sub, col, t))
            if need:
                new = self._walk_paths(need)
                if len(paths) + len(new) > CROSSING_CACHE:
                    paths.clear()
                    pids.clear()
                paths.update(new)
                level.update(new)
            nxt = []
            for key, sub, col, t in subs:
                tokens, ends = level[sub]
                if tokens.size:
                    found[key].append(tokens)
                if ends.size:
                    more = spawned.get((col, t))
                    more = (more if more is not None else self.spawn(col, t))[0]
                    if more:
                        nxt.append((key, sub, ends, more))
            frontier = nxt
            depth += 1
        return {key: np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else _NONE
                for key, parts in found.items()}

    def _walk_paths(self, need: dict[tuple, tuple[np.ndarray, int, int]]) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
        """Walk below ``nodes`` in terminal ``t`` from state ``q`` for each ``need`` entry: the tokens
        (int64) met and the nodes (sorted, unique) where ``t`` accepts. Walks in terminals of the
        stacked table go in one batch."""
        out: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        batch = []
        for sub, (nodes, t, q) in need.items():
            got = self._py_walk(nodes, t, q) if nodes.size <= PY_WALK_NODES else None
            if got is not None:
                out[sub] = got
                continue
            off = self.stacked.offset[t]
            if off < 0:
                term = self.terms[t]
                _, found, states = walk_from(term.trans, self.trie, nodes, np.full(nodes.size, q))
                out[sub] = self._walk_result(found, term.accept[states])
            else:
                batch.append((sub, nodes, q + off))
        if batch:
            nodes = np.concatenate([b[1] for b in batch])
            states = np.repeat(np.asarray([b[2] for b in batch], dtype=np.int64), [b[1].size for b in batch])
            owner = np.repeat(np.arange(len(batch)), [b[1].size for b in batch])
            src, found, st = walk_from(self.stacked.trans, self.trie, nodes, states, owner)
            order = np.argsort(src, kind="stable")
            found, acc = found[order], self.stacked.accept[st[order]]
            cuts = np.searchsorted(src[order], np.arange(len(batch) + 1)).tolist()
            for i, (sub, _, _) in enumerate(batch):
                out[sub] = self._walk_result(found[cuts[i] : cuts[i + 1]], acc[cuts[i] : cuts[i + 1]])
        return out

    def _py_walk(self, nodes: np.ndarray, t: int, q: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The walk of :meth:`_walk_paths` for one entry stepped in Python
        (:mod:`radixlm.grammar.earley_walk`); None when it is too wide for that."""
        off = self.stacked.offset[t]
        key = -1 if off >= 0 else t
        walker = self._walkers.get(key, False)
        if walker is False:
            if self._view is None:
                self._view = trie_view(self.trie)
            table = self.stacked if off >= 0 else self.terms[t]
            try:
                walker = TableWalker(table.trans, table.accept, self._view)
            except ValueError:
                walker = None
            self._walkers[key] = walker
        if walker is None:
            return None
        return walker.walk(nodes.tolist(), q + off if off >= 0 else q)

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

    def _walk_result(self, found: np.ndarray, accept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, end nodes)`` of a walk: ``found`` nodes (int64), ``accept`` bool per node."""
        tok = self.trie.node_token[found]
        return tok[tok >= 0].astype(np.int64), distinct(found[accept])
