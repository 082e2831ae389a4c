"""What the SchemaStore sweep (``benchmarks/schema_corpus_sweep.py``) found, on synthetic schemas
(issue 12): object keys in sorted order (real documents are often written by a key-sorting
formatter; undeclared keys may open open objects, see ``json_extras``), each
keyword applied only in the draft its ``$schema`` names, ``$ref`` siblings ignored in drafts 4 to
7, remote references refused cleanly. Token by token on the default model's vocabulary (and
``llama-spm`` when ``$RADIXLM_SHARED_DATA`` has it); the table is checked against ``jsonschema``."""

from __future__ import annotations

from typing import Any

import pytest

from radixlm.grammar import GrammarError
from radixlm.grammar.maskbench import load_compiler, table_vocabularies
from radixlm.grammar.schema_drafts import apply_dialect
from radixlm.grammar.testing import schema_table_tests

D4 = "http://json-schema.org/draft-04/schema#"
D7 = "http://json-schema.org/draft-07/schema#"
D2020 = "https://json-schema.org/draft/2020-12/schema"
S, I = {"type": "string"}, {"type": "integer"}
# seven declared properties: too many for any order (schema order, required first, sorted)
SEVEN = {"type": "object", "properties": {k: I for k in "gfedcba"}, "required": ["f"]}
SMALL = {"type": "object", "properties": {"name": S, "id": I}, "required": ["name"]}

# (name, schema, valid instances, invalid instances)
CASES: list[tuple[str, Any, list, list]] = [
    ("large object: keys sorted", SEVEN,
     [{"a": 1, "c": 2, "f": 3}, {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": 7}, {"g": 1, "f": 2},
      {"f": 1, "zz": "x"}],
     [{"a": 1, "c": 2}, {"a": "1", "f": 2}, {"a": 1, "f": 2, "c": None}]),
    ("small object: keys sorted, undeclared ones after the declared", SMALL,
     [{"id": 1, "name": "n"}, {"name": "n", "id": 1}, {"id": 1, "name": "n", "x": 2}], [{"id": 1}, {"name": 1}]),
    ("additionalProperties false: no undeclared key", {**SMALL, "additionalProperties": False},
     [{"id": 1, "name": "n"}], [{"$schema": "s", "name": "n"}]),
    ("nested objects sorted", {"type": "object", "properties": {"z": SEVEN, "y": I}},
     [{"z": {"a": 1, "f": 2}, "y": 1}, {"z": {"f": 2, "zz": 1}}], [{"z": {"a": 1}, "y": 1}]),
    ("grammar: large pairs are rules, every order refers to them", {"$defs": {"t": {
        "type": "object", "required": ["big"], "properties": {
            "big": {"type": "object", "properties": {k: {"type": "string", "maxLength": 40} for k in "pqrstuv"}},
            "kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}, "a": I}}}, "$ref": "#/$defs/t"},
     [{"a": 1, "big": {"p": "x", "v": "y"}, "kids": [{"big": {}}]}, {"big": {"q": ""}, "kids": [], "$schema": "s"},
      {"big": {}, "kids": [], "a": 2}],
     [{"a": 1, "kids": []}, {"$schema": "s", "big": {"q": 1}}, {"big": {"p": "x" * 41}}]),
    ("uniqueItems over an enum: exact, any order", {"type": "array", "items": {"enum": ["node", "deno", 1, 1.0, None]},
                                                    "uniqueItems": True},
     [[], ["node"], ["deno", "node"], ["node", 1, None], [None, 1, "deno", "node"]],
     [["node", "node"], [1, 1.0], [None, "deno", None], ["x"]]),
    ("uniqueItems over booleans with counts", {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True,
                                               "minItems": 2},
     [[True, False], [False, True]], [[True], [True, True], []]),
    ("uniqueItems over a long enum: in the schema's order", {"type": "array", "uniqueItems": True, "maxItems": 3,
                                                             "items": {"$ref": "#/$defs/e"}, "$defs": {"e": {"enum": list("abcdefgh")}}},
     [["a", "c", "h"], ["b"], []], [["a", "a"], ["a", "b", "c", "d"], ["z"]]),
    ("draft 4: const is no keyword", {"$schema": D4, "type": "object", "properties": {
        "s": {"oneOf": [{"const": "a"}, {"const": "b"}]}}}, [{}], [{"s": "a"}, {"s": 1}]),
    ("draft 4: if / propertyNames / contains are no keywords", {"$schema": D4, "type": "array", "items": {
        "propertyNames": {"maxLength": 1}, "if": {"type": "object"}, "then": {"required": ["q"]}}, "contains": I},
     [[{"long": 1}], [{}], [], ["x"]], [5, "x"]),
    ("draft 7: $ref hides its siblings", {"$schema": D7, "definitions": {"i": I},
                                          "properties": {"n": {"$ref": "#/definitions/i", "minimum": 5}}},
     [{"n": 1}, {"n": 7}], [{"n": "x"}]),
    ("2020-12: dependencies is no keyword, dependentRequired is",
     {"$schema": D2020, "type": "object", "dependencies": {"a": ["b"]}, "dependentRequired": {"c": ["d"]}},
     [{"a": 1}, {"c": 1, "d": 2}], [{"c": 1}]),
    ("draft 7: dependencies", {"$schema": D7, "type": "object", "dependencies": {"a": ["b"]}},
     [{"a": 1, "b": 2}, {}], [{"a": 1}]),
]


test_table_agrees_with_jsonschema, test_corpus_cases_token_by_token = schema_table_tests(CASES)


def test_apply_dialect_keeps_names_and_data() -> None:
    """Only keywords go: a property named like a keyword, enum / const data and the draft-4
    boolean ``exclusiveMinimum`` stay; nothing is copied when nothing is removed."""
    schema = {"$schema": D4, "properties": {"const": {"enum": [{"const": 1}]}, "if": {"minimum": 1, "exclusiveMinimum": True}},
              "const": 3}
    got = apply_dialect(schema)
    assert got == {"$schema": D4, "properties": {"const": {"enum": [{"const": 1}]}, "if": {"minimum": 1, "exclusiveMinimum": True}}}
    plain = {"$schema": D7, "type": "object", "properties": {"a": {"const": 1}}}
    assert apply_dialect(plain) is plain
    unnamed = {"type": "array", "items": [S], "additionalItems": I, "dependencies": {"a": ["b"]}}
    assert apply_dialect(unnamed) is unnamed  # no draft named: every keyword applies


def test_recursion_error_in_any_pass_is_a_grammar_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A grammar nested past Python's stack in a pass after the conversion (lowering, automaton
    building: SchemaStore's partial-mypy) is refused with a GrammarError, not a RecursionError."""
    from radixlm.grammar import compiler as compiler_mod

    def too_deep(*args: Any, **kwargs: Any) -> Any:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(compiler_mod, "dfa_from_ast", too_deep)
    comp = compiler_mod.GrammarCompiler(load_compiler(table_vocabularies()[0]).tokenizer_info)
    with pytest.raises(GrammarError, match="nesting too deep"):
        comp.compile_json_schema({"type": "object", "properties": {"recursion": {"type": "integer"}}})
