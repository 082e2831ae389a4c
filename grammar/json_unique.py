"""``uniqueItems`` over a finite item domain (items that are ``enum`` / ``const`` values, booleans,
``null``): the array never repeats a value.

With at most ``EXACT_MAX`` distinct values the automaton tracks the set of values written (exact:
every order, ``2^n`` states); with more it takes them in the order the schema lists them (a
sound restriction, ``n`` states). In a grammar each of those states is a rule, and the set is
tracked up to ``EXACT_GRAMMAR_MAX`` values; a schema with more than ``EXACT_MAX`` converts as one.
Items of an infinite domain (strings, numbers, objects) keep ``uniqueItems`` unenforced (see
:mod:`radixlm.grammar.json_schema`).
"""

from __future__ import annotations

from typing import Any

from radixlm.grammar.ast import EMPTY, NOTHING, Node, alt, cat, char
from radixlm.grammar.json_orders import GrammarRetry
from radixlm.grammar.schema_checks import valid_values
from radixlm.grammar.schema_merge import _json_eq, resolve_pointer

EXACT_MAX = 6
EXACT_GRAMMAR_MAX = 9  # in a grammar (a rule per set of values written: up to 512 small rules)
ORDERED_MAX = 12  # more values: uniqueItems unenforced (the automaton grows as n^3)


def finite_items(conv: Any, s: dict) -> list[Any] | None:
    """The distinct values an item of array schema ``s`` may take, when ``s`` has ``uniqueItems``,
    no tuple form and no ``contains`` and its items are finitely many; else None."""
    if s.get("uniqueItems") is not True or "prefixItems" in s or "contains" in s:
        return None
    items = s.get("items", True)
    if not isinstance(items, dict):
        return None
    if "$ref" in items and len(items) == 1:
        items = resolve_pointer(conv.root, items["$ref"])
        if not isinstance(items, dict):
            return None
    items = conv.normalize(items)
    if not isinstance(items, dict) or any(k in items for k in ("$ref", "anyOf", "oneOf", "x-any")):
        return None
    if "enum" in items or "const" in items:
        values = valid_values(items, conv.root)
    elif items.get("type") in ("boolean", "null") and set(items) <= {"type", "description", "title", "default"}:
        values = [True, False] if items["type"] == "boolean" else [None]
    else:
        return None
    out: list[Any] = []
    if len(values) > 4 * ORDERED_MAX:
        return None
    for v in values:
        if not any(_json_eq(v, w) for w in out):
            out.append(v)
    return out if len(out) <= ORDERED_MAX else None


def unique_array(conv: Any, s: dict, values: list[Any]) -> Node:
    """``[`` distinct ``values`` ``]`` within ``minItems`` / ``maxItems`` (see the module doc)."""
    lo = int(s.get("minItems", 0))
    hi = s.get("maxItems")
    n = len(values)
    hi = n if hi is None else min(int(hi), n)
    if hi < lo:
        return NOTHING
    if n > EXACT_MAX and not conv.grammar_mode:
        raise GrammarRetry()  # NOTE: as a grammar: exact to EXACT_GRAMMAR_MAX, rules (faster too)
    lits = [conv.literal(v) for v in values]
    exact = n <= (EXACT_GRAMMAR_MAX if conv.grammar_mode else EXACT_MAX)
    counted = lo > 0 or hi < n
    memo: dict[tuple[int, int], Node] = {}
    # NOTE: in a grammar each rest is a rule (the literals are terminals the rules share): one
    # automaton would copy the literals once per rest, ~n^3 states in order (38k for 12 values)
    uid = next(conv.uid) if conv.grammar_mode else None

    def after(used: int, last: int, count: int) -> Node:
        """The rest once ``count`` values are written: the set ``used`` (exact) or up to index
        ``last`` (in order)."""
        key = (used, 0) if exact else (last, count if counted else 0)
        got = memo.get(key)
        if got is not None:
            return got
        options: list[Node] = []
        if count < hi:
            for i in range(n) if exact else range(last + 1, n):
                if not used >> i & 1:
                    options.append(cat(conv.comma, lits[i], after(used | 1 << i, i, count + 1)))
        if count >= lo:
            options.append(EMPTY)
        out = alt(*options)
        if uid is not None and out not in (EMPTY, NOTHING):
            name = f"__unique{uid}_{key[0]}_{key[1]}"
            conv.rules[name], out = out, ("ref", name)
        memo[key] = out
        return out

    first = [cat(lits[i], after(1 << i, i, 1)) for i in range(n)] if hi > 0 else []
    body = alt(*first, *([EMPTY] if lo == 0 else []))
    return cat(char("["), conv.inner, body, conv.inner, char("]"))
