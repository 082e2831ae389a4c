"""Compile-time bookkeeping made lean (session 11): walk costs computed per state on demand, mask
table rows written in place, automaton runs and Earley terminal steps without per-state Python
lists. Each must give exactly what the former whole-table / stacked / list forms gave."""

from __future__ import annotations

import gc
import json

import numpy as np

from radixlm.grammar import GrammarMatcher, allocate_token_bitmask
from radixlm.grammar.automaton import regex_to_dfa
from radixlm.grammar.mask_table import MaskTable
from radixlm.grammar.maskbench import DEFAULT_TOKENIZER, load_compiler
from radixlm.grammar.state_costs import StateCosts
from radixlm.grammar.token_index import DfaIndex, RegionCache

PATTERNS = [r'"([^"\\]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4}){0,40}"', r'\{"a":(-?[0-9]+|"[a-z ]*"|true)(,"b":[0-9]{1,3})?\}',
            r"[a-zA-Z0-9 ]*x|[^q]{2,5}"]


def test_state_costs_on_demand_equal_whole_table() -> None:
    trie = load_compiler(DEFAULT_TOKENIZER).tokenizer_info.trie
    weight = trie.byte_weight.astype(np.float64)
    for pattern in PATTERNS:
        trans = regex_to_dfa(pattern).trans
        live = trans != 0
        want_live, want_cost = live.sum(axis=1), np.einsum("ij,j->i", live, weight).astype(np.int64)
        costs = StateCosts(trans, trie.byte_weight)
        rng = np.random.default_rng(0)
        some = rng.choice(trans.shape[0], size=max(1, trans.shape[0] // 3), replace=True).astype(np.int64)
        got = costs.fill(some)
        assert np.array_equal(got[some], want_cost[some]), pattern
        for s in range(trans.shape[0]):  # NOTE: asked one at a time, in any order
            assert costs.cost_of(s) == want_cost[s] and costs.live_of(s) == want_live[s], pattern
        n_live, cost = StateCosts(trans, trie.byte_weight).all()
        assert np.array_equal(n_live, want_live) and np.array_equal(cost, want_cost), pattern


def test_index_masks_do_not_depend_on_which_costs_are_known() -> None:
    """An index asked about a few states, then the rest, gives the masks of a fresh index asked
    about all at once (the cost arrays are filled lazily in the first)."""
    info = load_compiler(DEFAULT_TOKENIZER).tokenizer_info
    for pattern in PATTERNS:
        trans = regex_to_dfa(pattern).trans
        states = list(range(1, trans.shape[0]))
        whole = DfaIndex(trans, info.trie, info.mask_words, RegionCache())
        whole.compute(states)
        bit = DfaIndex(trans, info.trie, info.mask_words, RegionCache())
        for s in states[::-3]:
            bit.compute([s])
        bit.compute(states)
        for s in states:
            assert np.array_equal(bit.masks[s], whole.masks[s]), (pattern, s)


def test_from_states_rows_equal_stacked_rows() -> None:
    rng = np.random.default_rng(1)
    words = 7
    stop = np.zeros(words, dtype=np.int32)
    stop[3] = 1 << 5
    shared = rng.integers(-2**31, 2**31 - 1, size=words, dtype=np.int64).astype(np.int32)
    masks = {1: shared, 2: shared, 4: rng.integers(0, 2**20, size=words).astype(np.int32), 5: shared}
    accept = np.array([False, False, True, False, True, False])
    table = MaskTable.from_states(6, masks, accept, stop)
    rows = table.rows_cpu().numpy()
    for s, m in masks.items():
        want = (m | stop) if accept[s] else m
        assert np.array_equal(rows[table.row_id(s)], want), s
    assert table.row_id(1) == table.row_id(5) != table.row_id(2)  # NOTE: by identity and acceptance
    assert np.array_equal(rows[0], stop) and not rows[table.row_id(0)].any()
    assert table._np.shape[0] >= table.n_rows == 5


def test_runs_are_tuples_and_untracked_after_collections() -> None:
    dfa = regex_to_dfa(r'"[a-z]{2,6}"(,[0-9]+)*')
    runs = dfa.runs()
    assert all(type(r) is tuple for r in runs)
    gc.collect()
    gc.collect()  # NOTE: a state's tuple may be met before its runs in the first pass
    assert not any(gc.is_tracked(r) for r in runs if r)
    for s, row in enumerate(runs):
        for lo, hi, t in row:
            assert t and (dfa.trans[s, lo : hi + 1] == t).all()


def test_earley_grammar_walks_as_before() -> None:
    """Earley terminals step through flat views (``EarleyEngine.flats``): a recursive grammar
    still accepts a valid instance token by token and rejects an invalid one."""
    compiler = load_compiler(DEFAULT_TOKENIZER)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "kids": {"type": "array", "items": {"$ref": "#"}}},
              "required": ["name", "kids"], "additionalProperties": False}
    g = compiler.compile_json_schema(json.dumps(schema))
    assert hasattr(g.engine, "flats")
    info = compiler.tokenizer_info
    bm = allocate_token_bitmask(1, info.vocab_size)
    for text, ok in (('{"name": "a", "kids": [{"name": "b", "kids": []}]}', True), ('{"name": "a", "kids": [{"kids": []}]}', False)):
        m = GrammarMatcher(g)
        m.fill_next_token_bitmask(bm, 0)
        assert (m.accept_string(text) and m.can_terminate()) == ok, text
