"""Subset construction with embedded DFAs copied in bulk (``grammar/determinize.py``), the
level-at-a-time product (``dfa_ops.product``), and JSON-Schema pairs / scalars compiled as embedded
DFAs (cold states of a nested object stay cold). Every check compares languages exactly: against
the general construction (blocks disabled), and against brute force over short strings."""

from __future__ import annotations

import itertools
import json

import pytest

from radixlm.grammar import automaton
from radixlm.grammar.ast import alt, cat, char, cold, opt, rep
from radixlm.grammar.automaton import dfa_from_ast, regex_to_dfa
from radixlm.grammar.dfa_ops import product
from radixlm.grammar.json_schema import json_schema_to_ast

NUM = ("dfa", regex_to_dfa(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?"))
WORD = ("dfa", regex_to_dfa(r'"[a-c]*"'))
AB = ("dfa", regex_to_dfa(r"(ab|a)*"))
ASTS = {
    "cat": cat(char("["), NUM, char("]")),
    "loop": cat(char("["), opt(cat(NUM, rep(cat(char(","), NUM), 0, None))), char("]")),
    "overlap": cat(NUM, rep(char("1"), 0, 2), opt(WORD)),  # the block's accepting states continue
    "alt of blocks": alt(cat(WORD, char(":"), NUM), cat(NUM, char(":"), WORD), AB),
    "nested": cat(char("{"), ("dfa", dfa_from_ast(cat(WORD, char(":"), NUM))), rep(cat(char(","), AB), 0, 2),
                  char("}")),
    "start in block": cat(AB, opt(char("!"))),
    "cold": cat(WORD, alt(char("."), cold(cat(char(";"), NUM)))),
}


def _general(node: tuple) -> automaton.ByteDFA:
    nfa = automaton._NFA()
    s, e = nfa.build(node)
    return automaton._determinize(nfa, s, e, bulk=False)  # NOTE: every state the general way


def _bulk(node: tuple) -> automaton.ByteDFA:
    nfa = automaton._NFA()
    s, e = nfa.build(node)
    assert nfa.blocks
    return automaton._determinize(nfa, s, e)


def _same_language(a: automaton.ByteDFA, b: automaton.ByteDFA) -> bool:
    return product(a, b, "diff").start == 0 and product(b, a, "diff").start == 0


@pytest.mark.parametrize("name", list(ASTS))
def test_bulk_blocks_keep_the_language(name: str) -> None:
    node = ASTS[name]
    bulk, general = _bulk(node), _general(node)
    assert _same_language(bulk, general)
    assert bulk.n_states == general.n_states
    for n in range(6):
        for text in map("".join, itertools.product('ab1-.,:"[]{}!;', repeat=n)):
            assert bulk.matches(text) == general.matches(text), text


@pytest.mark.parametrize("name", list(ASTS))
def test_bulk_blocks_keep_hot_states(name: str) -> None:
    bulk, general = _bulk(ASTS[name]), _general(ASTS[name])
    assert (bulk.hot is None) == (general.hot is None)
    if bulk.hot is not None:
        assert int(bulk.hot.sum()) == int(general.hot.sum())
        for text in ['"ab"', '"ab".', '"a";', '"a";-1']:
            sb, sg = bulk.step(bulk.start, text.encode()), general.step(general.start, text.encode())
            assert bool(sb) == bool(sg)
            if sb:
                assert bulk.hot[sb] == general.hot[sg], text


PRODUCTS = [
    (r"[a-c]*b[a-c]{2}", r"[ab]*", "and"),
    (r"[a-c]*b[a-c]{2}", r"[ab]*", "diff"),
    (r'"([a-c]|\\u00[0-9a-f]{2})*"', r'"(ab|cab?)"', "diff"),
    (r"(a|bc)*", r"a*(bc)?a*", "and"),
    (r"x*", r"y", "and"),  # empty intersection
]


@pytest.mark.parametrize("a,b,mode", PRODUCTS)
def test_product_table(a: str, b: str, mode: str) -> None:
    da, db = regex_to_dfa(a), regex_to_dfa(b)
    got = product(da, db, mode)
    for n in range(7):
        for text in map("".join, itertools.product('abcxy"\\u0', repeat=n)) if n < 5 else \
                map("".join, itertools.product("abc", repeat=n)):
            want = da.matches(text) and (db.matches(text) if mode == "and" else not db.matches(text))
            assert got.matches(text) == want, text


NESTED = {"type": "object", "properties": {
    "o": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "string"}}, "required": ["x"]},
    "n": {"type": "number"}}, "required": ["o"]}


def test_pairs_as_blocks_keep_cold_states() -> None:
    """A nested object's undeclared keys are cold inside its pair's DFA and stay cold in the
    object around it; its schema-order path stays hot."""
    node, rules = json_schema_to_ast(NESTED)
    assert not rules
    d = dfa_from_ast(node)
    assert d.hot is not None

    def hot(text: str) -> bool:
        s = d.step(d.start, text.encode())
        assert s, text
        return bool(d.hot[s])

    assert hot('{"o": {"x": 1')
    assert hot('{"o": {"x": 1, "y": "a')
    assert not hot('{"o": {"x": 1, "y": "a", "q')  # undeclared key in the nested object
    assert not hot('{"o": {"x": 1}, "n": 2, "z": [')  # undeclared key in the outer object
    assert hot('{"o": {"x": 1}, "n": 2')


@pytest.mark.parametrize("value,ok", [
    ({"o": {"x": 1}}, True), ({"n": 1.5, "o": {"y": "", "x": -2}}, True),
    ({"o": {"x": 1, "z": [1, 2]}, "extra": {"s": [None]}}, True),
    ({"o": {"y": "a"}}, False), ({"o": {"x": "1"}}, False), ({"n": 1}, False),
])
def test_nested_object_table(value: dict, ok: bool) -> None:
    d = dfa_from_ast(json_schema_to_ast(NESTED)[0])
    text = json.dumps(value)
    assert d.matches(text) == ok, text
    assert d.matches(json.dumps(value, separators=(",", ":"))) == ok


def test_duplicate_key_text_is_refused() -> None:
    d = dfa_from_ast(json_schema_to_ast(NESTED)[0])
    assert not d.matches('{"o": {"x": 1, "x": 2}}')
    assert not d.matches('{"o": {"x": 1}, "o": {"x": 1}}')
    assert d.matches('{"o": {"x": 1}}')
    assert not d.matches('{"o": {}}')


CHAIN = r'"([^"\\]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4}){0,40}"'  # a bounded JSON string: a counting chain


@pytest.mark.parametrize("pattern", [CHAIN, r'"([^"\\]|\\u[0-9a-f]{4}){0,30}[a-z]*"'])  # DAG; with a loop
def test_large_blocks_keep_the_language(pattern: str) -> None:
    node = cat(char("["), ("dfa", regex_to_dfa(pattern)), char("]"))
    bulk, general = _bulk(node), _general(node)
    assert _same_language(bulk, general) and bulk.n_states == general.n_states
    for text in ['[""]', '["a\\u00e9b"]', '["' + "x" * 40 + '"]', '["' + "x" * 41 + '"]', '["\\q"]']:
        assert bulk.matches(text) == general.matches(text), text


def test_chain_copies_numbered_alike_from_the_first() -> None:
    # NOTE: bulk copies follow layers (determinize._layered): every copy of the chain has the same
    # rows relative to its first state, the first copy included (shift classes rely on it)
    dfa = _bulk(cat(char("["), ("dfa", regex_to_dfa(CHAIN)), char("]")))
    s = dfa.step(dfa.start, b'["')
    firsts = [s]
    for _ in range(30):
        s = dfa.step(s, b"a")
        firsts.append(s)
    step = firsts[1] - firsts[0]
    assert all(b - a == step for a, b in zip(firsts, firsts[1:]))

    def rel(q: int) -> list[tuple[int, int]]:
        return [(b, int(t) - q if t else -1) for b, t in enumerate(dfa.trans[q]) if b != ord('"')]

    for q in firsts[1:25]:
        for k in range(step):
            assert rel(firsts[0] + k) == rel(q + k), (q, k)
