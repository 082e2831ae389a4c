"""Schemas reduced from what the full-corpus compile sweep (``benchmarks/grammar_sweep.py``) found
(issue 12): each compiles within the budget and, token by token on the default model's vocabulary
(and ``llama-spm`` when ``$RADIXLM_SHARED_DATA`` has it), accepts its valid instances and refuses
its invalid ones. The table is checked against ``jsonschema``."""

from __future__ import annotations

from typing import Any

from radixlm.grammar.testing import schema_table_tests

# MaskBench Github_easy---o78062, reduced: a oneOf whose branches share a required long string
# ("name", up to 500 characters: once the disjointness check intersected two such counters and
# ran out of budget), reached through allOf [$ref to an allOf, properties] (the referenced
# allOf was flattened after the later branch, so "name" had to come after "description").
NAMED = {"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 500}},
         "required": ["name"]}
COMPETENCY = {"definitions": {
    "named": NAMED,
    "competency": {"allOf": [{"$ref": "#/definitions/named"}, {"oneOf": [
        {"properties": {"kids": {"type": "array", "items": {"type": "integer"}}}, "required": ["kids"]},
        {"properties": {"abilities": {"type": "array", "items": {"type": "string"}}}, "required": ["abilities"]}]}]}},
    "allOf": [{"$ref": "#/definitions/competency"},
              {"properties": {"description": {"type": "string", "minLength": 1}}, "required": ["description"]}]}

# MaskBench Github_trivial---o25751, reduced: oneOf branches told apart only by an optional
# property whose values are disjoint; the negation of a whole branch expanded past the budget.
def _repo(system: str, item: dict) -> dict:
    return {"properties": {"_attributes": {"type": "object", "required": ["system"],
                                           "properties": {"system": {"enum": [system]}}},
                           "_elements": {"type": "array", "items": item}}}


REPOS = {"type": "object", "required": ["_elements"], "oneOf": [
    _repo("zypp", {"type": "object", "required": ["alias", "url"], "properties": {
        "alias": {"type": "string", "minLength": 1}, "url": {"type": "string"}, "priority": {"type": "integer"}}}),
    _repo("yum", {"type": "object", "required": ["alias", "url"], "properties": {
        "alias": {"type": "string", "minLength": 1}, "url": {"type": "array", "items": {"type": "string"}}}}),
    _repo("apt", {"type": "object", "required": ["url", "components"], "properties": {
        "url": {"type": "string"}, "components": {"type": "array", "items": {"type": "string"}}}})]}

# MaskBench Github_easy---o35866, reduced: ``not {type: string, enum}`` on an untyped property of a
# recursive schema: any JSON value (a rule) minus a few strings.
NOT_IN_GRAMMAR = {"$defs": {"t": {"type": "object", "properties": {
    "kids": {"type": "array", "items": {"$ref": "#/$defs/t"}},
    "country": {"not": {"type": "string", "enum": ["CAN", "USA"]}}}}}, "$ref": "#/$defs/t"}

# (name, schema, valid instances, invalid instances)
CASES: list[tuple[str, Any, list, list]] = [
    ("allOf through $ref keeps property order; oneOf of long strings", COMPETENCY,
     [{"name": "n", "description": "d", "kids": [1]}, {"name": "n", "description": "d", "abilities": ["a"]}],
     [{"name": "n", "description": "d"}, {"name": "n", "description": "d", "kids": [1], "abilities": []},
      {"name": "", "description": "d", "kids": []}, {"name": "n" * 501, "description": "d", "kids": []}]),
    ("oneOf told apart by an optional property", REPOS,
     [{"_attributes": {"system": "zypp"}, "_elements": [{"alias": "a", "url": "u", "priority": 1}]},
      {"_attributes": {"system": "yum"}, "_elements": [{"alias": "a", "url": ["u"]}]},
      {"_attributes": {"system": "apt"}, "_elements": []}],
     [{"_attributes": {"system": "zypp"}, "_elements": [{"alias": "", "url": "u"}]},
      {"_attributes": {"system": "yum"}, "_elements": [{"alias": "a", "url": "u"}]},
      {"_attributes": {"system": "dnf"}, "_elements": []}, {"_elements": []}]),
    ("not enum on any value, in a grammar", NOT_IN_GRAMMAR,
     [{"country": "MEX"}, {"country": 1}, {"country": ["CAN"]}, {"country": {"a": "USA"}}, {"kids": [{"country": None}]},
      {"country": "CANADA"}],
     [{"country": "CAN"}, {"kids": [{"country": "USA"}]}]),
    ("not enum of numbers beside an enum", {"allOf": [{"enum": [5, 2, 2.5, "a", [1]]}, {"not": {"enum": [2, [1]]}},
                                                      {"not": {"type": "string"}}]},
     [5, 2.5], [2, 2.0, "a", [1], 3]),
    ("oneOf of strings: lengths disjoint", {"oneOf": [{"type": "string", "maxLength": 300},
                                                      {"type": "string", "minLength": 301, "maxLength": 400}]},
     ["", "x" * 300, "y" * 301], ["z" * 401, 1]),
    ("oneOf of strings: lengths overlap", {"oneOf": [{"type": "string", "maxLength": 300},
                                                     {"type": "string", "minLength": 200}]},
     ["", "x" * 199], ["x" * 200, "x" * 300]),
]


test_table_agrees_with_jsonschema, test_sweep_cases_token_by_token = schema_table_tests(CASES)


def test_not_pattern_on_a_long_string_rule() -> None:
    """MaskBench Github_easy---o1327, reduced: in a grammar compiled for its size, a long string is
    a rule of its own; ``not pattern`` subtracts from that rule's automaton (it was a GrammarError
    "rule reference inside a regular expression")."""
    from radixlm.grammar.json_schema import json_schema_to_ast

    schema = {"type": "object", "properties": {"org": {"type": "string", "maxLength": 500, "not": {"pattern": "[^a-z ]"}}}}
    root, rules = json_schema_to_ast(schema, grammar=True)
    from radixlm.grammar.cfg import lower

    cfg = lower(root, rules)
    assert all(name != "__leaf0" for name in cfg.nt_names)  # the unfiltered string: unused, not lowered
    body = rules[[n for n in cfg.nt_names if n.startswith("__leaf")][0]]
    assert body[0] == "dfa"
    dfa = body[1]
    assert dfa.matches('"ab c"') and not dfa.matches('"aB"') and not dfa.matches('"' + "a" * 501 + '"')
