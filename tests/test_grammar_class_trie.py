"""Class tries (grammar/class_trie.py): walking a DFA against the vocabulary trie compressed by the
DFA's byte classes gives exactly the masks of the full trie, for every state."""

from __future__ import annotations

import json

import numpy as np
import pytest

from radixlm.grammar.class_trie import ClassTries, byte_classes, class_trie
from radixlm.grammar.maskbench import DEFAULT_TOKENIZER, load_compiler
from radixlm.grammar.token_index import DfaIndex, RegionCache

GRAMMARS = [
    ("regex", r"[A-Z][a-z]{2,12}( [a-z]{2,12}){2,6}\."),
    ("regex", r"(\d{1,3}\.){3}\d{1,3}( - [A-Za-z ]{1,30}){1,4}"),
    ("json_schema", json.dumps({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,8}$"}, "maxItems": 3}},
        "required": ["name", "age"], "additionalProperties": False})),
]


@pytest.fixture(scope="module")
def compiler():
    return load_compiler(DEFAULT_TOKENIZER)


def _dfa(compiler, kind: str, source: str):
    g = compiler.compile_regex(source) if kind == "regex" else compiler.compile_json_schema(source)
    return g.engine.dfa


@pytest.mark.parametrize("kind,source", GRAMMARS)
def test_class_trie_masks_equal_full_trie(compiler, kind: str, source: str) -> None:
    info = compiler.tokenizer_info
    dfa = _dfa(compiler, kind, source)
    small = class_trie(info.trie, byte_classes(dfa.trans))
    assert small.n_nodes < info.trie.n_nodes
    full_index = DfaIndex(dfa.trans, info.trie, info.mask_words, RegionCache())
    small_index = DfaIndex(dfa.trans, small, info.mask_words, RegionCache())
    states = list(range(1, dfa.n_states))
    full_index.compute(states)
    small_index.compute(states)
    for s in states:
        assert np.array_equal(full_index.masks[s], small_index.masks[s]), s


def test_class_trie_structure(compiler) -> None:
    """Every token sits on the node of its class string; merged tokens are duplicates of the node's
    token; node bytes are class representatives."""
    info = compiler.tokenizer_info
    cls = byte_classes(_dfa(compiler, *GRAMMARS[0]).trans)
    rep = np.full(cls.max() + 1, 255)
    np.minimum.at(rep, cls, np.arange(256))
    small = class_trie(info.trie, cls)
    for t in range(0, info.tokenizer_size, 97):
        b = info.token_bytes[t]
        node = int(small.token_node[t])
        if not b:
            assert node == -1
            continue
        path = []
        while node > 0:
            path.append(int(small.node_byte[node]))
            node = int(small.parent[node])
        assert path[::-1] == [int(rep[cls[x]]) for x in b]
    lead = small.node_token[small.token_node[small.dup_token]]
    assert np.array_equal(lead, small.dup_of)


def test_class_tries_cache_and_fallback(compiler) -> None:
    info = compiler.tokenizer_info
    tries = ClassTries()
    trans = _dfa(compiler, *GRAMMARS[0]).trans
    a = tries.get(info.trie, trans)
    assert a is not info.trie and a is tries.get(info.trie, trans.copy())
    assert isinstance(a.regions, RegionCache)
    every_byte = np.arange(256, dtype=np.int32).reshape(1, 256).repeat(257, axis=0) % 257  # all classes distinct
    assert tries.get(info.trie, every_byte) is info.trie


def test_byte_classes_blocked_equal_whole_columns(monkeypatch) -> None:
    """Refining block by block gives the partition (and numbering) of whole-column comparison,
    across block edges and for tables smaller or larger than a block."""
    import radixlm.grammar.class_trie as ct

    def plain(trans: np.ndarray) -> np.ndarray:
        ids: dict[bytes, int] = {}
        return np.asarray([ids.setdefault(c.tobytes(), len(ids)) for c in np.ascontiguousarray(trans.T)])

    monkeypatch.setattr(ct, "BLOCK_ROWS", 7)
    rng = np.random.default_rng(0)
    for rows, patterns in ((1, 3), (7, 40), (50, 256), (200, 12), (203, 2)):
        base = rng.integers(0, 5, size=(rows, patterns))
        trans = base[:, rng.integers(0, patterns, size=256)].astype(np.int32)
        if rows > 7:  # two columns equal except in the last block: told apart only there
            trans[:, 200] = trans[:, 201]
            trans[-1, 200] += 1
        got = ct.byte_classes(trans)
        assert np.array_equal(got, plain(trans)), (rows, patterns)

