"""Radix-tree node and the prefix-length routine used by :class:`radixlm.radix.cache.RadixCache`."""

from __future__ import annotations

import itertools

import torch

_node_ids = itertools.count()


class TreeNode:
    """One edge of the radix tree (the tokens it adds below its parent) and their KV slots.

    Attributes:
        key: token ids of this edge (``len(key) == value.numel()``; a multiple of the page size).
        value: int64 ``[len(key)]`` KV slots owned by the cache.
        children: child nodes keyed by their first token (``page_size == 1``) or first page tuple.
        parent: parent node (``None`` for the root).
        lock_ref: number of locks on this node (a lock on a node also counts on every ancestor).
        last_access_time: logical clock of the last match/insert through this node (LRU order).
    """

    __slots__ = ("key", "value", "children", "parent", "lock_ref", "last_access_time", "id")

    def __init__(
        self,
        key: list[int],
        value: torch.Tensor,
        parent: TreeNode | None,
        last_access_time: int = 0,
    ) -> None:
        self.key = key
        self.value = value
        self.children: dict = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access_time = last_access_time
        self.id = next(_node_ids)

    def __lt__(self, other: TreeNode) -> bool:  # heap tie-break
        return self.id < other.id

    def __repr__(self) -> str:
        return (
            f"TreeNode(id={self.id}, len={len(self.key)}, lock_ref={self.lock_ref}, "
            f"t={self.last_access_time}, children={len(self.children)})"
        )

    def path_token_ids(self) -> list[int]:
        """Token ids from the root down to the end of this node."""
        parts = []
        node: TreeNode | None = self
        while node is not None:
            parts.append(node.key)
            node = node.parent
        return [t for part in reversed(parts) for t in part]


def prefix_len(key: list[int], ids: list[int], start: int) -> int:
    """Length of the common prefix of ``key`` and ``ids[start:]``.

    The whole-edge case is one C-level list comparison; a mismatch is located by bisection over
    slice comparisons, so the cost stays ~linear in C and logarithmic in Python steps.
    """
    n = len(key)
    if ids[start : start + n] == key:
        return n
    m = min(n, len(ids) - start)
    if m < n and ids[start : start + m] == key[:m]:
        return m
    lo, hi = 0, m  # key[:lo] matches; the first mismatch lies in [lo, hi)
    while hi - lo > 8:
        mid = (lo + hi) // 2
        if key[lo:mid] == ids[start + lo : start + mid]:
            lo = mid
        else:
            hi = mid
    while lo < hi and key[lo] == ids[start + lo]:
        lo += 1
    return lo
