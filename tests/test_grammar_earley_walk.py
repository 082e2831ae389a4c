"""Python crossing walks of the Earley engine (:mod:`radixlm.grammar.earley_walk`): the same tokens
and accept nodes as the vectorized :func:`~radixlm.grammar.trie_walks.walk_from`, on random DFAs
over a synthetic vocabulary, from the root (256 children: the live-byte lookup) and from inner
nodes; None past the step budget."""

from __future__ import annotations

import random

import numpy as np
import pytest

from radixlm.grammar.earley_walk import TableWalker
from radixlm.grammar.narrow_walk import TrieView
from radixlm.grammar.trie import TokenTrie
from radixlm.grammar.trie_walks import walk_from


def _vocab(seed: int = 0, n: int = 500) -> list[bytes]:
    rng = random.Random(seed)
    atoms = [b"a", b"b", b"\"", b",", b":", b"{", b"}", b" ", b"1"]
    out = {bytes([b]) for b in range(256)}
    while len(out) < n:
        out.add(b"".join(rng.choice(atoms) for _ in range(rng.choice([1, 2, 3, 5, 8]))))
    return sorted(out)


def _dfa(seed: int, n: int = 12, density: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
    """Random int32 ``[n, 256]`` table (state 0 dead) over the atoms' bytes, and accept flags."""
    rng = np.random.default_rng(seed)
    trans = np.zeros((n, 256), dtype=np.int32)
    live = rng.random((n - 1, 256)) < density
    trans[1:] = np.where(live, rng.integers(1, n, size=(n - 1, 256)), 0)
    accept = rng.random(n) < 0.4
    accept[0] = False
    return trans, accept


def _reference(trans, accept, trie, nodes, q):
    src, found, st = walk_from(trans, trie, np.asarray(nodes, dtype=np.int64), np.full(len(nodes), q))
    tok = trie.node_token[found]
    return sorted(tok[tok >= 0].tolist()), sorted(set(found[accept[st]].tolist()))


@pytest.mark.parametrize("seed", range(6))
def test_walk_matches_vectorized(seed: int) -> None:
    trie = TokenTrie(_vocab(seed))
    view = TrieView(trie)
    trans, accept = _dfa(seed, density=0.05 + 0.1 * seed)
    walker = TableWalker(trans, accept, view)
    rng = random.Random(seed)
    starts = [[0]] + [rng.sample(range(trie.n_nodes), k) for k in (1, 3, 9)]
    for nodes in starts:
        for q in range(1, trans.shape[0]):
            got = walker.walk(nodes, q, budget=10**9)
            assert got is not None
            tokens, ends = got
            want_tokens, want_ends = _reference(trans, accept, trie, nodes, q)
            assert sorted(tokens.tolist()) == want_tokens
            assert ends.tolist() == want_ends


def test_walk_gives_up_past_budget() -> None:
    trie = TokenTrie(_vocab())
    trans = np.zeros((2, 256), dtype=np.int32)
    trans[1] = 1  # every byte string lives: the whole trie
    walker = TableWalker(trans, np.array([False, True]), TrieView(trie))
    assert walker.walk([0], 1, budget=50) is None
    tokens, ends = walker.walk([0], 1, budget=10**9)
    assert np.unique(tokens).size == tokens.size == int((trie.node_token >= 0).sum())
    assert ends.size == trie.n_nodes - 1
