"""JSON Schema objects in general (issue 12): properties in any order, undeclared properties when
``additionalProperties`` is absent, the bounds that keep both sound and small; cold branches (masks
on first visit), differential masks and DFA minimization (exact); the ``uri-template`` format.
Accept / reject tables are string level on tiny synthetic schemas; the token-level checks use the
default model's vocabulary (and GPT-2's when the shared data is present)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from radixlm.grammar import GrammarMatcher, allocate_token_bitmask
from radixlm.grammar import json_containers, token_index
from radixlm.grammar.automaton import dfa_from_ast, regex_ast
from radixlm.grammar.bitmask import unpack_bitmask
from radixlm.grammar.dfa_ops import minimize, product
from radixlm.grammar.maskbench import encode_exact, load_compiler, load_tokenizer
from radixlm.grammar.token_index import DfaIndex, RegionCache
from tests.test_grammar_json_schema import R, _Recognizer
from tests.test_grammar_tokens import BPE

S, I = {"type": "string"}, {"type": "integer"}
THREE = {"type": "object", "properties": {"a": S, "b": I, "c": {"type": "boolean"}}, "required": ["a", "b"]}
CASES = [
    # name, schema, valid instances, invalid instances (each also checked with compact separators)
    ("any order, required", THREE,
     [{"a": "x", "b": 1}, {"b": 1, "a": "x"}, {"c": True, "b": 1, "a": "x"}, {"b": 1, "c": False, "a": ""}],
     [{"b": 1}, {"a": "x", "c": True}, {"b": "1", "a": "x"}, R('{"b": 1, "a": "x", "b": 2}'),
      R('{"a": "x", "b": 1, "c": true, "c": true}')]),
    ("extras after the declared ones", THREE,
     [{"b": 1, "a": "x", "zz": [1, "q"]}, {"a": "x", "b": 2, "c": True, "d": {"e": None}, "f": 1.5}],
     [{"a": "x", "b": 1, "c": 1}, R('{"a": "x", "b": 1, "a ": 1, "b": 2}'), R('{"a": "x", "b": 1, "b": 1}'),
      R('{"a": "x", "b": 1, "c": true, "\\u0063": 1}')]),
    ("additionalProperties false: no extras, any order", {**THREE, "additionalProperties": False},
     [{"b": 1, "a": "x"}], [{"a": "x", "b": 1, "d": 1}]),
    ("additionalProperties schema", {**THREE, "additionalProperties": I},
     [{"b": 1, "a": "x", "d": 4}], [{"a": "x", "b": 1, "d": "4"}]),
    ("maxProperties counts extras", {**THREE, "maxProperties": 3},
     [{"b": 1, "a": "x", "d": 4}, {"c": True, "a": "x", "b": 1}], [{"a": "x", "b": 1, "c": True, "d": 4}]),
    ("minProperties with extras", {**THREE, "minProperties": 3},
     [{"b": 1, "a": "x", "d": 4}], [{"b": 1, "a": "x"}]),
    ("nested objects in any order", {"type": "object", "properties": {"p": THREE, "q": I}, "required": ["p", "q"]},
     [{"q": 1, "p": {"b": 2, "a": "x"}}], [{"q": 1, "p": {"b": 2}}, {"p": {"a": "x", "b": 2}}]),
    ("patternProperties in any order", {"type": "object", "properties": {"a": S, "b": I},
                                        "patternProperties": {"^x": I}, "additionalProperties": False},
     [{"b": 1, "a": "s", "x1": 2}], [{"b": 1, "x1": "s"}, {"b": 1, "y": 2}]),
]


@pytest.mark.parametrize("name,schema,good,bad", CASES, ids=[c[0] for c in CASES])
def test_object_table(name: str, schema: dict, good: list, bad: list) -> None:
    accepts = _Recognizer(schema)
    for v in good:
        for text in (json.dumps(v), json.dumps(v, separators=(",", ":"))):
            assert accepts(text), (name, text)
    for v in bad:
        text = v if isinstance(v, R) else json.dumps(v)
        assert not accepts(text), (name, text)


SIX = {"type": "object", "properties": {"a": S, "b": I, "c": S, "d": {"type": "null"}, "e": I, "f": {"type": "boolean"}},
       "required": ["e", "b", "c"]}
FOUR = {"type": "object", "properties": {"a": S, "b": I, "c": {"type": "boolean"}, "d": {"type": "null"}},
        "required": ["b", "d"]}
MORE_CASES = [
    ("four properties in any order", FOUR,
     [{"d": None, "b": 1}, {"c": True, "d": None, "a": "x", "b": 2}, {"b": 1, "d": None, "a": ""}],
     [{"a": "x", "b": 1}, {"d": None, "c": True}, R('{"d": null, "b": 1, "d": null}'),
      R('{"c": true, "b": 1, "c": false, "d": null}'), {"d": 1, "b": 1}]),
    ("two large values in any order", {"type": "object", "required": ["p", "q"], "properties": {
        "p": THREE, "q": {"type": "array", "items": THREE}}},
     [{"q": [{"b": 1, "a": "x"}], "p": {"a": "y", "b": 2}}],
     [{"q": [{"b": 1}], "p": {"a": "y", "b": 2}}, {"q": [], "p": {"a": "y"}}]),
    ("outermost object: undeclared values nested three levels", THREE,
     [{"a": "x", "b": 1, "links": [{"href": "/x", "rel": ["self"]}]}, {"b": 1, "a": "x", "f": {"g": {"h": [1]}}}],
     [{"a": "x", "b": 1, "links": [{"href": 1, "a": "x"}], "c": 2}, R('{"a": "x", "b": 1, "f": {"g": {"h": [1}}}'),
      R('{"a": "x", "b": 1, "f": {"g": 1}, "a": "y"}')]),
    ("inner object: undeclared values nested one level", {"type": "object", "properties": {"p": THREE}},
     [{"p": {"a": "x", "b": 1, "z": [1, {}]}}], [{"p": {"a": "x", "b": 1, "z": 1, "c": "no"}}]),
    ("large object: schema order or the order of required", SIX,
     [{"a": "", "b": 1, "c": "", "e": 2}, {"e": 2, "b": 1, "c": "", "a": "", "f": True, "zz": 1},
      {"e": 2, "b": 1, "c": "", "d": None}, {"a": "", "b": 1, "c": "", "d": None, "e": 2, "f": False}],
     [{"b": 1, "e": 2, "c": ""}, {"e": 2, "b": 1, "c": ""} | {"a": 1}, R('{"e": 2, "b": 1, "c": "", "e": 3}'),
      R('{"e": 2, "b": 1, "c": "", "b": 1}'), {"e": 2, "b": 1}, {"e": 2, "b": 1, "c": "", "f": 1}]),
    ("large object: the required first, then the optional ones in any order", SIX,
     [{"e": 2, "b": 1, "c": "", "f": True, "a": "x", "d": None}, {"e": 2, "b": 1, "c": "", "d": None, "a": ""},
      {"e": 2, "b": 1, "c": "", "f": False, "zz": [1]}],
     [R('{"e": 2, "b": 1, "c": "", "f": true, "a": "x", "f": false}'), {"e": 2, "b": 1, "c": "", "d": None, "a": 1},
      R('{"e": 2, "b": 1, "c": "", "a": "", "c": ""}'), {"e": 2, "b": 1, "f": True, "a": "x"}]),
]


@pytest.mark.parametrize("name,schema,good,bad", MORE_CASES, ids=[c[0] for c in MORE_CASES])
def test_object_table_more(name: str, schema: dict, good: list, bad: list) -> None:
    test_object_table(name, schema, good, bad)


def test_hot_skips_bound_precomputed_paths() -> None:
    """Schema-order paths that skip optional properties keep precomputed masks only while their
    copies stay within ANY_ORDER_HOT times the object (the rest are cold: same language)."""
    assert json_containers._hot_skips([30, 30, 30, 30], [False] * 4) == 0
    assert json_containers._hot_skips([30, 30], [True, True]) == 1
    assert json_containers._hot_skips([100, 10, 10], [False, True, True]) >= 1
    assert json_containers._hot_skips([10, 10, 100], [False, True, True]) == 0


def test_large_objects_keep_schema_order() -> None:
    """Past ANY_ORDER_MAX properties the automaton of all orders is too large: schema order, nearly
    (see test_window_order_of_large_objects; a sound restriction), extras still allowed after the
    declared properties."""
    props = {f"k{i}": I for i in range(json_containers.ANY_ORDER_MAX + 2)}
    accepts = _Recognizer({"type": "object", "properties": props})
    assert accepts(json.dumps({"k0": 1, "k3": 2, "zz": 3}))
    assert accepts(json.dumps({"k3": 2, "k0": 1}))  # NOTE: one property ahead of the pending k0
    assert not accepts(json.dumps({"k5": 2, "k4": 1, "k3": 1, "k0": 1}))
    accepts = _Recognizer({"type": "object", "properties": props, "required": ["k3", "k0"]})
    assert accepts(json.dumps({"k3": 2, "k0": 1, "k1": 3}))  # NOTE: the order of required, then the rest
    assert not accepts(json.dumps({"k0": 1, "k1": 3, "k3": 2, "k2": 4}))


def test_window_order_of_large_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    """Optional properties too many for any order within RELAX_BUDGET: the required ones first,
    then the optional ones with at most k <= WINDOW_MAX (the largest within the budget; here 1)
    written ahead of the first pending one; never twice, never without a required one."""
    from radixlm.grammar.json_orders import WINDOW_MAX, window_cost

    n = 7
    monkeypatch.setattr(json_containers, "RELAX_BUDGET", 3000)  # NOTE: all orders over it, one ahead within
    props = {f"k{i}": I for i in range(n)} | {"r": S}
    accepts = _Recognizer({"type": "object", "properties": props, "required": ["r"], "additionalProperties": False})
    order = [f"k{i}" for i in range(n)]
    ahead = order[2:3] + order[:2] + order[3:]  # NOTE: one ahead (WINDOW_MAX where the budget allows)
    for keys in (order, ahead, order[1:], [order[3], order[0], order[2], order[5]]):
        assert accepts(json.dumps({"r": "x"} | {k: 1 for k in keys})), keys
    too_far = order[2:3 + WINDOW_MAX] + order[:2]
    for text in (json.dumps({"r": "x"} | {k: 1 for k in too_far}), json.dumps({k: 1 for k in order}),
                 '{"r": "x", "k1": 1, "k0": 1, "k1": 2}', '{"r": "x", "k0": 1, "k2": 1, "k0": 2}',
                 '{"r": "x", "k1": 1, "k0": 1, "r": "y"}', json.dumps({"r": "x", "k1": "1"})):
        assert not accepts(text), text
    assert window_cost([10] * 10, 1) < window_cost([10] * 10, 2)


def test_strict_mode_keeps_schema_order_free_but_no_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_containers, "IMPLICIT_EXTRAS", False)
    accepts = _Recognizer({**THREE, "title": "strict"})
    assert accepts(json.dumps({"b": 1, "a": "x"}))
    assert not accepts(json.dumps({"b": 1, "a": "x", "d": 1}))


def test_uri_template_format() -> None:
    accepts = _Recognizer({"type": "string", "format": "uri-template"})
    for ok in ["http://example.com/{id}", "http://x/{+path}/here{?q,lang*}", "/a{/b:3}", "plain", "é{x}"]:
        assert accepts(json.dumps(ok)), ok
    for bad in ["http://example.com/{", "a}b", "{}", "a b", "{x:0}", "%zz"]:
        assert not accepts(json.dumps(bad)), bad


def test_minimize_keeps_the_language() -> None:
    for pattern in [r"(ab|cb)*c", r"[a-c]{1,3}(xy|zy)?", r"(\d+\.\d*|\.\d+)(e[+-]?\d+)?", r'"([^"\\]|\\.)*"']:
        d = dfa_from_ast(regex_ast(pattern))
        m = minimize(d)
        assert m.n_states <= d.n_states
        assert product(d, m, "diff").start == 0 and product(m, d, "diff").start == 0
    d = dfa_from_ast(regex_ast("(ab(,ab)*)?;"))  # as built, the first and later items differ
    assert minimize(d).n_states < d.n_states


@pytest.mark.parametrize("name", BPE)
def test_differential_masks_equal_full_walks(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Masks derived from a similar state equal the masks of a plain vocabulary walk, for every
    state of a schema with undeclared keys (key prefixes of declared keys differ in one byte)."""
    info = load_compiler(name).tokenizer_info
    from radixlm.grammar.json_schema import json_schema_to_ast

    node, _ = json_schema_to_ast({**THREE, "properties": {**THREE["properties"], "name": S}})
    dfa = dfa_from_ast(node)
    fast = DfaIndex(dfa.trans, info.trie, info.mask_words, RegionCache())
    derived = [s for s in range(1, dfa.n_states) if fast.cost2(s) >= token_index.WIDE_NODES
               and token_index.reference_state(dfa.trans, fast.cost, info.trie.byte_weight, s)]
    assert len(derived) >= 4  # "n", "na", "nam", ...: a key prefix differs from the body in one byte
    fast.compute(derived)
    monkeypatch.setattr(token_index, "reference_state", lambda *a: 0)
    plain = DfaIndex(dfa.trans, info.trie, info.mask_words, RegionCache())
    plain.compute(derived)
    for s in derived:
        assert np.array_equal(fast.masks[s], plain.masks[s]), s


@pytest.mark.parametrize("name", BPE)
def test_cold_states_fill_on_first_visit(name: str) -> None:
    """Undeclared keys and out-of-order properties are cold: not precomputed at compile time; a
    matcher walking through them token by token gets rows equal to a direct walk, and every
    token of the instance is allowed by the filled bitmask."""
    comp, tok = load_compiler(name), load_tokenizer(name)
    info = comp.tokenizer_info
    compiled = comp.compile_json_schema({**THREE, "title": f"cold {name}"})
    table, engine = compiled.masks, compiled.engine
    assert engine.dfa.hot is not None and not table.complete
    text = json.dumps({"b": 1, "a": "x", "extra": [1, "y"]})
    m = GrammarMatcher(compiled)
    bm = allocate_token_bitmask(1, info.vocab_size)
    direct = DfaIndex(engine.dfa.trans, info.trie, info.mask_words, RegionCache())
    for t in encode_exact(tok, info, text) + [info.stop_token_ids[0]]:
        m.fill_next_token_bitmask(bm, 0)
        assert unpack_bitmask(bm, info.vocab_size)[0, t]
        state = m.mask_state()
        if state is not None and not engine.dfa.accept[state]:
            assert np.array_equal(table.row_np(table.row_id(state)), direct.mask(state))
        assert m.accept_token(t)
    assert m.is_terminated()
