"""``disable_additional_properties`` (OpenAI ``strict: true``, vLLM's option, xgrammar's
``strict_mode``): objects that declare properties take no undeclared keys unless the schema allows
them. Accept/reject tables walked token by token on real vocabularies, with the flag and without
it (JSON Schema semantics: the same "invalid" instances are then valid and accepted). The table is
checked against ``jsonschema`` on the schema closed by ``close_objects`` (the rewrite the
llguidance backend uses), so the three definitions of the flag agree."""

from __future__ import annotations

import json
from typing import Any

import pytest

from radixlm.grammar.backends import close_objects
from radixlm.grammar.maskbench import (
    load_compiler, load_tokenizer, schema_validator, table_failures, table_vocabularies,
)

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name"]}

# (name, schema, valid with the flag, valid without it but refused with the flag)
CASES: list[tuple[str, Any, list, list]] = [
    ("declared keys only", PERSON,
     [{"name": "Ann"}, {"name": "Ann", "age": 3}, {"age": 3, "name": "Ann"}],
     [{"name": "Ann", "country": "ES"}, {"name": "Ann", "age": 3, "aliases": ["A"]}]),
    ("nested objects closed too", {"type": "object", "properties": {"who": PERSON}},
     [{"who": {"name": "Bo"}}, {}], [{"who": {"name": "Bo", "x": 1}}, {"who": {"name": "Bo"}, "y": 2}]),
    ("objects in arrays and $defs", {"type": "array", "items": {"$ref": "#/$defs/p"}, "$defs": {"p": PERSON}},
     [[{"name": "C"}], []], [[{"name": "C", "z": None}]]),
    ("an explicit additionalProperties schema still applies", {
        "type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}},
     [{"a": 1, "b": "x"}, {"c": "y"}], []),
    ("an explicit additionalProperties true keeps extras", {
        "type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True},
     [{"a": 1, "b": [1, 2]}, {"c": None}], []),
    ("patternProperties without additionalProperties", {
        "type": "object", "patternProperties": {"^x_": {"type": "integer"}}},
     [{"x_a": 1}, {}], [{"y": 1}]),
    ("recursive (Earley) objects", {"$ref": "#/$defs/node", "$defs": {"node": {
        "type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}},
     [{"v": 1, "kids": [{"v": 2, "kids": []}]}, {}], [{"v": 1, "kids": [{"w": 2}]}, {"u": 0}]),
    ("a free-form object keeps any keys", {"type": "object"}, [{"k": 1}, {}], []),
    ("anyOf branches closed each", {"anyOf": [PERSON, {"type": "object", "properties": {"id": {"type": "integer"}},
                                                       "required": ["id"]}]},
     [{"name": "D"}, {"id": 4}], [{"id": 4, "extra": True}]),
]


@pytest.mark.parametrize("name,schema,valid,closed_out", CASES, ids=[c[0] for c in CASES])
def test_table_agrees_with_jsonschema(name, schema, valid, closed_out) -> None:
    open_check = schema_validator(schema)
    closed_check = schema_validator(json.loads(close_objects(json.dumps(schema))))
    assert all(closed_check.is_valid(v) and open_check.is_valid(v) for v in valid), name
    assert all(open_check.is_valid(v) and not closed_check.is_valid(v) for v in closed_out), name


@pytest.mark.parametrize("vocab", table_vocabularies())
def test_closed_objects_token_by_token(vocab: str) -> None:
    tok, comp = load_tokenizer(vocab), load_compiler(vocab)
    closed = table_failures(comp, tok, CASES, disable_additional_properties=True)
    assert not closed, closed
    # NOTE: without the flag every instance is valid JSON Schema and accepted
    plain = table_failures(comp, tok, [(n, s, v + out, []) for n, s, v, out in CASES])
    assert not plain, plain


def test_close_objects_leaves_allof_merges_and_data_open() -> None:
    schema = {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}],
              "properties": {"c": {"properties": {"d": {}}}},
              "enum": [{"properties": {}}], "$defs": {"properties": {"type": "object", "properties": {"e": {}}}}}
    out = json.loads(close_objects(json.dumps(schema)))
    assert "additionalProperties" not in out and all("additionalProperties" not in b for b in out["allOf"])
    assert out["properties"]["c"]["additionalProperties"] is False
    assert out["enum"] == [{"properties": {}}]
    assert out["$defs"]["properties"]["additionalProperties"] is False


def test_too_large_closed_falls_back_to_open(monkeypatch, caplog) -> None:
    """A schema that compiles open but not closed (a union of many closed objects whose values
    determinize together) compiles open, with a warning, instead of failing the request."""
    import radixlm.grammar.compiler as compiler_mod
    from radixlm.grammar import GrammarError
    from radixlm.grammar.bitmask import allocate_token_bitmask
    from radixlm.grammar.maskbench import DEFAULT_TOKENIZER, run_instance

    real = compiler_mod.json_schema_to_ast

    def closed_too_large(schema, any_whitespace=False, grammar=False, closed=False, separators="either"):
        if closed:
            raise GrammarError("grammar too complex: compile budget of 1 work units exceeded while testing")
        return real(schema, any_whitespace, grammar=grammar, closed=closed, separators=separators)

    monkeypatch.setattr(compiler_mod, "json_schema_to_ast", closed_too_large)
    comp, tok = load_compiler(DEFAULT_TOKENIZER), load_tokenizer(DEFAULT_TOKENIZER)
    schema = {"type": "object", "properties": {"fallback-case": {"type": "integer"}}}
    with caplog.at_level("WARNING"):
        compiled = comp.compile_json_schema(schema, disable_additional_properties=True)
    assert "too large to compile with closed objects" in caplog.text
    bitmask = allocate_token_bitmask(1, comp.tokenizer_info.vocab_size)
    assert run_instance(compiled, tok, json.dumps({"fallback-case": 1, "other": 2}), True, bitmask).accepted
