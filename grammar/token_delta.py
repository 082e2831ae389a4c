"""Token masks of a DFA state from the mask of a *similar* state (differential masks).

Many wide states differ from a neighbour only along a few byte paths: inside the key of an
undeclared property (``"na`` must not close as ``"name"`` when ``name`` is declared) every byte but
``m`` leads to the same plain string-body state as from that body state itself. For a state ``s``
and a reference ``g`` whose mask is known, walk the vocabulary trie from ``(s, g)`` in lockstep:
once both sides reach the *same* DFA state after a prefix, every token below that prefix is
allowed from ``s`` exactly when it is allowed from ``g``, so the walk stops there. The nodes where
the two sides still differ (the divergent nodes: the declared-key path, the closing quote and what
follows it) decide their tokens directly. Hence (exact, for any DFA)::

    mask(s) = (mask(g) & ~tokens(D)) | tokens({n in D : s is alive after n})
    D = trie nodes whose bytes lead ``s`` and ``g`` to different states

Only the divergent nodes are walked, instead of the whole vocabulary (a dense walk from a
string-body-like state touches every trie node) or whole first-byte subtrees.
"""

from __future__ import annotations

import numpy as np

from radixlm.grammar.trie import TokenTrie, expand

MIN_SHARED = 128  # the reference must agree with the state on at least this many bytes
MAX_SHARE = 4  # ... and the differing subtrees may hold at most 1/MAX_SHARE of the walk's nodes


def reference_state(trans: np.ndarray, cost: np.ndarray, byte_weight: np.ndarray, s: int) -> int:
    """The state ``g`` to derive ``s``'s mask from: the most common non-dead target of ``s``
    other than ``s``, when it agrees with ``s`` on >= ``MIN_SHARED`` bytes and the differing
    bytes' subtrees are small against ``s``'s walk; 0 when there is no good reference."""
    row = trans[s]
    counts = np.bincount(row, minlength=max(s, int(row.max())) + 1)
    counts[0] = 0
    counts[s] = 0
    g = int(counts.argmax())
    if g == 0 or counts[g] == 0:
        return 0
    differ = row != trans[g]
    if 256 - int(differ.sum()) < MIN_SHARED:
        return 0
    if int(byte_weight[differ].sum()) * MAX_SHARE > int(cost[s]):
        return 0
    return g


def delta_mask(trans: np.ndarray, trie: TokenTrie, words: int, s: int, g: int, base: np.ndarray,
               pack) -> np.ndarray:
    """``mask(s)`` from ``base = mask(g)`` by a lockstep walk (see the module docstring).

    Args:
        trans: int32 ``[n_states, 256]`` DFA transitions (0 dead).
        pack: :func:`radixlm.grammar.token_index.pack_tokens` (passed in to avoid an import cycle).
    Returns:
        int32 ``[words]`` packed mask of ``s`` (stop tokens excluded, like ``base``).
    """
    node, qs = divergent(trans, trie, s, g)
    return _edit(base, node, qs != 0, trie, words, pack)


def delta_bounds(trans: np.ndarray, trie: TokenTrie, words: int, s: int, g: int, base: np.ndarray,
                 base_bounds: np.ndarray, accept: np.ndarray, pack) -> tuple[np.ndarray, np.ndarray]:
    """``(mask(s), bounds(s))`` from ``mask(g)`` and ``bounds(g)`` (the trie nodes after which
    the DFA is accepting, as :meth:`radixlm.grammar.token_index.DfaIndex.boundary` keeps them for
    an Earley terminal). Below the divergent nodes ``D`` both walks are in one state, so
    ``bounds(s) = (bounds(g) - D) | {n in D : accepting after n from s}``.

    Args:
        base_bounds: int64 node ids, ``bounds(g)``.
        accept: bool ``[n_states]`` accepting flags of ``trans``.
    Returns:
        the packed int32 ``[words]`` mask and the int64 node ids of ``s``.
    """
    node, qs = divergent(trans, trie, s, g)
    mask = _edit(base, node, qs != 0, trie, words, pack)
    if not node.size:
        return mask, base_bounds
    kept = base_bounds[~np.isin(base_bounds, node)]
    return mask, np.concatenate([kept, node[accept[qs]]])


def divergent(trans: np.ndarray, trie: TokenTrie, s: int, g: int) -> tuple[np.ndarray, np.ndarray]:
    """The trie nodes ``D`` whose bytes lead ``s`` and ``g`` to different states (int64 ids, by
    depth), and the state of ``s`` after each (0: dead)."""
    flat = trans.reshape(-1)
    node = np.zeros(1, dtype=np.int64)
    qs = np.asarray([s], dtype=np.int64)
    qg = np.asarray([g], dtype=np.int64)
    nodes, alive = [], []
    while node.size:
        kids, owner = expand(trie.child_lo[node].astype(np.int64), trie.child_cnt[node])
        if kids.size == 0:
            break
        byte = trie.node_byte[kids]
        ns = flat[qs[owner] * 256 + byte].astype(np.int64)
        ng = flat[qg[owner] * 256 + byte].astype(np.int64)
        differ = ns != ng  # NOTE: equal states (both dead included): the subtree agrees with g
        node, qs, qg = kids[differ], ns[differ], ng[differ]
        nodes.append(node)
        alive.append(qs)
    if not nodes:
        z = np.zeros(0, dtype=np.int64)
        return z, z
    return np.concatenate(nodes), np.concatenate(alive)


def _edit(base: np.ndarray, node: np.ndarray, ok: np.ndarray, trie: TokenTrie, words: int, pack) -> np.ndarray:
    """``base`` with the tokens of ``node`` cleared, then set where ``ok``."""
    if not node.size:
        return base
    tok = trie.node_token[node]
    has = tok >= 0
    if not has.any():
        return base
    out = base & ~pack(tok[has], trie, words)
    keep = has & ok
    if keep.any():
        out = out | pack(tok[keep], trie, words)
    return out
