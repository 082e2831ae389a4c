"""Depth-limited chain masks of several copies at once (first visits near a counting chain's end).

Near the end of a counting chain (a ``maxLength`` string) no copy matches another over the whole
trie depth, so each copy's first visit takes ``mask(t) & short(D)`` from a copy ``t`` matching it
up to ``D`` bytes and walks the long tokens' trie (:func:`~radixlm.grammar.chain_share.share_by_depth`):
~100-200 µs per copy, and a long string visits one new copy per token. Every copy of the same
depth-``D`` class (the same window as ``t``, checked exactly) shares that first part, so one
first visit walks the long tokens' trie for up to ``MAX_BATCH`` copies of the class together (one
numpy gather per trie depth for all of them) and the visits that follow are table hits.

Exact for the same reason as the single walk: each copy is matched against ``t`` by the shift
classes' exact window comparison (:class:`~radixlm.grammar.shift_classes.ShiftClasses`), and its
long tokens (and, for an accept-tracking index, its boundary nodes deeper than ``D``) are walked.
Only while serving: under a compile budget (eager masks) the single walk is used, so compile time
is unchanged.
"""

from __future__ import annotations

import numpy as np

from radixlm.grammar import budget
from radixlm.grammar.chain_share import share_by_depth, share_whole  # noqa: F401 (re-exported)
from radixlm.grammar.tall_trie import node_depths, short_mask, tall_trie

BATCH_NODES = 4096  # long tokens' tries up to this many nodes are walked for several copies ...
BATCH_CELLS = 65536  # ... up to this many (node, copy) cells per walk ...
MAX_BATCH = 64  # ... and this many copies


def share_by_depth_batch(index, s: int, tall_share: int) -> bool:
    """As :func:`~radixlm.grammar.chain_share.share_by_depth` for wide state ``s`` of ``index``
    (a DfaIndex with shift classes), and the same for other copies of ``s``'s depth-``D`` class
    with no mask yet (nearest ones first, those after ``s`` before those before it). Returns
    False (nothing set) when no known state matches ``s``."""
    if budget._current.get() is not None:  # NOTE: compiling (eager masks): one copy at a time
        return share_by_depth(index, s, tall_share)
    shifts = index._shifts
    t, d = shifts.match_depth(s)
    if t < 0 or t not in index.masks or (index.accept is not None and t not in index.bounds):
        return False
    tall = tall_trie(index.trie, d)
    if tall_share * tall.n_nodes >= index.cost2(s):
        return False
    room = min(MAX_BATCH, BATCH_CELLS // max(tall.n_nodes, 1)) - 1
    others = _copies(index, t, d, s, room) if tall.n_nodes <= BATCH_NODES and room > 0 else []
    if not others:
        return share_by_depth(index, s, tall_share)
    group = [s] + others
    st = _walk_many(index.trans, tall, np.asarray(group, dtype=np.int64))
    words = index.words
    alive = st[tall.long_nodes] != 0  # [long tokens, copies]
    tok_i, copy_i = np.nonzero(alive)
    tok = tall.long_ids[tok_i].astype(np.int64)
    flat = copy_i.astype(np.int64) * words + (tok >> 5)
    bits = np.left_shift(1, tok & 31).astype(np.float64)  # NOTE: distinct bits per row: exact sums
    long_rows = np.bincount(flat, weights=bits, minlength=len(group) * words)
    long_rows = long_rows.astype(np.uint32).view(np.int32).reshape(len(group), words)
    base = index.masks[t] & short_mask(index.trie, d, words)
    rows = long_rows | base
    if index.accept is not None:
        depths = node_depths(index.trie)
        near = index.bounds[t]
        near = near[depths[near] <= d].astype(np.int64)
        deep_st = st[tall.deep_nodes]
        deep_ok = index.accept[deep_st] & (deep_st != 0)  # [deep nodes, copies]
    for k, q in enumerate(group):
        if index.accept is not None:
            deep = tall.deep_nodes[deep_ok[:, k]]
            index.bounds[q] = np.sort(np.concatenate([near, tall.old[deep]]))
        index.masks[q] = rows[k]
        shifts.register(q)
    return True


def _copies(index, t: int, d: int, s: int, room: int) -> list[int]:
    """Up to ``room`` states other than ``s`` with no mask yet whose depth-``d`` window equals
    ``t``'s (hash, offsets, then the keys compared exactly); nearest to ``s`` first, those after
    it before those before it."""
    shifts = index._shifts
    cache = shifts.__dict__.setdefault("_classes", {})
    h = int(shifts.hash[d][t])
    cands = cache.get((d, h))
    if cands is None:
        cands = cache[(d, h)] = np.flatnonzero(shifts.hash[d] == shifts.hash[d][t])
    low, high = shifts.low, shifts.high[d]
    lo_t, hi_t = int(low[t]), int(high[t])
    ok = (cands - low[cands] == t - lo_t) & (high[cands] - cands == hi_t - t) & (cands != s)
    cands = cands[ok]
    cands = np.asarray([c for c in cands.tolist() if c not in index.masks], dtype=np.int64)
    if not cands.size:
        return []
    order = np.lexsort((np.abs(cands - s), cands < s))
    cands = cands[order[: room]]
    offs = np.arange(hi_t - lo_t + 1)
    same = (shifts.keys[low[cands][:, None] + offs] == shifts.keys[lo_t + offs]).all(axis=1)
    return cands[same].tolist()


def _walk_many(trans: np.ndarray, trie, starts: np.ndarray) -> np.ndarray:
    """DFA state (0: dead) after every node of ``trie`` from each of ``starts``: int ``[n_nodes,
    len(starts)]``; one gather per depth for all starts (stops at the first depth with every
    parent dead)."""
    wide = trans.shape[0] >= 1 << 23  # NOTE: state * 256 + byte must fit int32
    flat = trans.reshape(-1).astype(np.int64 if wide else np.int32, copy=False)
    st = np.zeros((trie.n_nodes, starts.size), dtype=flat.dtype)
    st[0] = starts
    for lo, hi, parent, byte in trie.levels():
        par = st[parent]
        if not par.any():
            break
        par <<= 8
        par += byte[:, None]
        flat.take(par, out=st[lo:hi])
    return st
