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
        # per column: the items waiting on a symbol that were not predicted in it (origins before
        # the column), the predicted ones as a shared template (see _template), the terminals it
        # can scan, accepting flag
        self.waiting: list[dict[int, list[Item]]] = []
        self.predicted: list[dict[int, tuple[tuple[int, int], ...]]] = []
        self.scan_terms: list[frozenset[int]] = []
        self.accepting: list[bool] = []
        self.memo: dict[tuple[int, int], int | None] = {}
        self.by_content: dict[tuple[frozenset[Item], frozenset[int], bool], int] = {}  # see _new_column
        self._predicted: dict[int, frozenset[int]] = {}  # nonterminal -> nonterminals it predicts
        self._templates: dict[frozenset[int], tuple[dict, frozenset[int], bool]] = {}
        self._new_column([], self._prediction(cfg.start))  # NOTE: column 0 predicts the start symbol

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

    def items(self, col: int, sym: int) -> list[Item]:
        """The items of column ``col`` waiting on symbol ``sym`` (predicted ones included)."""
        got = self.waiting[col].get(sym, [])
        tmpl = self.predicted[col].get(sym)
        return got + [(p, d, col) for p, d in tmpl] if tmpl else got

    def _new_column(self, seeds: list[Item], predict: frozenset[int] = frozenset()) -> int:
        """The column closed from ``seeds`` (and predicting ``predict``): an existing one with the
        same content, or a new one.

        NOTE: the content key holds the items not predicted in the column (all with earlier
        origins) and the predicted nonterminals: the predicted items (origin the column itself)
        follow from those, so equal keys mean equal columns (and equal columns, equal keys)."""
        k = len(self.waiting)
        waiting, nts, accepting = self._closure(seeds, predict)
        by_sym, terms, start_done = self._template(nts)
        accepting = accepting or (start_done and k == 0)
        key = (frozenset(it for items in waiting.values() for it in items), nts, accepting)
        got = self.by_content.get(key)
        if got is not None:
            return got
        self.by_content[key] = k
        self.waiting.append(waiting)
        self.predicted.append(by_sym)
        self.scan_terms.append(frozenset(s for s in waiting if s >= 0) | terms)
        self.accepting.append(accepting)
        return k

    def _closure(self, seeds: list[Item], predict: frozenset[int]) -> tuple[dict[int, list[Item]], frozenset[int], bool]:
        """The non-predicted items waiting on a symbol (by symbol), the predicted nonterminals and
        the accepting flag (from completions) of the column closed from ``seeds``.

        Items from seeds and completions (origins before the column) are closed one by one; a
        nonterminal after a dot adds its whole prediction closure (:meth:`_prediction`); items
        predicted here wait in the template of those nonterminals (:meth:`_template`)."""
        seen: set[Item] = set()
        predicted: set[int] = set(predict)
        waiting: dict[int, list[Item]] = {}
        stack = list(seeds)
        rhs_all, lhs_all, nullable = self.rhs, self.lhs, self.nullable
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
                # NOTE: o is an earlier column (seeds and completions never start here)
                stack.extend((p2, d2 + 1, o2) for p2, d2, o2 in self.items(o, -(lhs + 1)))
                continue
            sym = rhs[d]
            waiting.setdefault(sym, []).append(item)
            if sym < 0:
                nt = -sym - 1
                if nt not in predicted:
                    predicted |= self._prediction(nt)
                if nullable[nt]:
                    stack.append((p, d + 1, o))
        return waiting, frozenset(predicted), accepting

    def _prediction(self, nt: int) -> frozenset[int]:
        """The nonterminals predicting ``nt`` predicts (itself included): those after a dot in its
        productions, through nullable prefixes, recursively (column-independent)."""
        got = self._predicted.get(nt)
        if got is None:
            rhs_all, by_lhs, nullable = self.rhs, self.by_lhs, self.nullable
            nts = {nt}
            stack = [nt]
            while stack:
                for p in by_lhs[stack.pop()]:
                    for sym in rhs_all[p]:
                        if sym >= 0:
                            break
                        n2 = -sym - 1
                        if n2 not in nts:
                            nts.add(n2)
                            stack.append(n2)
                        if not nullable[n2]:
                            break
            got = self._predicted[nt] = frozenset(nts)
        return got

    def _template(self, nts: frozenset[int]) -> tuple[dict[int, tuple[tuple[int, int], ...]], frozenset[int], bool]:
        """The items ``(production, dot)`` that predicting ``nts`` adds to a column, by the symbol
        after the dot; the terminals among those symbols; whether one of them completes the start
        symbol (an empty match). Shared by every column predicting the same nonterminals.

        NOTE: the dots of a production run through its nullable prefix (Aycock & Horspool); a
        completed predicted item is redundant for the column (its nonterminal is nullable, so
        whatever waits on it is skipped over anyway) but for the start symbol (acceptance)."""
        got = self._templates.get(nts)
        if got is None:
            rhs_all, nullable, start = self.rhs, self.nullable, self.cfg.start
            by_sym: dict[int, list[tuple[int, int]]] = {}
            start_done = False
            for n in sorted(nts):
                for p in self.by_lhs[n]:
                    rhs = rhs_all[p]
                    for d in range(len(rhs) + 1):
                        if d == len(rhs):
                            start_done = start_done or n == start
                            break
                        by_sym.setdefault(rhs[d], []).append((p, d))
                        if rhs[d] >= 0 or not nullable[-rhs[d] - 1]:
                            break
            got = ({s: tuple(v) for s, v in by_sym.items()}, frozenset(s for s in by_sym if s >= 0), start_done)
            self._templates[nts] = got
        return got

    def advance(self, col: int, term: int) -> int | None:
        """The column after scanning ``term`` in ``col`` (None if ``term`` is not expected)."""
        key = (col, term)
        if key in self.memo:
            return self.memo[key]
        items = self.items(col, term)
        out = self._new_column([(p, d + 1, o) for p, d, o in items]) if items else None
        self.memo[key] = out
        return out
