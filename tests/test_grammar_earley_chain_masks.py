"""Earley terminal indexes (``DfaIndex`` with ``accept``) share masks along counting chains
(``maxLength`` strings, bounded repetitions) through shift classes: every terminal state's mask and
boundary nodes equal a plain trie walk, whatever order the states are first visited in.

Default-model vocabulary (SmolLM2); the engine's own indexes are visited in state order one state
at a time (as while serving), a fresh index in reverse order (the sharing then runs the other way
along each chain), and both are compared with an unshared sparse walk from the root.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from radixlm.grammar import GrammarCompiler
from radixlm.grammar.earley_engine import EarleyEngine
from radixlm.grammar.maskbench import load_tokenizer
from radixlm.grammar.token_index import DfaIndex, RegionCache, pack_tokens, walk_from

THREAD = {"$defs": {"c": {"type": "object", "properties": {
    "author": {"type": "string", "maxLength": 24},
    "text": {"type": "string", "minLength": 3, "maxLength": 90},
    "replies": {"type": "array", "items": {"$ref": "#/$defs/c"}, "maxItems": 3}},
    "required": ["author", "text"]}},
    "type": "object", "properties": {"title": {"type": "string", "maxLength": 60},
                                      "comments": {"type": "array", "items": {"$ref": "#/$defs/c"}}},
    "required": ["title"]}
WORDS_EBNF = 'root: item ("," item)*\nitem: WORD | "[" root "]" | QUOTED | "@" NAME\nWORD: /[a-z]{1,40}/\nNAME: /[a-z_]{3,60}/\nQUOTED: /"[^"]{2,30}"/'


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler(load_tokenizer("smollm2"))


def _plain(idx: DfaIndex, q: int) -> tuple[np.ndarray, np.ndarray]:
    """Mask and sorted boundary nodes of state ``q`` by one sparse walk from the root."""
    _, node, st = walk_from(idx.trans, idx.trie, np.zeros(1, np.int64), np.asarray([q], np.int64))
    tok = idx.trie.node_token[node]
    return pack_tokens(tok[tok >= 0], idx.trie, idx.words), np.sort(node[idx.accept[st]])


@pytest.fixture
def shares(monkeypatch) -> list[int]:
    """Counts of states whose mask was taken from another (whole, by depth), while it lives."""
    from radixlm.grammar import token_index

    got = [0, 0]
    whole, by_depth = token_index.share_whole, token_index.share_by_depth_batch

    def count_whole(idx, s):
        ok = whole(idx, s)
        got[0] += ok
        return ok

    def count_depth(idx, s, share):
        ok = by_depth(idx, s, share)
        got[1] += ok
        return ok

    monkeypatch.setattr(token_index, "share_whole", count_whole)
    monkeypatch.setattr(token_index, "share_by_depth_batch", count_depth)
    return got


def _check(engine: EarleyEngine) -> int:
    """Compare every terminal state; returns the number of states checked."""
    checked = 0
    for t, term in enumerate(engine.terms):
        idx = engine.index[t]
        n = term.trans.shape[0]
        states = list(range(1, n))
        for q in states:  # NOTE: one at a time, as first visits while serving
            idx.mask(q)
            idx.boundary(q)
        fresh = DfaIndex(term.trans, engine.trie, engine.words, RegionCache(), term.accept)
        for q in reversed(states):
            fresh.mask(q)
            fresh.boundary(q)
        for q in states:
            want_mask, want_bounds = _plain(idx, q)
            for got in (idx, fresh):
                assert np.array_equal(got.masks[q], want_mask), (t, q)
                assert np.array_equal(np.sort(got.bounds[q]), want_bounds), (t, q)
            checked += 1
    return checked


def test_recursive_schema_chain_masks_and_bounds(compiler: GrammarCompiler, shares: list[int]) -> None:
    compiled = compiler.compile_json_schema(json.dumps(THREAD))
    assert isinstance(compiled.engine, EarleyEngine)
    assert _check(compiled.engine) > 300
    assert shares[0] > 0 and shares[1] > 0  # NOTE: the chains did share (else nothing new is checked)


def test_bounded_repetition_chain_masks_and_bounds(compiler: GrammarCompiler, shares: list[int]) -> None:
    compiled = compiler.compile_ebnf(WORDS_EBNF)
    assert isinstance(compiled.engine, EarleyEngine)
    assert _check(compiled.engine) > 40
    assert shares[1] > 0  # NOTE: chains shorter than the longest token: shared by depth only


@pytest.mark.parametrize("pattern", [r"[a-z_]{3,60}", r"[a-z]{2,90}", r"[ -~]{4,100};?"])
def test_accepting_chain_regex(compiler: GrammarCompiler, shares: list[int], pattern: str) -> None:
    """A chain whose copies differ in acceptance (before and past the minimum count): the shift
    classes of an accept-tracking index must keep them apart for the boundary nodes."""
    dfa = compiler.compile_regex(pattern).engine.dfa
    trie, words = compiler.tokenizer_info.trie, compiler.tokenizer_info.mask_words
    states = list(range(1, dfa.trans.shape[0]))
    for order in (states, states[::-1]):
        idx = DfaIndex(dfa.trans, trie, words, RegionCache(), dfa.accept)
        for q in order:
            idx.mask(q)
            idx.boundary(q)
        for q in states:
            want_mask, want_bounds = _plain(idx, q)
            assert np.array_equal(idx.masks[q], want_mask), (pattern, q)
            assert np.array_equal(np.sort(idx.bounds[q]), want_bounds), (pattern, q)
    assert shares[0] + shares[1] > 0
