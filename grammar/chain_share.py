"""Masks (and boundary nodes) of a counting chain's copies taken from a known copy.

:class:`~radixlm.grammar.shift_classes.ShiftClasses` finds a state ``t`` whose mask is known and
whose transitions agree with ``s``'s, shifted, over every path of up to ``D`` bytes (the whole
trie depth, or a shorter ``D`` near a chain's end). This module applies such a match to a
:class:`~radixlm.grammar.token_index.DfaIndex`: the mask, and for an index that tracks boundary
nodes (trie nodes after which the DFA, from the state, accepts) those too.

Boundary nodes stay exact because, for such an index, the shift classes' row keys also carry the
acceptance of every transition's target (``ShiftClasses(..., accept=...)``): walking ``s`` and
``t`` in lockstep along a path of ``k <= D`` bytes, the pair before the last byte was reached by
``k - 1 <= D - 1`` relative moves, so it lies in the compared window and its equal keys give the
last byte's targets equal acceptance (after an absolute move both sides are the same state). So
every boundary node of depth ``<= D`` is one for ``s`` exactly when it is one for ``t``; the deeper
ones come from the walk of the long tokens' trie (:mod:`radixlm.grammar.tall_trie`), which visits
every node deeper than ``D``.
"""

from __future__ import annotations

import numpy as np

from radixlm.grammar.mask_pack import pack_ids
from radixlm.grammar.tall_trie import node_depths, short_mask, tall_trie
from radixlm.grammar.trie_walks import dense_walk


def share_whole(index, s: int) -> bool:
    """Give wide state ``s`` of ``index`` the mask (and boundary nodes) of a known state of its
    shift class that agrees with it over the whole trie depth; False (nothing set) when none."""
    t = index._shifts.match(s)
    if t < 0 or t not in index.masks:
        return False
    if index.accept is not None:
        got = index.bounds.get(t)
        if got is None:
            return False
        index.bounds[s] = got
    index.masks[s] = index.masks[t]
    return True


def share_by_depth(index, s: int, tall_share: int) -> bool:
    """Mask of ``s`` as ``(mask(t) & short(D)) | long(s, D)`` for a known ``t`` matching ``s`` up
    to ``D`` bytes, and its boundary nodes as ``t``'s of depth ``<= D`` plus the deeper ones the
    long walk finds (sorted); ``s`` is registered. False (nothing set) when no ``t`` matches or
    the long tokens' trie is not under ``1 / tall_share`` of ``s``'s walk."""
    t, d = index._shifts.match_depth(s)
    if t < 0 or t not in index.masks or (index.accept is not None and t not in index.bounds):
        return False
    trie = index.trie
    tall = tall_trie(trie, d)
    if tall_share * tall.n_nodes >= index.cost2(s):
        return False
    st = dense_walk(index.trans, tall, s)
    long_tokens = pack_ids(tall.long_ids[st[tall.long_nodes] != 0], index.words)
    if index.accept is not None:
        depths = node_depths(trie)
        near = index.bounds[t]
        near = near[depths[near] <= d]
        deep = tall.deep_nodes[index.accept[st[tall.deep_nodes]] & (st[tall.deep_nodes] != 0)]
        index.bounds[s] = np.sort(np.concatenate([near.astype(np.int64), tall.old[deep]]))
    index.masks[s] = (index.masks[t] & short_mask(trie, d, index.words)) | long_tokens
    index._shifts.register(s)
    return True
