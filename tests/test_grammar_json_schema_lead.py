"""Undeclared properties first in open objects (``grammar/json_extras.py``, issue 12): where
undeclared keys are allowed (``additionalProperties`` absent, ``true`` or a schema,
``patternProperties``), an object may open with undeclared pairs, then its declared ones
(``{"_id": 1, "name": "x"}``), or consist of undeclared pairs only; the pairs still satisfy
``additionalProperties`` / ``patternProperties`` / ``propertyNames`` and count toward
``minProperties`` / ``maxProperties``, and a declared key still comes at most once, under its
``json.dumps`` spelling only. A leading undeclared key never starts with a declared key's first
character (a sound restriction that keeps compile-time masks narrow). Closed objects (``disable_additional_properties``, serving's default)
take no undeclared key, first or not.

Token by token on the table vocabularies (every step allowed by the bitmask); every instance of the
open tables is checked against ``jsonschema`` (valid ones valid, invalid ones invalid)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from radixlm.grammar.testing import schema_table_tests

S, I, B = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}
SMALL = {"type": "object", "properties": {"name": S, "id": I}, "required": ["name"]}  # any order
SEVEN = {"type": "object", "properties": {k: I for k in "abcdefg"}, "required": ["c"]}  # schema order
UNSORTED = {"type": "object", "properties": {k: I for k in "gfedcba"}}  # schema order and sorted
INNER = {"type": "object", "properties": {"o": SMALL, "n": I}}
TREE = {"$defs": {"n": {"type": "object", "properties": {
    "v": I, "a": I, "b": I, "c": I, "d": I, "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
    "required": ["v"]}}, "$ref": "#/$defs/n"}
# drafts <= 7: ``$ref`` hides its siblings, so these keys are undeclared (SchemaStore webextension)
HIDDEN = {"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"base": SMALL},
          "$ref": "#/definitions/base", "properties": {"version": S}}

# (name, schema, valid instances, invalid instances)
CASES: list[tuple[str, Any, list, list]] = [
    ("undeclared first, then declared (any order)", SMALL,
     [{"_id": 1, "name": "n"}, {"_id": "x", "_from": "y", "id": 2, "name": "n"}, {"x": [1], "name": "n", "id": 3},
      {"$schema": "u", "name": "n"}],
     [{"_id": 1}, {"_id": 1, "name": 2}, {"_id": 1, "id": "2", "name": "n"}]),
    ("undeclared first, then declared (schema order)", SEVEN,
     [{"x": 1, "c": 2}, {"x": {"k": 1}, "y": True, "a": 1, "c": 2, "z": None, "g": 3}],
     [{"x": 1, "a": 1}, {"x": 1, "c": "2"}, {"x": 1, "y": 2}]),
    ("undeclared first, then sorted keys", UNSORTED,
     [{"x": 1, "a": 1, "b": 2}, {"x": 1, "g": 1, "f": 2}], [{"x": 1, "a": "1", "b": 2}]),
    ("only undeclared pairs", {**SMALL, "required": []},
     [{"x": 1}, {"x": 1, "y": [2]}, {}], [{"x": 1, "name": 2}]),
    ("inner objects: undeclared first", INNER,
     [{"o": {"_id": 1, "name": "n"}, "n": 1}, {"x": 1, "o": {"y": "z", "name": "n", "id": 2}}],
     [{"o": {"_id": 1}}, {"o": {"_id": 1, "name": 1}}, {"x": 1, "n": "1"}]),
    ("undeclared first takes additionalProperties", {**SMALL, "additionalProperties": I},
     [{"x": 1, "name": "n"}, {"x": 1, "y": 2, "name": "n", "id": 3}],
     [{"x": "s", "name": "n"}, {"x": 1, "y": None, "name": "n"}]),
    ("undeclared first with patternProperties", {**SMALL, "patternProperties": {"^_": B}},
     [{"_a": True, "name": "n"}, {"x": [1], "_b": False, "name": "n"}, {"_a": True, "x": 1, "id": 2, "name": "n"}],
     [{"_a": 1, "name": "n"}, {"x": 1, "_b": "s", "name": "n"}]),
    ("patternProperties only (additionalProperties false)",
     {**SMALL, "patternProperties": {"^_": B}, "additionalProperties": False},
     [{"_a": True, "name": "n"}, {"_a": True, "_b": False, "id": 1, "name": "n"}],
     [{"x": 1, "name": "n"}, {"_a": "s", "name": "n"}]),
    ("undeclared first with propertyNames", {**SMALL, "propertyNames": {"pattern": "^[a-z]+$"}},
     [{"x": 1, "name": "n"}, {"xy": 1, "id": 1, "name": "n"}],
     [{"_id": 1, "name": "n"}, {"X": 1, "name": "n"}, {"x": 1, "_y": 2, "name": "n"}]),
    ("undeclared first counts toward maxProperties (any order)", {**SMALL, "maxProperties": 2},
     [{"x": 1, "name": "n"}, {"id": 1, "name": "n"}],
     [{"x": 1, "y": 2, "name": "n"}, {"x": 1, "id": 2, "name": "n"}]),
    ("undeclared first counts toward maxProperties (schema order)", {**SEVEN, "maxProperties": 3},
     [{"x": 1, "c": 1}, {"x": 1, "y": 2, "c": 1}, {"x": 1, "b": 1, "c": 2}],
     [{"x": 1, "y": 2, "z": 3, "c": 1}, {"x": 1, "y": 2, "b": 1, "c": 2}, {"x": 1, "b": 1, "c": 2, "d": 3}]),
    ("undeclared first counts toward minProperties", {**SMALL, "minProperties": 3},
     [{"x": 1, "y": 2, "name": "n"}, {"x": 1, "name": "n", "id": 1}, {"x": 1, "y": 2, "z": 3, "name": "n"}],
     [{"x": 1, "name": "n"}, {"x": 1, "y": 2}]),
    ("recursive schema (a grammar): undeclared first", TREE,
     [{"x": 1, "v": 1, "kids": [{"y": [1], "z": 2, "v": 2}]}, {"_id": "i", "v": 1, "a": 2, "w": {}}],
     [{"x": 1}, {"x": 1, "kids": [{"v": 1}]}, {"v": 1, "kids": [{"y": 1, "v": "2"}]}]),
    ("$schema first beside a declared $id (no other $ key first)",
     {"type": "object", "properties": {"$id": S, "name": S}, "required": ["name"]},
     [{"$schema": "u", "$id": "i", "name": "n"}, {"x": 1, "$schema": "u", "name": "n"}],
     [{"$schema": "u"}, {"$schema": "u", "$id": 1, "name": "n"}]),
    ("draft 7: $ref hides its siblings, so they are undeclared (first too)", HIDDEN,
     [{"version": "1", "name": "n"}, {"version": 1, "name": "n"}],
     [{"version": "1"}, {"version": "1", "name": 1}]),
]

test_table_agrees_with_jsonschema, test_lead_cases_token_by_token = schema_table_tests(CASES)

# raw texts (a key twice, other spellings): (schema, text, valid)
RAW: list[tuple[Any, str, bool]] = [
    (SMALL, '{"x": 1, "name": "n", "name": "m"}', False),  # a declared key twice
    (SMALL, '{"x": 1, "name": "n", "x": 2}', True),  # an undeclared key twice: JSON Schema sees the last
    (SMALL, '{"x": 1, "\\u006eame": "n"}', False),  # a declared key under another spelling
    (SMALL, '{"\\u006eame": "n", "name": "n"}', False),
    (SEVEN, '{"x": 1, "c": 1, "c": 2}', False),
    (SEVEN, '{"x": 1, "c": 1, "y": 2, "c": 2}', False),
    (SMALL, '{"x": 1,"name": "n"}', True),  # separators: either style at each one (the default)
    # valid, refused by design: a first undeclared key never starts as a declared one does (the
    # states reading declared keys would allow any key: wide masks computed at compile time)
    (SMALL, '{"nick": 1, "name": "n"}', False),
    (SEVEN, '{"a": 1, "bx": 2, "c": 3}', False),  # so is one between declared pairs (a single DFA)
    (SEVEN, '{"a": 1, "x": 2, "c": 3}', True),
    (SEVEN, '{"a": 1, "c": 3, "bx": 2}', True),  # after the declared ones: any undeclared key
]


def _walk(vocab: str, schema: Any, text: str, **options: Any) -> bool:
    """Whether ``text`` walks token by token (each token allowed by the bitmask) to the end."""
    from radixlm.grammar.bitmask import allocate_token_bitmask
    from radixlm.grammar.maskbench import load_compiler, load_tokenizer, run_instance

    tok, comp = load_tokenizer(vocab), load_compiler(vocab)
    compiled = comp.compile_json_schema(schema, **options)
    bitmask = allocate_token_bitmask(1, comp.tokenizer_info.vocab_size)
    res = run_instance(compiled, tok, text, True, bitmask)
    assert res.mismatch is None, (text, res.mismatch)
    return res.accepted


def _vocabularies() -> list[str]:
    from radixlm.grammar.maskbench import table_vocabularies

    return table_vocabularies()


@pytest.mark.parametrize("vocab", _vocabularies())
def test_raw_texts(vocab: str) -> None:
    wrong = [(text, valid) for schema, text, valid in RAW if _walk(vocab, schema, text) != valid]
    assert not wrong, wrong


def test_raw_texts_accepted_are_valid() -> None:
    """The raw texts accepted are valid (those refused are refused by design: a declared key twice
    or under another spelling, which ``json.loads`` would merge)."""
    from radixlm.grammar.maskbench import schema_validator

    for schema, text, valid in RAW:
        if valid:
            assert schema_validator(schema).is_valid(json.loads(text)), text


# closed objects (serving's default): no undeclared key, first or anywhere; (schema, accepted, refused)
CLOSED: list[tuple[Any, list, list]] = [
    (SMALL, [{"name": "n"}, {"id": 1, "name": "n"}], [{"_id": 1, "name": "n"}, {"x": 1}, {"name": "n", "x": 1}]),
    (SEVEN, [{"a": 1, "c": 2}], [{"x": 1, "c": 2}, {"x": 1, "a": 1, "c": 2}]),
    (INNER, [{"o": {"name": "n"}}], [{"o": {"_id": 1, "name": "n"}}, {"x": 1, "n": 1}]),
    ({**SMALL, "maxProperties": 2}, [{"name": "n", "id": 1}], [{"x": 1, "name": "n"}]),
]


@pytest.mark.parametrize("vocab", _vocabularies())
def test_closed_objects_refuse_undeclared_first(vocab: str) -> None:
    from radixlm.grammar.maskbench import schema_validator

    wrong = []
    for schema, accepted, refused in CLOSED:
        check = schema_validator(schema)
        for value, want in [(v, True) for v in accepted] + [(v, False) for v in refused]:
            assert check.is_valid(value) or not want  # NOTE: closed accepts a subset of the schema's language
            if _walk(vocab, schema, json.dumps(value), disable_additional_properties=True) != want:
                wrong.append((schema, value, want))
    assert not wrong, wrong


def test_closed_jump_forward_unchanged() -> None:
    """A closed object in schema order still forces its first key (jump-forward); open, the key
    is a choice since an undeclared one may come first."""
    from radixlm.grammar.maskbench import DEFAULT_TOKENIZER, load_compiler
    from radixlm.grammar import GrammarMatcher

    comp = load_compiler(DEFAULT_TOKENIZER)
    schema = {**SEVEN, "required": ["a", "c"], "properties": {k: I for k in "abcdefg"}}
    closed = GrammarMatcher(comp.compile_json_schema(schema, disable_additional_properties=True,
                                                     separators="consistent"))
    assert closed.find_jump_forward_string().startswith('{"a":')
    opened = GrammarMatcher(comp.compile_json_schema(schema, separators="consistent"))
    assert opened.find_jump_forward_string() == '{"'
