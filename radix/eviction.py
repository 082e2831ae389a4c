"""LRU eviction of the radix cache in two tiers (unleased, then leased) and its lease API.

A mixin of :class:`radixlm.radix.cache.RadixCache` (kept apart to keep files short): it reads the
cache's tree, counters and heaps (``_lru``, ``_lru_leased``, ``_evictable``, ``_num_nodes``,
``_root``, ``leases``) and is not used on its own. Leases are described in ``radix/lease.py``.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.radix.node import TreeNode


class EvictionMixin:
    """Two-tier LRU eviction and the lease methods of :class:`RadixCache`."""

    @staticmethod
    def _lru_valid(t: int, node: TreeNode, leased: bool = False) -> bool:
        """Is ``(t, node)`` the live entry of an evictable leaf in the ``leased`` tier's heap?"""
        return (
            node.parent is not None
            and not node.children
            and node.lock_ref == 0
            and node.t == t
            and (node.lease_ref > 0) == leased
        )

    def _lru_push(self, node: TreeNode) -> None:
        """Record ``node``'s current access time in its tier if it is an evictable leaf."""
        if node.children or node.lock_ref or node.parent is None:
            return
        leased = node.lease_ref > 0
        heap = self._lru_leased if leased else self._lru
        heapq.heappush(heap, (node.t, node))  # NOTE: a leaf's access time is its own t
        if len(heap) > 2 * self._num_nodes + 64:
            live = {n.id: (t, n) for t, n in heap if self._lru_valid(t, n, leased)}
            heap[:] = list(live.values())
            heapq.heapify(heap)

    # ---- eviction ----------------------------------------------------------------------------

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` cached slots: unleased leaves first, then leased ones
        (each tier least recently used first); expired leases end first (``radix/lease.py``)."""
        if num_tokens <= 0 or self._evictable == 0:
            return 0
        self.leases.expire()
        slots: list[torch.Tensor] = []
        freed = self._evict_tier(self._lru, False, num_tokens, slots)
        if freed < num_tokens:  # NOTE: leases never block admission: leased leaves go last
            freed += self._evict_tier(self._lru_leased, True, num_tokens - freed, slots)
        self._evictable -= freed
        if self.allocator is not None and slots:
            self.allocator.free(torch.cat(slots))  # NOTE: one free call: it copies the free list
        return freed

    def _evict_tier(self, heap: list, leased: bool, num_tokens: int, slots: list) -> int:
        root, valid = self._root, self._lru_valid
        freed = 0
        while freed < num_tokens and heap:
            t, node = heapq.heappop(heap)
            if not valid(t, node, leased):
                continue
            parent = node.parent
            del parent.children[self._key_at(node.chain, node.start)]
            slots.append(node.value)
            node.chain.drop_tail(node)
            if leased:
                self.leases.node_evicted(node)
            node.parent = None
            self._num_nodes -= 1
            freed += node.end - node.start
            if parent.t < node.t:  # NOTE: keeps the parent's (subtree) access time
                parent.t = node.t
            if parent is not root and not parent.children and parent.lock_ref == 0:
                self._lru_push(parent)  # NOTE: same tier (a leased leaf's parent is leased)
        return freed

    # ---- leases (radix/lease.py) -------------------------------------------------------------

    def lease(self, lease_id: str, node: TreeNode, ttl_s: float) -> None:
        """Lease the path root -> ``node`` as ``lease_id`` for ``ttl_s`` seconds (moves and renews
        an existing lease of that id). Raises ValueError for ``ttl_s <= 0``."""
        self.leases.lease(lease_id, node, ttl_s)

    def release_leases(self, ids) -> int:
        """End the leases ``ids`` (unknown ids ignored); returns how many ended."""
        return self.leases.release(ids)

    def expire_leases(self) -> int:
        """End the leases whose TTL ran out; returns how many ended."""
        return self.leases.expire()

    def num_leases(self) -> int:
        return len(self.leases)

