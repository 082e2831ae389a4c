"""Undeclared properties of JSON Schema objects (a mixin of the schema converter): their key/value
pairs, the value of an implicit additional property, and bounded relaxations of where they may
stand among the declared ones.

- **Between declared properties** (``gap_pairs``): JSON Schema does not order properties, and
  hand-written instances put an undeclared key anywhere after the first one (``{"a": 1, "x": 2,
  "b": 3}``). In an object without property counts, undeclared pairs may stand before any declared
  pair but the first; the value of an implicit one is nested at most ``GAP_DEPTH`` (1) level
  there (in a grammar any value; a sound restriction). Each
  position copies the pair's automaton (in a grammar: one rule), so the pairs between declared
  ones are allowed only while ``positions * size`` stays within ``GAP_BUDGET``; past it, and in
  a schema compiled again without the extra orders (``SORTED_ORDERS``), undeclared pairs follow
  the declared ones only (the previous behaviour). The object calls it for its schema-order and
  sorted copies (not for the required-first one).
- **First, in open objects** (``lead_pair``): instances open objects with undeclared keys too
  (``{"_id": 1, "name": "x"}``; in drafts <= 7 a ``$ref`` hides its siblings, so their keys are
  undeclared). Where undeclared keys are allowed and the conversion is not closed, an object with
  declared properties may open with undeclared pairs (as in the gaps, an implicit value nested at
  most ``GAP_DEPTH`` levels; in a single DFA only keys that start with a character no declared
  key starts with, ``_lead_keys``), then any non-empty body. Uncounted objects share the body's
  automaton (one copy of the pair); counted ones tell the leading pairs apart up to their bound
  (a copy per count within ``GAP_BUDGET``). Serving closes objects by default, so a
  model there still opens an object with a declared key (open, greedy SmolLM2 once wrote
  ``{"The tree is a small, ancient tree ...}`` for a tree schema).
- **``"$schema"`` first in the outermost object** (``schema_lead``): configuration files name their
  schema in a first ``"$schema"`` key. Where no undeclared pair may open the object (a closed
  conversion whose object allows the key explicitly, ``lead_pair`` over its budget) but that key
  is undeclared and allowed (by ``additionalProperties`` / ``patternProperties`` /
  ``propertyNames``), the outermost object may open with it (an implicit value nested at most
  ``EXTRA_DEPTH`` levels), then continue as if one pair had been written (a definition the
  outermost object shares through ``$ref`` with inner objects takes it there too: sound, the key
  is allowed).
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.grammar.ast import NOTHING, Node, alt, cat, cold, rep
from radixlm.grammar.automaton import ByteDFA, dfa_from_ast
from radixlm.grammar.dfa_ops import difference_finite, minimize, product, union
from radixlm.grammar.json_lexical import QUOTE, encoded_char, string_literal
from radixlm.grammar.regex_parser import MAX_CP

# NOTE: an unspecified additionalProperties (JSON Schema: any undeclared key is allowed) lets any
# undeclared key follow the declared ones, its value any JSON value (in a single-DFA schema with
# arrays / objects nested at most EXTRA_DEPTH_ROOT levels in an outermost object, EXTRA_DEPTH in
# the objects inside it: a sound restriction; the automaton of a value doubles with each level, and
# the outermost object is converted once while inner ones may be many).
IMPLICIT = "x-implicit-additional"
EXTRA_DEPTH = 1
EXTRA_DEPTH_ROOT = 3
GAP_BUDGET = 12_000  # positions * pair size of the undeclared pairs between declared ones
# An implicit value between declared pairs is nested at most GAP_DEPTH levels (0, a scalar or an
# empty container, saved MaskBench 0-1 ms of compile p50, within the noise, in three runs each)
GAP_DEPTH = EXTRA_DEPTH
LEAD_KEY = "$schema"
# The characters an undeclared key that opens an object may start with (in a single DFA; see
# ``_lead_keys``): SchemaStore's leading keys (``_from``, ``$edgeAgent``, ``background``, ``???``)
LEAD_FIRST = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_$@?.-"
PATTERN_PAIRS_MAX = 4  # patternProperties up to this many: keys matching two patterns take both schemas
_EXTRA_VALUES: dict[tuple, Node] = {}
_ANY_KEY: list[ByteDFA] = []
_PLAIN_LEAD_KEYS: dict[tuple, tuple[ByteDFA, ByteDFA]] = {}


def _any_key() -> ByteDFA:
    """Any object key, each character in a ``json.dumps`` encoding only (raw, or ``\\uXXXX`` for
    controls, quotes, backslashes and non-ASCII): a declared key then has no other spelling
    (``"\\u0061"`` is not an undeclared key next to a declared ``"a"``)."""
    if not _ANY_KEY:
        _ANY_KEY.append(dfa_from_ast(cat(QUOTE, rep(encoded_char(((0, MAX_CP),)), 0, None), QUOTE)))
    return _ANY_KEY[0]


class ExtrasMixin:
    """Undeclared pairs of :class:`radixlm.grammar.json_schema.SchemaConverter` objects."""

    comma: Node
    colon: Node
    inner: Node
    obj_depth: int
    grammar_mode: bool
    closed: bool
    rules: dict

    def _extra_pairs(self, props: dict, pats: dict, pat_dfas: dict, addl: Any, names: Any,
                     levels: int | None = None, lead: str = "") -> Node:
        """Key/value pairs of undeclared keys: a key matching exactly one ``patternProperties``
        pattern takes that pattern's schema, one matching two (of at most ``PATTERN_PAIRS_MAX``
        patterns) both schemas (keys matching more are left out: sound), any other
        key takes ``additionalProperties``; all keys must satisfy ``propertyNames``. ``levels``:
        the nesting of an implicit pair's value (default: by the object's depth); ``lead``:
        ``"gap"`` or ``"first"``, keys before a declared pair (between declared pairs or first,
        see :meth:`_lead_keys`)."""
        if addl is False and not pats:
            return NOTHING
        out = []
        for key, value_schema in self._extra_keys(props, pats, pat_dfas, addl, names):
            if lead:
                key = self._lead_keys(key, props, lead == "first", names is None and not pat_dfas)
                if not key.start:
                    continue
            value = self._extra_value_of(value_schema, levels)
            if value != NOTHING:
                out.append(cat(("dfa", key), self.colon, value))
        return alt(*out)

    def _extra_keys(self, props: dict, pats: dict, pat_dfas: dict, addl: Any,
                    names: Any) -> list[tuple[ByteDFA, Any]]:
        """The key automata of :meth:`_extra_pairs` (each with its value schema), memoized per
        converter: an object asks for them again for its gaps (same keys, other value depth)."""
        memo = self.__dict__.setdefault("_extra_key_memo", {})
        mk = (tuple(props), tuple(pat_dfas), tuple(pats[p] is False for p in pat_dfas), addl is False,
              None if names is None else json.dumps(names, sort_keys=True, default=str))
        got = memo.get(mk)

        def value_of(p: Any) -> Any:
            if isinstance(p, tuple):
                return {"allOf": [pats[q] for q in p]}
            return pats[p] if p is not None else addl

        if got is not None:
            return [(key, value_of(p)) for key, p in got]
        # NOTE: one automaton of all the declared keys, determinized at once
        declared = dfa_from_ast(alt(*(string_literal(k) for k in props))) if props else None
        names_dfa = dfa_from_ast(self.node(names)) if names is not None else None
        classes = []
        for p, d in pat_dfas.items():
            others = [o for q, o in pat_dfas.items() if q != p]
            classes.append((d, others, p, pats[p]))
        if len(pat_dfas) <= PATTERN_PAIRS_MAX:
            names_ = list(pat_dfas)
            for i, p in enumerate(names_):
                for q in names_[i + 1:]:
                    if pats[p] is False or pats[q] is False:
                        continue
                    both = product(pat_dfas[p], pat_dfas[q], "and")
                    if both.start:
                        others = [o for r, o in pat_dfas.items() if r not in (p, q)]
                        classes.append((both, others, (p, q), True))
        if addl is not False:
            classes.append((_any_key(), list(pat_dfas.values()), None, addl))
        got = []
        for key, banned, p, value_schema in classes:
            if value_schema is False:
                continue
            if declared is not None and not banned:
                key = difference_finite(key, declared)  # NOTE: the common case, without patterns
            elif declared is not None or banned:
                key = product(key, union(banned + [declared] if declared is not None else banned), "diff")
            if names_dfa is not None:
                key = product(key, names_dfa, "and")
            if key.start:
                got.append((key, p))
        memo[mk] = got
        return [(key, value_of(p)) for key, p in got]

    def _lead_keys(self, key: ByteDFA, props: dict, first: bool, plain: bool) -> ByteDFA:
        """The keys of ``key`` that may stand before a declared pair of an object declaring
        ``props`` (first, or between declared pairs): those whose first character (as
        ``json.dumps`` writes it) no declared key starts with. Otherwise the states reading a
        declared key (hot: their masks are computed at compile time) would also read any
        undeclared key, each allowing most of the vocabulary (MaskBench stride 20, undeclared
        pairs first: compile work p50 +58%; with both restrictions: -14%, sum -17%, against the
        tree before either). ``first``: the keys that open the object also start
        with a letter, a digit or one of ``_$@?.-`` (``LEAD_FIRST``): the state after ``{"``,
        hot, then allows a quarter of the vocabulary instead of nearly all of it. ``plain``: ``key``
        is any key but the declared ones (no patterns, no ``propertyNames``), the same as any key
        here: memoized per process (a product per object and compile cost ~1 ms). A sound
        restriction (``{"named": 1, "name": "x"}`` is refused)."""
        firsts = tuple(sorted({ord(json.dumps(k)[1]) for k in props}))
        memo = _PLAIN_LEAD_KEYS if plain else self.__dict__.setdefault("_lead_key_memo", {})
        mk = (firsts, first) if plain else (id(key), firsts, first)
        got = memo.get(mk)
        if got is None:
            if plain:
                key = _any_key()
                if len(memo) >= 512:  # NOTE: bounded (a long-running server; one call, thread-safe)
                    memo.clear()
            if first:
                ranges = [(c, c) for c in sorted(set(LEAD_FIRST.encode()) - set(firsts))]
            else:
                ranges, lo = [], 0
                for c in firsts:
                    if c > lo:
                        ranges.append((lo, c - 1))
                    lo = c + 1
                ranges.append((lo, MAX_CP))
            start = dfa_from_ast(cat(QUOTE, ("set", tuple(ranges)), rep(("set", ((0, MAX_CP),)), 0, None)))
            got = memo[mk] = (key, product(key, start, "and"))  # NOTE: keeps ``key`` alive (its id)
        return got[1]

    def _extra_value_of(self, value_schema: Any, levels: int | None) -> Node:
        """The value node of an undeclared pair whose schema is ``value_schema``."""
        if value_schema is IMPLICIT:
            return self.extra_value(levels)
        depth = self.obj_depth
        self.obj_depth = depth + 1  # NOTE: objects in the value are inner objects
        try:
            return self.node(value_schema)
        finally:
            self.obj_depth = depth

    def extra_value(self, levels: int | None = None) -> Node:
        """The value of an implicit additional property (see ``IMPLICIT``): any JSON value, in a
        single-DFA schema nested at most ``levels`` (default ``EXTRA_DEPTH_ROOT`` in an outermost
        object and ``EXTRA_DEPTH`` in the objects inside it)."""
        if self.grammar_mode:
            return self.any_value()
        if levels is None:
            levels = EXTRA_DEPTH_ROOT if self.obj_depth == 0 else EXTRA_DEPTH
        key = (self.comma, self.colon, self.inner, levels)
        got = _EXTRA_VALUES.get(key)
        if got is None:  # NOTE: the same automaton for every schema with these separators
            inner: Node | None = None
            for _ in range(levels + 1):
                inner = ("dfa", minimize(dfa_from_ast(self._any(inner))))
            got = _EXTRA_VALUES[key] = inner
        return got

    def undeclared_pair(self, props: dict, pats: dict, pat_dfas: dict, addl: Any, names: Any) -> Node:
        """One undeclared ``key: value`` pair for the places between declared pairs: an implicit
        value nested at most ``GAP_DEPTH`` levels (in a single DFA and an open conversion only
        keys that start as no declared key does, :meth:`_lead_keys`: the states reading the next
        declared keys stay narrow; in a grammar any key and value; closed conversions as before);
        NOTHING where no undeclared key is allowed. In a
        grammar the pair becomes one rule (``__gapN``, on first use by :meth:`gap_pairs`) every
        place refers to."""
        return self._extra_pairs(props, pats, pat_dfas, addl, names, levels=GAP_DEPTH,
                                 lead="" if self.grammar_mode or self.closed else "gap")

    def _gap_rule(self, pair: Node) -> Node:
        """``pair`` as it is written at a place before declared pairs: itself in a regex, a
        reference to one rule per pair in a grammar."""
        if not self.grammar_mode:
            return pair
        memo = self.__dict__.setdefault("_gap_rule_memo", {})
        got = memo.get(id(pair))
        if got is None:
            name = f"__gap{len(self.rules)}"
            self.rules[name] = pair
            got = memo[id(pair)] = (pair, ("ref", name))  # NOTE: keeps ``pair`` alive (its id)
        return got[1]

    def gap_pairs(self, pair: Node, positions: int) -> Node | None:
        """Undeclared pairs (``pair``, see :meth:`undeclared_pair`) that may stand before a
        declared pair (each after a comma, any number, cold), or None where they do not fit
        ``GAP_BUDGET`` over ``positions`` copies or no undeclared key is allowed."""
        if positions == 0 or pair == NOTHING:
            return None
        if not self.grammar_mode and positions * self.walk.size(pair) > GAP_BUDGET:
            return None
        return rep(cold(cat(self.comma, self._gap_rule(pair))), 0, None)

    def lead_pair(self, props: dict, pats: dict, pat_dfas: dict, addl: Any, names: Any,
                  top: int | None, gap: Node = NOTHING) -> tuple[Node | None, int]:
        """The undeclared pair that may open an open object (keys as :meth:`_lead_keys` allows,
        an implicit value nested at most ``GAP_DEPTH`` levels; in a grammar, where pairs are
        rules read apart from the declared keys, ``gap``'s rule: any undeclared key) and how many
        such pairs a counted object may open with before its counts stop telling them apart:
        ``top`` asked (None for an uncounted object, whose leading pairs loop over one copy),
        fewer where ``1 + 2 * top`` copies (a chain per count in the schema-order and sorted
        bodies) are over ``GAP_BUDGET``. ``(None, 0)`` when that leaves none or no undeclared key
        may come first (the object then opens with a declared key, or ``"$schema"``: a sound
        restriction)."""
        if self.grammar_mode and gap != NOTHING:
            pair = gap  # NOTE: the rule of the gaps (no new terminals; see :meth:`_gap_rule`)
        else:
            pair = self._extra_pairs(props, pats, pat_dfas, addl, names, levels=GAP_DEPTH,
                                     lead="" if self.grammar_mode else "first")
        if pair == NOTHING or top is not None and top < 1:
            return None, 0
        if not self.grammar_mode:
            size = self.walk.size(pair)
            if top is None and size > GAP_BUDGET:
                return None, 0
            if top is not None:
                top = min(top, (GAP_BUDGET // size - 1) // 2)
                if top < 1:
                    return None, 0
        return self._gap_rule(pair), top or 1

    def schema_lead(self, props: dict, pats: dict, pat_dfas: dict, addl: Any, names: Any) -> Node | None:
        """The pair ``"$schema": value`` that may open the outermost object (cold), or None where
        the key is declared, not allowed, or the object is an inner one."""
        if self.obj_depth != 0 or LEAD_KEY in props:
            return None
        text = json.dumps(LEAD_KEY)
        if names is not None and not dfa_from_ast(self.node(names)).matches(text):
            return None
        matched = [pats[p] for p, d in pat_dfas.items() if d.matches(text)]
        if len(matched) > 1:
            return None  # NOTE: allOf of several pattern schemas: left out (sound)
        value_schema = matched[0] if matched else addl
        if value_schema is False:
            return None
        value = self._extra_value_of(value_schema, EXTRA_DEPTH)  # NOTE: a URI in practice
        if value == NOTHING:
            return None
        return cold(cat(string_literal(LEAD_KEY), self.colon, value))
