"""An Earley recognizer over terminal ids, built column by column and shared by matchers.

A column is created by completing one terminal from an earlier column (``advance``); columns are
memoized by ``(column, terminal)``, so the chart is a tree of parse histories that many matchers
(and rollbacks) reuse. Nullable nonterminals are handled as in Aycock & Horspool.
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
        self.waiting: list[dict[int, list[Item]]] = []
        self.scan_terms: list[frozenset[int]] = []
        self.accepting: list[bool] = []
        self.memo: dict[tuple[int, int], int | None] = {}
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
        k = len(self.waiting)
        seen: set[Item] = set()
        waiting: dict[int, list[Item]] = {}
        self.waiting.append(waiting)
        stack = list(seeds)
        rhs_all, lhs_all, by_lhs, nullable = self.rhs, self.lhs, self.by_lhs, self.nullable
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
                sym = -(lhs + 1)
                src = waiting if o == k else self.waiting[o]
                for p2, d2, o2 in list(src.get(sym, ())):
                    stack.append((p2, d2 + 1, o2))
                continue
            sym = rhs[d]
            waiting.setdefault(sym, []).append(item)
            if sym < 0:
                nt = -sym - 1
                for p2 in by_lhs[nt]:
                    stack.append((p2, 0, k))
                if nullable[nt]:
                    stack.append((p, d + 1, o))
        self.scan_terms.append(frozenset(s for s in waiting if s >= 0))
        self.accepting.append(accepting)
        return k

    def advance(self, col: int, term: int) -> int | None:
        """The column after scanning ``term`` in ``col`` (None if ``term`` is not expected)."""
        key = (col, term)
        if key in self.memo:
            return self.memo[key]
        items = self.waiting[col].get(term)
        out = self._new_column([(p, d + 1, o) for p, d, o in items]) if items else None
        self.memo[key] = out
        return out
