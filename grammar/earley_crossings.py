"""Tokens that cross a terminal's end, for the Earley engine's masks (a mixin of
:class:`~radixlm.grammar.earley_engine.EarleyEngine`).

A thread ``(column, t, q)`` allows, beyond the tokens that stay inside terminal ``t`` (the terminal
DFA's mask), the tokens that end ``t`` at one of its boundary nodes (trie nodes where ``t`` accepts
from ``q``) and go on in the threads the column spawns there, possibly ending those too. The walks
below boundary nodes are cached per terminal path (column-free); which threads are spawned depends
on the column.

NOTE: a mask key modulo deep origins (a "shadow chart": the column unfolded a few origin levels,
so a deeper level of a recursive schema finds its twin's crossings) was built, exact, and made
MaskBench's first visits slower at every depth: benchmarks/results/grammar_earley_first_visits.md.
"""

from __future__ import annotations

import numpy as np

from radixlm.grammar.earley_walk import TableWalker, distinct
from radixlm.grammar.narrow_walk import trie_view
from radixlm.grammar.token_index import walk_from

Thread = tuple[int, int, int]
_NONE = np.zeros(0, dtype=np.int64)
CROSSING_CACHE = 100_000  # cached crossings (per thread) and walks (per terminal path)
PY_WALK_NODES = 64  # crossing walks below up to this many nodes try a Python walk first


class Crossings:
    """Crossing tokens of matcher threads.

    Uses the engine's ``chart``, ``index``, ``trie``, ``terms``, ``stacked``, ``ignore``,
    ``spawn``, ``_spawn``, ``_roots``, ``_bound_ids``, ``_crossing``, ``_paths``, ``_path_ids``,
    ``_next_path``, ``_walkers``, ``_view`` and ``_narrow_first_visit``.
    """

    def _crossings(self, threads: frozenset[Thread]) -> list[np.ndarray]:
        """:meth:`_crossings` on the real chart: cached per ``(boundary root, spawned threads)``,
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
        from its end share one set of boundary nodes.

        NOTE: boundary nodes without children (the token ends with the terminal) are left out
        (:meth:`_inner_bounds`): nothing crosses below them, so a state whose terminal can only
        end at a token's last byte spawns nothing, and no chart column is made for it."""
        got = self._roots.get((t, q))
        if got is None:
            nodes = self._inner_bounds(t, q)
            got = (-1, self._bound_ids.setdefault(nodes.tobytes(), len(self._bound_ids))) if nodes.size else False
            self._roots[(t, q)] = got
        return got

    def _inner_bounds(self, t: int, q: int) -> np.ndarray:
        """The boundary nodes of ``(t, q)`` that have children (int64, sorted; cached)."""
        got = self._inner.get((t, q))
        if got is None:
            idx = self.index[t]
            if q not in idx.bounds:
                self._narrow_first_visit(t, q)
            nodes = idx.boundary(q)
            got = self._inner[(t, q)] = nodes[self.trie.child_cnt[nodes] > 0] if nodes.size else nodes
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
        frontier = [(key, key[0], self._inner_bounds(t, q), more) for key, (t, q, more) in roots.items()]
        pids, paths = self._path_ids, self._paths
        spawned, spawn = self._spawn, self.spawn
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
                    more = (more if more is not None else spawn(col, t))[0]
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
            got = self._py_walk(nodes, t, q, False) if nodes.size <= PY_WALK_NODES else None
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

    def _py_walk(self, nodes: np.ndarray, t: int, q: int, leaves: bool = True) -> tuple[np.ndarray, np.ndarray] | None:
        """The walk of :meth:`_walk_paths` for one entry stepped in Python
        (:mod:`radixlm.grammar.earley_walk`); None when it is too wide for that. ``leaves``:
        keep end nodes without children (False: only those a token goes on below)."""
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
        return walker.walk(nodes.tolist(), q + off if off >= 0 else q, leaves=leaves)

    def _walk_result(self, found: np.ndarray, accept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, end nodes)`` of a crossing walk: ``found`` nodes (int64), ``accept`` bool per
        node; end nodes without children are left out (nothing crosses below them)."""
        tok = self.trie.node_token[found]
        ends = found[accept]
        return tok[tok >= 0].astype(np.int64), distinct(ends[self.trie.child_cnt[ends] > 0])
