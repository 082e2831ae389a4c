"""Schema-level helpers for the JSON Schema converter: implied types, enum filtering, and a
conservative disjointness test for ``oneOf``."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any, Callable

from radixlm.grammar.budget import check_budget
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.schema_refs import ROOT_URI
from radixlm.grammar.schema_merge import ALL_TYPES, ANNOTATIONS, _json_eq, resolve_pointer, types_of

OBJECT_KWS = ("properties", "required", "additionalProperties", "minProperties", "maxProperties",
              "propertyNames", "patternProperties", "unevaluatedProperties", "dependencies")
ARRAY_KWS = ("items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems", "contains",
             "unevaluatedItems")
STRING_KWS = ("minLength", "maxLength", "pattern", "format")
MAX_DEPTH = 6  # nested $refs / combinators / properties that ``disjoint`` looks through
NUMBER_KWS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


def value_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer()):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def implied_types(schema: dict) -> set[str] | None:
    """Types an instance may have: ``type``, else those the keywords constrain (restricting to
    them never accepts an invalid instance), else None (any type)."""
    ts = types_of(schema)
    if ts is None:
        inferred: set[str] = set()
        for kws, t in ((OBJECT_KWS, {"object"}), (ARRAY_KWS, {"array"}), (STRING_KWS, {"string"}),
                       (NUMBER_KWS, {"number", "integer"})):
            if any(k in schema for k in kws):
                inferred |= t
        extra = schema.get("x-all", {})
        if "pattern" in extra or "format" in extra:
            inferred.add("string")
        if "multipleOf" in extra:
            inferred |= {"number", "integer"}
        ts = inferred or None
    if "enum" in schema or "const" in schema:
        vals = [schema["const"]] if "const" in schema else list(schema.get("enum", []))
        vt = {value_type(v) for v in vals}
        if "integer" in vt:
            vt.add("number")
        ts = vt if ts is None else ts & vt
    return ts


def possible_types(schema: dict) -> set[str]:
    """Types of the instances ``schema`` may accept (an over-approximation: ``type``, ``enum`` /
    ``const``), unlike :func:`implied_types` which may restrict."""
    ts = types_of(schema)
    out = set(ALL_TYPES) if ts is None else set(ts)
    if "enum" in schema or "const" in schema:
        vals = [schema["const"]] if "const" in schema else list(schema.get("enum", []))
        vt = {value_type(v) for v in vals}
        if "integer" in vt:
            vt.add("number")
        out &= vt
    return out - negated_types(schema)


def negated_types(schema: dict) -> set[str]:
    """Types that a ``not`` of ``schema`` (or an entry of its ``x-nots``) excludes whole: one
    holding ``type`` alone (no instance of those types satisfies ``schema``; ``not {type: number}``
    excludes integers too, ``not {type: integer}`` only them)."""
    nots = list(schema.get("x-nots", [])) + ([schema["not"]] if "not" in schema else [])
    out: set[str] = set()
    for n in nots:
        if isinstance(n, dict) and "type" in n and all(k == "type" or k in ANNOTATIONS for k in n):
            ts = types_of(n) or set()
            out |= set(ts) | ({"integer"} if "number" in ts else set())
    return out


def emitted_types(schema: dict) -> set[str]:
    """Types of the instances the converter may emit for ``schema``: its implied types, or with
    combinators (whose branches may add a ``type``) its possible types; less the types a ``not``
    excludes whole (see :func:`negated_types`)."""
    if any(k in schema for k in ("anyOf", "oneOf", "allOf", "x-any", "$ref")):
        return possible_types(schema)
    ts = implied_types(schema)
    return (set(ALL_TYPES) if ts is None else set(ts)) - negated_types(schema)


# The ``x-any`` kind of a sound restriction (an ``if`` whose ``not if`` has no positive form): its
# branches accept less than the keywords they replace, so they stand for them only where accepting
# less is safe (what the converter emits), never where a schema's whole language is needed.
UNDER = "x-under-anyOf"


def standard(schema: Any, over: bool = False) -> Any:
    """``schema`` with the converter's internal keywords (``x-all``, ``x-any``, ``x-nots``,
    ``x-checks``) written back as standard ones, at every depth, for a validator. ``over``: a
    language at least the schema's (``UNDER`` restrictions left out), else at most."""
    if isinstance(schema, list):
        return [standard(v, over) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict = {}
    more: list = []
    for k, v in schema.items():
        if k == "x-all":
            more += [{k2: standard(x, over)} for k2, vs in v.items() for x in vs]
        elif k == "x-any":
            more += [{"anyOf" if kind == UNDER else kind: standard(branches, over)}
                     for kind, branches in v if not (over and kind == UNDER)]
        elif k == "x-nots":
            more += [{"not": standard(n, not over)} for n in v]
        elif k == "x-checks":
            more += standard(v, over)
        elif k == "x-any-first":
            continue
        elif k in ("enum", "const"):
            out[k] = v
        else:
            out[k] = standard(v, not over if k == "not" else over)
    if more:
        out["allOf"] = list(out.get("allOf", [])) + more
    return out


def _validator(schema: dict, root: Any, over: bool = False) -> Any:
    import jsonschema

    sub = standard(schema, over)
    if isinstance(root, dict):
        for key in ("definitions", "$defs"):
            if key in root:
                sub.setdefault(key, root[key])
    cls = jsonschema.validators.validator_for(root if isinstance(root, dict) else {}, default=jsonschema.Draft7Validator)
    if _REGISTRY and _REGISTRY[0] is root:
        registry = _REGISTRY[1]
    else:  # NOTE: the canonical ``$ref``s point into the root document under ROOT_URI
        from referencing import Registry, Resource
        from referencing.jsonschema import DRAFT7

        registry = Registry().with_resource(ROOT_URI, Resource.from_contents(root, default_specification=DRAFT7))
        _REGISTRY[:] = [root, registry]
    return cls(sub, registry=registry)


_REGISTRY: list = []


def valid_values(schema: dict, root: Any) -> list[Any]:
    """``enum`` / ``const`` members that satisfy the schema's other keywords (``x-nots`` and
    ``x-checks`` included: exact, by a validator; a GrammarError where it cannot check them)."""
    vals = [schema["const"]] if "const" in schema else list(schema["enum"])
    if "const" in schema and "enum" in schema:
        vals = [v for v in vals if any(_json_eq(v, e) for e in schema["enum"])]
    rest = {k: v for k, v in schema.items() if k not in ("enum", "const")}
    if not any(k not in ANNOTATIONS for k in rest):
        return vals
    # NOTE: a validator built and run per call, ~50 us and ~10 us a value, unseen otherwise
    check_budget("checking enum values", 50 + 10 * len(vals))
    try:
        check = _validator(rest, root)
        return [v for v in vals if check.is_valid(v)]
    except Exception:  # noqa: BLE001 - an odd sub-schema: fall back to the type filter
        if "x-checks" in rest or "x-nots" in rest:  # NOTE: only the validator checks those: refuse, never guess
            raise GrammarError("unsupported JSON Schema keyword: 'not' (could not be checked)") from None
        ts = implied_types(rest)
        return [v for v in vals if ts is None or value_type(v) in ts or
                (value_type(v) == "integer" and "number" in ts)]


def _interval(s: dict) -> tuple[Decimal | None, Decimal | None]:
    from radixlm.grammar.json_scalars import bounds

    lo, _, hi, _ = bounds(s)
    return lo, hi


def _branches(s: dict, root: Any) -> list[Any] | None:
    """The branches of a schema whose only combinator is one ``anyOf`` / ``oneOf``, each merged
    with the schema's other keywords (what the converter emits for it, see
    ``SchemaConverter.combinator``): the schema's instances all satisfy one of them. None for any
    other schema."""
    kinds = [k for k in ("anyOf", "oneOf", "allOf", "x-any", "not", "x-nots", "x-checks", "$ref") if k in s]
    if len(kinds) != 1 or kinds[0] not in ("anyOf", "oneOf") or not isinstance(s[kinds[0]], list):
        return None
    from radixlm.grammar.schema_merge import merge

    rest = {k: v for k, v in s.items() if k != kinds[0] and k not in ANNOTATIONS}
    out = []
    for b in s[kinds[0]]:
        if isinstance(b, dict) and "$ref" in b:
            if len(b) != 1:
                return None
            b = resolve_pointer(root, b["$ref"])
        try:
            out.append(merge(rest, b) if rest else b)
        except GrammarError:
            return None
    return out


def disjoint(a: Any, b: Any, root: Any, string_dfa: Callable[[dict], Any] | None = None,
             depth: int = 0) -> bool:
    """True only when no instance can satisfy both schemas (conservative: False when unsure).
    A schema combining branches (``anyOf`` / ``oneOf``) is disjoint from ``b`` when each of its
    branches is (to ``MAX_DEPTH`` nested combinators)."""
    if a is False or b is False:
        return True
    if a is True or b is True or not isinstance(a, dict) or not isinstance(b, dict):
        return False
    if a.get("x-under") or b.get("x-under"):
        return False  # NOTE: a sound restriction of a schema (schema_merge.seal) stands for less than it
    if "$ref" in a or "$ref" in b:
        if depth >= MAX_DEPTH or len(a if "$ref" in a else b) != 1:
            return False
        if "$ref" in a:
            return disjoint(resolve_pointer(root, a["$ref"]), b, root, string_dfa, depth + 1)
        return disjoint(a, resolve_pointer(root, b["$ref"]), root, string_dfa, depth + 1)
    # NOTE: what the converter emits for ``a`` (its implied types) must fail ``b`` (whose language
    # may hold every type its keywords do not exclude), and the other way round.
    common = (emitted_types(a) & possible_types(b)) | (emitted_types(b) & possible_types(a))
    if not common:
        return True
    # NOTE: enumerated values bound a schema whatever its other keywords (they only remove values),
    # and a validator ignoring the internal x-* keywords accepts more than the schema: both sound.
    va = [a["const"]] if "const" in a else a.get("enum")
    vb = [b["const"]] if "const" in b else b.get("enum")
    if va is not None and vb is not None:
        return not any(_json_eq(x, y) for x in va for y in vb)
    for vals, other in ((va, b), (vb, a)):
        if vals is not None:
            try:
                check = _validator(other, root, over=True)
                return not any(check.is_valid(v) for v in vals)
            except Exception:  # noqa: BLE001
                return False
    if common == {"object"} and (_keys_disjoint(a, b) or _required_disjoint(a, b, root, string_dfa, depth)):
        return True  # NOTE: before the combinators: other keywords only narrow either side
    if depth < MAX_DEPTH:
        for x, y in ((a, b), (b, a)):
            parts = _branches(x, root)
            if parts is not None:
                return all(disjoint(p, y, root, string_dfa, depth + 1) for p in parts)
    if any(k in x for x in (a, b) for k in ("anyOf", "oneOf", "allOf", "x-any", "not", "x-nots", "x-checks")):
        return False
    if common == {"object"}:
        return False
    if common <= {"number", "integer"}:
        (la, ha), (lb, hb) = _interval(a), _interval(b)
        return (ha is not None and lb is not None and ha < lb) or (hb is not None and la is not None and hb < la)
    if common == {"string"}:
        (la, ha), (lb, hb) = _lengths(a), _lengths(b)
        if (ha is not None and ha < lb) or (hb is not None and hb < la):
            return True
        if not any(_has_content_rule(x) for x in (a, b)):
            return False  # NOTE: "a" * max(la, lb) satisfies both (no product of length counters)
    if common == {"string"} and string_dfa is not None:
        from radixlm.grammar.dfa_ops import product

        return product(string_dfa(a), string_dfa(b), "and").start == 0
    return False


def unsatisfiable(schema: Any, depth: int = 0) -> bool:
    """True only when no instance satisfies ``schema`` (conservative, cheap: no ``$ref`` or
    combinator is looked into): ``false``, an empty ``type`` or ``enum``, or an object-only schema
    requiring a property whose schema is unsatisfiable or that it forbids. Prunes the branches
    that merging conditionals into each other makes contradictory."""
    if schema is False:
        return True
    if not isinstance(schema, dict):
        return False
    t = schema.get("type")
    if (isinstance(t, list) and not t) or schema.get("enum") == []:
        return True
    if t not in ("object", ["object"]) or depth >= MAX_DEPTH:
        return False
    props = schema.get("properties", {})
    closed = schema.get("additionalProperties") is False and not schema.get("patternProperties")
    for k in schema.get("required", []):
        if k in props:
            if unsatisfiable(props[k], depth + 1):
                return True
        elif closed:
            return True
    return False


def _required_disjoint(a: dict, b: dict, root: Any, string_dfa: Callable[[dict], Any] | None,
                       depth: int) -> bool:
    """Objects: a property both require with disjoint values (a discriminator), or one that a
    side requires and the other forbids."""
    pa, pb = a.get("properties", {}), b.get("properties", {})
    ra, rb = set(a.get("required", [])), set(b.get("required", []))
    for k in ra & rb:
        if k in pa and k in pb and disjoint(pa[k], pb[k], root, string_dfa, depth + 1):
            return True
    for req, props, other in ((ra, pb, b), (rb, pa, a)):
        for k in req:
            if props.get(k) is False or (k not in props and other.get("additionalProperties") is False
                                         and not other.get("patternProperties")):
                return True
    return False


def _lengths(s: dict) -> tuple[int, int | None]:
    """A string schema's ``minLength`` / ``maxLength`` (code points; None: unbounded)."""
    hi = s.get("maxLength")
    return int(s.get("minLength", 0)), None if hi is None else int(hi)


def _has_content_rule(s: dict) -> bool:
    """Whether a string schema constrains more than the length (``pattern``, ``format``, also
    through the converter's merged ``x-all``)."""
    extra = s.get("x-all", {})
    return any(k in s or k in extra for k in ("pattern", "format"))


def _keys_disjoint(a: dict, b: dict) -> bool:
    """No object satisfies both ``a`` and ``b``: one of them needs a property
    (``required`` / ``minProperties``) and no key is allowed by both (each allows only its declared
    and ``patternProperties`` keys). Every other keyword only narrows an object, so this holds
    whatever else the schemas say."""

    def nonempty(s: dict) -> bool:
        return bool(s.get("required")) or int(s.get("minProperties", 0)) > 0

    def forms(s: dict) -> tuple[list[str], list[str]] | None:
        if s.get("additionalProperties", s.get("unevaluatedProperties")) is not False:
            return None
        names = [k for k, v in s.get("properties", {}).items() if v is not False]
        pats = [p for p, v in s.get("patternProperties", {}).items() if v is not False]
        return names, pats

    if not (nonempty(a) or nonempty(b)):
        return False
    fa, fb = forms(a), forms(b)
    if fa is None or fb is None:
        return False
    from radixlm.grammar.dfa_ops import product
    from radixlm.grammar.json_scalars import content_dfa

    try:
        da = [content_dfa(p, True) for p in fa[1]]
        db = [content_dfa(p, True) for p in fb[1]]
    except GrammarError:
        return False
    if set(fa[0]) & set(fb[0]):
        return False
    for names, dfas in ((fa[0], db), (fb[0], da)):
        if any(d.matches(json.dumps(k)) for k in names for d in dfas):
            return False
    return all(product(x, y, "and").start == 0 for x in da for y in db)
