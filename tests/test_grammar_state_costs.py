"""Batched walk-cost bounds and the state graph of a DFA index (compile-time work of eager masks):
the batched ``cost2`` must give the scalar's integers, and the run/edge lists the plain
construction's arrays."""

from __future__ import annotations

import numpy as np

from radixlm.grammar.automaton import regex_to_dfa
from radixlm.grammar.maskbench import DEFAULT_TOKENIZER, load_compiler
from radixlm.grammar.state_costs import pair_cost, pair_costs
from radixlm.grammar.token_index import DfaIndex, RegionCache

PATTERNS = [r'"([^"\\]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4}){0,40}"', r'\{"a":(-?[0-9]+|"[a-z ]*"|true)(,"b":[0-9]{1,3})?\}',
            r"[a-zA-Z0-9 ]*x|[^q]{2,5}"]


def _plain_graph(trans: np.ndarray) -> tuple[tuple, tuple]:
    """The runs and the CSR successor/predecessor lists, built the straightforward way."""
    n = trans.shape[0]
    change = np.ones(trans.shape, dtype=bool)
    change[:, 1:] = trans[:, 1:] != trans[:, :-1]
    src, col = np.nonzero(change)
    dst = trans[src, col]
    keep = dst != 0
    pairs = np.unique(src[keep].astype(np.int64) * n + dst[keep])
    rev = pairs[np.argsort(pairs % n, kind="stable")]
    graph = (np.searchsorted(pairs // n, np.arange(n + 1)), pairs % n, np.searchsorted(rev % n, np.arange(n + 1)), rev // n)
    return (np.searchsorted(src, np.arange(n + 1)), dst, col), graph


def test_batched_costs_equal_scalar() -> None:
    trie = load_compiler(DEFAULT_TOKENIZER).tokenizer_info.trie
    for pattern in PATTERNS:
        trans = regex_to_dfa(pattern).trans
        states = np.arange(trans.shape[0], dtype=np.int64)
        got = pair_costs(trans, trie, states[::-1].copy())[::-1]
        want = np.array([pair_cost(trans, trie, int(s)) for s in states])
        assert np.array_equal(got, want), pattern


def test_graph_equals_plain_construction() -> None:
    info = load_compiler(DEFAULT_TOKENIZER).tokenizer_info
    for pattern in PATTERNS:
        trans = regex_to_dfa(pattern).trans
        index = DfaIndex(trans, info.trie, info.mask_words, RegionCache())
        graph = index._neighbours()
        runs, want = _plain_graph(trans)
        for a, b in zip(runs + want, index._runs + graph):
            assert a.dtype == b.dtype and np.array_equal(a, b), pattern
