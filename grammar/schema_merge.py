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
                props[k] = merge(props[k], v) if k in props else v
            out[key] = props
        elif key in ("items", "additionalProperties", "additionalItems", "propertyNames", "contains"):
            if isinstance(va, list) or isinstance(vb, list):
                if va != vb:
                    raise GrammarError(f"allOf: cannot merge tuple '{key}'")
            else:
                out[key] = merge(va, vb)
        elif key == "prefixItems":
            n = max(len(va), len(vb))
            out[key] = [merge(va[i] if i < len(va) else True, vb[i] if i < len(vb) else True) for i in range(n)]
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
    """Properties declared by only one side must also satisfy the other side's
    ``additionalProperties`` (when it has one)."""
    for side, other in ((a, b), (b, a)):
        addl = other.get("additionalProperties")
        if addl is None or addl is True:
            continue
        mine = side.get("properties", {})
        theirs = other.get("properties", {})
        props = dict(out.get("properties", {}))
        for k in mine:
            if k not in theirs:
                props[k] = merge(props[k], addl)
        out["properties"] = props
