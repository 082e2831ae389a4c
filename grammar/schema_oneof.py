"""``oneOf`` with branches that may overlap, restricted soundly.

An instance is valid for ``oneOf`` when it matches exactly one branch. For every pair of branches
that are not provably disjoint, branch ``a`` is narrowed until it provably excludes branch ``b``:
per instance type, a type is kept when the two branches restricted to it are disjoint, an object
type is kept when ``b`` requires a property that ``a`` is then forbidden to have, or when both
declare a property whose values are disjoint (``a`` then requires it: a discriminator), else ``a``
is intersected with the negation of ``b`` where that is expressible, and any other overlapping
type is dropped from ``a``. Whatever the narrowed branches accept matches its own
branch and no other, so it is valid; some valid instances may be rejected.

Where none of that works for a type, before it is dropped, combinators are distributed over (to
``MAX_SPLIT_DEPTH`` levels, ``MAX_SPLIT`` branches each):
``a`` excludes ``b = rest and anyOf/oneOf(b1..bn)`` when it excludes each ``rest and bi``; and
``a = rest and anyOf(a1..an)`` is the union of its branches, each narrowed on its own (a
``oneOf``'s branches first made exclusive among themselves, so their union stays within ``a``);
and an array is kept with every item narrowed to fail the other's ``items``.
"""

from __future__ import annotations

from typing import Any, Callable

from radixlm.grammar.budget import check_budget
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.schema_checks import (
    ARRAY_KWS, NUMBER_KWS, OBJECT_KWS, STRING_KWS, UNDER, implied_types, possible_types, unsatisfiable,
)
from radixlm.grammar.schema_merge import ANNOTATIONS, merge, seal, types_of

MAX_OUTSIDE = 4
MAX_SPLIT = 12  # branches of a combinator that ``separate`` distributes over
MAX_SPLIT_DEPTH = 5  # nested combinators (and array items) it distributes over
MAX_DISCRIMINATORS = 8
_TYPES = ("null", "boolean", "object", "array", "string", "number", "integer")


def _types(schema: Any) -> list[str]:
    ts = implied_types(schema) if isinstance(schema, dict) else None
    ts = set(_TYPES) if ts is None else set(ts)
    return [t for t in _TYPES if t in ts and not (t == "integer" and "number" in ts)]


def _view(schema: Any, t: str) -> Any:
    try:
        return merge(schema, {"type": t})
    except GrammarError:
        return None


_OWN_KWS = {"object": OBJECT_KWS, "array": ARRAY_KWS, "string": STRING_KWS, "number": NUMBER_KWS,
             "integer": NUMBER_KWS, "null": (), "boolean": ()}
_TYPED_KWS = frozenset(OBJECT_KWS + ARRAY_KWS + STRING_KWS + NUMBER_KWS)


def accepts_every(schema: Any, t: str) -> bool:
    """Whether ``schema`` provably accepts every instance of type ``t``: its ``type`` allows
    ``t`` and each of its other keywords applies only to other types (``minLength`` says nothing
    of an object). Conservative: any other keyword answers False."""
    if schema is True or schema == {}:
        return True
    if not isinstance(schema, dict):
        return False
    ts = types_of(schema)
    if ts is not None and t not in ts:
        return False
    own = _OWN_KWS[t]
    for k, v in schema.items():
        if k == "type" or k in ANNOTATIONS:
            continue
        if k == "x-all":
            if any(k2 not in _TYPED_KWS or k2 in own for k2 in v):
                return False
        elif k not in _TYPED_KWS or k in own:
            return False
    return True


def _outside_keys(a: Any, b: dict) -> list[str] | None:
    """Up to ``MAX_OUTSIDE`` properties that ``a`` allows and ``b`` forbids (``b`` has
    ``additionalProperties: false`` and neither declares nor pattern-matches them); None when every
    key ``a`` allows is one of them (``a`` is closed too: any property then fails ``b``)."""
    if not isinstance(a, dict) or b.get("additionalProperties") is not False or b.get("patternProperties"):
        return []
    theirs = b.get("properties", {})
    mine = [k for k, v in a.get("properties", {}).items() if v is not False]
    out = [k for k in mine if k not in theirs]
    if (out and len(out) == len(mine) and a.get("additionalProperties") is False
            and not a.get("patternProperties")):
        return None
    return out[:MAX_OUTSIDE]


def _discriminator(a: Any, b: dict, disjoint: Callable[[Any, Any], bool]) -> str | None:
    """A property both ``a`` and ``b`` declare whose two value schemas are disjoint (the first in
    ``a``'s order, among ``MAX_DISCRIMINATORS``), or None."""
    if not isinstance(a, dict):
        return None
    theirs = b.get("properties", {})
    tried = 0
    for k, v in a.get("properties", {}).items():
        if k in theirs and v is not False:
            if disjoint(v, theirs[k]):
                return k
            tried += 1
            if tried >= MAX_DISCRIMINATORS:
                break
    return None


def _split(s: Any, prepare: Callable[[Any], Any]) -> tuple[str, list[Any]] | None:
    """``(kind, parts)`` for ``s = rest and kind(b1..bn)`` (its first pending ``anyOf`` /
    ``oneOf``, as the converter expands it): ``parts[i]`` is ``rest`` merged with ``bi`` (each
    through ``prepare``: ``$ref`` resolved, ``allOf`` merged; None where it cannot). None when
    ``s`` has no combinator, more than ``MAX_SPLIT`` branches, or a branch cannot be prepared."""
    if not isinstance(s, dict):
        return None
    rest = dict(s)
    pending = list(rest.pop("x-any", []))
    for key in ("anyOf", "oneOf"):
        if key in rest:
            pending.insert(0, (key, rest.pop(key)))
    if not pending:
        return None
    kind, branches = pending[0]
    if pending[1:]:
        rest["x-any"] = pending[1:]
    if not isinstance(branches, list) or len(branches) > MAX_SPLIT:
        return None
    first = bool(rest.get("x-any-first"))  # NOTE: keeps the order the converter emits properties in
    parts = []
    for b in branches:
        b = prepare(b)
        if b is None:
            return None
        try:
            b = seal(b)  # NOTE: a branch's unevaluated* sees only the branch
            part = b if b is False else prepare(merge(b, rest) if first else merge(rest, b))
        except GrammarError:
            return None
        if part is None:
            return None
        parts.append(False if unsatisfiable(part) else part)
    return kind, parts


def _distribute(a: Any, b: Any, disjoint: Callable[[Any, Any], bool], negate: Callable[[Any], Any],
                prepare: Callable[[Any], Any], depth: int) -> tuple[bool, Any]:
    """``(True, narrowed a)`` when ``b`` or ``a`` has a combinator to distribute over (see the
    module docstring), else ``(False, None)``."""
    got = _split(b, prepare)
    if got is not None and got[0] != UNDER:  # NOTE: b's restricted branches do not cover b
        for part in got[1]:
            if a is False:
                break
            if not disjoint(a, part):
                a = separate(a, part, disjoint, negate, prepare, depth + 1)
        return True, a
    got = _split(a, prepare)
    if got is None:
        return False, None
    kind, parts = got
    if kind == "oneOf":
        parts = exclusive_branches(parts, disjoint, negate, prepare, depth + 1)
    out = [p if p is False or disjoint(p, b) else separate(p, b, disjoint, negate, prepare, depth + 1)
           for p in parts]
    out = [p for p in out if p is not False]
    return True, (False if not out else out[0] if len(out) == 1 else {"anyOf": out})


def _items_apart(a: dict, b: dict, disjoint: Callable[[Any, Any], bool], negate: Callable[[Any], Any],
                 prepare: Callable[[Any], Any], depth: int) -> Any:
    """Arrays: ``a`` with every item narrowed to fail ``b``'s ``items`` schema, and at least one
    item where ``b`` accepts the empty array (such an array fails ``b``); None when either side
    has tuple items or the items cannot be told apart."""
    mine, theirs = a.get("items", True), b.get("items")
    if ("prefixItems" in a or "prefixItems" in b or not isinstance(theirs, (dict, bool))
            or not isinstance(mine, (dict, bool))):
        return None
    mine, theirs = prepare(mine), prepare(theirs)
    if mine is None or theirs is None or theirs is True or theirs == {}:
        return None
    mine = {} if mine is True else mine
    item = mine if mine is False or disjoint(mine, theirs) else separate(mine, theirs, disjoint, negate, prepare, depth + 1)
    if item is False:
        return None
    out = dict(a)
    out["items"] = item
    if int(b.get("minItems", 0)) < 1:  # NOTE: else the empty array fails b already
        out["minItems"] = max(1, int(a.get("minItems", 0)))
    return out


def _apart(va: dict, vb: Any, t: str, disjoint: Callable[[Any, Any], bool], negate: Callable[[Any], Any],
           prepare: Callable[[Any], Any], depth: int) -> Any:
    """The last resort of :func:`separate` for type ``t`` (views ``va`` / ``vb``), before ``va``
    is dropped: combinators distributed over, array items told apart; None where neither helps."""
    done, got = _distribute(va, vb, disjoint, negate, prepare, depth)
    if done and got is not False:
        return got
    if t == "array" and isinstance(vb, dict):
        return _items_apart(va, vb, disjoint, negate, prepare, depth)
    return None


def separate(a: dict, b: Any, disjoint: Callable[[Any, Any], bool], negate: Callable[[Any], Any],
             prepare: Callable[[Any], Any] | None = None, depth: int = 0) -> Any:
    """``a`` narrowed so that nothing it accepts satisfies ``b`` (False: nothing is left).
    ``negate(s)``: a positive schema for ``not s``, or None when it cannot be expressed;
    ``prepare(s)``: ``s`` with a top-level ``$ref`` resolved and ``allOf`` merged (None where it
    cannot be); without it, combinators are not distributed over."""
    check_budget("narrowing oneOf branches")
    if isinstance(b, dict) and b.get("x-under"):
        # NOTE: b restricted (schema_merge.seal) stands for less than it accepts: a keeps only
        # the types b cannot have
        kept = [t for t in _types(a) if t not in possible_types(b)]
        return merge(a, {"type": kept}) if kept else False
    views: list[Any] = []
    narrowed_any = False
    for t in _types(a):
        va, vb = _view(a, t), _view(b, t)
        if va is None or va is False:
            continue
        if vb is False or (vb is not None and disjoint(va, vb)):
            views.append(va)
            continue
        if vb is not None and accepts_every(vb, t):
            continue  # NOTE: every value of this type satisfies b: a keeps none of them
        if t == "object" and isinstance(b, dict):
            mine = set(a.get("required", []))
            theirs = [k for k in b.get("required", []) if k not in mine]
            if theirs:
                views.append(merge(va, {"properties": {theirs[0]: False}}))
                narrowed_any = True
                continue
            outside = _outside_keys(va, b)
            if outside is None:
                # NOTE: b forbids every key a allows: a with any property fails b
                views.append(merge(va, {"minProperties": 1}))
                narrowed_any = True
                continue
            if outside:
                # NOTE: b forbids undeclared keys: a with one of its own keys that b lacks fails b
                views.append({"anyOf": [merge(va, {"required": [k]}) for k in outside]})
                narrowed_any = True
                continue
            key = _discriminator(va, b, disjoint)
            if key is not None:
                # NOTE: a's value of this key fails b's: a with the key present fails b (cheaper
                # than a negation of b, which may expand into every way of violating it)
                views.append(merge(va, {"required": [key]}))
                narrowed_any = True
                continue
        if t == "number" and isinstance(vb, dict) and "number" not in (types_of(vb) or {"number"}):
            # NOTE: b's numbers are integers: a keeps its numbers that are not (sound: a's integers
            # that fail b's other keywords are dropped too)
            views.append(merge(va, {"not": {"type": "integer"}}))
            narrowed_any = True
            continue
        rest = {k: v for k, v in b.items() if k != "type"} if isinstance(b, dict) else b
        neg = negate(rest) if rest not in ({}, True) else None
        if neg is False:
            continue  # NOTE: b holds every value of this type
        if neg is not None:
            try:
                views.append(merge(va, neg))
                narrowed_any = True
                continue
            except GrammarError:
                pass
        if prepare is not None and depth < MAX_SPLIT_DEPTH:
            got = _apart(va, b if vb is None else vb, t, disjoint, negate, prepare, depth)
            if got is not None:
                views.append(got)
                narrowed_any = True
    views = [v for v in views if v is not False]
    if not views:
        return False
    if narrowed_any:
        return views[0] if len(views) == 1 else {"anyOf": views}
    return merge(a, {"type": [_types(v)[0] for v in views]})


def exclusive_branches(branches: list[Any], disjoint: Callable[[Any, Any], bool],
                       negate: Callable[[Any], Any], prepare: Callable[[Any], Any] | None = None,
                       depth: int = 0) -> list[Any]:
    """Each branch narrowed against every other (see the module docstring and :func:`separate`);
    branches that are already pairwise disjoint come back unchanged."""
    out = []
    for i, a in enumerate(branches):
        for j, b in enumerate(branches):
            if i == j or a is False or disjoint(a, b):
                continue
            if a is True:
                a = {}
            if "$ref" in a:
                a = prepare(a) if prepare is not None else None
                if a is None or (isinstance(a, dict) and "$ref" in a):
                    raise GrammarError("unsupported: oneOf whose recursive branches may overlap")
                if a is False:
                    break
                a = {} if a is True else a
            a = separate(a, b, disjoint, negate, prepare, depth)
        out.append(a)
    return out
