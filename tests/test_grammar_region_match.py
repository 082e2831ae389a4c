"""First visits through a known region shape (:mod:`radixlm.grammar.region_match`) keep every mask
exact.

- A first visit that maps a state onto a cached shape (no region search), walks the merged trie
  below the shape's exit nodes and packs the few tokens in Python gives the mask of a plain walk
  from the root, for string bodies in several contexts (property values, undeclared keys and
  values, array items: there the exit leads back into a string), on the default model's
  vocabulary and on DeepSeek-LLM's and GPT-2's where the shared data has them.
- :func:`~radixlm.grammar.narrow_walk.or_tokens` and :func:`~radixlm.grammar.narrow_walk.edit_tokens`
  equal :func:`~radixlm.grammar.narrow_walk.pack_few`,
  and :class:`~radixlm.grammar.region_match.ExitTrie` finds the tokens of a walk below each exit
  node.
- State costs computed one by one (first visits) equal the batched ones.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from radixlm.grammar import GrammarCompiler, region_match
from radixlm.grammar.maskbench import DEFAULT_TOKENIZER, load_compiler, tokenizer_available
from radixlm.grammar.narrow_walk import NarrowWalker, edit_tokens, or_tokens, pack_few
from radixlm.grammar.state_costs import StateCosts
from radixlm.grammar.testing import dfa_states_along
from radixlm.grammar.token_index import DfaIndex, pack_tokens, walk_from

VOCABS = [v for v in (DEFAULT_TOKENIZER, "deepseek-llm", "gpt-2") if tokenizer_available(v)]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
                                           "n": {"type": "integer"}, "note": {"type": "string"}},
          "required": ["name", "tags"]}
TEXTS = [{"name": "caf\u00e9 \\\"x\\\"", "tags": ["a", "b c", "\u8a9e"], "n": 3, "note": "ok"},
         {"tags": ["z"], "extra": "v\u00e9", "name": "q", "other": {"k": "s"}},
         {"note": "late", "name": "n", "tags": []}]


def _plain(idx: DfaIndex, q: int) -> np.ndarray:
    """Mask of ``q`` by one sparse walk from the root."""
    _, node, _ = walk_from(idx.trans, idx.trie, np.zeros(1, np.int64), np.asarray([q], np.int64))
    tok = idx.trie.node_token[node]
    return pack_tokens(tok[tok >= 0], idx.trie, idx.words)


@pytest.mark.parametrize("vocab", VOCABS)
def test_matched_first_visits_equal_plain_walk(vocab: str, monkeypatch) -> None:
    matched = []
    plain_match = region_match.match_region
    monkeypatch.setattr("radixlm.grammar.token_index.match_region",
                        lambda *a: (lambda got: matched.append(got is not None) or got)(plain_match(*a)))
    comp = GrammarCompiler(load_compiler(vocab).tokenizer_info)
    engine = comp.compile_json_schema(json.dumps(SCHEMA)).engine
    dfa, old = engine.dfa, engine.index  # NOTE: the compile cached the hot states' region shapes
    states = []
    for text in TEXTS:
        states += dfa_states_along(dfa, json.dumps(text).encode())
    rng = np.random.default_rng(0)
    states += rng.choice(np.arange(1, dfa.n_states), size=min(60, dfa.n_states - 1), replace=False).tolist()
    idx = DfaIndex(dfa.trans, old.trie, old.words, old.regions)
    for s in dict.fromkeys(states):
        idx.compute([s])  # NOTE: one state at a time, as a first visit while serving
        assert np.array_equal(idx.masks[s], _plain(idx, s)), (vocab, s)
    assert sum(matched) >= 3  # NOTE: string bodies in new contexts took the known shape


@pytest.mark.parametrize("vocab", VOCABS[:2])
def test_or_tokens_and_exit_trie(vocab: str) -> None:
    info = load_compiler(vocab).tokenizer_info
    trie, words = info.trie, info.mask_words
    rng = np.random.default_rng(1)
    with_dups = trie.dup_src[:20].tolist()
    for n in (0, 1, 7, 48, 49, 300):
        toks = rng.choice(trie.node_token[trie.node_token >= 0], size=n, replace=False).tolist()
        toks = toks + with_dups[: n // 4]
        want = pack_few(np.unique(np.asarray(toks, dtype=np.int64)), trie, words)
        assert np.array_equal(or_tokens(None, toks, trie, words), want)
        base = rng.integers(-2**31, 2**31 - 1, size=words, dtype=np.int64).astype(np.int32)
        assert np.array_equal(or_tokens(base, toks, trie, words), base | want)
        half = sorted(set(toks))[: n // 2]
        clear = pack_few(np.asarray(half, dtype=np.int64), trie, words)
        assert np.array_equal(edit_tokens(base, half, toks, trie, words), base & ~clear | want)
    engine = GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA)).engine
    idx = engine.index
    walker = NarrowWalker(idx.trans, idx.trie)
    body = dfa_states_along(engine.dfa, b'{"name": "ab')[-1]
    got = region_match.match_region(idx.regions, idx.trans, walker._rows, body)
    assert got is not None
    entry, order = got
    _, merged, starts = region_match.exit_parts(entry, idx.trie, idx.words)
    assert merged is not None
    rows = walker._rows
    want = walker.tokens([(n, rows[(order[f] << 8) | b]) for n, f, b in starts], budget=10**9)
    assert sorted(merged.tokens(rows, order, budget=10**9)) == sorted(want)


def test_costs_one_by_one_equal_batched() -> None:
    info = load_compiler(DEFAULT_TOKENIZER).tokenizer_info
    engine = GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA)).engine
    trans = engine.dfa.trans
    batched = StateCosts(trans, info.trie.byte_weight)
    batched.fill(np.arange(trans.shape[0], dtype=np.int64))
    single = StateCosts(trans, info.trie.byte_weight)
    for s in range(trans.shape[0]):
        assert single.cost_of(s) == batched.cost_of(s) and single.live_of(s) == batched.live_of(s)
