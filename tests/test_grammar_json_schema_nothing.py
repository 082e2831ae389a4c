"""Sub-schemas that accept no value at all (issue 12): the lowering must treat them as the empty
language and propagate that exactly as JSON Schema does, in the single-DFA path and in the
recursive (grammar / Earley) path alike:

- an optional property (declared, or through ``patternProperties`` / ``additionalProperties``)
  whose value accepts nothing can simply never appear: the object without it is still valid;
- a required property whose value accepts nothing makes the whole object accept nothing;
- array ``items`` accepting nothing leaves only the empty array (nothing at all under
  ``minItems`` >= 1, or when ``contains`` accepts nothing);
- ``anyOf`` / ``oneOf`` branches that accept nothing drop out;
- a schema whose root accepts nothing is a clean GrammarError (MaskBench Github_easy---o46142:
  a required property whose value is a ``oneOf`` of three identical objects).

Each instance is walked token by token on the default model's vocabulary and on ``llama-spm``
(when ``$RADIXLM_SHARED_DATA`` has it): every step's bitmask must agree with ``accept_token``, and
no accepted prefix may reach a dead end (a state allowing no token, not even the stop token: a
rule without a base case once let ``{"z": {"k": {"k": {`` through). The table itself is checked
against ``jsonschema``."""

from __future__ import annotations

from typing import Any

import pytest

from radixlm.grammar import GrammarError, GrammarMatcher, allocate_token_bitmask
from radixlm.grammar.maskbench import (
    DEFAULT_TOKENIZER, encode_exact, load_compiler, load_tokenizer, schema_validator, table_failures,
    table_vocabularies,
)
from radixlm.grammar.testing import schema_table_tests

NONE_STR = {"type": "string", "enum": [1]}                      # no value: type and enum disagree
NONE_ONEOF = {"oneOf": [{"type": "object"}, {"type": "object"}]}  # no value matches exactly one


def _recursive(prop: Any) -> dict:
    """A recursive object (forces the grammar path) with an optional property ``p`` = ``prop``."""
    return {"$defs": {"t": {"type": "object", "properties": {
        "kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}, "p": prop}}}, "$ref": "#/$defs/t"}


SELF_REQUIRED = {"t": {"type": "object", "properties": {"k": {"$ref": "#/$defs/t"}}, "required": ["k"]}}

# (name, schema, valid instances, invalid instances)
CASES: list[tuple[str, Any, list, list]] = [
    ("optional property", {"type": "object", "properties": {"a": NONE_ONEOF, "b": {"type": "integer"}}},
     [{}, {"b": 1}, {"x": 1}], [{"a": {}}, {"a": 1}]),
    ("optional property, closed", {"type": "object", "properties": {"a": NONE_ONEOF, "b": {"type": "integer"}},
                                   "additionalProperties": False}, [{}, {"b": 1}], [{"a": {}}, {"x": 1}]),
    ("required property in anyOf", {"anyOf": [{"type": "object", "properties": {"a": NONE_STR}, "required": ["a"]},
                                              {"type": "integer"}]}, [1], [{}, {"a": 1}]),
    ("required undeclared, closed", {"anyOf": [{"type": "object", "required": ["x"], "additionalProperties": False},
                                               {"type": "null"}]}, [None], [{}, {"x": 1}]),
    ("additionalProperties", {"type": "object", "properties": {"b": {"type": "integer"}},
                              "additionalProperties": NONE_STR}, [{}, {"b": 1}], [{"x": 1}, {"x": "s"}]),
    ("patternProperties", {"type": "object", "patternProperties": {"^x": NONE_STR}}, [{}, {"b": 1}], [{"x": 1}]),
    ("items", {"type": "array", "items": NONE_STR}, [[]], [[1], ["a"]]),
    ("items with minItems", {"anyOf": [{"type": "array", "items": NONE_STR, "minItems": 1}, {"type": "null"}]},
     [None], [[], [1]]),
    ("prefixItems", {"type": "array", "prefixItems": [{"type": "integer"}, NONE_STR]}, [[], [1]], [[1, 2]]),
    ("contains", {"anyOf": [{"type": "array", "contains": NONE_STR}, {"type": "null"}]}, [None], [[], [1]]),
    ("anyOf branch", {"anyOf": [NONE_ONEOF, {"type": "integer"}]}, [1], [{}]),
    ("dependentSchemas", {"type": "object", "properties": {"a": {"type": "integer"}},
                          "dependentSchemas": {"a": NONE_STR}}, [{}, {"b": 1}], [{"a": 1}]),
    ("recursive: optional property", _recursive(NONE_STR), [{}, {"kids": [{}]}], [{"p": 1}]),
    ("recursive: optional oneOf", _recursive(NONE_ONEOF), [{}, {"kids": [{"kids": []}]}], [{"p": {}}]),
    ("recursive: required undeclared", _recursive({"type": "object", "required": ["x"],
                                                    "additionalProperties": False}),
     [{}, {"kids": []}], [{"p": {}}, {"p": {"x": 1}}]),
    ("recursive: items", _recursive({"type": "array", "items": NONE_STR}), [{"p": []}], [{"p": [1]}]),
    ("recursive: items with minItems", _recursive({"type": "array", "items": NONE_STR, "minItems": 1}),
     [{}], [{"p": []}, {"p": [1]}]),
    ("recursive: additional/pattern", {"$defs": {"t": {"type": "object", "properties": {
        "kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}}, "patternProperties": {"^y": NONE_STR},
        "additionalProperties": NONE_STR}}, "$ref": "#/$defs/t"}, [{}, {"kids": [{}]}], [{"x": 1}, {"y": 1}]),
    ("rule without base case, optional", {"$defs": SELF_REQUIRED, "type": "object", "properties": {
        "z": {"$ref": "#/$defs/t"}, "w": {"type": "integer"}}}, [{}, {"w": 1}], [{"z": {}}, {"z": {"k": {}}}]),
    ("rule without base case, items", {"$defs": SELF_REQUIRED, "type": "array", "items": {"$ref": "#/$defs/t"}},
     [[]], [[{}]]),
    ("rule without base case, anyOf", {"$defs": SELF_REQUIRED, "anyOf": [{"$ref": "#/$defs/t"},
                                                                        {"type": "integer"}]}, [1], [{}]),
]

# Schemas whose root accepts nothing: a clean GrammarError.
EMPTY_ROOTS = [
    {"type": "object", "properties": {"a": NONE_ONEOF}, "required": ["a"]},
    {"type": "object", "required": ["x"], "additionalProperties": False},
    {"type": "object", "propertyNames": False, "required": ["a"]},
    {"$defs": SELF_REQUIRED, "$ref": "#/$defs/t"},
    # MaskBench Github_easy---o46142, reduced: four required properties, the first a oneOf of
    # three identical object schemas.
    {"definitions": {"P": {"oneOf": [{"$ref": "#/definitions/T"}] * 3},
                     "T": {"type": "object", "properties": {"type": {"type": "string"}, "enum": {"type": "array"}}}},
     "properties": {"P": {"$ref": "#/definitions/P"}, "T": {"$ref": "#/definitions/T"}}, "required": ["P", "T"]},
]


test_table_agrees_with_jsonschema = schema_table_tests(CASES)[0]


@pytest.mark.parametrize("vocab", table_vocabularies())
def test_nothing_token_by_token(vocab: str) -> None:
    tok, comp = load_tokenizer(vocab), load_compiler(vocab)
    bitmask = allocate_token_bitmask(1, comp.tokenizer_info.vocab_size)

    def no_dead_end(compiled, text: str) -> None:
        dead = _dead_end(compiled, tok, text, bitmask)
        assert dead is None, (text, dead)

    failures = table_failures(comp, tok, CASES, each=no_dead_end)
    assert not failures, failures


def _dead_end(compiled: Any, tok: Any, text: str, bitmask: Any) -> str | None:
    """The prefix of ``text`` after which the matcher allows no token at all (None if none)."""
    matcher = GrammarMatcher(compiled)
    ids = encode_exact(tok, compiled.tokenizer_info, text)
    for i, tid in enumerate(ids):
        matcher.fill_next_token_bitmask(bitmask, 0)
        if not bool(bitmask[0].any()):
            return tok.decode(ids[:i])
        if not matcher.accept_token(tid):
            return None
    matcher.fill_next_token_bitmask(bitmask, 0)
    return None if bool(bitmask[0].any()) else text


def test_rule_without_base_case_refuses_the_first_dead_token() -> None:
    """``{"z": ...`` where ``z``'s value is an object requiring itself: no value exists, so the
    key cannot be completed (before: the masks let ``{"z": {"k": {"k": {`` through)."""
    tok, comp = load_tokenizer(DEFAULT_TOKENIZER), load_compiler(DEFAULT_TOKENIZER)
    compiled = comp.compile_json_schema(CASES[-3][1])
    matcher = GrammarMatcher(compiled)
    text = '{"z": {"k": {'
    ids = encode_exact(tok, compiled.tokenizer_info, text)
    accepted = ""
    for tid in ids:
        if not matcher.accept_token(tid):
            break
        accepted += tok.decode([tid])
    assert len(accepted) < len('{"z": '), accepted


@pytest.mark.parametrize("schema", EMPTY_ROOTS)
def test_root_accepting_nothing_is_a_grammar_error(schema: Any) -> None:
    check = schema_validator(schema)
    assert not any(check.is_valid(v) for v in ({}, {"a": {}}, {"x": 1}, {"P": {}, "T": {}}))
    comp = load_compiler(DEFAULT_TOKENIZER)
    with pytest.raises(GrammarError):
        comp.compile_json_schema(schema)
