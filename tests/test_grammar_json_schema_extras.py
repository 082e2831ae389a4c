"""Undeclared properties between declared ones (implicit values there nested at most one
level), and ``"$schema"`` first in the outermost object (``grammar/json_extras.py``; issue
12: SchemaStore documents name their schema in a first ``"$schema"`` key and put undeclared keys
anywhere). Token by token on the default model's vocabulary; the table is checked against
``jsonschema``. Every undeclared pair still satisfies ``additionalProperties`` /
``patternProperties`` / ``propertyNames`` (undeclared pairs first, in open objects:
``tests/test_grammar_json_schema_lead.py``)."""

from __future__ import annotations

from typing import Any

from radixlm.grammar.testing import schema_table_tests

S, I, B = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}
SEVEN = {"type": "object", "properties": {k: I for k in "abcdefg"}}  # schema order = sorted order
NODE = {"type": "object", "properties": {"v": I, "a": I, "b": I, "c": I, "d": I,
                                         "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
        "required": ["v"]}
TREE = {"$defs": {"n": NODE}, "$ref": "#/$defs/n"}
SMALL = {"type": "object", "properties": {"name": S, "id": I}, "required": ["name"]}

# (name, schema, valid instances, invalid instances)
CASES: list[tuple[str, Any, list, list]] = [
    ("$schema first, then declared keys in any order (small object)", SMALL,
     [{"$schema": "u", "name": "n"}, {"$schema": "u", "id": 1, "name": "n"}, {"$schema": {"v": 1}, "name": "n"}],
     [{"$schema": "u"}, {"$schema": "u", "id": 1}, {"$schema": "u", "name": 1}]),
    ("$schema first in a large object, then schema order", {**SEVEN, "required": ["c"]},
     [{"$schema": "u", "a": 1, "c": 2}, {"$schema": "u", "c": 2, "x": 3}, {"$schema": "u", "b": 1, "c": 2, "g": 3}],
     [{"$schema": "u", "a": 1}, {"$schema": "u", "a": "1", "c": 2}]),
    ("$schema first takes additionalProperties", {**SMALL, "additionalProperties": I},
     [{"$schema": 1, "name": "n"}, {"name": "n", "z": 2}], [{"$schema": "u", "name": "n"}]),
    ("$schema first takes its patternProperties schema", {**SMALL, "patternProperties": {"^\\$": B}},
     [{"$schema": True, "name": "n"}], [{"$schema": "u", "name": "n"}]),
    ("$schema first: not where propertyNames forbids it", {**SMALL, "propertyNames": {"pattern": "^[a-z]"}},
     [{"name": "n"}, {"name": "n", "x": 1}], [{"$schema": "u", "name": "n"}]),
    ("$schema first: not where additionalProperties is false", {**SMALL, "additionalProperties": False},
     [{"name": "n"}], [{"$schema": "u", "name": "n"}]),
    ("$schema first counts toward maxProperties", {**SMALL, "maxProperties": 2},
     [{"$schema": "u", "name": "n"}, {"name": "n", "id": 1}], [{"$schema": "u", "name": "n", "id": 1}]),
    ("undeclared keys between declared ones", SEVEN,
     [{"a": 1, "x": True, "b": 2}, {"a": 1, "x": [1], "y": {"k": None}, "c": 2, "z": {"k": [1]}},
      {"a": 1, "b": 2, "zz": "s", "g": 3}],
     [{"a": 1, "x": True, "b": "2"}, {"a": 1, "b": 2, "a2": 1, "c": "x"}]),
    ("undeclared keys between declared ones: additionalProperties schema",
     {**SEVEN, "additionalProperties": S},
     [{"a": 1, "x": "s", "b": 2}], [{"a": 1, "x": 1, "b": 2}]),
    ("undeclared keys between declared ones: patternProperties",
     {**SEVEN, "patternProperties": {"^x": B}, "additionalProperties": False},
     [{"a": 1, "x1": True, "b": 2}], [{"a": 1, "x1": 1, "b": 2}, {"a": 1, "y": True, "b": 2}]),
    ("inner objects: undeclared keys between declared ones, required ones still required",
     {"type": "object", "properties": {"o": {**SEVEN, "required": ["c"]}}},
     [{"o": {"a": 1, "x": 1, "c": 2}}, {"o": {"c": 2, "x": [], "d": 1}}], [{"o": {"x": 1}}, {"o": {"a": 1, "x": 1}}]),
    ("recursive schema (a grammar): undeclared keys between declared ones, $schema first", TREE,
     [{"v": 1, "x": 2, "kids": [{"v": 2, "y": [1], "a": 1}]}, {"$schema": "u", "v": 1, "b": 2, "z": {}, "c": 3}],
     [{"v": 1, "x": 2, "kids": [{"y": 1}]}, {"v": 1, "w": 1, "a": "s"}, {"v": 1, "w": 1, "kids": 3}]),
]

test_table_agrees_with_jsonschema, test_extras_cases_token_by_token = schema_table_tests(CASES)
