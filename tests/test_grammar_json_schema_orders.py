"""SchemaStore coverage fixes (issue 12): accept/reject rows walked token by token on real
vocabularies (``schema_table_tests``), schemas written here. Valid rows once rejected (keys sorted
as ``sort_keys`` writes them in an object whose pairs are too large for a sorted copy in a single
DFA; ``oneOf`` branches whose disjointness needs a ``not {type}``; the required-first order of a
large object in a grammar); invalid rows keep the conversion sound."""

from __future__ import annotations

from typing import Any

from radixlm.grammar.json_schema import json_schema_to_ast
from radixlm.grammar.testing import schema_table_tests

# an object whose pairs carry objects large enough that a sorted copy does not fit one DFA
_INNER = {"type": "object", "properties": {f"f{i}": {"type": "string", "maxLength": 24} for i in range(8)},
          "additionalProperties": False}
LARGE_PAIRS = {"type": "object", "required": ["zeta"], "properties": {
    "zeta": _INNER, "alpha": _INNER, "mid": {"type": "integer"}, "beta": _INNER, "gamma": {"type": "boolean"}}}

# a oneOf of "metadata has no pd" and "metadata.pd is 2": disjoint once a branch whose metadata
# must be an object and not an object is seen to hold nothing
_HAS_PD = {"properties": {"metadata": {"type": "object", "properties": {"pd": {}}, "required": ["pd"]}}}
_PD2 = {"properties": {"metadata": {"type": "object", "properties": {"pd": {"const": 2}}, "required": ["pd"]}}}
_BASE = {"type": "object", "required": ["metadata"],
         "properties": {"metadata": {"type": "object", "properties": {"pd": {"type": "integer", "enum": [1, 2, 3]}}}}}

# an allOf reaching itself through $ref at the same instance location (no validator terminates
# on an instance that gets there): nothing validates through it, the rest of the schema converts
IN_PLACE_CYCLE = {"definitions": {"loop": {"allOf": [{"$ref": "#/definitions/loop"}, {"type": "object"}]}},
                  "type": "object", "properties": {"a": {"type": "integer"}, "b": {"$ref": "#/definitions/loop"}}}

# a diamond (the same base reached twice through allOf) is no cycle
DIAMOND = {"definitions": {"base": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
                           "named": {"allOf": [{"$ref": "#/definitions/base"}, {"properties": {"name": {"type": "string"}}}]}},
           "allOf": [{"$ref": "#/definitions/base"}, {"$ref": "#/definitions/named"}, {"$ref": "#/definitions/base"}]}

# uniqueItems over a finite domain inside a grammar (a recursive property makes it one): rules
_COLORS = ["red", "green", "blue", "cyan", "magenta", "yellow", "black", "white", "gray", "pink"]
UNIQUE_IN_GRAMMAR = {"type": "object", "properties": {
    "few": {"type": "array", "uniqueItems": True, "items": {"enum": _COLORS[:4]}},
    "many": {"type": "array", "uniqueItems": True, "items": {"enum": _COLORS}, "minItems": 2, "maxItems": 4},
    "methods": {"type": "array", "uniqueItems": True, "minItems": 1,
                "items": {"enum": ["GET", "POST", "HEAD", "OPTIONS", "PUT", "TRACE", "DELETE", "PATCH", "CONNECT"]}},
    "child": {"$ref": "#"}}}

# a property whose $ref is reached again through a $ref to the property itself (an anyOf branch
# beside it): the same target twice in place, no cycle
TWICE = {"definitions": {
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "uniqueItems": True},
    "item": {"type": "object", "additionalProperties": False,
             "properties": {"name": {"type": "string"}, "tags": {"$ref": "#/definitions/tags", "description": "tags"}},
             "anyOf": [{"properties": {"name": {"type": "string"}}, "required": ["name"]},
                       {"properties": {"tags": {"$ref": "#/definitions/item/properties/tags"}}, "required": ["tags"]}]}},
    "type": "array", "items": {"$ref": "#/definitions/item"}}

# the same without recursion: more than EXACT_MAX values convert the schema as a grammar
METHODS = {"type": "array", "uniqueItems": True, "maxItems": 5,
           "items": {"enum": ["GET", "POST", "HEAD", "OPTIONS", "PUT", "TRACE", "DELETE", "PATCH", "CONNECT"]}}

# more properties than any order allows (ANY_ORDER_MAX), two required, and a recursive property
# (a grammar): the required ones first, then the optional ones in any order (as in a single DFA)
_SIX = {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "string"},
        "d": {"type": "boolean"}, "e": {"type": "integer"}, "g": {"$ref": "#"}}
REQUIRED_FIRST_RECURSIVE = {"type": "object", "required": ["b", "e"], "properties": _SIX}

# (name, schema, valid instances, invalid instances)
CASES: list[tuple[str, Any, list, list]] = [
    ("sorted keys of an object with large pairs (converted as a grammar)", LARGE_PAIRS,
     [{"alpha": {"f1": "a"}, "beta": {}, "gamma": True, "zeta": {"f0": "x", "f7": "y"}},
      {"alpha": {}, "zeta": {}}, {"zeta": {}, "alpha": {}, "mid": 3}, {"beta": {}, "mid": 1, "zeta": {"f2": ""}}],
     [{"alpha": {}, "beta": {}}, {"alpha": {"f1": 3}, "zeta": {}}, {"alpha": {}, "zeta": {"g": "x"}},
      {"beta": {}, "mid": 1.5, "zeta": {}}, {"zeta": {"f0": "x" * 25}}, []]),
    ("oneOf of a negated nested object and a nested const", {**_BASE, "oneOf": [{"not": _HAS_PD}, _PD2]},
     [{"metadata": {"pd": 2}}, {"metadata": {}}], [{"metadata": {"pd": 1}}, {"metadata": {"pd": 3}}, {}, {"metadata": 2}]),
    ("if: that oneOf, then a value", {**_BASE, "properties": {**_BASE["properties"], "data": {"type": "object"}},
                                       "if": {"oneOf": [{"not": _HAS_PD}, _PD2]},
                                       "then": {"properties": {"data": {"properties": {"x": {"const": 2}}}}}},
     [{"metadata": {"pd": 2}, "data": {"x": 2}}, {"metadata": {}, "data": {"x": 2}}, {"metadata": {"pd": 1}, "data": {"x": 1}}],
     [{"metadata": {"pd": 2}, "data": {"x": 1}}, {"metadata": {}, "data": {"x": 3}}, {"metadata": {"pd": 4}}]),
    ("an in-place allOf cycle beside a plain property", IN_PLACE_CYCLE,
     [{"a": 1}, {}], [{"a": "x"}, {"a": 1.5}, [], 3]),
    ("uniqueItems over enums in a grammar", UNIQUE_IN_GRAMMAR,
     [{"few": ["blue", "red"]}, {"few": []}, {"few": ["red", "green", "blue", "cyan"]},
      {"many": ["red", "pink"]}, {"many": ["green", "blue", "gray", "pink"]}, {"child": {"few": ["cyan"]}},
      {"methods": ["PUT", "PATCH", "DELETE", "GET"]}, {"methods": ["CONNECT", "GET", "POST", "HEAD", "OPTIONS", "PUT",
                                                                   "TRACE", "DELETE", "PATCH"]}],
     [{"few": ["red", "red"]}, {"few": ["blue", "red", "blue"]}, {"many": ["red"]}, {"many": ["red", "red"]},
      {"many": ["red", "green", "blue", "cyan", "pink"]}, {"child": {"many": ["gray", "gray"]}}, {"few": ["teal"]},
      {"methods": ["GET", "PUT", "GET"]}, {"methods": []}, {"methods": ["PATCH", "PATCH"]}]),
    ("propertyNames over declared keys (one walk of each key's spellings)", {
        "type": "object", "properties": {"\u00e9": {"type": "integer"}, "a/b": {"type": "integer"}, "abc": {"type": "integer"},
                                          "zz": {"type": "integer"}}, "propertyNames": {"maxLength": 2}},
     [{"\u00e9": 1}, {"zz": 2, "\u00e9": 3}, {}], [{"a/b": 1}, {"abc": 1}, {"zz": "x"}]),
    ("propertyNames pattern and a required key", {
        "type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}, "Bad": {"type": "boolean"}},
        "propertyNames": {"pattern": "^[a-z]+$"}, "additionalProperties": False},
     [{"ok": True}], [{"ok": True, "Bad": False}, {"Bad": True}, {}]),
    ("a $ref reached twice in place", TWICE, [[{"tags": ["a"]}], [{"name": "x"}, {"tags": ["b", "a"]}], []],
     [[{}], [{"tags": []}], [{"tags": ["a", "a"]}], [{"tags": ["d"]}], [{"name": 1}]]),
    ("uniqueItems over 9 values without recursion", METHODS,
     [["PUT", "PATCH", "DELETE", "GET"], [], ["CONNECT"], ["TRACE", "HEAD", "GET", "POST", "OPTIONS"]],
     [["GET", "GET"], ["PUT", "PATCH", "PUT"], ["GET", "POST", "HEAD", "OPTIONS", "PUT", "TRACE"], ["get"], {}]),
    ("required first, then optional ones out of order, in a grammar", REQUIRED_FIRST_RECURSIVE,
     [{"b": 2, "e": 3, "d": True, "a": 1}, {"b": 2, "e": 3, "g": {"b": 0, "e": 1, "c": ""}, "c": "x"},
      {"a": 1, "b": 2, "c": "y", "d": True, "e": 3}],
     [{"a": 1, "c": "x"}, {"b": 2, "d": True, "a": 1}, {"b": "2", "e": 3}, {"b": 2, "e": 3, "g": {"b": 1}}, []]),
    ("a diamond of allOf $refs", DIAMOND, [{"id": 1}, {"id": 2, "name": "x"}, {"name": "y", "id": 3}],
     [{"name": "x"}, {"id": "1"}, {"id": 1, "name": 2}, []]),
]

test_table_agrees_with_jsonschema, test_table_token_by_token = schema_table_tests(CASES)


def test_in_place_cycle_converts() -> None:
    """The cycle holds nothing (was unbounded recursion: 'schema nesting too deep'); a property
    reaching it is refused (jsonschema cannot judge it: it recurses forever)."""
    from radixlm.grammar.automaton import dfa_from_ast

    node, rules = json_schema_to_ast(IN_PLACE_CYCLE)
    assert not rules
    dfa = dfa_from_ast(node)
    assert dfa.matches('{"a": 1}') and not dfa.matches('{"b": {}}')


def test_unique_items_in_a_grammar_are_rules() -> None:
    """Each rest of a uniqueItems array is a rule of the grammar."""
    for schema in (UNIQUE_IN_GRAMMAR, METHODS):
        _, rules = json_schema_to_ast(schema)
        assert any(name.startswith("__unique") for name in rules)


def test_large_pairs_convert_as_a_grammar() -> None:
    """The object's sorted copy fits only with its large pairs as rules: a grammar, not a regex."""
    _, rules = json_schema_to_ast(LARGE_PAIRS)
    assert rules
