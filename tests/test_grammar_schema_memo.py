"""Equal sub-schemas convert to one AST (vector: the common properties of a sink merged into each
of 70 ``oneOf`` branches, and the same inline object under many definitions, each with its own
``description`` / ``_metadata``, were converted again every time; each copy's share keys were
fresh, so every automaton around it was determinized again and the grammar got one terminal per
copy: the compile ran out of budget).

The synthetic schema: sinks told apart by a ``type`` constant, each with an inline ``batch``
object equal to the others but for annotations and a ``$ref`` with an unknown sibling keyword,
merged (``allOf``) with common properties holding a ``oneOf`` of objects; ``labels`` takes any
value, so the schema compiles as a grammar."""

from __future__ import annotations

import time
from typing import Any

from radixlm.grammar.json_schema import json_schema_to_ast
from radixlm.grammar.maskbench import load_compiler, table_vocabularies
from radixlm.grammar.testing import schema_table_tests

CPU_BOUND_S = 8.0


def _batch(i: int) -> dict:
    return {"description": f"batch of sink {i}", "type": "object", "additionalProperties": False,
            "properties": {"max_bytes": {"type": ["integer", "null"], "minimum": 0, "description": f"b{i}"},
                           "max_events": {"type": ["integer", "null"], "minimum": 0},
                           "timeout_secs": {"type": ["number", "null"], "minimum": 0},
                           "mode": {"enum": ["a", "b", "c"]}}}


def _sinks(n: int) -> dict:
    defs: dict[str, Any] = {}
    for i in range(n):
        defs[f"sink{i}"] = {"type": "object", "required": ["type"], "properties": {
            "type": {"const": f"kind{i}", "_metadata": {"name": f"T{i}"}},
            f"field{i}": {"type": "string", "maxLength": 40},
            "batch": _batch(i),
            "request": {"$ref": "#/definitions/request", "_metadata": {"n": i}, "description": f"r{i}"}}}
    defs["request"] = {"type": "object", "additionalProperties": False, "properties": {
        "retries": {"type": "integer", "minimum": 0, "maximum": 100}, "timeout": {"type": "number"},
        "rate": {"type": "integer"}}}
    defs["sinks"] = {"oneOf": [{"allOf": [{"$ref": f"#/definitions/sink{i}", "description": f"s{i}"}]}
                               for i in range(n)]}
    buffer = {"oneOf": [
        {"type": "object", "additionalProperties": False, "properties": {
            "type": {"const": "memory"}, "max_events": {"type": "integer", "minimum": 1},
            "flush": {"type": "number", "maximum": 60}, "when_full": {"enum": ["block", "drop"]}}},
        {"type": "object", "additionalProperties": False, "required": ["type"], "properties": {
            "type": {"const": "disk"}, "max_size": {"type": "integer", "minimum": 1},
            "when_full": {"enum": ["block", "drop"]}}}]}
    common = {"type": "object", "required": ["inputs"], "properties": {
        "inputs": {"type": "array", "items": {"type": "string", "maxLength": 30}}, "labels": {},
        "buffer": buffer}}
    defs["outer"] = {"allOf": [common, {"$ref": "#/definitions/sinks"}]}
    return {"type": "object", "additionalProperties": {"$ref": "#/definitions/outer"}, "definitions": defs}


SINKS = _sinks(40)
CASES = [
    ("40 sinks sharing annotated sub-schemas", SINKS,
     [{}, {"a": {"inputs": ["x"], "type": "kind3", "batch": {"max_bytes": 10, "mode": "b"}}},
      {"a": {"inputs": [], "labels": {"k": [1]}, "buffer": {"type": "disk", "max_size": 5}, "type": "kind39",
             "request": {"retries": 3}},
       "b": {"inputs": ["y", "z"], "type": "kind0", "field0": "v", "batch": {"timeout_secs": 1.5}}}],
     [{"a": {"type": "kind3"}}, {"a": {"inputs": [], "type": "kind40"}},
      {"a": {"inputs": [], "type": "kind1", "batch": {"mode": "d"}}},
      {"a": {"inputs": [], "type": "kind1", "batch": {"max_bytes": -1}}},
      {"a": {"inputs": [], "type": "kind2", "request": {"retries": 101}}},
      {"a": {"inputs": [], "type": "kind2", "buffer": {"max_size": 5}}},
      {"a": {"inputs": [], "type": "kind2", "batch": {"extra": 1}}}]),
]

test_table_agrees_with_jsonschema, test_sinks_token_by_token = schema_table_tests(CASES)


def _values(node: Any, key: bytes, out: list) -> None:
    """The nodes that follow the literal ``key`` in a ``cat`` of ``node`` (walked once per object)."""
    seen: set[int] = set()

    def walk(n: Any) -> None:
        if not isinstance(n, tuple) or not n or id(n) in seen:
            return
        seen.add(id(n))
        if n[0] == "cat":
            items = n[1]
            text = bytes(it[1][0][0] for it in items if it[0] == "set" and len(it[1]) == 1
                         and it[1][0][0] == it[1][0][1])
            if key in text and len(items) > len(key):
                out.append(items[-1])
        for k in n[1:]:
            if isinstance(k, tuple):
                walk(k)
            elif isinstance(k, dict):
                for v in k.values():
                    walk(v)

    walk(node)


def test_equal_sub_schemas_convert_to_one_ast() -> None:
    """Every sink's ``batch`` value (equal but for annotations) is one AST object."""
    root, rules = json_schema_to_ast(SINKS, grammar=True)
    found: list = []
    for r in [root, *rules.values()]:
        _values(r, b'"batch":', found)
    assert len(found) >= 40
    assert len({id(v) for v in found}) == 1


def test_sinks_compile_within_bound() -> None:
    comp = load_compiler(table_vocabularies()[0])
    fresh = type(comp)(comp.tokenizer_info)
    start = time.process_time()
    fresh.compile_json_schema(_sinks(120))
    assert time.process_time() - start < CPU_BOUND_S
