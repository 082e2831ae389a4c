"""Combinators over objects and arrays (``grammar/schema_oneof.py``, ``schema_rewrite.py``,
``schema_not.py``): overlapping ``oneOf`` branches narrowed through nested ``anyOf`` / ``oneOf``
branches and array items instead of dropped; ``if`` whose negation cannot be expressed; ``not
contains``; ``propertyNames`` read as a schema of strings. Token by token on the default model's vocabulary; the table is checked against
``jsonschema`` (valid instances accepted, invalid ones never)."""

from __future__ import annotations

from typing import Any

from radixlm.grammar.testing import schema_table_tests

S, I, B = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}


def closed(*keys: str, **more: Any) -> dict:
    """A closed object of string properties ``keys`` (and ``more`` of other schemas)."""
    return {"type": "object", "properties": {**{k: S for k in keys}, **more}, "additionalProperties": False}


SECRET = {"oneOf": [S, closed("secret")]}  # a string, or an object holding one
ROOMS = closed("name", rooms={"type": "array", "items": S}, on=B)
DEFS = {"t": closed("t1", "t2"), "m": closed("m1", "t2"),
        "ev": {"oneOf": [{"type": "string", "pattern": "="}, closed("secret")]}}

# (name, schema, valid instances, invalid instances)
CASES: list[tuple[str, Any, list, list]] = [
    ("oneOf: a closed object against a branch that is an anyOf of closed objects",
     {"$defs": DEFS, "type": "object",
      "properties": {"s": {"oneOf": [closed("g", "h"), {"type": "object", "anyOf": [{"$ref": "#/$defs/t"},
                                                                                      {"$ref": "#/$defs/m"}]}]}}},
     [{"s": {"t1": "a"}}, {"s": {"g": "a"}}, {"s": {"m1": "q", "t2": "r"}}, {"s": {"t2": "r"}}, {}],
     [{"s": {}}, {"s": {"g": "a", "t1": "b"}}, {"s": {"h": 1}}]),
    ("oneOf: nested oneOf of a string, an object and an array against another closed object",
     {"$defs": DEFS, "oneOf": [{"oneOf": [{"$ref": "#/$defs/ev"}, {"type": "array", "items": {"$ref": "#/$defs/ev"}}]},
                               closed(glob={"type": "array"}, jobs={"type": "array"})]},
     ["a=b", {"secret": "s"}, ["a=b", {"secret": "q"}], {"glob": ["a=b"]}, {"jobs": []}, [], [{}]],
     [{}, {"secret": "s", "glob": []}, 3, "ab"]),
    ("oneOf: arrays of overlapping closed objects (every item told apart)",
     {"oneOf": [SECRET, {"type": "array", "items": SECRET, "minItems": 1}, ROOMS, {"type": "array", "items": ROOMS}]},
     ["s", {"secret": "x"}, {"rooms": ["a"]}, [{"rooms": ["a"]}], [{"secret": "s"}, "x"], [{"on": True}], []],
     [{}, [{}], [{"secret": "s"}, {"on": True}], 3]),
    ("oneOf: arrays of unique items (not enforced for objects) told apart item by item",
     {"oneOf": [{"oneOf": [SECRET, {"type": "array", "items": SECRET, "minItems": 1, "uniqueItems": True}]}, B,
                ROOMS, {"type": "array", "items": ROOMS, "minItems": 1, "uniqueItems": True}]},
     ["s", {"secret": "x"}, {"rooms": ["a"]}, [{"rooms": ["a"]}], [{"secret": "s"}, "x"], [{"secret": "s"}]],
     [{}, [{}], [{"secret": "s"}, {"on": True}], 3, []]),
    ("allOf of three types: no type is left (an empty type list is not 'any type')",
     {"type": "object", "properties": {"x": {"allOf": [{"type": "string"}, I, I]}}},
     [{}], [{"x": 3}, {"x": "a"}, {"x": None}]),
    ("oneOf: arrays whose items are disjoint, both accepting the empty array",
     {"oneOf": [{"type": "array", "items": S}, {"type": "array", "items": I}]},
     [["a"], [1, 2]], [[], ["a", 1]]),
    ("oneOf: closed objects without a common key need one property",
     {"oneOf": [closed(*"abcdef"), closed(*"uvwxyz")]},
     [{"f": "1"}, {"u": "1", "z": "2"}, {"a": "1", "e": "2"}], [{}, {"a": "1", "z": "2"}]),
    ("if whose negation cannot be expressed, no else: then alone",
     {"type": "object", "properties": {"v": S, "l": {"type": "array", "items": I}},
      "if": {"properties": {"l": {"uniqueItems": True}}}, "then": {"required": ["v"]}},
     [{"v": "1", "l": [1, 1]}, {"v": "3", "l": [2]}], [{"l": [1]}, {}]),
    ("if whose negation cannot be expressed, with else: then and (if or else)",
     {"type": "object", "properties": {"n": I, "x": S, "y": S},
      "if": {"properties": {"n": {"multipleOf": 3}}}, "then": {"required": ["x"]}, "else": {"required": ["y"]}},
     [{"n": 3, "x": "1"}, {"n": 4, "x": "1", "y": "2"}, {"x": "1"}], [{"n": 3, "y": "1"}, {"n": 4, "x": "1"}, {}]),
    ("if on an array property containing an item: not contains is every item failing it",
     {"type": "object", "required": ["l"],
      "properties": {"v": S, "l": {"type": "array", "items": {"type": "object", "properties": {"f": S}}}},
      "if": {"properties": {"l": {"contains": {"required": ["f"]}}}},
      "then": {"properties": {"v": {"const": "3"}}, "required": ["v"]}},
     [{"v": "1", "l": [{}]}, {"v": "3", "l": [{"f": "a"}]}, {"l": []}], [{"v": "1", "l": [{"f": "a"}]}, {"l": [{}, {"f": "b"}]}]),
    ("propertyNames with an untyped not: keys are strings (not any JSON value)",
     {"type": "object", "propertyNames": {"not": {"pattern": "^x"}}, "additionalProperties": I},
     [{}, {"a": 1}, {"a": 1, "bx": 2}], [{"x": 1}, {"a": "s"}, {"a": 1, "xy": 2}]),
    ("propertyNames: a $ref to an untyped not",
     {"$defs": {"n": {"not": {"enum": ["id", "key"]}}}, "type": "object",
      "properties": {"o": {"type": "object", "propertyNames": {"$ref": "#/$defs/n"}}}},
     [{"o": {"a": 1}}, {"o": {}}], [{"o": {"id": 1}}, {"o": {"key": 2, "a": 1}}]),
    ("not contains", {"type": "array", "not": {"contains": {"const": "c"}}}, [["a", "b"], []], [["c"], ["a", "c"]]),
    ("allOf of anyOf and a conditional over one object",
     {"type": "object", "properties": {"p": S, "q": S, "r": S, "v": {"enum": ["1", "3"]}}, "required": ["v"],
      "allOf": [{"anyOf": [{"required": ["p"]}, {"required": ["q"]}]},
                {"if": {"required": ["r"]}, "then": {"properties": {"v": {"const": "3"}}}}]},
     [{"p": "a", "v": "1"}, {"q": "b", "r": "c", "v": "3"}, {"p": "a", "q": "b", "v": "1"}],
     [{"v": "1"}, {"p": "a", "r": "c", "v": "1"}]),
]

test_table_agrees_with_jsonschema, test_combinator_cases_token_by_token = schema_table_tests(CASES)
