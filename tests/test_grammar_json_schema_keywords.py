"""JSON Schema keywords, token by token on real vocabularies (issue 12): for every keyword an
accept / reject table; each instance (``json.dumps``, real tokenization) is walked with the filled
bitmask, every step must be allowed exactly when ``accept_token`` accepts it, valid instances must
terminate and invalid ones must not. The table itself is checked against ``jsonschema``.

Vocabularies: the default model's own (always), plus ``$RADIXLM_SHARED_DATA/tokenizers`` when
present. Also: unsupported features raise a GrammarError naming them, and a schema of shared
sub-schemas referenced many levels deep compiles (or fails) within a few seconds."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from radixlm.grammar import GrammarError
from radixlm.grammar.json_schema import json_schema_to_ast
from radixlm.grammar.maskbench import (
    DEFAULT_TOKENIZER, load_compiler, load_tokenizer, schema_validator, table_failures, table_vocabularies,
)

DEFS = {"$defs": {"pos": {"type": "integer", "minimum": 1}, "name": {"type": "string", "maxLength": 3}}}
TREE = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {
    "type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}, "required": ["v"]}},
    "$ref": "#/$defs/node"}

# (keyword, schema, valid instances, invalid instances)
CASES: list[tuple[str, Any, list, list]] = [
    ("$ref $defs", {**DEFS, "type": "object", "properties": {"a": {"$ref": "#/$defs/pos"}, "b": {"$ref": "#/$defs/name"}},
                    "required": ["a"]}, [{"a": 1, "b": "xy"}, {"a": 7}], [{"a": 0}, {"a": 1, "b": "long"}, {"b": "x"}]),
    ("$ref definitions", {"definitions": {"n": {"enum": [1, 2]}}, "type": "array", "items": {"$ref": "#/definitions/n"}},
     [[1, 2, 1], []], [[3], ["1"]]),
    ("$ref recursive", TREE, [{"v": 1}, {"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 3}]}],
     [{"kids": []}, {"v": 1, "kids": [{"v": "x"}]}, {"v": 1, "kids": [{"v": 1}, {"v": 2}, {"v": 3}]}]),
    ("$anchor", {"$defs": {"x": {"$anchor": "small", "type": "integer", "maximum": 9}}, "type": "array",
                 "items": {"$ref": "#small"}}, [[1, 9]], [[10], ["a"]]),
    ("$id-relative", {"$id": "https://example.com/root.json", "$defs": {"a": {"$id": "item.json", "type": "string",
                      "minLength": 2}}, "type": "array", "items": {"$ref": "item.json"}}, [["ab"]], [["a"], [1]]),
    ("allOf", {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                         {"properties": {"a": {"minimum": 5}}}]}, [{"a": 5}], [{"a": 4}, {}]),
    ("anyOf", {"anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer"}]}, ["ab", 3], ["abc", 1.5, None]),
    ("oneOf", {"oneOf": [{"type": "string"}, {"type": "boolean"}]}, ["x", True], [1, None]),
    ("additionalProperties", {"type": "object", "properties": {"a": {"type": "integer"}},
                              "additionalProperties": {"type": "string"}}, [{"a": 1, "z": "s"}, {"q": ""}],
     [{"a": 1, "z": 2}, {"a": "x"}]),
    ("patternProperties", {"type": "object", "patternProperties": {"^x-": {"type": "integer"}},
                           "additionalProperties": False}, [{"x-a": 1}, {}], [{"x-a": "s"}, {"y": 1}]),
    ("propertyNames", {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}, "additionalProperties": {"type": "integer"}},
     [{"ab": 1}], [{"Ab": 1}, {"a1": 1}]),
    ("min/maxProperties", {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1,
                           "maxProperties": 2}, [{"a": 1}, {"a": 1, "b": 2}], [{}, {"a": 1, "b": 2, "c": 3}]),
    ("prefixItems", {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False},
     [[1, "a"], [1], []], [[1, 2], [1, "a", 3]]),
    ("items array form", {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array", "items": [{"type": "integer"}], "additionalItems": {"type": "string"}},
     [[1, "a", "b"]], [["a"], [1, 2]]),
    ("contains", {"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 10}}, [[1, 10], [11]],
     [[1, 2], [], ["x", 10]]),
    ("min/maxItems", {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2},
     [[True], [True, False]], [[], [True, True, True]]),
    ("uniqueItems (not enforced)", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [[1, 2]], [["a"]]),
    ("enum any type", {"enum": ["a", 1, None, [1, 2], {"k": "v"}, 2.5]}, ["a", 1, None, [1, 2], {"k": "v"}, 2.5],
     ["b", 2, [2, 1], {"k": "w"}]),
    ("const object", {"const": {"a": [1, True]}}, [{"a": [1, True]}], [{"a": [1, False]}, {}]),
    ("format date/time", {"type": "array", "prefixItems": [{"format": "date"}, {"format": "time"}], "items": False},
     [["2024-02-29", "23:59:60Z"]], [["2023-02-29", "10:00:00Z"], ["2024-01-01", "24:00:00Z"]]),
    ("format date-time", {"type": "string", "format": "date-time"}, ["2024-01-31T12:00:00+01:00"], ["2024-01-31 12:00"]),
    ("format email/uri", {"type": "array", "prefixItems": [{"format": "email"}, {"format": "uri"}], "items": False},
     [["a.b@c.org", "https://x.org/p?q=1"]], [["no-at", "https://x.org"], ["a@b.c", "no scheme"]]),
    ("format uuid/ipv4/ipv6/hostname", {"type": "array", "prefixItems": [{"format": "uuid"}, {"format": "ipv4"},
     {"format": "ipv6"}, {"format": "hostname"}], "items": False},
     [["123e4567-e89b-12d3-a456-426614174000", "10.0.0.255", "2001:db8::1", "example.com"]],
     [["123e4567", "10.0.0.1", "::1", "a.com"], ["123e4567-e89b-12d3-a456-426614174000", "256.0.0.1", "::1", "x"],
      ["123e4567-e89b-12d3-a456-426614174000", "1.1.1.1", "1:::2", "x"]]),
    ("pattern classes", {"type": "string", "pattern": "^\\d{2,3}\\w\\s[\\u0041-\\u0043]+?$"}, ["12_ AB", "123a C"],
     ["1a A", "12a  A", "12aD"]),
    ("pattern unanchored", {"type": "string", "pattern": "ab"}, ["xaby", "ab"], ["a", "ba"]),
    ("string length (counted)", {"type": "string", "minLength": 70, "maxLength": 80}, ["x" * 70, "é" * 80],
     ["x" * 69, "x" * 81]),
    ("integer bounds", {"type": "integer", "exclusiveMinimum": 0, "maximum": 100}, [1, 100], [0, 101, 5.5]),
    ("draft4 exclusive", {"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1,
                          "exclusiveMaximum": True}, [0.5, 0.999], [0, 1, -0.5]),
    ("multipleOf", {"type": "number", "multipleOf": 0.5}, [1.5, -2, 0], [0.25, 1.1]),
    ("type list", {"type": ["string", "null"]}, ["a", None], [1, True]),
    ("if/then/else", {"type": "object", "properties": {"k": {"enum": ["a", "b"]}, "n": {"type": "integer"}},
                      "required": ["k"], "if": {"properties": {"k": {"const": "a"}}},
                      "then": {"required": ["n"]}, "else": {"properties": {"n": {"maximum": 0}}}},
     [{"k": "a", "n": 5}, {"k": "b"}, {"k": "b", "n": -1}], [{"k": "a"}, {"k": "b", "n": 3}]),
    ("allOf of two if/then", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                                             "c": {"type": "integer"}}, "required": ["a"],
                              "allOf": [{"if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}},
                                        {"if": {"properties": {"a": {"const": 2}}}, "then": {"required": ["c"]}}]},
     [{"a": 1, "b": 0}, {"a": 2, "c": 0}, {"a": 3}], [{"a": 1}, {"a": 2, "b": 0}]),
    ("definitions named like keywords", {"definitions": {"default": {"type": "integer"}, "enum": {"type": "string"}},
                                         "type": "array", "prefixItems": [{"$ref": "#/definitions/default"},
                                                                          {"$ref": "#/definitions/enum"}], "items": False},
     [[1, "a"]], [["a", 1]]),
    ("not", {"type": "string", "not": {"enum": ["x", "y"]}}, ["z", ""], ["x", "y", 1]),
    ("dependentRequired", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                           "dependentRequired": {"a": ["b"]}}, [{"a": 1, "b": 2}, {"b": 2}, {}], [{"a": 1}]),
    ("format regex", {"type": "string", "format": "regex"},
     ["^[a-z]+$", "(foo|bar)\\d{2,3}", "^(?:[a-z0-9-]+\\.)+[a-z]{2,}$", "a|", "(?:x)*?", "[^\\s]+", ""],
     ["*", "(a", "a)", "[z-a]", "a**", "[]", "a{3,2}", "\\", "?a"]),
    ("annotations ignored", {"type": "integer", "title": "t", "description": "d", "examples": [1], "default": 1,
                             "$comment": "c", "deprecated": True, "readOnly": True}, [3], ["3"]),
]


@pytest.mark.parametrize("keyword,schema,valid,invalid", CASES, ids=[c[0] for c in CASES])
def test_table_agrees_with_jsonschema(keyword: str, schema: Any, valid: list, invalid: list) -> None:
    check = schema_validator(schema, formats=True)
    assert all(check.is_valid(v) for v in valid), keyword
    if keyword.startswith("format") and not {"date-time", "uri"} <= set(check.format_checker.checkers):
        return  # NOTE: jsonschema checks these formats only with optional packages installed
    assert not any(check.is_valid(v) for v in invalid), keyword


@pytest.mark.parametrize("vocab", table_vocabularies())
def test_keywords_token_by_token(vocab: str) -> None:
    tok, comp = load_tokenizer(vocab), load_compiler(vocab)
    if vocab == DEFAULT_TOKENIZER:
        assert comp.tokenizer_info.tokenizer_size == 49152
    failures = table_failures(comp, tok, CASES)
    assert not failures, failures


@pytest.mark.parametrize("schema,keyword", [
    ({"type": "string", "pattern": "^a++b"}, "possessive"),
    ({"type": "string", "pattern": "(a)\\1"}, "backreference"),
    ({"type": "array", "contains": {"multipleOf": 2}, "maxContains": 2}, "not"),  # maxContains needs not contains
    ({"$ref": "https://example.com/remote.json"}, "does not resolve"),
    ({"type": "object", "not": {"additionalProperties": False}}, "not"),
    ({"type": "integer", "minimum": "x"}, "minimum"),
])
def test_unsupported_raise_grammar_error(schema: dict, keyword: str) -> None:
    with pytest.raises(GrammarError, match=keyword):
        json_schema_to_ast(schema)


def test_shared_definitions_many_levels_deep_compile_quickly() -> None:
    """30 definitions, each referencing the next twice (a DAG of 2**30 paths): once this took
    forever (a tree walk); now every definition is converted once."""
    defs = {f"d{i}": {"type": "object", "properties": {"l": {"$ref": f"#/$defs/d{i + 1}"},
                                                       "r": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(30)}
    defs["d30"] = {"type": "integer"}
    schema = {"$defs": defs, "$ref": "#/$defs/d0"}
    comp = load_compiler(DEFAULT_TOKENIZER)
    t0 = time.perf_counter()
    try:
        compiled = comp.compile_json_schema(schema)
    except GrammarError as e:
        assert "too" in str(e)  # a clean budget / size error is acceptable
    else:
        assert compiled is not None
    assert time.perf_counter() - t0 < 8
