"""Converting a sub-schema met again to the very same AST (see :class:`ConvertOnce`).

An object's AST carries share keys drawn from a per-conversion counter (one automaton fragment per
set of emitted properties, see :mod:`radixlm.grammar.json_containers`), so two conversions of equal
schemas give ASTs that differ only in those keys: every automaton built around them (a property
pair, a grammar terminal) is determinized again and the grammar gets one more terminal with the
same language. Generated schemas repeat sub-schemas a lot: common properties merged into each of
dozens of ``oneOf`` branches, the same inline object under many definitions. Converted once, equal
sub-schemas give one AST, so the automaton memo and the grammar's terminal sharing see them as one.
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.grammar.ast import Node
from radixlm.grammar.schema_merge import ASSERTIONS

_KEPT = ASSERTIONS | {"x-any-first"}  # NOTE: the converter's own; orders the properties
_MAPS = ("properties", "patternProperties", "dependentSchemas", "definitions", "$defs")
_SUBS = ("items", "additionalItems", "additionalProperties", "unevaluatedProperties", "propertyNames",
         "contains", "not", "if", "then", "else", "unevaluatedItems")
_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")


def assertions_only(schema: Any) -> Any:
    """``schema`` without the keywords that constrain nothing (annotations, unknown keywords),
    in its sub-schemas too; data (``enum``, ``const``, ``required``, the converter's ``x-``
    keywords) as it is."""
    if isinstance(schema, list):
        return [assertions_only(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k not in _KEPT:
            continue
        if k in _MAPS and isinstance(v, dict):
            v = {name: assertions_only(sub) for name, sub in v.items()}
        elif k in _SUBS or k in _LISTS:
            v = assertions_only(v)
        elif k == "dependencies" and isinstance(v, dict):
            v = {name: sub if isinstance(sub, list) else assertions_only(sub) for name, sub in v.items()}
        out[k] = v
    return out


class ConvertOnce:
    """Memo of :meth:`node` (per schema object) and :meth:`object_once` (per canonical text) for
    :class:`radixlm.grammar.json_schema.SchemaConverter`."""

    converted: dict[int, tuple[Any, Node]]
    objects: dict[tuple[str, bool], Node]
    obj_depth: int
    split_leaves: bool
    walk: Any

    def node(self, schema: Any) -> Node:
        """The AST of ``schema``, converted once per schema object.

        NOTE: merging copies the containers, not the sub-schemas, so a sub-schema met again (common
        properties merged into every ``oneOf`` branch) is the same object; the memo keeps the
        object alive, so its ``id`` names no other schema while the conversion runs."""
        got = self.converted.get(id(schema))
        if got is not None:
            return got[1]
        out = self._node(schema)
        if isinstance(schema, dict):
            self.converted[id(schema)] = (schema, out)
        return out

    def object_once(self, schema: dict) -> Node:
        """The object AST of ``schema`` (``type`` object), one per canonical JSON text of its
        assertions (and whether it is the outermost object: undeclared values nest deeper there)."""
        self._key_names(schema.get("propertyNames"))
        try:
            key = (json.dumps(assertions_only(schema), sort_keys=True), self.obj_depth == 0)
        except (TypeError, ValueError):
            return self.object(schema)
        got = self.objects.get(key)
        if got is None:
            got = self.objects[key] = self.object(schema)
        return got

    def _key_names(self, names: Any) -> None:
        """Memoize a ``propertyNames`` schema (``node`` of that very object) as a schema of
        strings (keys are strings: an untyped ``not`` there is not "any JSON value"), converted
        without rules of its own (``split_leaves``): the object intersects its keys with it as
        an automaton."""
        if not isinstance(names, dict) or id(names) in self.converted:
            return
        split, self.split_leaves = self.split_leaves, False
        try:
            out = self.node({"allOf": [names, {"type": "string"}]})
        finally:
            self.split_leaves = split
        if not self.walk.has_ref(out):
            self.converted[id(names)] = (names, out)
