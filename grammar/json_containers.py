"""JSON Schema arrays and objects -> regex AST (a mixin of the schema converter)."""

from __future__ import annotations

import json
import os
from typing import Any

from radixlm.grammar.ast import EMPTY, NOTHING, Node, alt, cat, char, cold, opt, rep
from radixlm.grammar.automaton import dfa_from_ast
from radixlm.grammar.budget import check_budget
from radixlm.grammar.dfa_ops import product
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.json_lexical import string_literal
from radixlm.grammar.json_orders import ANY_ORDER_HOT, SORTED_ORDERS, GrammarRetry, _hot_skips, sorted_order, window_order  # noqa: F401
from radixlm.grammar.json_scalars import content_dfa
from radixlm.grammar.schema_merge import seal
from radixlm.grammar.json_unique import finite_items, unique_array
from radixlm.grammar.json_extras import EXTRA_DEPTH, EXTRA_DEPTH_ROOT, IMPLICIT, ExtrasMixin, _any_key  # noqa: F401


ANY_RULE = "__json_value"  # in a grammar, the rule of any JSON value
# Declared properties may come in any order (JSON Schema does not constrain it) when the automaton
# of all orders stays small: at most ANY_ORDER_MAX properties and ANY_ORDER_BUDGET fragments beyond
# the schema-order object; schema-order paths keep precomputed masks up to ANY_ORDER_HOT times the
# schema-order object, the rest are cold (see ``_any_order``). Larger objects keep schema order, or
# the required properties first in the order ``required`` lists them (cold; a sound restriction).
ANY_ORDER_MAX = 4
ANY_ORDER_TAIL_MAX = 8  # the optional properties after the required ones (a cold copy), same budget
ANY_ORDER_BUDGET = 8_000
# The cold relaxed orders of a large object (the optional tail in any order, or nearly in order)
# get a smaller budget: their states cost compile time whether or not an output visits them.
RELAX_BUDGET = 2_000
SORTED_BUDGET = 4 * ANY_ORDER_BUDGET  # objects (by AST size) that also take sorted keys
PAIR_RULE_SIZE = 400  # in a grammar, a declared pair larger than this is a rule (orders share it)
IMPLICIT_EXTRAS = os.environ.get("RADIXLM_JSON_EXTRAS", "1") != "0"


OBJECT_PAIR_WORK = 48  # work units counted per declared pair of an object converted


class ContainerMixin(ExtrasMixin):
    """``array`` and ``object`` of :class:`radixlm.grammar.json_schema.SchemaConverter`."""

    comma: Node
    colon: Node
    inner: Node
    obj_depth: int
    grammar_mode: bool

    def array(self, s: dict) -> Node:
        if "unevaluatedItems" in s:  # NOTE: in-place applicators are merged in: the elements
            s = seal(s)              # that nothing else evaluates
        values = finite_items(self, s)
        if values is not None:  # NOTE: uniqueItems over a finite domain: enforced (json_unique)
            return unique_array(self, s, values)
        items = s.get("items")
        prefix = s.get("prefixItems")
        if isinstance(items, list):  # draft 4-7 tuple form
            prefix, rest = items, s.get("additionalItems", True)
        else:
            rest = True if items is None else items
        prefix = list(prefix or [])
        lo = int(s.get("minItems", 0))
        hi = s.get("maxItems")
        hi = None if hi is None else int(hi)
        rest_node = self.node(rest) if rest is not False else NOTHING
        if rest_node == NOTHING:
            hi = len(prefix) if hi is None else min(hi, len(prefix))
        if hi is not None and hi < lo:
            return NOTHING
        nodes = [self.node(p) for p in prefix]

        def elem(i: int) -> Node:
            return nodes[i] if i < len(nodes) else rest_node

        def tail(i: int) -> Node:  # elements i.. after at least one, each after a comma
            if hi is not None and i >= hi:
                return EMPTY
            if i >= len(nodes):
                return rep(cat(self.comma, rest_node), max(lo - i, 0), None if hi is None else hi - i)
            more = cat(self.comma, elem(i), tail(i + 1))
            return more if i < lo else opt(more)

        body = cat(elem(0), tail(1)) if hi is None or hi > 0 else EMPTY
        if lo == 0 and body != EMPTY:
            body = opt(body)
        out = cat(char("["), self.inner, body, self.inner, char("]"))
        if "contains" in s:
            out = self._contains(s, out, [rest] + list(prefix), rest_node, nodes)
        return out

    def _contains(self, s: dict, out: Node, elem_schemas: list, rest_node: Node, nodes: list[Node]) -> Node:
        """``contains`` with ``minContains`` (default 1) and ``maxContains``: the array language
        intersected with "[ e, ..., m, ..., e ]" (at least k elements ``m`` that also satisfy
        ``contains``, ``e`` any element form) or, with ``maxContains``, with sequences of ``m`` and
        ``n`` (elements that do not satisfy it: its ``not``) holding between k and the maximum ``m``."""
        lo_c = int(s.get("minContains", 1))
        hi_c = None if s.get("maxContains") is None else int(s["maxContains"])
        if hi_c is not None and hi_c < lo_c:
            return NOTHING
        if lo_c <= 0 and hi_c is None:
            return out
        wanted = s["contains"]
        elems = [e for e in elem_schemas if e is not False]
        mark = alt(*(self.node({"allOf": [e, wanted]}) for e in elems))
        if mark == NOTHING and lo_c > 0:
            return NOTHING
        sep = self.comma
        if hi_c is None:
            anyone = alt(rest_node, *nodes)
            seg = cat(rep(cat(anyone, sep), 0, None), mark)
            body = cat(seg, rep(cat(sep, seg), lo_c - 1, lo_c - 1), rep(cat(sep, anyone), 0, None))
        else:
            non = alt(*(self.node({"allOf": [e, {"not": wanted}]}) for e in elems))
            nons = rep(cat(sep, non), 0, None)
            more = cat(sep, mark, nons)
            body = alt(cat(non, nons, rep(more, lo_c, hi_c)),
                       cat(mark, nons, rep(more, max(lo_c - 1, 0), hi_c - 1)) if hi_c > 0 else NOTHING)
            body = opt(body) if lo_c <= 0 else body
        found = cat(char("["), self.inner, body, self.inner, char("]"))
        if not nodes and s.get("minItems", 0) <= max(lo_c, 0) and "maxItems" not in s:
            return found  # the same language: every element is a rest element
        if self.walk.has_ref(out) or self.walk.has_ref(found):
            raise GrammarError("unsupported JSON Schema keyword: 'contains' (with tuple items or item "
                               "counts in a recursive schema)")
        both = product(dfa_from_ast(out), dfa_from_ast(found), "and")
        return ("dfa", both) if both.start else NOTHING

    def _pair(self, kv: Node) -> Node:
        """A declared ``key: value`` pair as an embedded DFA (memoized per process by its AST; cold
        states of a nested object stay cold): the any-order copies of an object, and the objects
        around it, copy its states in bulk instead of determinizing them again. In grammar mode
        (large or recursive schemas) pairs stay ASTs."""
        if self.grammar_mode or self.walk.has_ref(kv):
            return kv
        got = dfa_from_ast(kv)
        return ("dfa", got) if got.start else NOTHING

    def object(self, s: dict) -> Node:
        props = dict(s.get("properties", {}))
        required = list(dict.fromkeys(s.get("required", [])))
        explicit = "additionalProperties" in s or "unevaluatedProperties" in s
        # NOTE: undeclared keys where the schema is silent are JSON Schema's default (IMPLICIT:
        # bounded values); none in a closed conversion where properties are declared
        pats = dict(s.get("patternProperties", {}))
        implicit = (IMPLICIT if IMPLICIT_EXTRAS and not self.closed else False) if props or pats else True
        addl = s.get("additionalProperties", s.get("unevaluatedProperties", implicit))
        names = s.get("propertyNames")
        names = None if names is True or names == {} else names  # NOTE: every name allowed
        pat_dfas = {p: content_dfa(p, True) for p in pats}
        for k in required:
            if k not in props:
                props[k] = addl if explicit and not any(d.matches(json.dumps(k)) for d in pat_dfas.values()) else True
        for k in list(props):
            also = [pats[p] for p, d in pat_dfas.items() if d.matches(json.dumps(k))]
            if also:
                props[k] = {"allOf": [props[k]] + also}
        lo_p = int(s.get("minProperties", 0))
        hi_p = s.get("maxProperties")
        hi_p = None if hi_p is None else int(hi_p)
        if hi_p is not None and hi_p < lo_p:
            return NOTHING  # NOTE: no count fits (the extras would take the larger)
        entries, sizes, keys = [], [], []  # sizes: of each pair's AST (see _any_order)
        depth = self.obj_depth
        self.obj_depth = depth + 1
        try:
            values = {k: NOTHING if v is False else self.node(v) for k, v in props.items()}
        finally:
            self.obj_depth = depth
        names_dfa = dfa_from_ast(self.node(names)) if names is not None and props else None
        for k in props:
            node = values[k]
            # NOTE: a sound names automaton accepting a spelling of the key: the key is a valid
            # name (both json.dumps spellings tried; one product per key cost ~1 ms each)
            if names_dfa is not None and node != NOTHING and not any(
                    names_dfa.matches(json.dumps(k, ensure_ascii=a)) for a in (True, False)):
                node = NOTHING
            if node == NOTHING:
                if k in required:
                    return NOTHING
                continue
            kv = cat(string_literal(k), self.colon, node)
            sizes.append(self.walk.size(kv))
            if self.grammar_mode and sizes[-1] > PAIR_RULE_SIZE:
                # NOTE: a large pair is a rule of its own: every order of the object refers to it
                name = f"__pair{len(self.rules)}"
                self.rules[name], kv, sizes[-1] = kv, ("ref", name), 1
            keys.append(k)
            entries.append((self._pair(kv), k in required))
        # NOTE: each declared pair costs ~20-40 us of AST work (literal, orders, sizes) the
        # automaton counters never see: 10^4 objects from dependencies cost 12 s unseen
        check_budget("converting an object", OBJECT_PAIR_WORK * (len(entries) + 1))
        extra_kv = self._extra_pairs(props, pats, pat_dfas, addl, names)
        if addl is IMPLICIT:
            extra_kv = cold(extra_kv)  # NOTE: undeclared keys are rare in outputs: masks on first visit
        uid = next(self.uid)
        n = len(entries)
        counted = lo_p > 0 or hi_p is not None

        def extras(c: int, first: bool) -> Node:
            need = max(lo_p - c, 0)
            room = None if hi_p is None else hi_p - c
            if extra_kv == NOTHING or room == 0:
                return EMPTY if need == 0 and not (first and lead_free) else NOTHING
            if not counted:  # NOTE: one automaton copy of the pair: both uses continue into the loop
                kv = ("share", (uid, "kv"), extra_kv)
                loop = ("share", (uid, "loop"), rep(cat(self.comma, kv), 0, None))
                if not first:
                    return loop
                return cat(kv, loop) if lead_free else opt(cat(kv, loop))  # NOTE: lead_free: no empty body (below)
            if not first:
                return rep(cat(self.comma, extra_kv), need, room)
            tail = rep(cat(self.comma, extra_kv), max(need - 1, 0), None if room is None else room - 1)
            return opt(cat(extra_kv, tail)) if need == 0 else cat(extra_kv, tail)

        # NOTE: undeclared pairs also between declared ones (uncounted objects; in the schema-order
        # and sorted copies) and, in open objects, first (else "$schema" first in the outermost
        # object): json_extras
        relax = SORTED_ORDERS.get()  # NOTE: off in a second compile of a schema too large with them
        free = relax and IMPLICIT_EXTRAS and not self.closed and n > 0 and (hi_p is None or hi_p >= 1)
        pair = self.undeclared_pair(props, pats, pat_dfas, addl, names) if relax and not counted else NOTHING
        gap = self.gap_pairs(pair, 2 * n)
        more, top = self.lead_pair(props, pats, pat_dfas, addl, names, (hi_p if hi_p is not None else max(lo_p, 1))
                                   if counted else None, pair) if free else (None, 0)
        lead = self.schema_lead(props, pats, pat_dfas, addl, names) if relax else None
        if more is not None and lead is not None and any(k[:1] == "$" for k in props):
            more = alt(more, lead)  # NOTE: "$schema" beside a declared "$id" (no "$" key is free first)
        lead_free = more is not None and not counted  # NOTE: see below
        lead = more if more is not None else lead

        def ordered(seq: list[tuple[Node, bool]], tag: int, led_by: int = 0) -> Node:
            """The body with the entries of ``seq`` in that order (each optional one may be
            skipped), then the undeclared pairs; ``led_by``: the body after that many pairs
            written before them (a counted object led by undeclared pairs may take more, up to
            ``top`` told apart)."""
            memo: dict[tuple[int, int], Node] = {}

            def rest(i: int, c: int) -> Node:  # properties i.. after c emitted (c >= 1)
                ck = (c if hi_p is not None else min(c, lo_p)) if counted else 1  # NOTE: past minProperties, uncounted
                if (i, ck) in memo:
                    return memo[(i, ck)]
                if i == n:
                    out = extras(c, False)
                else:
                    kv, req = seq[i]
                    take = cat(self.comma, kv, rest(i + 1, c + 1)) if hi_p is None or c < hi_p else NOTHING
                    take = cat(gap, take) if gap is not None and tag != 1 and take != NOTHING else take
                    out = take if req else alt(take, rest(i + 1, c))
                out = ("share", (uid, tag, i, ck), out) if out not in (EMPTY, NOTHING) else out
                memo[(i, ck)] = out
                return out

            def first(i: int) -> Node:
                if i == n:
                    return extras(0, True)
                kv, req = seq[i]
                take = cat(kv, rest(i + 1, 1)) if hi_p is None or hi_p >= 1 else NOTHING
                return take if req else alt(take, first(i + 1))

            def chain(k: int) -> Node:  # counted: k undeclared pairs led, more may follow
                if k < top:
                    return alt(rest(0, k), cat(self.comma, more, chain(k + 1)))
                if hi_p is None and k >= lo_p:  # NOTE: past minProperties more are not counted
                    return cat(rep(cat(self.comma, more), 0, None), rest(0, k))
                return rest(0, k)

            if not led_by:
                return first(0)
            if hi_p is not None and hi_p < led_by:
                return NOTHING
            return chain(led_by) if counted and more is not None else rest(0, led_by)

        tails: dict[tuple[int, bool], Node] = {}

        def shared_extras(c: int, first: bool) -> Node:  # one fragment per count (if counted)
            key = ((c if hi_p is not None else min(c, lo_p)) if counted else 0, first)
            if key not in tails:
                node = extras(c, first)
                tails[key] = ("share", (uid, "x", key), node) if node not in (EMPTY, NOTHING) else node
            return tails[key]

        order_free = self._any_order(entries, sizes, shared_extras, uid, hi_p)
        alpha = None
        if SORTED_ORDERS.get() and sum(sizes) <= SORTED_BUDGET and order_free is None:
            alpha = sorted_order(keys, entries)
        elif SORTED_ORDERS.get() and order_free is None and not self.grammar_mode:
            # NOTE: too large for a sorted copy in one regex; as a grammar its large pairs are
            # rules (size 1 each): convert the schema as one when the copy then fits
            if sum(1 if z > PAIR_RULE_SIZE else z for z in sizes) <= SORTED_BUDGET and sorted_order(keys, entries):
                raise GrammarRetry()
        body = order_free if order_free is not None else ordered(entries, 0)
        if order_free is None and sum(sizes) <= ANY_ORDER_BUDGET:
            # NOTE: a second order, cold: the required properties in the order ``required`` lists
            # them, then the optional ones (in any order when few); one more copy of the object
            by_key = dict(zip(keys, entries))
            seq = [by_key[k] for k in required if k in by_key] + [e for k, e in zip(keys, entries) if not e[1]]
            size_of = dict(zip(keys, sizes))
            seq_sizes = [size_of[k] for k in required if k in by_key] + [z for z, (_, r) in zip(sizes, entries) if not r]
            free_tail = self._required_first(seq, seq_sizes, shared_extras, uid, hi_p, counted)
            if free_tail is not None or seq != entries:
                body = alt(body, cold(free_tail or ordered(seq, 1)))
        if alpha is not None:
            # NOTE: keys sorted as ``json.dumps(sort_keys=True)`` writes them (cold)
            body = alt(body, cold(ordered(alpha, 2)))
        if lead_free:
            # NOTE: undeclared pairs first, each followed by a comma, then any non-empty body (built
            # without its empty string, added back here): one body automaton after `{` and after
            # `{"x": 1, `, so the states after `{"` serve both; one copy of the lead pair (cold)
            # (``Walk.size`` counts a share key once: registered here, the cold pairs leave the
            # sizes of the objects around this one, and so their orders and budgets, as they were)
            self.walk.size(("share", (uid, "leads"), EMPTY))
            leads = rep(cat(("share", (uid, "lead"), more), self.comma), 1, None)
            empty = EMPTY if not any(req for _, req in entries) else NOTHING
            body = alt(cat(("share", (uid, "leads"), opt(cold(leads))), body), empty)
        elif lead is not None:  # NOTE: undeclared pairs (counted) or "$schema" first, then the orders above (cold)
            led = self._any_order(entries, sizes, shared_extras, uid, hi_p, offset=1,
                                  lead="lead" if counted else "join") if order_free else None
            if led is None or more is not None:  # NOTE: 2+ leading pairs: schema order
                led = alt(led or NOTHING, ordered(entries, 0, 1))
            body = alt(body, cold(cat(lead, alt(led, ordered(alpha, 2, 1) if alpha is not None else NOTHING))))
        if body == NOTHING:
            return NOTHING
        return ("scope", cat(char("{"), self.inner, body, self.inner, char("}")))

    def _required_first(self, seq: list[tuple[Node, bool]], sizes: list[int], extras: Any, uid: int,
                        hi_p: int | None, counted: bool) -> Node | None:
        """The body with the required entries of ``seq`` first, in that order, then the optional
        ones in any order (see ``_any_order``; ``sizes`` in ``seq`` order), or when they are too
        many for that, nearly in order (:func:`radixlm.grammar.json_orders.window_order`); None
        when neither fits."""
        n_req = sum(1 for _, req in seq if req)
        if hi_p is not None and hi_p < n_req:
            return None  # NOTE: in a grammar too (its large pairs are rules the orders refer to)
        tail = None
        if n_req:
            tail = self._any_order(seq[n_req:], sizes[n_req:], extras, uid, hi_p, offset=n_req,
                                   max_n=ANY_ORDER_TAIL_MAX, budget=RELAX_BUDGET)
        if tail is None and not counted:
            tail = window_order(seq[n_req:], sizes[n_req:], self.comma, extras, uid, n_req, RELAX_BUDGET)
        if tail is None:
            return None
        head = [seq[0][0]] + [cat(self.comma, kv) for kv, _ in seq[1:n_req]] if n_req else []
        return cat(*head, tail)

    def _any_order(self, entries: list[tuple[Node, bool]], sizes: list[int], extras: Any, uid: int,
                   hi_p: int | None, offset: int = 0, max_n: int = ANY_ORDER_MAX,
                   budget: int = ANY_ORDER_BUDGET, lead: str | None = None) -> Node | None:
        """The object body with the declared ``entries`` (``(key: value node, required)``) in any
        order, each at most once, every required one present, then the undeclared pairs
        (``extras(count, first)``). One automaton state per set of emitted properties (a
        ``share`` per set), so the size grows as ``2^n``: None (keep schema order) past
        ``ANY_ORDER_MAX`` properties or ``ANY_ORDER_BUDGET`` added fragments, or with one
        property. Pairs out of schema order, or after a skipped required entry or more than
        ``_hot_skips`` skipped optional ones, are cold. ``offset``: pairs already written before
        these (each entry then follows a comma); ``max_n``: the most entries; ``lead``: a
        ``share`` tag for the body after a leading pair (``offset`` 1): past the first entry its
        states are the plain body's when the object is not counted (``"join"``)."""
        n = len(entries)
        if n < (1 if offset else 2) or n > max_n:
            return None
        if sum(sizes) * ((1 << (n - 1)) - 1) > budget:  # the copies beyond schema order
            return None
        need = sum(1 << i for i, (_, req) in enumerate(entries) if req)
        skips = _hot_skips(sizes, [req for _, req in entries])
        memo: dict[int, Node] = {}

        def after(done: int) -> Node:  # the rest of the body once the entries in ``done`` are out
            got = memo.get(done)
            if got is not None:
                return got
            count = bin(done).count("1") + offset
            options = []
            if hi_p is None or count < hi_p:
                for i, (kv, _) in enumerate(entries):
                    if not done >> i & 1:
                        pair = kv if count == 0 else cat(self.comma, kv)
                        earlier = (1 << i) - 1
                        missed = earlier & ~done
                        if done >> i or missed & need or bin(missed).count("1") > skips:
                            pair = cold(pair)  # NOTE: out of schema order (or rare): masks on first visit
                        options.append(cat(pair, after(done | 1 << i)))
            if done & need == need:
                options.append(extras(count, count == 0))
            out = alt(*options)
            tag = offset if lead is None else (0 if lead == "join" and done else lead)
            out = ("share", (uid, "any", tag, done), out) if out not in (EMPTY, NOTHING) else out
            memo[done] = out
            return out

        return after(0)

