"""Walks of the vocabulary trie against a byte DFA, vectorized with numpy (see
:mod:`radixlm.grammar.token_index`): sparse over live ``(node, state)`` pairs, or dense over every
node of each depth."""

from __future__ import annotations

import numpy as np

from radixlm.grammar.trie import TokenTrie, expand

DENSE_STOP_CHECK = 2048  # the dense walk tests a level for live parents only below this many nodes
TAIL_NODES = 24  # depths with fewer nodes than this (all deeper too) are walked node by node


def walk_from(trans: np.ndarray, trie: TokenTrie, nodes: np.ndarray, states: np.ndarray,
              src: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sparse walk below ``nodes`` (each in DFA state ``states``) through the subtrees.

    Returns ``(src, node, state)`` for every live descendant (``src``: index of its start pair, or
    the given ``src`` values); the start nodes themselves are not included.
    """
    flat = trans.reshape(-1)
    child_lo, child_cnt, node_byte = trie.walk_arrays()
    src = np.arange(nodes.size, dtype=np.int64) if src is None else src.astype(np.int64)
    node = nodes.astype(np.int64)
    st = states.astype(np.int64)
    out_src, out_node, out_st = [], [], []
    while src.size:
        # NOTE: expand() inlined over int64 copies: fewer numpy calls per depth (first visits
        # walk a few dozen pairs, where each call's overhead is most of the cost)
        cnt = child_cnt[node]
        ends = np.cumsum(cnt)
        total = int(ends[-1])
        if total == 0:
            break
        owner = np.repeat(np.arange(node.size), cnt)
        kids = np.repeat(child_lo[node] - ends + cnt, cnt)
        kids += np.arange(total)
        nst = flat[(st << 8)[owner] + node_byte[kids]]
        live = np.flatnonzero(nst)
        owner = owner[live]
        src, node, st = src[owner], kids[live], nst[live].astype(np.int64)
        out_src.append(src)
        out_node.append(node)
        out_st.append(st)
    if not out_src:
        z = np.zeros(0, np.int64)
        return z, z, z
    return np.concatenate(out_src), np.concatenate(out_node), np.concatenate(out_st)


def dense_walk(trans: np.ndarray, trie: TokenTrie, start: int) -> np.ndarray:
    """DFA state (0: dead) after every trie node's bytes, from ``start``: int32 ``[n_nodes]``.

    One gather per trie depth (``trans[parent state, byte]``), in place; stops at the first depth
    with no live parent among few nodes (state 0 is absorbing, so large dead levels stay 0). The
    deep, thin depths (fewer than ``TAIL_NODES`` nodes each) go node by node in Python instead.
    """
    flat = trans.reshape(-1)
    wide = trans.shape[0] >= 1 << 23  # NOTE: state * 256 + byte must fit int32
    flat = flat.astype(np.int64 if wide else np.int32, copy=False)
    st = np.zeros(trie.n_nodes, dtype=flat.dtype)
    st[0] = start
    tail_lo = trie.tail(TAIL_NODES)[0]
    for lo, hi, parent, byte in trie.levels():
        if lo >= tail_lo:
            _tail_walk(flat, trie, st)
            break
        par = st[parent]
        if hi - lo < DENSE_STOP_CHECK and not par.any():
            break
        par <<= 8
        par += byte
        flat.take(par, out=st[lo:hi])
    return st.astype(np.int32, copy=False)


def _tail_walk(flat: np.ndarray, trie: TokenTrie, st: np.ndarray) -> None:
    """Fill ``st`` for the trie's tail (:meth:`TokenTrie.tail`) node by node: a few hundred
    nodes over ~100 depths, where one numpy call per depth would cost more (NOTE: measured)."""
    lo, parents, bytes_ = trie.tail(TAIL_NODES)
    first = parents[0]
    vals = st[first:lo].tolist()
    if not any(vals):
        return
    rows = memoryview(flat)
    for p, b in zip(parents, bytes_):
        q = vals[p - first]
        vals.append(rows[(q << 8) | b] if q else 0)
    st[lo:] = vals[lo - first :]
