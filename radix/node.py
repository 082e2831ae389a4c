"""Radix-tree nodes, the token/slot chains they slice, and a fast common-prefix routine.

Used by :class:`radixlm.radix.cache.RadixCache`. A node does not own a copy of its tokens and slots:
it is the depth range ``[start, end)`` of a :class:`Chain`, the tokens and slots of one insert (from
the depth where it branched off down to its end). Splitting a node cuts the range in two; the nodes
of one chain always form a parent -> child path, so a match can compare a whole run of nodes at
once (one list comparison) and then find where it stopped with one bisection over the chain's node
ends, instead of visiting every node (a shared trunk cut at thousands of branch points).
"""

from __future__ import annotations

import array
import itertools
import struct
from bisect import bisect_left

import numpy as np
import torch

_node_ids = itertools.count()


class Chain:
    """Tokens and KV slots of one insert, and the live nodes that slice them.

    Attributes:
        base: tree depth of ``tokens[0]``.
        tokens: token ids of depths ``base ..``: the inserted ``list[int]``, packed into an int64
            ``np.ndarray`` the first time a match compares against it (:meth:`array`).
        slots: int64 ``[len(tokens)]`` their KV slots (owned by the nodes that cover them).
        nodes: the live nodes of this chain, parent before child (a path); ``ends`` their ``end``.
    """

    __slots__ = ("base", "tokens", "slots", "nodes", "ends")

    def __init__(self, base: int, tokens: list[int] | np.ndarray, slots: torch.Tensor) -> None:
        self.base, self.tokens, self.slots = base, tokens, slots
        self.nodes: list[TreeNode] = []
        self.ends: list[int] = []

    def array(self) -> np.ndarray:
        """``tokens`` as int64 (packed once, on first use: inserts stay cheap)."""
        if type(self.tokens) is list:
            self.tokens = pack(self.tokens)
        return self.tokens

    def ids(self, a: int, b: int) -> list[int]:
        """``tokens[a:b]`` as a list of ints."""
        t = self.tokens[a:b]
        return t if type(t) is list else t.tolist()

    def add(self, node: TreeNode) -> None:
        """Register ``node`` (its ``end`` is not yet in ``ends``), keeping depth order."""
        i = bisect_left(self.ends, node.end)
        self.ends.insert(i, node.end)
        self.nodes.insert(i, node)

    def drop_tail(self, node: TreeNode) -> None:
        """Forget the last node (an evicted leaf); shrink the arrays when mostly dead."""
        assert self.nodes[-1] is node, "only a chain's last node can be a leaf"
        self.nodes.pop()
        self.ends.pop()
        live = (self.ends[-1] if self.ends else self.base) - self.base
        if 2 * live < len(self.tokens):  # NOTE: keep memory ~ live tokens; nodes hold no copies
            t = self.tokens[:live]
            self.tokens = t if type(t) is list else t.copy()
            self.slots = self.slots[:live].clone()


class TreeNode:
    """One edge of the radix tree (the tokens it adds below its parent) and their KV slots.

    Attributes:
        chain, start, end: the edge is depths ``[start, end)`` of ``chain``; ``end`` is the depth of
            the node (tokens from the root to its end).
        children: child nodes keyed by their first token (``page_size == 1``) or first page tuple.
        parent: parent node (``None`` for the root).
        lock_ref: number of locks on this node (a lock on a node also counts on every ancestor).
        lease_ref: number of program leases held on this node or a descendant (``radix/lease.py``):
            a leased node is evicted only after every unleased one.
        t: logical time of the last match/insert that *ended* at this node, or of an evicted child
            (see :attr:`last_access_time`).
    """

    __slots__ = ("chain", "start", "end", "children", "parent", "lock_ref", "lease_ref", "t", "id")

    def __init__(self, chain: Chain, start: int, end: int, parent: TreeNode | None, t: int = 0):
        self.chain, self.start, self.end = chain, start, end
        self.children: dict = {}
        self.parent = parent
        self.lock_ref = 0
        self.lease_ref = 0
        self.t = t
        self.id = next(_node_ids)

    @property
    def key(self) -> list[int]:
        """Token ids of this edge (a copy; ``len == end - start``, a multiple of the page size)."""
        b = self.chain.base
        return self.chain.ids(self.start - b, self.end - b)

    @property
    def value(self) -> torch.Tensor:
        """int64 ``[end - start]`` KV slots of this edge (a read-only view), owned by the cache."""
        b = self.chain.base
        return self.chain.slots[self.start - b : self.end - b]

    @property
    def last_access_time(self) -> int:
        """Logical clock of the last match/insert through this node (LRU order).

        NOTE: a match or insert stamps only the node where it ends (``t``); every node on the path
        counts as accessed, so a node's time is the max of ``t`` over its subtree (an evicted leaf
        folds its ``t`` into its parent's). For a leaf that is ``t`` itself: O(1) where eviction
        needs it; inner nodes cost a walk of their subtree (diagnostics and tests only).
        """
        best, stack = self.t, list(self.children.values())
        while stack:
            node = stack.pop()
            best = max(best, node.t)
            stack.extend(node.children.values())
        return best

    def __lt__(self, other: TreeNode) -> bool:  # heap tie-break
        return self.id < other.id

    def __repr__(self) -> str:
        return (
            f"TreeNode(id={self.id}, depth={self.start}..{self.end}, lock_ref={self.lock_ref}, "
            f"lease_ref={self.lease_ref}, "
            f"t={self.t}, children={len(self.children)})"
        )

    def path_token_ids(self) -> list[int]:
        """Token ids from the root down to the end of this node."""
        parts = []
        node: TreeNode | None = self
        while node is not None and node.parent is not None:
            chain = node.chain
            parts.append(chain.ids(0, node.end - chain.base))
            node = chain.nodes[0].parent  # NOTE: the chain's first node starts at chain.base
        return [t for part in reversed(parts) for t in part]


def pack_ids(token_ids) -> np.ndarray:
    """Token ids packed once as a read-only int64 ``np.ndarray`` ``[len]`` for
    :meth:`RadixCache.match_prefix` / ``match_node`` / ``insert`` (a caller that matches and then
    inserts the same ids packs them once instead of twice). Accepts what :func:`as_ids` accepts."""
    ids = as_ids(token_ids)
    arr = pack(ids) if type(ids) is list else ids.view()  # NOTE: a view: the caller's flags stay
    arr.flags.writeable = False
    return arr


def as_ids(token_ids):
    """``token_ids`` as the cache walks them: a ``list[int]`` as is, an int64 1-D ``np.ndarray``
    for arrays (``np.ndarray``, ``array.array``, ``torch.Tensor``; other integer dtypes are
    converted), anything else iterable as a list. Raises ValueError for a non-1-D array."""
    t = type(token_ids)
    if t is list:
        return token_ids
    if t is np.ndarray or isinstance(token_ids, (np.ndarray, array.array, torch.Tensor)):
        if isinstance(token_ids, torch.Tensor):
            token_ids = token_ids.detach().cpu().numpy()
        elif isinstance(token_ids, array.array):
            token_ids = np.frombuffer(token_ids, dtype=token_ids.typecode)
        arr = np.asarray(token_ids)
        if arr.ndim != 1:
            raise ValueError(f"token ids must be 1-D, got shape {arr.shape}")
        return arr if arr.dtype == np.int64 else arr.astype(np.int64)
    return list(token_ids)


def pack(ids: list[int]) -> np.ndarray:
    """``ids`` as an int64 array (~4 ns a token: one ``struct.pack``)."""
    return np.frombuffer(struct.pack(f"{len(ids)}q", *ids), dtype=np.int64)


def common_len(a: np.ndarray, i: int, b: np.ndarray, j: int, m: int) -> int:
    """Length of the common prefix of ``a[i:i+m]`` and ``b[j:j+m]`` (both at least ``m`` long)."""
    ne = a[i : i + m] != b[j : j + m]
    k = int(ne.argmax())
    return k if ne[k] else m
