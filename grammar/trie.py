"""Byte trie of a vocabulary in breadth-first layout, for vectorized walks against a byte DFA.

Node 0 is the root. Nodes of one depth are contiguous and sorted by prefix, so the children of any
node are one contiguous run ``[child_lo[n], child_lo[n] + child_cnt[n])`` of the next depth: a walk
expands all live nodes of a depth at once with numpy (see :func:`expand`).
"""

from __future__ import annotations

import numpy as np


class TokenTrie:
    """Trie over the byte strings of all non-special tokens.

    Attributes:
        node_byte: int32 ``[n_nodes]``, the byte on the edge into each node (root: 0).
        child_lo, child_cnt: int32 ``[n_nodes]``, the children run of each node.
        node_token: int32 ``[n_nodes]``, one token id ending at the node, or -1.
        dup_token, dup_of: int32, further token ids with the same bytes as ``dup_of``.
        token_node: int32 ``[tokenizer_size]``, node of each token (-1: special / empty).
        max_depth: the longest token in bytes.
    """

    def __init__(self, token_bytes: list[bytes | None]) -> None:
        by_bytes: dict[bytes, list[int]] = {}
        for tid, b in enumerate(token_bytes):
            if b:
                by_bytes.setdefault(b, []).append(tid)
        keys = sorted(by_bytes)
        n = len(keys)
        lens = np.fromiter((len(k) for k in keys), dtype=np.int64, count=n)
        width = int(lens.max()) if n else 0
        mat = np.zeros((n, width), dtype=np.uint8)
        flat = np.frombuffer(b"".join(keys), dtype=np.uint8)
        rows = np.repeat(np.arange(n), lens)
        cols = np.arange(flat.size) - np.repeat(np.cumsum(lens) - lens, lens)
        mat[rows, cols] = flat
        # lcp[i]: common prefix length of keys[i-1] and keys[i] (sorted, so the first difference
        # or the shorter length).
        lcp = np.zeros(n, dtype=np.int64)
        if n > 1:
            diff = mat[1:] != mat[:-1]
            first = np.where(diff.any(axis=1), diff.argmax(axis=1), width)
            lcp[1:] = np.minimum(first, np.minimum(lens[1:], lens[:-1]))
        bytes_l, parent_l, cur = [np.zeros(1, np.int64)], [np.full(1, -1, np.int64)], np.zeros(n, np.int64)
        depth_start = [0, 1]
        end_node = np.zeros(n, dtype=np.int64)
        total = 1
        for d in range(1, width + 1):
            has = lens >= d
            new = has & (lcp < d)
            idx = np.nonzero(has)[0]
            new_idx = np.nonzero(new)[0]
            count = new_idx.size
            # node id at depth d of every key that long: running count of new nodes.
            ids = total + np.cumsum(new[idx]) - 1
            bytes_l.append(mat[new_idx, d - 1].astype(np.int64))
            parent_l.append(cur[new_idx])
            cur = cur.copy()
            cur[idx] = ids
            ends = idx[lens[idx] == d]
            end_node[ends] = cur[ends]
            total += count
            depth_start.append(total)
        node_token = np.full(total, -1, dtype=np.int32)
        token_node = np.full(len(token_bytes), -1, dtype=np.int32)
        dup_token: list[int] = []
        dup_of: list[int] = []
        for i, k in enumerate(keys):
            ids_k = by_bytes[k]
            node = int(end_node[i])
            node_token[node] = ids_k[0]
            for t in ids_k:
                token_node[t] = node
            for t in ids_k[1:]:
                dup_token.append(t)
                dup_of.append(ids_k[0])
        self._set_structure(np.asarray(depth_start, dtype=np.int64), np.concatenate(parent_l),
                            np.concatenate(bytes_l), node_token, token_node,
                            np.asarray(dup_token, dtype=np.int64), np.asarray(dup_of, dtype=np.int64))

    @classmethod
    def from_structure(cls, depth_start: np.ndarray, parent: np.ndarray, node_byte: np.ndarray,
                       node_token: np.ndarray, token_node: np.ndarray, dup_token: np.ndarray,
                       dup_of: np.ndarray) -> "TokenTrie":
        """A trie from its breadth-first arrays (see the class docstring; ``parent`` int
        ``[n_nodes]``, root -1, non-decreasing within each depth)."""
        self = cls.__new__(cls)
        self._set_structure(depth_start, parent, node_byte, node_token, token_node, dup_token, dup_of)
        return self

    def _set_structure(self, depth_start, parent, node_byte, node_token, token_node, dup_token, dup_of) -> None:
        total = int(depth_start[-1])
        width = len(depth_start) - 2
        parent = np.asarray(parent, dtype=np.int64)
        self.n_nodes = total
        self.max_depth = width
        self.depth_start = np.asarray(depth_start, dtype=np.int64)
        self.node_byte = np.asarray(node_byte).astype(np.int32)
        self.node_token = np.asarray(node_token, dtype=np.int32)
        self.token_node = np.asarray(token_node, dtype=np.int32)
        self.dup_token = np.asarray(dup_token, dtype=np.int64)
        self.dup_of = np.asarray(dup_of, dtype=np.int64)
        self.child_lo = np.zeros(total, dtype=np.int32)
        self.child_cnt = np.zeros(total, dtype=np.int32)
        if total > 1:
            par = parent[1:]
            cnt = np.bincount(par, minlength=total)
            self.child_cnt[:] = cnt
            # parents are non-decreasing in BFS order, so each run starts at its first child.
            starts = np.searchsorted(par, np.arange(total), side="left") + 1
            self.child_lo[:] = np.where(cnt > 0, starts, 0)
        self.parent = parent.astype(np.int32)
        # subtree size of each depth-1 node, indexed by its byte (cost estimate of a walk).
        top = np.zeros(total, dtype=np.int64)
        d1 = np.arange(self.depth_start[1], self.depth_start[2]) if width else np.zeros(0, np.int64)
        top[d1] = d1
        for d in range(2, width + 1):
            lo, hi = self.depth_start[d], self.depth_start[d + 1]
            top[lo:hi] = top[parent[lo:hi]]
        sizes = np.bincount(top[1:], minlength=total) if total > 1 else np.zeros(total, np.int64)
        self.byte_weight = np.zeros(256, dtype=np.int64)
        self.byte_weight[self.node_byte[d1]] = sizes[d1]
        # subtree sizes of depth-2 nodes by their two bytes (a finer cost estimate).
        self.pair_weight = np.zeros((256, 256), dtype=np.int64)
        if width >= 2:
            top2 = np.zeros(total, dtype=np.int64)
            d2 = np.arange(self.depth_start[2], self.depth_start[3])
            top2[d2] = d2
            for d in range(3, width + 1):
                lo, hi = self.depth_start[d], self.depth_start[d + 1]
                top2[lo:hi] = top2[parent[lo:hi]]
            deep = np.arange(self.depth_start[2], total)
            sizes2 = np.bincount(top2[deep], minlength=total)
            self.pair_weight[self.node_byte[parent[d2]], self.node_byte[d2]] = sizes2[d2]
        # tokens with byte-duplicates: CSR from the primary id to the others.
        order = np.argsort(self.dup_of, kind="stable")
        self.dup_src = self.dup_of[order]
        self.dup_dst = self.dup_token[order]

    def levels(self) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
        """Per depth >= 1: ``(lo, hi, parent, byte)``, the node range ``[lo, hi)``, its parents
        (intp) and last bytes (int32), for level-by-level walks (built once)."""
        got = getattr(self, "_levels", None)
        if got is None:
            ds = self.depth_start
            got = self._levels = [
                (int(ds[d]), int(ds[d + 1]), self.parent[ds[d] : ds[d + 1]].astype(np.intp),
                 self.node_byte[ds[d] : ds[d + 1]].astype(np.int32))
                for d in range(1, len(ds) - 1) if ds[d + 1] > ds[d]]
        return got

    def pair_prefix(self) -> np.ndarray:
        """int32 ``[257, 256]``: prefix sums of :attr:`pair_weight` over the first byte (row
        ``b``: the first bytes below ``b``), built once. NOTE: int32 (every sum is at most
        ``n_nodes``): half the memory a first visit's gathers touch."""
        got = getattr(self, "_pair_prefix", None)
        if got is None:
            got = np.zeros((257, 256), dtype=np.int64)
            np.cumsum(self.pair_weight, axis=0, out=got[1:])
            got = self._pair_prefix = got.astype(np.int32)
        return got

    def walk_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """int64 copies of ``(child_lo, child_cnt, node_byte)`` for the sparse walks' gathers
        (no per-level conversions), built once."""
        got = getattr(self, "_walk_arrays", None)
        if got is None:
            got = self._walk_arrays = (self.child_lo.astype(np.int64), self.child_cnt.astype(np.int64),
                                       self.node_byte.astype(np.int64))
        return got

    def subtree_sizes(self) -> np.ndarray:
        """int64 ``[n_nodes]``: nodes in each node's subtree, itself included (built once)."""
        got = getattr(self, "_subtree_sizes", None)
        if got is None:
            got = np.ones(self.n_nodes, dtype=np.int64)
            for lo, hi, parent, _ in reversed(self.levels()):  # NOTE: deepest first; parents sorted
                plo, phi = int(parent[0]), int(parent[-1]) + 1
                got[plo:phi] += np.bincount(parent - plo, weights=got[lo:hi], minlength=phi - plo).astype(np.int64)
            self._subtree_sizes = got
        return got

    def node_of_tokens(self) -> np.ndarray:
        """intp ``[tokenizer_size]``: :attr:`token_node` with the root (0) for tokens without a
        node, for gathers over the vocabulary (built once)."""
        got = getattr(self, "_node_of_tokens", None)
        if got is None:
            got = self._node_of_tokens = np.maximum(self.token_node, 0).astype(np.intp)
        return got

    def tail(self, max_nodes: int) -> tuple[int, list[int], list[int]]:
        """The deep, thin part of the trie for per-node walks: ``(lo, parent, byte)`` with ``lo``
        the first node of the first depth from which every depth has fewer than ``max_nodes``
        nodes (``n_nodes``: none), and the parents and last bytes of the nodes from ``lo`` on as
        Python lists (built once per ``max_nodes``)."""
        got = getattr(self, "_tails", None)
        if got is None:
            got = self._tails = {}
        out = got.get(max_nodes)
        if out is None:
            sizes = np.diff(self.depth_start)
            d = len(sizes)
            while d > 1 and sizes[d - 1] < max_nodes:
                d -= 1
            lo = int(self.depth_start[d]) if d < len(sizes) else self.n_nodes
            out = got[max_nodes] = (lo, self.parent[lo:].tolist(), self.node_byte[lo:].tolist())
        return out

    def children(self, node: int) -> range:
        lo = int(self.child_lo[node])
        return range(lo, lo + int(self.child_cnt[node]))


def expand(lo: np.ndarray, cnt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate the runs ``[lo[i], lo[i] + cnt[i])``; also return the run index of each element."""
    total = int(cnt.sum())
    if total == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    owner = np.repeat(np.arange(lo.size), cnt)
    offs = np.arange(total) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    return lo[owner] + offs, owner
