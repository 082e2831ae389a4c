"""An object with ``minProperties`` counts its properties only up to that bound (partial-mypy:
one fragment per position and count, cubic). A grammar's large ref-free piece with ``share`` fragments is lowered structurally
(partial-mypy: an array of objects of 50 optional properties in schema order, compiled as a
grammar, was one terminal whose DFA carried a trie of every key still allowed at each position:
over 100k states, out of budget). Each position is a nonterminal now; the language is unchanged."""

from __future__ import annotations

import time

from radixlm.grammar.maskbench import load_compiler, table_vocabularies
from radixlm.grammar.testing import schema_table_tests

CPU_BOUND_S = 8.0
NAMES = [f"{'zyxwvutsrq'[i % 10]}{'_option_value' * (1 + i % 2)}_{i:02d}" for i in range(60)]  # not sorted
OPTIONS = {"type": "object", "additionalProperties": False, "required": ["module"], "minProperties": 2,
           "properties": {"module": {"type": "string", "maxLength": 20},
                          **{k: ({"type": "boolean"} if i % 3 else {"enum": ["normal", "skip", "error"]})
                             for i, k in enumerate(NAMES)}}}
SCHEMA = {"type": "object", "properties": {"plugins": {}, "overrides": {"type": "array", "items": OPTIONS}},
          "additionalProperties": False}

CASES = [
    ("array of objects with 60 optional properties in order", SCHEMA,
     [{}, {"overrides": []}, {"plugins": [1, {"a": None}], "overrides": [{"module": "m", NAMES[7]: False}]},
      {"overrides": [{"module": "a", NAMES[1]: True, NAMES[3]: "skip", NAMES[59]: False},
                     {"module": "b", **{k: (True if i % 3 else "error") for i, k in enumerate(NAMES)}}]}],
     [{"overrides": [{}]}, {"overrides": [{"module": "m"}]}, {"overrides": [{"module": "a", NAMES[1]: "skip"}]},
      {"overrides": [{"module": "a", NAMES[0]: "loud"}]}, {"overrides": [{"module": "a", "other": 1}]},
      {"overrides": {"module": "a"}}, {"extra": 1}]),
]

test_table_agrees_with_jsonschema, test_split_token_by_token = schema_table_tests(CASES)


def test_many_optional_properties_compile_within_bound() -> None:
    comp = load_compiler(table_vocabularies()[0])
    fresh = type(comp)(comp.tokenizer_info)
    start = time.process_time()
    fresh.compile_json_schema(SCHEMA)
    assert time.process_time() - start < CPU_BOUND_S
