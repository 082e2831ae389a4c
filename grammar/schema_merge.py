"""JSON Schema ``allOf`` merging and ``$ref`` resolution (schema-level, before any automaton).

Merging follows JSON Schema semantics (an unspecified ``additionalProperties`` means "anything"),
so ``allOf: [{properties: {a}}, {properties: {b}}]`` allows both ``a`` and ``b``; strictness is
applied only afterwards, by the converter, to the merged schema.
"""

from __future__ import annotations

import json
from typing import Any
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.schema_refs import pointer_parts

Schema = Any  # dict or bool

ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "example", "$schema", "$id", "id", "$comment",
    "readOnly", "writeOnly", "deprecated", "contentMediaType", "contentEncoding", "contentSchema",
    "definitions", "$defs", "$anchor", "$dynamicAnchor", "$vocabulary", "discriminator", "nullable",
    "markdownDescription", "errorMessage", "xml", "externalDocs", "$recursiveAnchor", "x-any-first",
})
# Keywords that constrain an instance (JSON Schema drafts 4 to 2020-12) and the converter's own;
# any other keyword is ignored by validators, so by ``not`` and ``allOf`` merging too.
ASSERTIONS = frozenset({
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "format", "items", "prefixItems", "additionalItems", "maxItems",
    "minItems", "uniqueItems", "contains", "maxContains", "minContains", "unevaluatedItems", "properties",
    "patternProperties", "additionalProperties", "propertyNames", "maxProperties", "minProperties",
    "required", "dependentRequired", "dependentSchemas", "dependencies", "unevaluatedProperties", "allOf",
    "anyOf", "oneOf", "not", "if", "then", "else", "$ref", "$dynamicRef", "$recursiveRef",
    "x-all", "x-any", "x-nots", "x-checks",
})
# Assertions merged specially below; everything else that is not an annotation must be equal.
_MIN = ("minimum", "minLength", "minItems", "minProperties", "exclusiveMinimum")
_MAX = ("maximum", "maxLength", "maxItems", "maxProperties", "exclusiveMaximum")
NUMERIC_TYPES = {"integer", "number"}
_DEFERRED = ("if", "then", "else", "dependencies", "dependentRequired", "dependentSchemas")
ALL_TYPES = ("null", "boolean", "object", "array", "string", "number", "integer")


def resolve_pointer(root: Schema, ref: str) -> Schema:
    """Follow a ``$ref`` already made canonical by :func:`radixlm.grammar.schema_refs.canonical_refs`
    (also plain local pointers: ``#``, ``#/definitions/x``, ``#/$defs/x``)."""
    parts = pointer_parts(ref)
    if parts is None:
        return ref == "x-bool:true"
    node = root
    for part in parts:
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise GrammarError(f"$ref {ref!r} does not resolve")
    return node


def types_of(schema: dict) -> set[str] | None:
    """The ``type`` keyword as a set (``integer`` implied by ``number``), None when absent."""
    t = schema.get("type")
    if t is None:
        return None
    ts = {t} if isinstance(t, str) else set(t)
    if not ts <= set(ALL_TYPES):
        raise GrammarError(f"unknown type {t!r}")
    if "number" in ts:
        ts.add("integer")
    return ts


def _json_eq(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def merge(a: Schema, b: Schema) -> Schema:
    """``allOf: [a, b]`` as one schema (neither may contain ``$ref`` at its top level)."""
    if a is False or b is False:
        return False
    if a is True or a == {}:
        return b
    if b is True or b == {}:
        return a
    if any(k in a and k in b for k in _DEFERRED):
        # NOTE: two conditionals (or dependency maps) at one level: keep b's as a nested allOf
        b = dict(b)
        moved = {k: b.pop(k) for k in _DEFERRED if k in b}
        b["allOf"] = list(b.get("allOf", [])) + [moved]
    if isinstance(a.get("$ref"), str) and isinstance(b.get("$ref"), str) and a["$ref"] != b["$ref"]:
        b = dict(b)
        b["allOf"] = list(b.get("allOf", [])) + [{"$ref": b.pop("$ref")}]
    if isinstance(a.get("items"), list) or isinstance(b.get("items"), list):
        a, b = _as_prefix(a), _as_prefix(b)
    if "prefixItems" in a or "prefixItems" in b:
        a, b = _tuple_items(a, b)
    out = dict(a)
    for key, vb in b.items():
        if key in ANNOTATIONS or key not in out:
            if key not in ANNOTATIONS:
                out[key] = vb
            continue
        va = out[key]
        if key == "type":
            ta, tb = types_of(a), types_of(b)  # NOTE: an empty list (no type at all) stays empty
            ta, tb = set(ALL_TYPES) if ta is None else ta, set(ALL_TYPES) if tb is None else tb
            both = ta & tb
            out[key] = sorted(both - ({"integer"} if "number" in both else set()))
        elif key == "required":
            out[key] = list(dict.fromkeys(list(va) + list(vb)))
        elif key in ("properties", "patternProperties"):
            props = dict(va)
            for k, v in vb.items():
                props[k] = merge(seal(props[k]), seal(v)) if k in props else v
            out[key] = props
        elif key in ("items", "additionalProperties", "additionalItems", "propertyNames", "contains"):
            if isinstance(va, list) or isinstance(vb, list):
                if va != vb:
                    raise GrammarError(f"allOf: cannot merge tuple '{key}'")
            else:
                out[key] = merge(seal(va), seal(vb))
        elif key == "prefixItems":  # NOTE: of one length here (_tuple_items)
            out[key] = [merge(seal(x), seal(y)) for x, y in zip(va, vb)]
        elif key in _MIN and not isinstance(va, bool) and not isinstance(vb, bool):
            out[key] = max(va, vb)
        elif key in _MAX and not isinstance(va, bool) and not isinstance(vb, bool):
            out[key] = min(va, vb)
        elif key == "enum":
            out[key] = [x for x in va if any(_json_eq(x, y) for y in vb)]
        elif key == "allOf":
            out[key] = list(va) + list(vb)
        elif key in ("anyOf", "oneOf"):
            out["x-any"] = list(out.get("x-any", [])) + [(key, vb)]
        elif key == "const":
            if not _json_eq(va, vb):
                return False
        elif key in ("pattern", "format", "not", "multipleOf"):
            if not _json_eq(va, vb):
                extra = dict(out.get("x-all", {}))
                extra[key] = list(extra.get(key, [])) + [vb]
                out["x-all"] = extra
        elif key in ("x-any", "x-nots", "x-checks"):
            out[key] = list(va) + list(vb)
        elif key == "x-all":
            extra = dict(va)
            for k2, v2 in vb.items():
                extra[k2] = list(extra.get(k2, [])) + list(v2)
            out[key] = extra
        elif key not in ASSERTIONS:
            continue  # NOTE: an unknown keyword constrains nothing
        elif not _json_eq(va, vb):
            raise GrammarError(f"allOf: cannot merge differing '{key}'")
    _fix_additional(out, a, b)
    return out


def _fix_additional(out: dict, a: dict, b: dict) -> None:
    """Properties (and ``patternProperties`` patterns) declared by only one side must also satisfy
    the other side's ``additionalProperties`` (when it has one; also where the other side's own
    patterns would have exempted a key: a sound restriction)."""
    for side, other in ((a, b), (b, a)):
        addl = other.get("additionalProperties")
        if addl is None or addl is True:
            continue
        for key in ("properties", "patternProperties"):
            mine, theirs = side.get(key, {}), other.get(key, {})
            props = dict(out.get(key, {}))
            for k in mine:
                if k not in theirs:
                    props[k] = merge(seal(props[k]), seal(addl))
            if props:
                out[key] = props


def _tuple_items(a: dict, b: dict) -> tuple[dict, dict]:
    """``a`` and ``b`` with ``prefixItems`` of one length (the side with fewer positions, or none,
    extended with its ``items``) so that merging position by position is exact: an ``items`` of
    one side applies to every position the other side's ``prefixItems`` covers."""
    n = max(len(a.get("prefixItems", [])), len(b.get("prefixItems", [])))
    out = []
    for s in (a, b):
        pre = list(s.get("prefixItems", []))
        if len(pre) < n:
            s = dict(s)
            s["prefixItems"] = pre + [s.get("items", True)] * (n - len(pre))
        out.append(s)
    return out[0], out[1]


def _as_prefix(s: dict) -> dict:
    """A draft 4-7 tuple (``items`` a list, ``additionalItems``) as ``prefixItems`` / ``items``
    (the same language; an ``additionalItems`` beside no tuple has no effect)."""
    if "additionalItems" not in s and not isinstance(s.get("items"), list):
        return s
    out = dict(s)
    more = out.pop("additionalItems", True)
    if isinstance(out.get("items"), list):
        out["prefixItems"] = out.pop("items")
        out["items"] = more
    return out


_IN_PLACE = ("allOf", "anyOf", "oneOf", "x-any", "if", "then", "else", "$ref", "dependentSchemas", "dependencies", "not")


def seal(s: Schema) -> Schema:
    """``s`` as a sibling of other schemas: its ``unevaluatedProperties`` / ``unevaluatedItems``
    see only what ``s`` itself evaluates, so they become ``additionalProperties`` / ``items`` (no-ops
    beside those). Exact for ``s`` without in-place applicators; with them (``allOf``, ``anyOf``,
    ``$ref`` ...) stricter, never looser: what those evaluate must then satisfy them too."""
    if not isinstance(s, dict) or ("unevaluatedProperties" not in s and "unevaluatedItems" not in s):
        return s
    out = dict(s)
    if any(k in s for k in _IN_PLACE):
        out["x-under"] = True  # NOTE: stricter than s: never read as s's whole language (disjoint)
    if "unevaluatedProperties" in out:
        u = out.pop("unevaluatedProperties")
        if "additionalProperties" not in out:
            out["additionalProperties"] = u
    if "unevaluatedItems" in out:
        u = out.pop("unevaluatedItems")
        if isinstance(out.get("items"), list):
            out.setdefault("additionalItems", u)
        else:
            out.setdefault("items", u)
    return out


def unevaluated(schema: Schema) -> bool:
    """Whether ``schema`` restricts its unevaluated properties or items."""
    return isinstance(schema, dict) and (schema.get("unevaluatedProperties", True) is not True or
                                         schema.get("unevaluatedItems", True) is not True)


_IN_PLACE_LISTS = ("allOf", "anyOf", "oneOf")
_IN_PLACE_ONE = ("if", "then", "else")


def guard(s: Schema, parent: dict) -> Schema:
    """``s`` (merged into ``parent`` though its annotations do not count: the positive form of a
    ``not``, a failed ``if``) with ``parent``'s ``unevaluatedProperties`` / ``unevaluatedItems``
    applied to every key / element it may evaluate, so that the merge never lets through one they
    reject (a sound restriction)."""
    u, ui = parent.get("unevaluatedProperties", True), parent.get("unevaluatedItems", True)
    if (u is True and ui is True) or not isinstance(s, dict):
        return s
    s = seal(s)
    if "$ref" in s:
        raise GrammarError("unsupported: unevaluatedProperties / unevaluatedItems beside a $ref under 'not' or 'if'")
    out = dict(s)
    if u is not True:
        for key in ("properties", "patternProperties"):
            if isinstance(s.get(key), dict):
                out[key] = {k: merge(seal(v), u) for k, v in s[key].items()}
        if "additionalProperties" in s:
            out["additionalProperties"] = merge(seal(s["additionalProperties"]), u)
    if ui is not True:
        for key in ("prefixItems", "items", "additionalItems", "contains"):
            if isinstance(s.get(key), list):
                out[key] = [merge(seal(v), ui) for v in s[key]]
            elif key in s:
                out[key] = merge(seal(s[key]), ui)
    for key in _IN_PLACE_LISTS:
        if isinstance(s.get(key), list):
            out[key] = [guard(b, parent) for b in s[key]]
    for key in _IN_PLACE_ONE:
        if key in s:
            out[key] = guard(s[key], parent)
    for key in ("dependentSchemas", "dependencies"):
        if isinstance(s.get(key), dict):
            out[key] = {k: v if isinstance(v, list) else guard(v, parent) for k, v in s[key].items()}
    if "x-any" in s:
        out["x-any"] = [(k, [guard(b, parent) for b in bs]) for k, bs in s["x-any"]]
    return out
