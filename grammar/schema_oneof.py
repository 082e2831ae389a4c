"""``oneOf`` with branches that may overlap, restricted soundly.

An instance is valid for ``oneOf`` when it matches exactly one branch. For every pair of branches
that are not provably disjoint, branch ``a`` is narrowed until it provably excludes branch ``b``:
per instance type, a type is kept when the two branches restricted to it are disjoint, an object
type is kept when ``b`` requires a property that ``a`` is then forbidden to have, or when both
declare a property whose values are disjoint (``a`` then requires it: a discriminator), else ``a``
is intersected with the negation of ``b`` where that is expressible, and any other overlapping
type is dropped from ``a``. Whatever the narrowed branches accept matches its own
branch and no other, so it is valid; some valid instances may be rejected.
"""

from __future__ import annotations

from typing import Any, Callable

from radixlm.grammar.errors import GrammarError
from radixlm.grammar.schema_checks import ARRAY_KWS, NUMBER_KWS, OBJECT_KWS, STRING_KWS, implied_types
from radixlm.grammar.schema_merge import ANNOTATIONS, merge, types_of

MAX_OUTSIDE = 4
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


def _outside_keys(a: Any, b: dict) -> list[str]:
    """Up to ``MAX_OUTSIDE`` properties that ``a`` allows and ``b`` forbids (``b`` has
    ``additionalProperties: false`` and neither declares nor pattern-matches them)."""
    if not isinstance(a, dict) or b.get("additionalProperties") is not False or b.get("patternProperties"):
        return []
    theirs = b.get("properties", {})
    out = [k for k, v in a.get("properties", {}).items() if k not in theirs and v is not False]
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


def separate(a: dict, b: Any, disjoint: Callable[[Any, Any], bool], negate: Callable[[Any], Any]) -> Any:
    """``a`` narrowed so that nothing it accepts satisfies ``b`` (False: nothing is left).
    ``negate(s)``: a positive schema for ``not s``, or None when it cannot be expressed."""
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
        rest = {k: v for k, v in b.items() if k != "type"} if isinstance(b, dict) else b
        neg = negate(rest) if rest not in ({}, True) else None
        if neg is not None and neg is not False:
            try:
                views.append(merge(va, neg))
                narrowed_any = True
            except GrammarError:
                pass
    views = [v for v in views if v is not False]
    if not views:
        return False
    if narrowed_any:
        return views[0] if len(views) == 1 else {"anyOf": views}
    return merge(a, {"type": [_types(v)[0] for v in views]})


def exclusive_branches(branches: list[Any], disjoint: Callable[[Any, Any], bool],
                       negate: Callable[[Any], Any]) -> list[Any]:
    """Each branch narrowed against every other (see the module docstring); branches that are
    already pairwise disjoint come back unchanged."""
    out = []
    for i, a in enumerate(branches):
        for j, b in enumerate(branches):
            if i == j or a is False or disjoint(a, b):
                continue
            if a is True:
                a = {}
            if "$ref" in a:
                raise GrammarError("unsupported: oneOf whose recursive branches may overlap")
            a = separate(a, b, disjoint, negate)
        out.append(a)
    return out
