"""Remote ``$ref``s (issue 12): never fetched, replaced by a sound approximation by polarity
(:mod:`radixlm.grammar.schema_remote`): the parts of a schema that need a remote document are never
produced, and the engine never accepts an instance that the real schema rejects, whatever the
remote document holds.

Each table row is walked token by token (``json.dumps``, real tokenization; the filled bitmask must
agree with ``accept_token`` at every step) on the default model's vocabulary and ``llama-spm``
(when ``$RADIXLM_SHARED_DATA`` has it). Soundness: every row the engine accepts is checked with
``jsonschema`` against the original schema, its remote documents supplied through a
``referencing.Registry`` built here, for each of several remote documents (``true``, ``false``,
typed ones, ...). Rows the engine refuses may be valid for some remote document (they need it)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from radixlm.grammar import GrammarError
from radixlm.grammar.json_schema import json_schema_to_ast
from radixlm.grammar.maskbench import (
    DEFAULT_TOKENIZER, load_compiler, load_tokenizer, schema_validator, table_failures, table_vocabularies,
)
from radixlm.grammar.schema_refs import canonical_refs

R = "https://example.com/remote.json"
ITEM = "https://example.com/item.json"  # what "item.json" means under the $id below
DEFS = "https://example.com/defs.json"
# What a remote document may hold: accepting everything, nothing, or some values.
DOCS: list[Any] = [True, False, {}, {"type": "integer"}, {"type": "string"}, {"type": "object"},
                   {"required": ["a"]}, {"not": {"type": "object"}}, {"type": "array", "minItems": 1},
                   {"properties": {"a": True}}]
D = {"type": "object", "properties": {"r": {"$ref": R}, "x": {"type": "string"}}}

# (name, schema, accepted instances, refused instances)
CASES: list[tuple[str, Any, list, list]] = [
    ("optional property", {"type": "object", "properties": {"a": {"$ref": R}, "b": {"type": "integer"},
                                                           "c": {"not": {"not": {"$ref": R}}}}, "required": ["b"]},
     [{"b": 1}, {"b": -3, "z": "s"}], [{"a": 1, "b": 1}, {"a": {}, "b": 1}, {"b": 1, "c": 1}, {"b": "x"}, {}]),
    ("anyOf branch", {"anyOf": [{"$ref": R}, {"type": "string", "maxLength": 3}]}, ["ab", ""], ["abcd", 1, None]),
    ("anyOf branch with siblings", {"anyOf": [{"$ref": R, "type": "integer"}, {"type": "boolean"}]}, [True], [1, "s"]),
    ("not", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
             "not": {"required": ["a"], "properties": {"a": {"$ref": R}}}},
     [{"b": "x"}, {}], [{"a": 1}, {"a": 1, "b": "x"}]),
    ("if/then/else", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                      "if": {"$ref": R}, "then": {"required": ["a"]}, "else": {"required": ["b"]}},
     [{"a": 1, "b": 2}], [{"a": 1}, {"b": 2}, {}]),
    ("if/then only", {"type": "object", "properties": {"a": {"type": "integer"}},
                      "if": {"properties": {"a": {"$ref": R}}}, "then": {"required": ["a"]}},
     [{"a": 1}], [{}, {"a": "x"}]),
    ("not if", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "not": {"if": {"$ref": R}, "then": {"required": ["a"]}, "else": {"required": ["b"]}}},
     [{}], [{"a": 1}, {"b": 1}, {"a": 1, "b": 1}]),
    ("oneOf branch", {"oneOf": [{"type": "object", "properties": {"a": {"$ref": R}}, "required": ["a"]},
                                {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}]},
     [{"b": 1}, {"b": 0, "c": "s"}], [{"a": 1, "b": 1}, {"a": 1}, {}, {"b": "x"}]),
    ("oneOf branch from below", {"oneOf": [
        {"type": "object", "properties": {"a": {"$ref": R}, "k": {"const": 1}}, "required": ["k"]},
        {"type": "object", "properties": {"k": {"const": 2}, "b": {"type": "integer"}}, "required": ["k"]}]},
     [{"k": 1}, {"k": 2}, {"k": 2, "b": 3}], [{"k": 1, "a": 1}, {"k": 3}, {}]),
    ("oneOf bare remote branch from below", {"type": "object", "properties": {"p": {"type": "integer"}, "q": {
        "oneOf": [{"anyOf": [{"$ref": R}, {"type": "string", "maxLength": 2}]}, {"type": "integer"}]}}},
     [{"p": 1}, {"q": "ab"}], [{"q": 1}, {"q": "abc"}, {"q": None}]),
    ("not oneOf", {"type": "array", "items": {"type": "integer"},
                   "not": {"oneOf": [{"minItems": 3, "contains": {"$ref": R}}, {"maxItems": 1}]}},
     [[1, 2]], [[], [1], [1, 2, 3]]),
    ("local def in both polarities", {"$defs": {"d": D}, "type": "object", "properties": {
        "p": {"$ref": "#/$defs/d"}, "n": {"not": {"$ref": "#/$defs/d"}}}},
     [{"p": {"x": "s"}}, {"n": 1}, {"n": "s"}, {"p": {}, "n": None}], [{"p": {"r": 1}}, {"n": {}}, {"n": {"r": 1}}]),
    ("$id-relative", {"$id": "https://example.com/root.json", "type": "array",
                      "items": {"anyOf": [{"$ref": "item.json"}, {"type": "integer"}]}},
     [[1, 2], []], [["s"], [1.5]]),
    ("pointer into a remote document", {"type": "object", "properties": {
        "v": {"$ref": DEFS + "#/$defs/v"}, "w": {"type": "boolean"}}}, [{"w": True}, {}], [{"v": 1}, {"w": 1}]),
    ("contains with maxContains", {"anyOf": [{"type": "array", "contains": {"$ref": R}, "maxContains": 1},
                                             {"type": "string"}]}, ["s"], [[], [1]]),
    ("contains with maxContains, minContains 0", {"anyOf": [{"type": "array", "contains": {"$ref": R},
                                                             "minContains": 0, "maxContains": 1}, {"type": "string"}]},
     ["s"], [[], [1, 2]]),
    ("contains", {"type": "array", "items": {"type": "integer"}, "contains": {"anyOf": [{"$ref": R}, {"minimum": 5}]}},
     [[5], [1, 7]], [[], [1]]),
    ("unevaluatedProperties beside if", {"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
                                                    "if": {"$ref": R}, "else": {"properties": {"b": {"type": "integer"}}},
                                                    "unevaluatedProperties": False}, {"type": "null"}]},
     [None], [{"a": 1}, {"b": 1}, {}]),
    ("unevaluatedProperties beside anyOf", {"type": "object", "anyOf": [
        {"$ref": R}, {"properties": {"a": {"type": "integer"}}, "required": ["a"]}], "unevaluatedProperties": False},
     [{"a": 1}], [{"a": 1, "b": 1}, {"b": 1}, {}]),
    ("not unevaluatedProperties", {"type": "object", "properties": {"q": {"type": "integer"}, "p": {
        "type": "object", "not": {"allOf": [{"$ref": R}], "unevaluatedProperties": False}}}},
     [{"q": 1}], [{"p": {"a": 1}}, {"p": {}}]),
    ("dependentSchemas", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                          "dependentSchemas": {"a": {"$ref": R}}}, [{"b": 1}, {}], [{"a": 1}, {"a": 1, "b": 1}]),
    ("recursive", {"$defs": {"t": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/t"}},
                                                                   "r": {"$ref": R}}}}, "$ref": "#/$defs/t"},
     [{}, {"kids": [{}, {"kids": []}]}], [{"r": 1}, {"kids": [{"r": 1}]}]),
    ("ref into a sub-schema made false", {"type": "object", "properties": {
        "p": {"allOf": [{"$ref": R}], "$defs": {"q": {"type": "integer"}}}, "n": {"$ref": "#/properties/p/$defs/q"}}},
     [{"n": 1}, {}], [{"n": "s"}, {"p": 1}]),
    ("draft 7, $ref hides siblings", {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                                      "properties": {"a": {"$ref": R, "type": "string"}, "b": {"type": "integer"}}},
     [{"b": 1}], [{"a": "s"}, {"b": "s"}]),
]


def _remote(schema: Any) -> list[str]:
    """The remote documents ``schema`` names (URI without fragment)."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "$ref" and isinstance(v, str) and v.split("#")[0].endswith(".json") and "root" not in v:
                    found.append(v.split("#")[0])
                walk(v)
        elif isinstance(node, list):
            for x in node:
                walk(x)

    walk(schema)
    return sorted({ITEM if u == "item.json" else u for u in found})


def _validators(schema: Any) -> list[Any]:
    """One validator of the original schema per remote document of :data:`DOCS` (the same one
    behind every remote URI; under ``defs.json`` at ``/$defs/v``)."""
    out = []
    for doc in DOCS:
        contents = {u: ({"$defs": {"v": doc}} if u == DEFS else doc) for u in _remote(schema)}
        registry = Registry().with_resources(
            (u, Resource.from_contents(c, default_specification=DRAFT202012)) for u, c in contents.items())
        check = schema_validator(schema)
        out.append(type(check)(schema, registry=registry))
    return out


@pytest.mark.parametrize("name,schema,accepted,refused", CASES, ids=[c[0] for c in CASES])
def test_accepted_rows_valid_whatever_the_remote_document(name: str, schema: Any, accepted: list, refused: list) -> None:
    assert _remote(schema), name
    for check in _validators(schema):
        for value in accepted:
            assert check.is_valid(value), (name, value)


@pytest.mark.parametrize("vocab", table_vocabularies())
def test_remote_refs_token_by_token(vocab: str) -> None:
    tok, comp = load_tokenizer(vocab), load_compiler(vocab)
    failures = table_failures(comp, tok, CASES)
    assert not failures, failures


def test_refused_rows_need_the_remote_document() -> None:
    """The approximation costs only what needs the remote document: some refused rows are valid
    for some remote document of :data:`DOCS`."""
    needs = {"optional property": {"a": 1, "b": 1}, "anyOf branch": 1, "not": {"a": 1}, "oneOf branch from below":
             {"k": 1, "a": 1}, "oneOf bare remote branch from below": {"q": 1},
             "if/then/else": {"a": 1}, "oneOf branch": {"a": 1}, "recursive": {"r": 1}}
    for name, schema, _, refused in CASES:
        if name in needs:
            assert needs[name] in refused
            assert any(check.is_valid(needs[name]) for check in _validators(schema)), name


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"$ref": R}}, "required": ["a"]},
    {"type": "integer", "not": {"$ref": R}},
])
def test_nothing_left_is_a_clean_error(schema: dict) -> None:
    with pytest.raises(GrammarError, match="accepts no string"):
        load_compiler(DEFAULT_TOKENIZER).compile_json_schema(schema)


@pytest.mark.parametrize("schema", [{"$ref": R}, {"oneOf": [{"$ref": R}, {"type": "integer"}]},
                                    {"allOf": [{"$ref": R}, {"type": "integer"}]}])
def test_root_needing_the_remote_document_names_it(schema: dict) -> None:
    with pytest.raises(GrammarError, match="remote.json.*not fetched.*accepts nothing"):
        json_schema_to_ast(schema)


@pytest.mark.parametrize("schema,ref", [
    ({"type": "object", "properties": {"a": {"$ref": "#/definitions/nope"}}}, "#/definitions/nope"),
    ({"$id": "https://example.com/a.json", "$defs": {"o": {"$id": "other.json"}},
      "properties": {"o": {"$ref": "other.json#/nope"}}}, "other.json#/nope"),
    ({"$defs": {"x": {"$anchor": "here"}}, "items": {"$ref": "#there"}}, "#there"),
])
def test_missing_local_target_is_an_error(schema: dict, ref: str) -> None:
    with pytest.raises(GrammarError, match="does not resolve within the schema") as e:
        json_schema_to_ast(schema)
    assert ref in str(e.value) and "fetched" not in str(e.value)


def test_embedded_id_is_local() -> None:
    schema = {"$id": "https://example.com/a.json", "$defs": {"o": {"$id": "other.json", "$defs": {
        "x": {"type": "string"}}}}, "type": "object", "properties": {"o": {"$ref": "other.json#/$defs/x"}}}
    out = canonical_refs(schema)
    assert out["properties"]["o"]["$ref"].endswith("#/$defs/o/$defs/x")


def test_one_warning_per_compile_names_the_refs(caplog: pytest.LogCaptureFixture) -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": R}, "b": {"$ref": DEFS + "#/$defs/v"},
                                               "c": {"$ref": R}}}
    with caplog.at_level(logging.WARNING, logger="radixlm.grammar.schema_remote"):
        json_schema_to_ast(schema)
    records = [r for r in caplog.records if r.name == "radixlm.grammar.schema_remote"]
    assert len(records) == 1
    assert R in records[0].getMessage() and DEFS in records[0].getMessage()


@pytest.mark.parametrize("ref", ["https://example.com/schemas/other.json", "other.json#/definitions/x",
                                 "http://json-schema.org/draft-07/schema#", "//host/x.json"])
def test_remote_ref_compiles_without_network(ref: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is fetched: an optional property whose value is a remote document is never produced."""
    import socket

    def no_network(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("network access while compiling a schema")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    schema = {"$id": "https://example.com/root.json", "type": "object", "properties": {"a": {"$ref": ref}}}
    assert canonical_refs(schema)["properties"]["a"] is False
    json_schema_to_ast(schema)


def _random_schema(rng: Any, depth: int) -> Any:
    """A random schema of the keywords the approximation treats by polarity."""
    leaves = [{"type": "integer"}, {"type": "string"}, {"type": "object"}, True, False, {"$ref": R}, {"$ref": R},
              {"$ref": "#/$defs/d"}, {"minimum": 2}, {"required": ["a"]}, {"maxItems": 1}, {"not": {"$ref": R}}]
    if depth == 0 or rng.random() < 0.3:
        return rng.choice(leaves)
    sub = [_random_schema(rng, depth - 1) for _ in range(3)]
    return rng.choice([
        {"not": sub[0]}, {"anyOf": sub[:2]}, {"allOf": sub[:2]}, {"oneOf": sub}, {"oneOf": sub[:2]},
        {"if": sub[0], "then": sub[1], "else": sub[2]}, {"if": sub[0], "then": sub[1]},
        {"properties": {"a": sub[0], "b": sub[1]}}, {"items": sub[0]}, {"contains": sub[0], "maxContains": 1},
        {"contains": sub[0]}, {"dependentSchemas": {"a": sub[0]}}, {"$ref": R, "type": "object"},
        {"properties": {"a": sub[0]}, "anyOf": sub[1:], "unevaluatedProperties": False},
        {"oneOf": sub[:2], "properties": {"b": sub[2]}, "unevaluatedProperties": False},
        {"allOf": [sub[0]], "if": sub[1], "then": sub[2], "unevaluatedProperties": False},
    ])


def _random_value(rng: Any, depth: int = 2) -> Any:
    k = rng.randrange(7)
    if depth == 0 or k < 3:
        return rng.choice([0, 1, 3, "s", None, True])
    if k < 5:
        return [_random_value(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    return {key: _random_value(rng, depth - 1) for key in rng.sample(["a", "b", "c"], rng.randint(0, 3))}


def _as_jsonschema(node: Any) -> Any:
    """The approximated schema as ``jsonschema`` reads it (``x-bool:`` references as booleans)."""
    if isinstance(node, list):
        return [_as_jsonschema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: v if k in ("enum", "const") else _as_jsonschema(v) for k, v in node.items()}
    ref = out.get("$ref")
    if isinstance(ref, str) and ref.startswith("x-bool:"):
        del out["$ref"]
        out["allOf"] = list(out.get("allOf", [])) + [ref == "x-bool:true"]
    return out


def test_random_schemas_accept_a_subset_whatever_the_remote_document() -> None:
    """The approximation itself (before any automaton): every value the approximated schema
    accepts is valid for the original with each remote document of :data:`DOCS`."""
    import random

    import jsonschema

    from radixlm.grammar.schema_refs import ROOT_URI

    rng = random.Random(13)
    checked = 0
    for _ in range(40):
        body = _random_schema(rng, 3)
        schema = {"$defs": {"d": _random_schema(rng, 2)}, **(body if isinstance(body, dict) else {"allOf": [body]})}
        try:
            approx = _as_jsonschema(canonical_refs(schema))
        except GrammarError:
            continue
        registry = Registry().with_resource(ROOT_URI, Resource.from_contents(approx, default_specification=DRAFT202012))
        mine = jsonschema.Draft202012Validator({"$ref": ROOT_URI + "#"}, registry=registry)
        originals = _validators(schema)
        for value in (_random_value(rng) for _ in range(25)):
            try:
                if mine.is_valid(value):
                    checked += 1
                    assert all(check.is_valid(value) for check in originals), (schema, value)
            except RecursionError:  # NOTE: an in-place $ref cycle of the random schema
                break
    assert checked > 50
