"""dfa_ops.difference_finite: the same language (and size) as the general product difference."""

from __future__ import annotations

import json
import random

import pytest

from radixlm.grammar.automaton import dfa_from_ast, regex_to_dfa
from radixlm.grammar.dfa_ops import difference_finite, product, union
from radixlm.grammar.json_containers import _any_key
from radixlm.grammar.json_lexical import string_literal

ALPHABET = ["a", "b", "n", '"', "\\", "é", "\u0001", "/", "ü", "日", "😀"]


def _same_language(x, y) -> bool:
    return not product(x, y, "diff").start and not product(y, x, "diff").start


@pytest.mark.parametrize("seed", range(6))
def test_undeclared_keys_match_the_product(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(25):
        keys = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 5))) for _ in range(rng.randint(1, 6))]
        declared = union([dfa_from_ast(string_literal(k)) for k in keys])
        got = difference_finite(_any_key(), declared)
        ref = product(_any_key(), declared, "diff")
        assert _same_language(got, ref), keys
        assert got.n_states == ref.n_states  # NOTE: no unreachable state kept
        for k in keys:
            assert not got.matches(json.dumps(k))


def test_regex_minus_words() -> None:
    a = regex_to_dfa("[a-c]{0,4}x?")
    b = union([regex_to_dfa(w) for w in ("", "ab", "abcx", "ccc")])
    got = difference_finite(a, b)
    assert _same_language(got, product(a, b, "diff"))
    assert not got.matches("ab") and got.matches("abc") and not got.matches("")


def test_infinite_language_is_refused() -> None:
    with pytest.raises(ValueError):
        difference_finite(_any_key(), regex_to_dfa("a+"))


def test_dead_end_next_to_an_embedded_dfa() -> None:
    """A byte leading into an empty language (a dead end) in an automaton that embeds a DFA: the
    target is an empty state set, never a block group (was a StopIteration)."""
    block = ("dfa", regex_to_dfa("x+"))
    node = ("alt", (("cat", (block, ("set", ((97, 97),)), ("alt", ()))), ("cat", (block, ("set", ((98, 98),))))))
    d = dfa_from_ast(node)
    assert d.matches("xxb") and not d.matches("xxa") and not d.matches("xa")
    assert d.step(d.start, b"xa") == 0  # NOTE: a dead end is not a valid prefix


def test_schema_whose_branches_narrow_to_nothing_compiles() -> None:
    """MaskBench Github_trivial---o25731 (oneOf branches differing in an enum): was a
    StopIteration out of the determinizer."""
    item = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string", "minLength": 1},
                                                                    "sum": {"type": "string", "pattern": "^[a-f0-9]+$"}}}
    schema = {"type": "object", "required": ["_elements"], "oneOf": [
        {"properties": {"_attributes": {"type": "object", "required": ["ps"], "properties": {"ps": {"enum": [v]}}},
                        "_elements": {"type": "array", "items": item}}} for v in ("rpm", "dpkg")]}
    from radixlm.grammar.json_schema import json_schema_to_ast

    node, rules = json_schema_to_ast(schema)
    d = dfa_from_ast(node)
    assert d.matches(json.dumps({"_attributes": {"ps": "rpm"}, "_elements": [{"name": "a", "sum": "ff"}]}))
    assert not d.matches(json.dumps({"_attributes": {"ps": "rpm"}, "_elements": [{"name": ""}]}))
    assert not d.matches(json.dumps({"_elements": []}))  # NOTE: both branches match: not oneOf
