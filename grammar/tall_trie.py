"""The long tokens of a trie as a trie of their own, and the mask of the short ones.

A mask can be split by token length: ``mask(s) = (mask(s) & short(D)) | long(s, D)`` with
``short(D)`` the tokens of at most ``D`` bytes and ``long(s, D)`` those longer, alive from ``s``.
When the tokens of at most ``D`` bytes are known to fare alike from ``s`` and from a state ``t``
whose mask is known (:meth:`radixlm.grammar.shift_classes.ShiftClasses.match_depth`), the first
part is ``mask(t) & short(D)`` and only the long tokens are walked: the trie of the nodes that have
a token of more than ``D`` bytes below them (:func:`tall_trie`; a 100k vocabulary has ~12k such
nodes for ``D = 16``, ~1.5k for ``D = 32``, against ~217k in all).
"""

from __future__ import annotations

import numpy as np

from radixlm.grammar.mask_pack import pack_tokens
from radixlm.grammar.trie import TokenTrie


def node_depths(trie: TokenTrie) -> np.ndarray:
    """int64 ``[n_nodes]``: the depth (bytes) of every node, root 0 (built once per trie)."""
    got = getattr(trie, "_node_depth", None)
    if got is None:
        got = np.repeat(np.arange(len(trie.depth_start) - 1), np.diff(trie.depth_start))
        trie._node_depth = got
    return got


def _max_below(trie: TokenTrie) -> np.ndarray:
    """int64 ``[n_nodes]``: the largest depth of a node in each node's subtree (itself included)."""
    got = getattr(trie, "_max_below", None)
    if got is None:
        got = node_depths(trie).copy()
        for lo, hi, parent, _ in reversed(trie.levels()):
            # NOTE: breadth-first tries keep siblings together, parents in order: one reduceat per
            # level (np.maximum.at, its fallback, cost ~4x as much: ~10 ms on a 217k-node trie)
            cut = parent[1:] != parent[:-1]
            if (parent[1:][cut] > parent[:-1][cut]).all():
                starts = np.flatnonzero(np.r_[True, cut])
                par = parent[starts]
                got[par] = np.maximum(got[par], np.maximum.reduceat(got[lo:hi], starts))
            else:
                np.maximum.at(got, parent, got[lo:hi])
        trie._max_below = got
    return got


def tall_trie(trie: TokenTrie, depth: int) -> TokenTrie:
    """The nodes of ``trie`` with a node deeper than ``depth`` in their subtree, as a trie (same
    breadth-first order); only tokens longer than ``depth`` bytes keep their node (and their
    byte-duplicates), shorter ones are left out; ``long_ids`` (int64) lists those tokens and
    ``long_nodes`` their nodes, ``old`` (int64) maps its nodes to ``trie``'s and ``deep_nodes``
    (int64) lists its nodes deeper than ``depth``. Cached on ``trie`` per ``depth``."""
    cache = trie.__dict__.setdefault("_tall", {})
    got = cache.get(depth)
    if got is not None:
        return got
    keep = _max_below(trie) > depth
    keep[0] = True
    old = np.flatnonzero(keep)
    new_of = np.full(trie.n_nodes, -1, dtype=np.int64)
    new_of[old] = np.arange(old.size)
    depths = node_depths(trie)
    depth_start = np.searchsorted(depths[old], np.arange(len(trie.depth_start)))
    parent = np.where(old == 0, -1, new_of[trie.parent[old]])
    long_node = depths[old] > depth
    node_token = np.where(long_node, trie.node_token[old], -1).astype(np.int32)
    token_node = np.full(trie.token_node.size, -1, dtype=np.int32)
    has = trie.token_node >= 0
    ids = np.flatnonzero(has)
    tn = trie.token_node[has].astype(np.int64)
    long_tok = depths[tn] > depth
    token_node[ids[long_tok]] = new_of[tn[long_tok]]
    dup_long = depths[np.maximum(trie.token_node[trie.dup_token], 0)] > depth if trie.dup_token.size else np.zeros(0, bool)
    got = TokenTrie.from_structure(depth_start, parent, trie.node_byte[old], node_token, token_node,
                                   trie.dup_token[dup_long], trie.dup_of[dup_long])
    got.long_ids = ids[long_tok]  # NOTE: every token longer than ``depth`` (duplicates too) ...
    got.long_nodes = token_node[got.long_ids].astype(np.intp)  # ... and its node in the tall trie
    got.old = old.astype(np.int64)
    got.deep_nodes = np.flatnonzero(depths[old] > depth)  # NOTE: every node of trie deeper than depth
    cache[depth] = got
    return got


def short_mask(trie: TokenTrie, depth: int, words: int) -> np.ndarray:
    """int32 ``[words]``: the tokens of ``trie`` of at most ``depth`` bytes (byte-duplicates
    included). Cached on ``trie`` per ``(depth, words)``."""
    cache = trie.__dict__.setdefault("_short", {})
    got = cache.get((depth, words))
    if got is None:
        nodes = np.flatnonzero((node_depths(trie) <= depth) & (trie.node_token >= 0))
        got = cache[(depth, words)] = pack_tokens(trie.node_token[nodes].astype(np.int64), trie, words)
    return got
