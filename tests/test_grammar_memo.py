"""The per-process automaton memo (``automaton.dfa_from_ast``): shared sub-automata are exact, a
whole grammar is not kept in it, and a cached automaton never stands for another schema."""

from __future__ import annotations

import json

import numpy as np

from radixlm.grammar import automaton
from radixlm.grammar.automaton import dfa_from_ast
from radixlm.grammar.json_schema import json_schema_to_ast


def _schema(key: str, values: list[str]) -> dict:
    return {"type": "object", "properties": {key: {"enum": values}, "n": {"type": "integer", "minimum": 0}},
            "required": [key]}


def test_memoized_automaton_equals_a_fresh_build() -> None:
    node, _ = json_schema_to_ast(_schema("colour", ["red", "green"]))
    first = dfa_from_ast(node)
    assert dfa_from_ast(node) is first  # NOTE: memo hit
    fresh = dfa_from_ast(node, memo=False)
    assert fresh is not first
    assert np.array_equal(fresh.trans, first.trans) and np.array_equal(fresh.accept, first.accept)
    assert fresh.start == first.start


def test_whole_grammar_is_not_memoized() -> None:
    node, _ = json_schema_to_ast(_schema("size", ["s", "m", "l"]))
    before = len(automaton._MEMO)
    got = dfa_from_ast(node, memo=False)
    assert len(automaton._MEMO) == before
    assert all(d is not got for d in automaton._MEMO.values())


def test_memo_never_answers_for_another_schema() -> None:
    schemas = [_schema("colour", ["red", "green"]), _schema("color", ["red", "green"]),
               _schema("colour", ["red", "blue"])]
    dfas = []
    for s in schemas:
        node, _ = json_schema_to_ast(s)
        dfas.append(dfa_from_ast(node))
        dfas.append(dfa_from_ast(node))  # NOTE: second build from the memo
    texts = [json.dumps({"colour": "green", "n": 3}), json.dumps({"color": "green", "n": 3}),
             json.dumps({"colour": "blue"})]
    table = [[d.matches(t) for t in texts] for d in dfas]
    assert table == [[True, False, False], [True, False, False],
                     [False, True, False], [False, True, False],
                     [False, False, True], [False, False, True]]
