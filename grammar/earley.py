"""An Earley recognizer over terminal ids, built column by column and shared by matchers.

A column is created by completing one terminal from an earlier column (``advance``); columns are
memoized by ``(column, terminal)``, so the chart is a tree of parse histories that many matchers
(and rollbacks) reuse. Nullable nonterminals are handled as in Aycock & Horspool.

Columns are also shared by *content*: a new column whose waiting items (those with a symbol after
the dot; origins equal to the column itself written as -1) and accepting flag equal an existing
column's is that column. Its future (the columns after it, the terminals they scan, acceptance)
depends on nothing else, so the two are interchangeable; this folds the repeated elements of a
list (after the second one, each element's columns are the previous element's) and keeps the chart
and everything cached per column from growing with the length of the output.
"""

from __future__ import annotations

from radixlm.grammar.cfg import CFG

Item = tuple[int, int, int]  # (production, dot, origin column)


class Chart:
    def __init__(self, cfg: CFG) -> None:
        self.cfg = cfg
        n_nt = len(cfg.nt_names)
        self.by_lhs: list[list[int]] = [[] for _ in range(n_nt)]
        for p, (lhs, _) in enumerate(cfg.prods):
            self.by_lhs[lhs].append(p)
        self.rhs = [rhs for _, rhs in cfg.prods]
        self.lhs = [lhs for lhs, _ in cfg.prods]
        self.nullable = self._nullable()
        # per column: items waiting on a symbol, the terminals it can scan, accepting flag
        self.waiting: list[dict[int, tuple[Item, ...]]] = []
        self.scan_terms: list[frozenset[int]] = []
        self.accepting: list[bool] = []
        self.memo: dict[tuple[int, int], int | None] = {}
        self.by_content: dict[tuple[frozenset[Item], bool], int] = {}  # see _new_column
        self._predicted: dict[int, tuple[tuple[tuple[int, int, int | None, Item], ...], frozenset[int], bool]] = {}
        self._new_column([(p, 0, 0) for p in self.by_lhs[cfg.start]])

    def _nullable(self) -> list[bool]:
        nullable = [False] * len(self.cfg.nt_names)
        changed = True
        while changed:
            changed = False
            for lhs, rhs in self.cfg.prods:
                if not nullable[lhs] and all(s < 0 and nullable[-s - 1] for s in rhs):
                    nullable[lhs] = changed = True
        return nullable

    @property
    def n_columns(self) -> int:
        return len(self.waiting)

    def _new_column(self, seeds: list[Item]) -> int:
        """The column closed from ``seeds``: an existing one with the same content, or a new one."""
        k = len(self.waiting)
        waiting, accepting, content = self._closure(seeds, k)
        key = (frozenset(content), accepting)
        got = self.by_content.get(key)
        if got is not None:
            return got
        self.by_content[key] = k
        # NOTE: tuples of int tuples (and then their dicts) leave the cyclic GC's lists once it
        # has seen them; lists stay: the columns of long outputs were ~70% of the objects the
        # collector tracked, traversed by every full collection (grammar_corpus_walks.py)
        self.waiting.append({s: tuple(v) for s, v in waiting.items()})
        self.scan_terms.append(frozenset(s for s in waiting if s >= 0))
        self.accepting.append(accepting)
        return k

    def _closure(self, seeds: list[Item], k: int) -> tuple[dict[int, list[Item]], bool, list[Item]]:
        """Waiting items by symbol, the accepting flag of column ``k`` closed from ``seeds``, and
        its content (the waiting items, origin ``k`` written -1: the key of :meth:`_new_column`).

        Items from seeds and completions are closed one by one; a predicted nonterminal adds its
        whole prediction closure at once (:meth:`_prediction`)."""
        seen: set[Item] = set()
        predicted: set[int] = set()
        waiting: dict[int, list[Item]] = {}
        content: list[Item] = []
        stack = list(seeds)
        rhs_all, lhs_all, nullable, all_waiting = self.rhs, self.lhs, self.nullable, self.waiting
        start = self.cfg.start
        accepting = False
        while stack:
            item = stack.pop()
            if item in seen:
                continue
            seen.add(item)
            p, d, o = item
            rhs = rhs_all[p]
            if d == len(rhs):
                lhs = lhs_all[p]
                if lhs == start and o == 0:
                    accepting = True
                got = (waiting if o == k else all_waiting[o]).get(-(lhs + 1))
                if got:
                    stack.extend([(p2, d2 + 1, o2) for p2, d2, o2 in got])
                continue
            sym = rhs[d]
            lst = waiting.get(sym)
            if lst is None:
                waiting[sym] = [item]
            else:
                lst.append(item)
            content.append((p, d, -1) if o == k else item)
            if sym < 0:
                nt = -sym - 1
                if nt not in predicted:
                    items, nts, done_start = self._prediction(nt)
                    predicted |= nts
                    if done_start and k == 0:
                        accepting = True
                    for p2, d2, sym2, own in items:
                        it = (p2, d2, k)
                        if it in seen:
                            continue
                        seen.add(it)
                        if sym2 is not None:
                            lst = waiting.get(sym2)
                            if lst is None:
                                waiting[sym2] = [it]
                            else:
                                lst.append(it)
                            content.append(own)
                if nullable[nt]:
                    stack.append((p, d + 1, o))
        return waiting, accepting, content

    def _prediction(self, nt: int) -> tuple[tuple[tuple[int, int, int | None, Item], ...], frozenset[int], bool]:
        """The items ``(production, dot, symbol after the dot or None, (production, dot, -1))``
        that predicting ``nt`` adds to a column (all with that column as origin), the
        nonterminals it predicts, and whether one of its completed items is the start rule's.

        NOTE: column-independent: predictions recurse on the nonterminal after the dot and skip
        nullable ones (Aycock & Horspool). A completed item among them is redundant for the
        column (its nonterminal is nullable, so whatever waits on it is skipped over anyway)."""
        got = self._predicted.get(nt)
        if got is None:
            rhs_all, by_lhs, nullable = self.rhs, self.by_lhs, self.nullable
            seen: set[tuple[int, int]] = set()
            nts = {nt}
            out: list[tuple[int, int, int | None, Item]] = []
            stack = [(p, 0) for p in by_lhs[nt]]
            while stack:
                p, d = stack.pop()
                if (p, d) in seen:
                    continue
                seen.add((p, d))
                rhs = rhs_all[p]
                if d == len(rhs):
                    out.append((p, d, None, (p, d, -1)))
                    continue
                sym = rhs[d]
                out.append((p, d, sym, (p, d, -1)))
                if sym < 0:
                    n2 = -sym - 1
                    if n2 not in nts:
                        nts.add(n2)
                        stack.extend((p2, 0) for p2 in by_lhs[n2])
                    if nullable[n2]:
                        stack.append((p, d + 1))
            start = self.cfg.start
            done_start = any(sym is None and self.lhs[p] == start for p, _, sym, _ in out)
            got = self._predicted[nt] = (tuple(out), frozenset(nts), done_start)
        return got

    def advance(self, col: int, term: int) -> int | None:
        """The column after scanning ``term`` in ``col`` (None if ``term`` is not expected)."""
        key = (col, term)
        if key in self.memo:
            return self.memo[key]
        items = self.waiting[col].get(term)
        out = self._new_column([(p, d + 1, o) for p, d, o in items]) if items else None
        self.memo[key] = out
        return out
