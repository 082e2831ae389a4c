"""JSON Schema ``not`` and ``oneOf`` handled soundly (issue 12): a ``not`` with no positive form
is checked exactly by a validator where the schema enumerates its values, and is a compile error
naming the keyword otherwise; ``oneOf`` branches are exclusive only when proven so (the type test
is over what each branch may accept, not what the converter emits for it). Accept / reject
tables at string level, including invalid instances a naive approximation would accept."""

from __future__ import annotations

import json

import pytest

from radixlm.grammar.errors import GrammarError
from radixlm.grammar.json_schema import json_schema_to_ast
from tests.test_grammar_json_schema import _Recognizer

OBJ = {"type": "object"}
CASES = [
    # name, schema, valid instances, invalid instances
    ("enum filtered by not patternProperties",
     {"enum": [{"foo": "bar", "fooooo": 2}, {"foo": 1}, {"fo": 3}, {"fo": "x"}],
      "not": {"patternProperties": {"f.*o": {"type": "integer"}}}},
     [{"foo": "bar", "fooooo": 2}, {"fo": "x"}], [{"foo": 1}, {"fo": 3}]),
    ("enum filtered by not oneOf (inside allOf)",
     {"allOf": [{"enum": [{"bar": 2, "baz": 3, "foo": 1}, {"foo": 1, "bar": 2}]},
                {"not": {"type": "object", "oneOf": [{"required": ["foo", "bar"]}, {"required": ["foo", "baz"]}]}}]},
     [{"bar": 2, "baz": 3, "foo": 1}], [{"foo": 1, "bar": 2}]),
    ("const filtered by not additionalProperties",
     {"const": {"foo": 1}, "not": {"additionalProperties": {"type": "boolean"}}}, [{"foo": 1}], [{"foo": True}]),
    ("enum with not and a $ref inside",
     {"definitions": {"i": {"type": "integer"}}, "enum": [{"a": "s"}, {"a": 1}],
      "not": {"patternProperties": {"a": {"$ref": "#/definitions/i"}}}}, [{"a": "s"}], [{"a": 1}]),
    ("not propertyNames false: some key", {**OBJ, "not": {"propertyNames": False}}, [{"k": 1}], [{}, 3]),
    ("not propertyNames not enum: one of the keys present",
     {**OBJ, "not": {"propertyNames": {"not": {"enum": ["1", "3"]}}}}, [{"1": 0}, {"3": 0, "4": 0}], [{"4": 0}, {}]),
    ("not with an unknown keyword only: nothing", {"type": "integer", "not": {"x-foo": 1}}, [], [1]),
    ("not integer within numbers", {"type": "number", "not": {"type": "integer"}}, [], [5, 0]),
    ("oneOf: implied types are not the branch's language",
     {"oneOf": [{"minLength": 2}, {"type": "integer"}]}, ["ab"], [5, "a"]),
    ("oneOf disjoint by type with anyOf inside",
     {"oneOf": [{"type": ["string", "null"], "minLength": 2},
                {"type": "object", "properties": {"a": {"type": "string"}}, "anyOf": [{"required": ["a"]}]}]},
     ["ab", None, {"a": "x"}], [{}, "a"]),
    ("oneOf of closed objects: a key only one branch allows",
     {**OBJ, "oneOf": [{"additionalProperties": False, "properties": {"next": {"type": "string"}}},
                       {"additionalProperties": False, "properties": {"previous": {"type": "string"}}}]},
     [{"next": "x"}, {"previous": "y"}], [{}, {"next": "x", "previous": "y"}, {"other": 1}]),
    ("oneOf overlap narrowed with an unknown keyword inside",
     {"oneOf": [{"type": "object", "properties": {"a": {"type": "string", "_format": "uri"}}, "required": ["b"]},
                {"type": "object", "properties": {"a": {"type": "integer"}}}]},
     [{"a": 1}], [{"b": 1}, {"a": 1, "b": 2}]),
    ("oneOf of enums with a sibling not: disjoint by values",
     {"oneOf": [{"enum": ["a", "b"]}, {"enum": ["c"]}], "not": {"enum": ["d"]}}, ["a", "b", "c"], ["d", "e", 1]),
    ("oneOf of a nested oneOf and an enum: disjoint by values",
     {"oneOf": [{"oneOf": [{"type": "string", "enum": ["a", "b"]}, {"enum": ["c"]}]}, {"enum": ["d", "e"]}]},
     ["a", "c", "d", "e"], ["f", None]),
    ("not oneOf: none of the branches or two at once",
     {**OBJ, "not": {"oneOf": [{"required": ["a"]}, {"required": ["b"]}]}},
     [{}, {"a": 1, "b": 2}, {"c": 1}], [{"a": 1}, {"b": 1}, {"a": 1, "c": 2}, "s"]),
    ("oneOf needing a nested negated oneOf",
     {"oneOf": [{"x-unknown": 1}, {"type": "string"},
                {"type": "array", "minItems": 1, "items": {"oneOf": [{"x-unknown": 1}, {"type": "string"}]}}]},
     [["p", "q"], [], 1, None, [1, "s"], {"a": [1]}], ["s", [1], [1, 2], [None]]),
    ("oneOf of enums sharing a value: the shared one refused",
     {"oneOf": [{"oneOf": [{"enum": ["a", "b"]}, {"enum": ["c"]}]}, {"enum": ["d", "a"]}]}, ["b", "c"], ["a", "f"]),
]


@pytest.mark.parametrize("name,schema,good,bad", CASES, ids=[c[0] for c in CASES])
def test_not_oneof_table(name: str, schema: dict, good: list, bad: list) -> None:
    try:
        accepts = _Recognizer(schema)
    except GrammarError:
        assert not good, name  # a schema with no valid instance may be refused at compile time
        return
    for v in good:
        assert accepts(json.dumps(v)), (name, v)
    for v in bad:
        assert not accepts(json.dumps(v)), (name, v)


@pytest.mark.parametrize("schema,word", [
    ({"type": "object", "not": {"patternProperties": {"a": {"type": "integer"}}}}, "patternProperties"),
    ({"type": "object", "not": {"propertyNames": {"pattern": "^a"}}}, "propertyNames"),
])
def test_not_without_values_names_the_keyword(schema: dict, word: str) -> None:
    with pytest.raises(GrammarError, match=word):
        json_schema_to_ast(schema)
