"""The mask-tail changes of issue 12 keep every mask exact.

- Depth-limited chain masks computed for several copies at once (:mod:`radixlm.grammar.chain_batch`)
  equal a plain walk of each state (no shift classes), masks and boundary nodes, for a DFA index
  and an accept-tracking (Earley terminal) index, visiting a long string's states in order and
  every state in reverse order, on the default model's vocabulary and DeepSeek-LLM's (shared data).
- Earley and lazy-DFA grammars have the initial state's row before the first fill, equal to the
  mask computed on a first visit.
- Mask-table rows are deduplicated exactly (CRC-32 buckets, compared bytes).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from radixlm.grammar import GrammarCompiler, GrammarMatcher, chain_batch
from radixlm.grammar.automaton import regex_to_dfa
from radixlm.grammar.mask_table import MaskTable
from radixlm.grammar.maskbench import DEFAULT_TOKENIZER, load_compiler, tokenizer_available
from radixlm.grammar.token_index import DfaIndex, RegionCache, pack_tokens, walk_from
from radixlm.grammar.testing import dfa_states_along

CHAIN = r'"([^"\\]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4}){0,%d}"'
VOCABS = [v for v in (DEFAULT_TOKENIZER, "deepseek-llm") if tokenizer_available(v)]


def _plain(idx: DfaIndex, q: int) -> tuple[np.ndarray, np.ndarray]:
    """Mask and sorted accepting nodes of ``q`` by one sparse walk from the root."""
    _, node, st = walk_from(idx.trans, idx.trie, np.zeros(1, np.int64), np.asarray([q], np.int64))
    tok = idx.trie.node_token[node]
    acc = np.sort(node[idx.accept[st]]) if idx.accept is not None else None
    return pack_tokens(tok[tok >= 0], idx.trie, idx.words), acc


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("accept", [False, True])
def test_chain_copies_batched_equal_plain_walk(vocab: str, accept: bool, monkeypatch) -> None:
    batches = []
    plain_batch = chain_batch._walk_many
    monkeypatch.setattr(chain_batch, "_walk_many", lambda *a: batches.append(a[2].size) or plain_batch(*a))
    info = load_compiler(vocab).tokenizer_info
    dfa = regex_to_dfa(CHAIN % 160)
    text = ('"' + 'The quick brown fox, é\\"語\\u00e9 jumps over the lazy dog ' * 6).encode()
    states = dfa_states_along(dfa, text)
    orders = (states, list(range(dfa.n_states - 1, 0, -1)))
    for order in orders:
        idx = DfaIndex(dfa.trans, info.trie, info.mask_words, RegionCache(), dfa.accept if accept else None)
        for s in order:
            got = idx.mask(s)
            want, bounds = _plain(idx, s)
            assert np.array_equal(got, want), (vocab, s)
            if accept:
                assert np.array_equal(np.sort(idx.boundary(s)), bounds), (vocab, s)
    assert any(n > 1 for n in batches)  # NOTE: several copies did share one walk


@pytest.mark.parametrize("vocab", VOCABS)
def test_initial_row_before_first_fill(vocab: str) -> None:
    comp = GrammarCompiler(load_compiler(vocab).tokenizer_info)
    recursive = {"$defs": {"n": {"type": "object", "properties": {"v": {"type": "integer"},
                                                                   "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}},
                 "$ref": "#/$defs/n"}
    compiled = comp.compile_json_schema(json.dumps(recursive))
    engine = compiled.engine
    assert engine.initial() in compiled.masks._row_of  # NOTE: computed at compile
    row = compiled.masks.row_np(compiled.masks.row_id(engine.initial()))
    want = engine.mask(engine.initial())
    want = want | compiled.tokenizer_info.stop_mask() if engine.accepting(engine.initial()) else want
    assert np.array_equal(row, want)
    bm = torch.zeros((1, compiled.tokenizer_info.mask_words), dtype=torch.int32)
    GrammarMatcher(compiled).fill_next_token_bitmask(bm)
    assert np.array_equal(bm[0].numpy(), want)


def test_lazy_dfa_table_has_the_start_row() -> None:
    from radixlm.grammar.dfa_engine import DfaEngine

    info = load_compiler(DEFAULT_TOKENIZER).tokenizer_info
    dfa = regex_to_dfa(r'\{"a": [0-9]{1,3}\}')
    engine = DfaEngine(dfa, info, RegionCache(), eager=False)
    calls = []
    table = engine.mask_table(info.stop_mask(), lambda states: calls.append(states) or engine.masks(states))
    assert calls == [[dfa.start]] and not table.complete
    assert np.array_equal(table.row_np(table.row_id(dfa.start)), engine.mask(dfa.start))
    assert len(calls) == 1  # NOTE: a hit


def test_table_rows_deduplicated_exactly() -> None:
    words = 40
    stop = np.zeros(words, np.int32)
    stop[0] = 1
    rng = np.random.default_rng(0)
    masks = {}
    table = MaskTable(words, stop, lambda states: [masks[s] for s in states])
    base = rng.integers(-2**31, 2**31 - 1, size=words, dtype=np.int64).astype(np.int32)
    for s in range(300):  # NOTE: past the spare rows: the table grows
        m = base.copy()
        k = s % 37
        m[k] ^= np.int32(1 << (k % 31))  # NOTE: 37 distinct masks, each met ~8 times
        masks[s] = m
    rows = table.row_ids(list(range(300)))
    for s in range(300):
        assert np.array_equal(table.row_np(int(rows[s])), masks[s])
        same = [u for u in range(300) if np.array_equal(masks[u], masks[s])]
        assert len({int(rows[u]) for u in same}) == 1
    assert table.n_rows == 1 + 37
    assert table.row_id(None) == 0 and np.array_equal(table.row_np(0), stop)
