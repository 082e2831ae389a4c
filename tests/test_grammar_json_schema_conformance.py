"""JSON Schema conformance fixes found with ``benchmarks/schema_test_suite.py`` (the official
JSON-Schema-Test-Suite, run outside the repository): one accept/reject row per fix, schemas written
here. Each instance is walked token by token on real vocabularies (``schema_table_tests``); the
table itself is checked against ``jsonschema``. Soundness rows: an invalid instance the engine once
accepted; completeness rows: a valid one it once rejected (or a schema it could not compile)."""

from __future__ import annotations

from typing import Any

import pytest

from radixlm.grammar import GrammarError
from radixlm.grammar.json_schema import json_schema_to_ast
from radixlm.grammar.testing import schema_table_tests

D7 = "http://json-schema.org/draft-07/schema#"

# (name, schema, valid instances, invalid instances)
CASES: list[tuple[str, Any, list, list]] = [
    # strings: a surrogate pair escape (json.dumps of a character above the BMP) is one character
    ("minLength counts a surrogate pair once", {"type": "string", "minLength": 2},
     ["\U0001F389\U0001F389", "ab", "a\U0001F389"], ["\U0001F389", "a", ""]),
    ("maxLength counts a surrogate pair once", {"type": "string", "maxLength": 1},
     ["\U0001F389", "x", ""], ["\U0001F389\U0001F389", "xy"]),
    # allOf merging: items of one side covers the prefixItems positions of the other
    ("items beside prefixItems in allOf", {"type": "array", "items": {"type": "integer", "maximum": 9},
                                           "allOf": [{"prefixItems": [{"type": "integer", "minimum": 5}]}]},
     [[5, 1], [9], []], [[12], [6, 10], [4]]),
    ("patternProperties under the other side's additionalProperties", {"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
        {"patternProperties": {"^x": {"type": "integer"}}}]},
     [{"a": 1}, {}], [{"x1": 1}, {"a": 1, "xy": 2}]),
    ("a key matching two patternProperties takes both schemas", {
        "type": "object", "patternProperties": {"^a": {"type": "integer"}, "b$": {"minimum": 10}},
        "additionalProperties": False},
     [{"ab": 12, "a": 1, "b": 20}, {"axb": 10}], [{"ab": 5}, {"ab": 12.5}, {"c": 1}, {"b": 3}]),
    # unevaluatedProperties: a branch's sees only the branch; the parent's sees the branches
    ("unevaluatedProperties in a $ref target", {
        "$defs": {"closed": {"type": "object", "properties": {"id": {"type": "integer"}}, "unevaluatedProperties": False}},
        "$ref": "#/$defs/closed", "properties": {"name": {"type": "string"}}},
     [{"id": 1}, {}], [{"id": 1, "name": "x"}, {"name": "y"}]),
    ("unevaluatedProperties in one allOf branch", {"type": "object", "allOf": [
        {"properties": {"a": {"type": "integer"}}},
        {"properties": {"b": {"type": "integer"}}, "unevaluatedProperties": False}]},
     [{"b": 1}, {}], [{"a": 1}, {"a": 1, "b": 2}]),
    ("unevaluatedProperties of the parent sees allOf", {
        "type": "object", "allOf": [{"properties": {"a": {"type": "integer"}}}],
        "properties": {"b": {"type": "string"}}, "unevaluatedProperties": False},
     [{"a": 1, "b": "x"}, {"a": 2}], [{"c": 1}, {"a": "x"}]),
    ("unevaluatedProperties ignores what a not declares", {
        "type": "object", "properties": {"a": {"type": "integer"}},
        "not": {"not": {"properties": {"b": {"type": "integer"}}}}, "unevaluatedProperties": False},
     [{"a": 1}, {}], [{"a": 1, "b": 1}, {"b": 1}]),
    ("unevaluatedProperties ignores a failed if", {
        "type": "object", "if": {"properties": {"mode": {"const": "a"}}, "required": ["mode"]},
        "then": {"properties": {"x": {"type": "integer"}}}, "else": {"properties": {"y": {"type": "integer"}}},
        "unevaluatedProperties": False},
     [{"mode": "a", "x": 1}, {"mode": "a"}, {"y": 1}, {}], [{"mode": "b", "y": 1}, {"mode": "b"}, {"x": 1}]),
    ("unevaluatedProperties beside exclusive oneOf", {
        "type": "object", "oneOf": [
            {"properties": {"t": {"const": 1}, "n": {"type": "integer"}}, "required": ["t"]},
            {"properties": {"t": {"const": 2}, "s": {"type": "string"}}, "required": ["t"]}],
        "unevaluatedProperties": False},
     [{"t": 1, "n": 3}, {"t": 2, "s": "x"}, {"t": 1}], [{"t": 1, "s": "x"}, {"t": 3}, {"t": 2, "n": 1}]),
    ("unevaluatedProperties sees a passing if without then or else", {
        "type": "object", "if": {"properties": {"a": {"const": 1}}, "required": ["a"]}, "unevaluatedProperties": False},
     [{"a": 1}, {}], [{"a": 2}, {"b": 1}]),
    # unevaluatedItems: the elements nothing else evaluates (in-place applicators merged in)
    ("unevaluatedItems after prefixItems", {"type": "array", "prefixItems": [{"type": "string"}], "unevaluatedItems": False},
     [["a"], []], [["a", 1], ["a", "b"]]),
    ("unevaluatedItems sees prefixItems in allOf", {"type": "array", "allOf": [{"prefixItems": [{"type": "integer"}]}],
                                                    "unevaluatedItems": {"type": "string"}},
     [[1, "a", "b"], [1], []], [[1, 2], ["x"]]),
    ("unevaluatedItems in one allOf branch", {"type": "array", "allOf": [{"prefixItems": [True]}, {"unevaluatedItems": False}]},
     [[]], [[1], [1, 2]]),
    ("unevaluatedItems beside items: no effect", {"type": "array", "items": {"type": "integer"}, "unevaluatedItems": False},
     [[1, 2], []], [["a"]]),
    # not: numbers other than the enum / const values are open intervals between them
    ("not const number", {"type": ["integer", "string"], "not": {"const": 3}}, [2, 4, -7, "3"], [3, 3.0]),
    ("not enum with numbers", {"not": {"enum": [1.5, 2, "x"]}, "type": ["number", "string", "null"]},
     [1, 1.25, 2.5, "y", None], [1.5, 2, "x"]),
    ("then false: the condition must fail", {"type": "integer", "if": {"const": 1}, "then": False}, [0, 2, 10], [1]),
    ("if without then or else has no effect", {"type": "integer", "if": {"minimum": 10}}, [1, 20], ["a"]),
    ("draft-7 tuple items in allOf", {"$schema": D7, "type": "array", "allOf": [{"items": [{"type": "integer"}, {"type": "string"}]}],
                                      "items": [{"type": "integer"}], "additionalItems": {"type": "boolean"}},
     [[1], []], [[1, "a"], [1, True], ["x"]]),
    ("draft-7 tuple merged with a plain items", {"$schema": D7, "type": "array", "items": [{"type": "string"}],
                                                 "allOf": [{"items": {"maxLength": 2}}]},
     [["ab", "c"], ["a"]], [["abc"], [1], ["a", "xyz"]]),
    # numbers: an integer's multipleOf with many decimals reduces to an integer modulus
    ("integer multipleOf 1e-9", {"type": "integer", "multipleOf": 1e-9}, [123456, 0, -5], [1.5]),
    ("integer multipleOf 0.25 (every 1)", {"type": "integer", "multipleOf": 0.25, "minimum": -3}, [-3, 4], [-4, 2.5]),
    # contains with minContains above 1 and maxContains (exact element counts)
    ("minContains 2", {"type": "array", "contains": {"type": "integer", "minimum": 10}, "minContains": 2},
     [[10, 11], [1, 10, 2, 20], [10, 10, 10]], [[10], [1, 2], []]),
    ("maxContains 1", {"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 10}, "maxContains": 1},
     [[10, 3], [1, 10], [11]], [[10, 11], [1, 2], [], [12, 1, 13]]),
    ("minContains 0 maxContains 2 over any items", {"type": "array", "contains": {"const": "x"},
                                                     "minContains": 0, "maxContains": 2},
     [[], ["y"], ["x", 1, "x"], [{"a": "x"}]], [["x", "x", "x"]]),
    ("minContains with prefixItems", {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"},
                                       "contains": {"type": "integer", "minimum": 5}, "minContains": 2},
     [["a", 5, 6], ["b", 9, 1, 7]], [["a", 5], ["a", 1, 6], [5, 6, 7]]),
    # objects: an enum / const object in any key order; propertyNames true allows every name
    ("const object in any key order", {"const": {"a": 1, "b": [True, {"c": None, "d": "x"}]}},
     [{"a": 1, "b": [True, {"c": None, "d": "x"}]}, {"b": [True, {"d": "x", "c": None}], "a": 1}],
     [{"a": 1}, {"a": 1, "b": [{"c": None, "d": "x"}, True]}]),
    ("enum of objects in any key order", {"enum": [{"x": 1, "y": 2}, {"z": 3}]},
     [{"y": 2, "x": 1}, {"x": 1, "y": 2}, {"z": 3}], [{"x": 1}, {"y": 2, "x": 2}]),
    ("propertyNames true", {"type": "object", "properties": {"a": {"type": "integer"}}, "propertyNames": True},
     [{"a": 1}, {}], [{"a": "x"}]),
    ("not const object: every key order is the value", {
        "type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "string"}},
        "additionalProperties": False, "not": {"const": {"a": True, "b": "x"}}},
     [{"a": True}, {"a": False, "b": "x"}, {"b": "y", "a": True}], [{"a": True, "b": "x"}, {"b": "x", "a": True}]),
    # patterns: \S excludes the whitespace of ECMA-262 and of Python alike
    ("pattern \\S excludes Unicode spaces", {"type": "string", "pattern": "^\\S+$"},
     ["abc", "\u00e9t\u00e9"], ["a\u00a0b", "a b", "\u2003", "x\u2029"]),
    ("pattern \\s matches Unicode spaces", {"type": "string", "pattern": "^a\\sb$"},
     ["a b", "a\u00a0b", "a\u3000b"], ["ab", "a_b"]),
    # numbers that are not integers: not {type: integer}, and oneOf an integer branch and a number one
    ("not type integer", {"type": "number", "not": {"type": "integer"}, "maximum": 100}, [1.5, -0.25, 99.75], [1, 1.0, 101.5]),
    ("oneOf integer or number overlapping", {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 2}]},
     [2.5, 1, -7, 10.25], [3, 1.5, 2]),
    ("overlapping oneOf beside unevaluatedProperties", {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "oneOf": [{"required": ["a"]}, {"required": ["b"]}], "unevaluatedProperties": False},
     [{"a": 1}, {"b": 2}], [{"a": 1, "b": 2}, {}, {"a": 1, "c": 3}]),
    ("overlapping oneOf branches that declare keys, beside unevaluatedProperties", {
        "type": "object", "unevaluatedProperties": False, "oneOf": [
            {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]},
     [{"a": 1}, {"b": 2}], [{"a": 1, "b": 2}, {"a": 1, "b": "x"}, {"a": 1, "c": 1}, {}]),
    ("$ref to an $id inside a keyword the draft ignores (then without if)", {
        "$schema": "https://json-schema.org/draft/2020-12/schema", "$ref": "http://example.com/t",
        "then": {"$id": "http://example.com/t", "type": "integer", "minimum": 3}},
     [3, 10], ["a", 2]),
    ("oneOf beside a branch whose unevaluatedProperties sees an anyOf", {
        "type": "object", "oneOf": [{"required": ["y"]},
                                    {"anyOf": [{"properties": {"y": True}}], "unevaluatedProperties": False}]},
     [{}], [{"y": 1}]),
    # $ref: up to draft 7 a sibling $id does not move the base URI
    ("draft-7 $id beside $ref", {
        "$schema": D7, "$id": "http://example.com/root/",
        "definitions": {"a": {"$id": "http://example.com/x.json", "type": "string"},
                        "b": {"$id": "x.json", "type": "integer"}},
        "allOf": [{"$id": "http://example.com/", "$ref": "x.json"}]},
     [3, 0], ["s"]),
]

test_table_agrees_with_jsonschema, test_table_token_by_token = schema_table_tests(CASES)

# Schemas that must fail to compile (naming the cause), not compile to something unsound.
ERRORS: list[tuple[str, Any, str]] = [
    ("not const array holding a number (1 is also 1.00)", {"type": "array", "items": {"type": "number"},
                                                           "not": {"const": [1]}}, "not"),
]


@pytest.mark.parametrize("name,schema,needle", ERRORS, ids=[e[0] for e in ERRORS])
def test_clean_errors(name: str, schema: Any, needle: str) -> None:
    with pytest.raises(GrammarError, match=needle):
        json_schema_to_ast(schema)


def test_ecma_control_escape() -> None:
    """``\\cX`` (ECMA-262; Python's ``re`` has no such escape, so it is not in the table)."""
    import json

    from radixlm.grammar.bitmask import allocate_token_bitmask
    from radixlm.grammar.maskbench import DEFAULT_TOKENIZER, load_compiler, load_tokenizer, run_instance

    comp, tok = load_compiler(DEFAULT_TOKENIZER), load_tokenizer(DEFAULT_TOKENIZER)
    compiled = comp.compile_json_schema({"type": "string", "pattern": "^a\\cJ\\cc$"})
    bitmask = allocate_token_bitmask(1, comp.tokenizer_info.vocab_size)
    assert run_instance(compiled, tok, json.dumps("a\n\x03"), True, bitmask).accepted
    assert not run_instance(compiled, tok, json.dumps("acJcc"), False, bitmask).accepted


def test_oneof_against_a_restricted_if_never_accepts_invalid() -> None:
    """A oneOf branch ``if C then false`` whose ``not C`` has no positive form is converted as a
    restriction (nothing): the other branches must not be read as disjoint from it (they were:
    null and 5 satisfy both branches, and were accepted). Refusing the schema is sound too."""
    import json

    from radixlm.grammar.bitmask import allocate_token_bitmask
    from radixlm.grammar.maskbench import DEFAULT_TOKENIZER, load_compiler, load_tokenizer, run_instance

    cond = {"type": "array", "contains": {"const": 1}, "maxContains": 1}
    schema = {"oneOf": [{"type": ["null", "integer"]}, {"if": cond, "then": False}]}
    comp, tok = load_compiler(DEFAULT_TOKENIZER), load_tokenizer(DEFAULT_TOKENIZER)
    try:
        compiled = comp.compile_json_schema(schema)
    except GrammarError:
        return
    bitmask = allocate_token_bitmask(1, comp.tokenizer_info.vocab_size)
    for value in (None, 5, [1]):
        assert not run_instance(compiled, tok, json.dumps(value), False, bitmask).accepted, value
