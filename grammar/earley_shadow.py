"""Earley columns modulo the origins a token cannot reach: one mask computation per nesting level.

A recursive schema (a tree of objects, a list of lists) repeats the same Earley columns at every
nesting level, but under new column ids: the items' origins point at the enclosing level's
columns, so a column of level 3 is a different column from its twin at level 1 and every cache
keyed by column (spawned threads, crossing tokens, whole-state masks) misses at each new level.

What a token's walk reads of a column ``c`` is its waiting items and, when one of them completes
(a terminal ends a rule), the waiting items of that item's origin column, and so on: one origin
level per completion. A :class:`ShadowChart` node is a column *unfolded* ``depth`` origin levels
deep: its items ``(production, dot, origin node)`` with the origins unfolded one level less, the
origins at depth 0 replaced by the :data:`OPAQUE` node (no items known), and nodes hash-consed by
content. Two columns whose unfoldings are equal are the same node, whichever level they are at.

Earley closure runs on nodes exactly as on columns (:meth:`ShadowChart.advance`: the same
algorithm, with a node's own origin written -1), as long as it never reads the items of
:data:`OPAQUE`: a completion that would pop past the unfolded depth raises :class:`Opaque`, and
the caller computes with the real chart instead. So everything computed on nodes is exact:

- a completion reading an unfolded origin reads the very items (origins included, as nodes)
  that the real closure reads in the real origin column, so both closures add the same items up
  to the node mapping, predict the same nonterminals and scan the same terminals;
- a column reached over two origin paths may be unfolded twice, to different depths, and two
  real columns may map to one node: items equal up to the mapping then collapse into one, which
  changes no scanned terminal (closure is a set computation);
- acceptance (whether the start rule completes at column 0) is left out: it never changes a token
  mask (the stop tokens are added from the real state's flag).

Compare the Leo / Aycock-Horspool view of an Earley chart as a graph-structured stack: a node is
the top ``depth`` levels of every stack that the column's items stand for.
"""

from __future__ import annotations

from radixlm.grammar.earley import Chart

OPAQUE = 0  # the node of every origin past the unfolded depth: reading its items raises Opaque
NODE_CACHE = 200_000  # nodes (and memoized advances) before the shadow chart starts over

Item = tuple[int, int, int]  # (production, dot, origin node; -1: the node itself)


class Opaque(Exception):
    """A closure on shadow nodes needed the items of an origin past the unfolded depth."""


class ShadowChart:
    """Columns of ``chart`` unfolded ``depth`` origin levels deep, hash-consed (see module doc).

    Node ids are ints (0: :data:`OPAQUE`). ``waiting[n]``: ``{symbol: [items]}`` of node ``n``;
    ``scan_terms[n]``: the terminals it scans. :meth:`node_of` maps a real column to its node,
    :meth:`advance` is :meth:`Chart.advance` on nodes (raises :class:`Opaque`).

    Raises:
        ValueError: ``depth < 1``.
    """

    def __init__(self, chart: Chart, depth: int) -> None:
        if depth < 1:
            raise ValueError("depth must be at least 1")
        self.chart = chart
        self.depth = depth
        self._reset()

    def _reset(self) -> None:
        self.waiting: list[dict[int, list[Item]] | None] = [None]
        self.scan_terms: list[frozenset[int]] = [frozenset()]
        self._ids: dict[frozenset[Item], int] = {}
        self._canon: list[dict[int, int]] = [{} for _ in range(self.depth + 1)]  # depth -> col -> node
        self.memo: dict[tuple[int, int], int | None] = {}
        self.generation = getattr(self, "generation", -1) + 1

    def full(self) -> bool:
        """True past NODE_CACHE nodes or memoized advances (the owner then calls :meth:`clear`)."""
        return len(self.waiting) + len(self.memo) > NODE_CACHE

    def clear(self) -> None:
        """Forget every node (ids are reused after this: caches keyed by nodes must be cleared
        too; ``generation`` counts the clears)."""
        self._reset()

    def node_of(self, col: int, depth: int | None = None) -> int:
        """The node of real column ``col`` unfolded ``depth`` levels (default: the chart's)."""
        j = self.depth if depth is None else depth
        if j == 0:
            return OPAQUE
        canon = self._canon[j]
        got = canon.get(col)
        if got is None:
            origins: dict[int, int] = {}
            items = []
            for its in self.chart.waiting[col].values():
                for p, d, o in its:
                    if o == col:
                        items.append((p, d, -1))
                        continue
                    n = origins.get(o)
                    if n is None:
                        n = origins[o] = self.node_of(o, j - 1)
                    items.append((p, d, n))
            got = canon[col] = self._intern(frozenset(items))
        return got

    def _intern(self, items: frozenset[Item]) -> int:
        got = self._ids.get(items)
        if got is None:
            waiting: dict[int, list[Item]] = {}
            rhs = self.chart.rhs
            for item in items:
                waiting.setdefault(rhs[item[0]][item[1]], []).append(item)
            got = self._ids[items] = len(self.waiting)
            self.waiting.append(waiting)
            self.scan_terms.append(frozenset(s for s in waiting if s >= 0))
        return got

    def advance(self, node: int, term: int) -> int | None:
        """The node after scanning ``term`` in ``node`` (None: not expected).

        Raises:
            Opaque: a completion reached an origin past the unfolded depth.
        """
        key = (node, term)
        got = self.memo.get(key, -1)
        if got != -1:
            return got
        items = self.waiting[node].get(term)
        out = None
        if items:
            seeds = [(p, d + 1, node if o == -1 else o) for p, d, o in items]
            out = self._intern(self._closure(seeds))
        self.memo[key] = out
        return out

    def _closure(self, seeds: list[Item]) -> frozenset[Item]:
        """The waiting items of the node closed from ``seeds`` (:meth:`Chart._closure` on nodes;
        the new node's own origin is -1; acceptance is not tracked)."""
        chart = self.chart
        rhs_all, lhs_all, nullable = chart.rhs, chart.lhs, chart.nullable
        all_waiting = self.waiting
        seen: set[Item] = set()
        predicted: set[int] = set()
        waiting: dict[int, list[Item]] = {}
        stack = list(seeds)
        while stack:
            item = stack.pop()
            if item in seen:
                continue
            seen.add(item)
            p, d, o = item
            rhs = rhs_all[p]
            if d == len(rhs):
                sym = -(lhs_all[p] + 1)
                if o == -1:
                    for p2, d2, o2 in list(waiting.get(sym, ())):
                        stack.append((p2, d2 + 1, o2))
                elif o == OPAQUE:
                    raise Opaque
                else:  # NOTE: an origin's own items say -1 for that origin
                    for p2, d2, o2 in all_waiting[o].get(sym, ()):
                        stack.append((p2, d2 + 1, o if o2 == -1 else o2))
                continue
            sym = rhs[d]
            waiting.setdefault(sym, []).append(item)
            if sym < 0:
                nt = -sym - 1
                if nt not in predicted:
                    pitems, nts, _ = chart._prediction(nt)
                    predicted |= nts
                    for p2, d2, sym2, _ in pitems:
                        it = (p2, d2, -1)
                        if it in seen:
                            continue
                        seen.add(it)
                        if sym2 is not None:
                            waiting.setdefault(sym2, []).append(it)
                if nullable[nt]:
                    stack.append((p, d + 1, o))
        return frozenset(it for its in waiting.values() for it in its)
