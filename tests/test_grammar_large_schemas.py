"""Large real-world schema shapes (issue 12): recursion through ``allOf`` / ``$ref`` with siblings
compiles soundly, and work the compile budget used not to see is counted, so a schema too large
fails inside the work budget (a clean GrammarError) instead of burning CPU to the backstop.

Schemas are written for the test (shapes of SchemaStore's package.json, pulumi, intlayer,
mongodb-atlas-search and template), not the SchemaStore files. Accept/reject tables are walked
token by token; every row's expectation is checked with ``jsonschema`` first.
"""

from __future__ import annotations

from typing import Any

import pytest

from radixlm.grammar import GrammarError
from radixlm.grammar import budget
from radixlm.grammar.json_schema import json_schema_to_ast
from radixlm.grammar.maskbench import load_compiler, load_tokenizer, schema_validator, table_failures, table_vocabularies

# package.json's shape: a definition whose allOf holds a $ref to itself (through a property) beside
# object keywords that hold at every level.
NODE = {"$defs": {"node": {"type": "object", "allOf": [
    {"properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}},
    {"properties": {"name": {"type": "string", "maxLength": 3}}, "required": ["name"]}]}},
    "$ref": "#/$defs/node"}
# the allOf branch is the recursive one: a child is a node AND has an integer id
CHILD = {"$defs": {"node": {"type": "object", "properties": {
    "v": {"type": "integer"},
    "kid": {"allOf": [{"$ref": "#/$defs/node"}, {"required": ["id"], "properties": {"id": {"type": "integer"}}}]}},
    "required": ["v"]}}, "$ref": "#/$defs/node"}
# draft 2020-12: a $ref to the definition being converted beside sibling keywords (intlayer)
SIBLINGS = {"$defs": {"t": {"type": "object", "properties": {
    "sub": {"$ref": "#/$defs/t", "maxProperties": 1}, "n": {"type": "boolean"}}}}, "$ref": "#/$defs/t"}
# a oneOf branch that is a recursive $ref beside the parent's keywords (pulumi)
ONEOF = {"$defs": {"e": {"type": "object", "properties": {"k": {"type": "integer"}, "x": {
    "type": "object", "required": ["k"], "oneOf": [{"$ref": "#/$defs/e"}, {"properties": {"k": {"const": 0}}}]}},
    "additionalProperties": False}}, "$ref": "#/$defs/e"}

# a recursive $ref branch whose type the parent's excludes (web-types' string beside an object)
APART = {"$defs": {"t": {"type": "object", "properties": {"s": {
    "type": "string", "oneOf": [{"$ref": "#/$defs/t"}, {"maxLength": 2}]}, "k": {"$ref": "#/$defs/t"}}}},
    "$ref": "#/$defs/t"}

CASES: list[tuple[str, Any, list, list]] = [
    ("allOf with a $ref to itself inside a branch", NODE,
     [{"name": "a"}, {"name": "a", "kids": []}, {"name": "a", "kids": [{"name": "b", "kids": [{"name": "c"}]}]}],
     [{}, {"kids": []}, {"name": "a", "kids": [{}]}, {"name": "a", "kids": [{"name": "b", "kids": [{"name": "long"}]}]},
      {"name": 1}]),
    ("allOf whose recursive branch is a $ref", CHILD,
     [{"v": 1}, {"v": 1, "kid": {"v": 2, "id": 3}}, {"v": 1, "kid": {"v": 2, "id": 3, "kid": {"v": 4, "id": 5}}}],
     [{"v": 1, "kid": {"v": 2}}, {"v": 1, "kid": {"id": 3}}, {"v": 1, "kid": {"v": 2, "id": 3, "kid": {"v": 4}}},
      {"v": 1, "kid": {"v": 2, "id": "x"}}]),
    ("recursive $ref with siblings", SIBLINGS,
     [{}, {"sub": {}}, {"sub": {"n": True}}, {"sub": {"sub": {"sub": {}}}}, {"n": False, "sub": {"sub": {"n": True}}}],
     [{"sub": {"n": True, "sub": {}}}, {"sub": {"sub": {"n": 1}}}, {"sub": 1}]),
    ("oneOf with a recursive $ref and sibling keywords", ONEOF,
     [{}, {"x": {"k": 1}}, {"x": {"k": 1, "x": {"k": 2}}}, {"k": 0, "x": {"k": 3, "x": {"k": -1}}}],
     [{"x": {"k": 0}}, {"x": {"k": "a"}}, {"x": {}}, {"y": 1}, {"x": {"k": 1, "x": {"k": 0}}}]),
    ("recursive $ref branch of another type", APART, [{}, {"s": "ab"}, {"k": {"s": ""}}],
     [{"s": "abc"}, {"s": {}}, {"k": {"s": {"s": "a"}}}]),
]


@pytest.mark.parametrize("name,schema,accepted,refused", CASES, ids=[c[0] for c in CASES])
def test_rows_agree_with_jsonschema(name: str, schema: Any, accepted: list, refused: list) -> None:
    check = schema_validator(schema)
    for value in accepted:
        assert check.is_valid(value), (name, value)
    for value in refused:
        assert not check.is_valid(value), (name, value)


@pytest.mark.parametrize("vocab", table_vocabularies())
def test_recursive_refs_beside_keywords_token_by_token(vocab: str) -> None:
    tok, comp = load_tokenizer(vocab), load_compiler(vocab)
    failures = table_failures(comp, tok, CASES)
    assert not failures, failures


def test_in_place_cycle_through_siblings_is_nothing() -> None:
    """``A = {$ref: A, ...}`` at one location never ends in a validator: no value, as for ``allOf``."""
    schema = {"$defs": {"a": {"$ref": "#/$defs/a", "minProperties": 1}},
              "type": "object", "properties": {"p": {"$ref": "#/$defs/a"}, "q": {"type": "null"}}}
    vocab = table_vocabularies()[0]
    rows = [("in place", schema, [{}, {"q": None}], [{"p": {"a": 1}}, {"p": {}}, {"q": None, "p": 1}])]
    assert not table_failures(load_compiler(vocab), load_tokenizer(vocab), rows)


def _growing(levels: int) -> dict:
    """Definitions that each combine the next ones through allOf (web-types' shape): the siblings
    of the recursive $ref grow at every level."""
    defs = {}
    for i in range(levels):
        defs[f"d{i}"] = {"type": "object", "allOf": [{"$ref": f"#/$defs/d{(i + 1) % levels}"}, {"$ref": "#/$defs/host"}],
                         "properties": {f"p{i}": {"type": "integer"}}}
    defs["host"] = {"type": "object", "properties": {"kids": {"type": "array", "items": {
        "allOf": [{"$ref": "#/$defs/d0"}, {"properties": {"z": {"type": "string"}}}]}}}}
    return {"$defs": defs, "$ref": "#/$defs/d1"}


def test_growing_siblings_end_within_the_budget() -> None:
    """Compiled (a rule per name) or refused cleanly, never inlined level after level: within a
    small share of the budget either way."""
    for levels in (2, 3, 4):
        with budget.compile_budget(units=3_000_000):
            try:
                json_schema_to_ast(_growing(levels))
            except GrammarError as e:
                assert "recursive $ref" in str(e) or "too complex" in str(e), e
            assert budget.budget_spent() < 1_000_000


def _dependencies(n: int) -> dict:
    """mongodb-atlas-search's shape: n properties, each a ``dependencies`` entry on a ``type``
    enum; the branches of the rewritten dependencies multiply objects (2^n before pruning)."""
    kinds = [f"k{i}" for i in range(n)]
    props = {"type": {"enum": kinds}} | {f"p{i}": {"type": "boolean"} for i in range(n)}
    deps = {f"p{i}": {"properties": {"type": {"enum": kinds[i:i + 5]}}} for i in range(n)}
    return {"type": "object", "additionalProperties": False, "properties": props, "dependencies": deps}


def test_object_work_is_counted() -> None:
    """Each converted object counts per declared pair: the ~1,000 objects of this dependency
    expansion (0.4 s of CPU) exceed 150,000 units (they used to count ~40,000)."""
    with budget.compile_budget(units=150_000):
        with pytest.raises(GrammarError, match="work units"):
            json_schema_to_ast(_dependencies(10), grammar=True)


def test_automaton_memo_hits_are_counted() -> None:
    """Asking for the same automaton again (a memo hit) counts work (template.json asked 10^5
    times, unseen by the budget)."""
    from radixlm.grammar.ast import alt, lit
    from radixlm.grammar.automaton import dfa_from_ast

    node = alt(*(lit(f"value{i}") for i in range(20)))
    dfa_from_ast(node)
    with budget.compile_budget(units=10_000_000):
        for _ in range(100):
            dfa_from_ast(node)
        assert budget.budget_spent() >= 100 * 20


def test_pattern_automata_are_built_once_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pattern's automaton is built once per process (flatpak's patternProperties object, met at
    each level of a deep schema, rebuilt a ~10 ms AST 1,451 times) and its building counts."""
    from radixlm.grammar import json_scalars

    monkeypatch.setattr(json_scalars, "_CONTENT_DFAS", {})
    with budget.compile_budget(units=10_000_000):
        first = json_scalars.content_dfa(r"^[\w\u00e9-\u4e00]+$", True)
        spent = budget.budget_spent()
        assert spent >= 50
        assert json_scalars.content_dfa(r"^[\w\u00e9-\u4e00]+$", True) is first
        assert budget.budget_spent() - spent < 10
    assert first.matches('"ab\\u00e9"') and not first.matches('"a-b"')


LARGE_NOT_PATTERN = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8, "not": {"pattern": "^[a-z]{3,450}$"}},
    "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z0-9]{2,450}$"}}}}


def test_not_pattern_in_a_grammar_is_an_automaton() -> None:
    """``not {pattern}`` in a schema converted as a grammar whose large scalars are leaf rules
    (glazewm): the banned pattern stays an automaton ("rule reference '__leaf0' inside a regular
    expression" before)."""
    json_schema_to_ast(LARGE_NOT_PATTERN, grammar=True)
    vocab = table_vocabularies()[0]
    rows = [("not pattern", LARGE_NOT_PATTERN, [{"name": "ab"}, {"name": "abc1"}, {"tags": ["x1"]}],
             [{"name": "abc"}, {"name": "abcdefgh1"}, {"tags": ["A"]}])]
    check = schema_validator(LARGE_NOT_PATTERN)
    assert all(check.is_valid(v) for v in rows[0][2]) and not any(check.is_valid(v) for v in rows[0][3])
    assert not table_failures(load_compiler(vocab), load_tokenizer(vocab), rows)


def test_not_enum_literals_are_counted() -> None:
    """``not {enum}`` builds a literal per value and an automaton difference: counted (template's
    multiplied conditionals did this 10^5 times unseen by the budget)."""
    schema = {"type": "string", "not": {"enum": [f"v{i}" for i in range(50)]}}
    with budget.compile_budget(units=10_000_000):
        json_schema_to_ast(schema)
        assert budget.budget_spent() >= 20 * 50


def test_retry_skips_the_single_dfa_the_first_try_ran_out_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compile's second try (without sorted key orders) goes straight to the grammar when the
    first try's single DFA ran out of its share (cloudify spent 1.3 s of its 6 s redoing it)."""
    import radixlm.grammar.compiler as compiler_mod

    calls: list[tuple[bool, bool, str]] = []
    real = compiler_mod.json_schema_to_ast

    def spy(*args: Any, **kwargs: Any) -> Any:
        try:
            out = real(*args, **kwargs)
        except GrammarError as e:
            calls.append((bool(kwargs.get("grammar")), compiler_mod.SORTED_ORDERS.get(), str(e)[:20]))
            raise
        calls.append((bool(kwargs.get("grammar")), compiler_mod.SORTED_ORDERS.get(), "ok"))
        return out

    monkeypatch.setattr(compiler_mod, "json_schema_to_ast", spy)
    monkeypatch.setattr(budget, "DEFAULT_UNITS", 60_000)
    schema = {"type": "object", "properties": {f"key{i}": {"type": "string", "maxLength": 3 + i} for i in range(14)}}
    vocab = table_vocabularies()[0]
    try:
        load_compiler(vocab).compile_json_schema(schema)
    except GrammarError:
        pass
    first_dfa = [c for c in calls if not c[0] and c[1]]
    assert first_dfa and first_dfa[0][2].startswith("grammar too"), calls
    assert not [c for c in calls if not c[0] and not c[1]], calls  # NOTE: no single DFA again
