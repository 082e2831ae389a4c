"""Key orders of objects too large for their relaxed copies in one regex (SchemaStore coverage,
issue 12): accept/reject rows walked token by token on real vocabularies (``schema_table_tests``),
schemas written here. Valid rows once rejected (keys sorted as ``sort_keys`` writes them, the
object's pairs too large for a sorted copy in a single DFA); invalid rows keep the conversion
sound."""

from __future__ import annotations

from typing import Any

from radixlm.grammar.json_schema import json_schema_to_ast
from radixlm.grammar.testing import schema_table_tests

# an object whose pairs carry objects large enough that a sorted copy does not fit one DFA
_INNER = {"type": "object", "properties": {f"f{i}": {"type": "string", "maxLength": 24} for i in range(8)},
          "additionalProperties": False}
LARGE_PAIRS = {"type": "object", "required": ["zeta"], "properties": {
    "zeta": _INNER, "alpha": _INNER, "mid": {"type": "integer"}, "beta": _INNER, "gamma": {"type": "boolean"}}}

# (name, schema, valid instances, invalid instances)
CASES: list[tuple[str, Any, list, list]] = [
    ("sorted keys of an object with large pairs (converted as a grammar)", LARGE_PAIRS,
     [{"alpha": {"f1": "a"}, "beta": {}, "gamma": True, "zeta": {"f0": "x", "f7": "y"}},
      {"alpha": {}, "zeta": {}}, {"zeta": {}, "alpha": {}, "mid": 3}, {"beta": {}, "mid": 1, "zeta": {"f2": ""}}],
     [{"alpha": {}, "beta": {}}, {"alpha": {"f1": 3}, "zeta": {}}, {"alpha": {}, "zeta": {"g": "x"}},
      {"beta": {}, "mid": 1.5, "zeta": {}}, {"zeta": {"f0": "x" * 25}}, []]),
]

test_table_agrees_with_jsonschema, test_table_token_by_token = schema_table_tests(CASES)


def test_large_pairs_convert_as_a_grammar() -> None:
    """The object's sorted copy fits only with its large pairs as rules: a grammar, not a regex."""
    _, rules = json_schema_to_ast(LARGE_PAIRS)
    assert rules
