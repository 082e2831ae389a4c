"""JSON Schema -> grammar: a feature table of accepted / rejected serializations, whitespace
modes, recursion, unsupported keywords (issue 4, deliverable 3). String level: no tokenizer."""

from __future__ import annotations

import json

import pytest

from radixlm.grammar import GrammarError
from radixlm.grammar.automaton import dfa_from_ast
from radixlm.grammar.cfg import lower
from radixlm.grammar.earley import Chart
from radixlm.grammar.json_schema import json_schema_to_ast


class _Recognizer:
    """String-level acceptance through either engine path (DFA, or Earley over terminal DFAs)."""

    def __init__(self, schema: dict, any_whitespace: bool = False) -> None:
        node, rules = json_schema_to_ast(schema, any_whitespace)
        self.dfa = None if rules else dfa_from_ast(node)
        if rules:
            self.cfg = lower(node, rules)
            self.chart = Chart(self.cfg)

    def __call__(self, text: str) -> bool:
        data = text.encode()
        if self.dfa is not None:
            return self.dfa.matches(data)
        threads = {(0, t, self.cfg.terminals[t].start) for t in self.chart.scan_terms[0]}
        accepting = self.chart.accepting[0]
        for b in data:
            nxt, accepting = set(), False
            for col, t, q in threads:
                q2 = self.cfg.terminals[t].rows[q][b]
                if not q2:
                    continue
                nxt.add((col, t, q2))
                if self.cfg.terminals[t].accept[q2]:
                    c2 = self.chart.advance(col, t)
                    if c2 is not None:
                        accepting |= self.chart.accepting[c2]
                        nxt |= {(c2, t2, self.cfg.terminals[t2].start) for t2 in self.chart.scan_terms[c2]}
            threads = nxt
        return accepting


class R(str):
    """A raw text (not a JSON value to serialize)."""


OBJ = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
       "required": ["name"]}
TREE = {"$defs": {"node": {"type": "object", "properties": {
    "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
    "required": ["v"]}}, "$ref": "#/$defs/node"}

# (feature, schema, accepted JSON values or raw texts, rejected ones)
CASES = [
    ("null/boolean", {"type": ["null", "boolean"]}, [None, True, False], [0, "true"]),
    ("integer", {"type": "integer"}, [0, -7, 123456789012], [1.5, "1", R("01")]),
    ("number", {"type": "number"}, [0, -1.5, 1e-05, 2.5e+20, 3], [R("-"), R("1."), R("01")]),
    ("integer bounds", {"type": "integer", "minimum": -3, "exclusiveMaximum": 10}, [-3, 0, 9], [-4, 10, 100]),
    ("number bounds", {"type": "number", "minimum": 0.5, "maximum": 2}, [0.5, 1, 1.999, 2, 2.0], [0.49, 2.01, -1]),
    ("draft4 exclusive", {"type": "number", "minimum": 0, "exclusiveMinimum": True}, [0.1, 3], [0, -1]),
    ("multipleOf", {"type": "number", "multipleOf": 0.25}, [0.5, 1.25, -2, 3.0], [0.3, 1.1]),
    ("string", {"type": "string"}, ["", "a\"b\\c\n", "é😀"], [1, None]),
    ("string length", {"type": "string", "minLength": 2, "maxLength": 3}, ["ab", "abc", "é😀"], ["a", "abcd"]),
    ("pattern (search)", {"type": "string", "pattern": "[0-9]{3}"}, ["x123y", "123"], ["12", "a1b2"]),
    ("pattern (anchored)", {"type": "string", "pattern": "^[a-z]+$"}, ["abc"], ["ab1", "A", ""]),
    ("pattern + length", {"type": "string", "pattern": "^a", "maxLength": 2}, ["a", "ab"], ["abc", "b"]),
    ("format date-time", {"type": "string", "format": "date-time"}, ["2024-01-31T12:00:00Z", "2024-01-31T12:00:00.5+01:00"],
     ["2024-01-31 12:00:00", "2024-13-01T00:00:00Z"]),
    ("format date / uuid", {"type": "array", "prefixItems": [{"format": "date"}, {"format": "uuid"}], "items": False},
     [["2020-02-29", "123e4567-e89b-12d3-a456-426614174000"]], [["2020-2-29", "123e4567-e89b-12d3-a456-42661417400"]]),
    ("format email", {"type": "string", "format": "email"}, ["a.b@c.org"], ["not an email"]),
    ("enum", {"enum": ["a", 1, None, [1, 2], {"k": "v"}]}, ["a", 1, None, [1, 2], {"k": "v"}], ["b", 2, [2, 1]]),
    ("const", {"const": "é"}, ["é"], ["e"]),
    ("enum filtered by type", {"type": "string", "enum": ["a", 1]}, ["a"], [1]),
    ("object required/optional", OBJ, [{"name": "x"}, {"name": "x", "age": 3}], [{"age": 3}, {"name": 1}]),
    ("any property order", OBJ, [{"name": "x", "age": 3}, {"age": 3, "name": "x"}],
     [{"age": 3}, R('{"age": 3, "name": "x", "age": 3}'), R('{"age": 3, "age": 3, "name": "x"}')]),
    ("additionalProperties false", {**OBJ, "additionalProperties": False}, [{"name": "x"}], [{"name": "x", "z": 1}]),
    ("additionalProperties schema", {**OBJ, "additionalProperties": {"type": "integer"}},
     [{"name": "x", "z": 1, "w": 2}], [{"name": "x", "z": "s"}, R('{"name": "x", "name": "y"}')]),
    ("undeclared keys by default", OBJ, [{"name": "x"}, {"name": "x", "extra": 1}],
     [{"extra": 1}, {"name": "x", "extra": 1, "age": "y"}, R('{"name": "x", "name": 1}')]),
    ("free-form object", {"type": "object"}, [{}, {"a": [1, {"b": None}]}], [[], "x"]),
    ("min/maxProperties", {"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "minProperties": 1, "maxProperties": 2},
     [{"a": 1}, {"b": 1, "c": 2}], [{}, {"a": 1, "b": 2, "c": 3}]),
    ("array items/bounds", {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
     [[1], [1, 2, 3]], [[], [1, 2, 3, 4], ["a"]]),
    ("array of objects maxItems", {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "integer"}}},
                                   "maxItems": 2}, [[{"a": 1}, {}], []], [[{}, {}, {}], [{"a": 1}, {"a": 2}, {"a": 3}]]),
    ("calendar dates", {"type": "string", "format": "date"}, ["2024-02-29", "2000-02-29", "2023-04-30"],
     ["2023-02-29", "1900-02-29", "2023-04-31", "2023-02-30"]),
    ("prefixItems", {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
     [["a", 1], ["a"], []], [["a", 1, 2], [1, "a"]]),
    ("tuple items (draft 7)", {"type": "array", "items": [{"type": "string"}], "additionalItems": {"type": "integer"}},
     [["a", 1, 2]], [["a", "b"]]),
    ("anyOf", {"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 5}]}, ["s", 5], [4, None]),
    ("oneOf disjoint", {"oneOf": [{"type": "string"}, {"type": "null"}]}, ["s", None], [1]),
    ("oneOf of combinators disjoint branch by branch", {"oneOf": [
        {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}]},
        {"anyOf": [{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}, {"type": "null"}]}]},
     ["s", [1, 2], {"x": 1}, None], [1, {"y": 1}, ["s"], True]),
    ("oneOf of objects whose allowed keys are disjoint", {"oneOf": [
        {"type": "object", "patternProperties": {"^[0-9]+x$": {"type": "string"}}, "additionalProperties": False,
         "minProperties": 1},
        {"type": "object", "patternProperties": {"^[a-z]+$": {"type": "string"}}, "additionalProperties": False,
         "minProperties": 1, "not": {"required": ["ios"]}}]},
     [{"2x": "a"}, {"ab": "c", "d": "e"}, {"15x": "a", "3x": "b"}], [{}, {"2x": "a", "ab": "c"}, {"A": "b"}, {"ios": "a"},
                                                                     {"2x": 1}]),
    ("allOf merge", {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                               {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
     [{"a": 1, "b": "x"}], [{"a": 1}, {"b": "x"}]),
    ("anyOf with siblings", {"type": "object", "properties": {"a": {}, "b": {}},
                             "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}, [{"a": 1}, {"b": 2}], [{}]),
    ("$ref / definitions", {"definitions": {"p": {"type": "integer"}}, "type": "array", "items": {"$ref": "#/definitions/p"}},
     [[1, 2]], [["a"]]),
    ("recursive $ref", TREE, [{"v": 1}, {"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 3}]}], [{"v": 1, "kids": [{}]}]),
    ("any value", {"type": "object", "properties": {"x": {}}, "required": ["x"]},
     [{"x": [1, {"y": [None, "z"]}]}, {"x": "s"}], [R('{"x": }'), R('{"x": [1,]}')]),
    ("not type", {"not": {"type": "string"}, "type": ["string", "integer"]}, [1], ["s"]),
    ("not enum", {"type": "string", "not": {"enum": ["a"]}}, ["b", "aa"], ["a"]),
    ("boolean schemas", {"type": "object", "properties": {"a": True, "b": False}}, [{"a": 1}, {}], [{"b": 1}]),
]


@pytest.mark.parametrize("name,schema,good,bad", CASES, ids=[c[0] for c in CASES])
def test_schema_features(name: str, schema: dict, good: list, bad: list) -> None:
    accepts = _Recognizer(schema)
    for v in good:
        texts = [v] if isinstance(v, R) else [json.dumps(v), json.dumps(v, separators=(",", ":")),
                                               json.dumps(v, ensure_ascii=False)]
        for text in texts:
            assert accepts(text), (name, text)
    for v in bad:
        text = v if isinstance(v, R) else json.dumps(v)
        assert not accepts(text), (name, text)


def test_whitespace_modes() -> None:
    value = {"a": [1, 2], "b": {"c": None}}
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}},
              "b": {"type": "object", "properties": {"c": {"type": "null"}}}}}
    strict, loose = _Recognizer(schema), _Recognizer(schema, any_whitespace=True)
    assert strict(json.dumps(value)) and strict(json.dumps(value, separators=(",", ":")))
    assert not strict(json.dumps(value, indent=2))
    assert not strict('{"a": [1,  2]}')
    assert loose(json.dumps(value, indent=2)) and loose('{ "a" : [ 1 ,2 ] }')
    assert not loose('{"a": [1,' + " " * 100 + "2]}")  # bounded


@pytest.mark.parametrize("schema,keyword", [
    ({"type": "array", "contains": {"multipleOf": 2}, "maxContains": 2}, "not"),  # maxContains needs not contains
    ({"$recursiveRef": "#"}, "recursiveRef"),
    ({"$dynamicRef": "#meta"}, "dynamicRef"),
    ({"not": {"multipleOf": 2}}, "not"),
    ({"$ref": "http://example.com/s.json"}, "\\$ref"),
    ({"type": "string", "minLength": 100000}, "minLength"),
])
def test_unsupported_keywords_are_named(schema: dict, keyword: str) -> None:
    with pytest.raises(GrammarError, match=keyword):
        json_schema_to_ast(schema)


def test_invalid_schema_text() -> None:
    with pytest.raises(GrammarError, match="not valid JSON"):
        json_schema_to_ast("{oops")


def test_implicit_additional_properties(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unspecified additionalProperties allows undeclared keys (with values nested at most
    EXTRA_DEPTH_ROOT levels in the outermost object); never a declared key twice or with a wrong value. RADIXLM_JSON_EXTRAS=0
    (``IMPLICIT_EXTRAS`` False) is the strict mode: no undeclared key."""
    from radixlm.grammar import json_containers

    rec = _Recognizer(OBJ)
    for value in [{"name": "x"}, {"name": "x", "extra": 1}, {"name": "x", "age": 1, "x": [1, {}], "y": {"z": "w"}},
                  {"name": "x", "nam": 1, "names": 2, "ag": 3}, {"age": 2, "name": "x", "e": None}]:
        assert rec(json.dumps(value)), value
    for value in [{"extra": 1}, {"name": "x", "age": "y"}, {"name": "x", "name ": 1, "age": "y"},
                  {"name": "x", "x": [[[[[1]]]]]}, {"extra": 1, "age": 1}]:
        assert not rec(json.dumps(value)), value
    assert not rec('{"name": "x", "name": "y"}')
    assert not rec('{"x": 1, "name": "x", "name": "y"}')
    monkeypatch.setattr(json_containers, "IMPLICIT_EXTRAS", False)
    strict = _Recognizer({**OBJ, "title": "strict"})
    assert strict(json.dumps({"name": "x", "age": 2}))
    assert not strict(json.dumps({"name": "x", "extra": 1}))


def test_schema_too_large_for_one_automaton_compiles_as_a_grammar() -> None:
    """Twenty long-``maxLength`` strings are over 100,000 DFA states as one automaton: the schema
    compiles as a grammar (the Earley engine; each long string one shared rule), token by token
    on the default model's vocabulary."""
    from radixlm.grammar import GrammarMatcher
    from radixlm.grammar.earley_engine import EarleyEngine
    from radixlm.grammar.maskbench import DEFAULT_TOKENIZER, encode_exact, load_compiler, load_tokenizer

    props = {f"field{i}": {"type": ["string", "null"], "maxLength": 4096} for i in range(20)}
    schema = {"type": "object", "properties": props | {"n": {"type": "integer"}}, "required": ["field3", "n"],
              "additionalProperties": False}
    comp, tok = load_compiler(DEFAULT_TOKENIZER), load_tokenizer(DEFAULT_TOKENIZER)
    compiled = comp.compile_json_schema(schema)
    assert isinstance(compiled.engine, EarleyEngine)
    info = compiled.tokenizer_info

    def accepted(text: str) -> bool:
        m = GrammarMatcher(compiled)
        return all(m.accept_token(t) for t in encode_exact(tok, info, text) + [info.stop_token_ids[0]]) \
            and m.is_terminated()

    good = [{"field3": "x" * 300, "n": 1}, {"field0": None, "field3": "é", "field7": "", "n": -2},
            {"field3": "a", "n": 5, "field0": None, "field1": "b"}]
    bad = [{"field3": "x", "n": "1"}, {"field0": "a", "n": 1}, {"field3": "x", "n": 1, "zz": 1},
           {"field3": 1, "n": 1}]
    for v in good:
        assert accepted(json.dumps(v)), v
    for v in bad:
        assert not accepted(json.dumps(v)), v
    assert not accepted('{"field3": "x", "n": 1, "field3": "y"}')


def test_pattern_with_a_long_max_length_lowers_the_bound() -> None:
    """A large pattern automaton times a long ``maxLength`` counter is too many product states:
    the bound is lowered (sound: longer strings are rejected, never an invalid one accepted)."""
    from radixlm.grammar import json_scalars

    pattern = "^[^@^\\s]+@[^@^\\.^\\s]+(\\.[^@^\\.^\\s]*)*.gov.uk"
    accepts = _Recognizer({"type": "string", "minLength": 5, "maxLength": 254, "pattern": pattern})
    assert accepts(json.dumps("someone@agency.gov.uk")) and accepts(json.dumps("a@b.c.d.gov.uk-x"))
    for bad in ("someone@agency.gov.us", "a@b", "@agency.gov.uk", "x" * 300 + "@agency.gov.uk"):
        assert not accepts(json.dumps(bad)), bad
    assert not accepts(json.dumps("a" * json_scalars.MAX_COUNTED + "@b.gov.uk"))
