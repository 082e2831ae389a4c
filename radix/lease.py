"""Program-aware cache leases: soft protection of prefixes a running program will extend again.

A lease names one tree node (the end of a program state's cached sequence) and lasts ``ttl_s``
seconds; re-leasing the same id moves it to the new node and renews it; the program releases it at
its end. It covers the path root -> node: each node's ``lease_ref`` counts the leases held on it
or below it. Eviction (:meth:`radixlm.radix.cache.RadixCache.evict`) takes evictable leaves in two
tiers, both least recently used first: every unleased leaf before any leased one. So a lease never
blocks admission and never deadlocks: under pressure leased leaves are evicted too (LRU among
leased nodes); a lease whose node is evicted moves up to the node's parent (the prefix still
cached stays leased) and ends when only the root is left.

Why: the interpreter knows that a running program will extend its state again (the next turn, the
next tool observation); plain LRU does not, and evicts a program's prefix while the program waits on
a tool or a user, in favour of prefixes of programs that already ended.

Single-threaded like the cache: every method runs on the scheduler's thread.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixlm.radix.node import TreeNode


@dataclass
class Lease:
    """One program lease: ``node`` (and its path to the root) is leased until ``expires``
    (``clock()`` seconds)."""

    id: str
    node: TreeNode
    expires: float


class LeaseTable:
    """The leases of one cache, by id and by node, with lazy TTL expiry.

    Args:
        on_unleased: called with a node whose ``lease_ref`` dropped to 0 (the cache re-files an
            evictable leaf into the unleased eviction tier).
        on_leased: called with a node whose ``lease_ref`` rose from 0 (re-filed as leased).
        clock: seconds, monotonic (``time.monotonic``; tests pass a fake clock).
    """

    def __init__(self, on_unleased: Callable[[TreeNode], None], on_leased: Callable[[TreeNode], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.on_unleased, self.on_leased, self.clock = on_unleased, on_leased, clock
        self.by_id: dict[str, Lease] = {}
        self.by_node: dict[int, set[str]] = {}  # node.id -> ids of the leases held on that node
        self._expiry: list[tuple[float, str]] = []  # lazy heap: stale entries are skipped
        self.evicted_tokens = 0  # leased tokens evicted under pressure (statistics)

    def __len__(self) -> int:
        return len(self.by_id)

    # ---- lease / release / expire ----------------------------------------------------------

    def lease(self, lease_id: str, node: TreeNode, ttl_s: float) -> None:
        """Hold ``lease_id`` on ``node`` for ``ttl_s`` seconds from now (moves and renews an
        existing lease of that id). A root ``node`` (nothing cached) just ends the lease.

        Raises:
            ValueError: ``ttl_s <= 0``.
        """
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.expire()  # NOTE: keeps the table bounded when no eviction runs (clients that never release)
        old = self.by_id.get(lease_id)
        if old is not None and old.node is not node:
            self._drop(old)
            old = None
        if node.parent is None:  # the root: an empty prefix needs no lease
            if old is not None:
                self._drop(old)
            return
        expires = self.clock() + ttl_s
        if old is None:
            self.by_id[lease_id] = Lease(lease_id, node, expires)
            self.by_node.setdefault(node.id, set()).add(lease_id)
            self._add_path(node, +1)
        else:
            old.expires = expires
        heapq.heappush(self._expiry, (expires, lease_id))
        if len(self._expiry) > 2 * len(self.by_id) + 64:
            self._expiry = [(x.expires, x.id) for x in self.by_id.values()]
            heapq.heapify(self._expiry)

    def release(self, ids: Iterable[str]) -> int:
        """End the leases ``ids`` (unknown ids are ignored). Returns how many ended."""
        n = 0
        for lease_id in ids:
            lease = self.by_id.get(lease_id)
            if lease is not None:
                self._drop(lease)
                n += 1
        return n

    def expire(self, now: float | None = None) -> int:
        """End every lease whose TTL ran out by ``now`` (default ``clock()``). Returns the count."""
        now = self.clock() if now is None else now
        n = 0
        heap = self._expiry
        while heap and heap[0][0] <= now:
            expires, lease_id = heapq.heappop(heap)
            lease = self.by_id.get(lease_id)
            if lease is not None and lease.expires == expires:
                self._drop(lease)
                n += 1
        return n

    def clear(self) -> None:
        """Forget every lease (the cache is being reset; its nodes are gone)."""
        self.by_id.clear()
        self.by_node.clear()
        self._expiry.clear()

    # ---- eviction --------------------------------------------------------------------------

    def node_evicted(self, node: TreeNode) -> None:
        """``node`` (a leased leaf) leaves the tree: its leases move up to its parent, whose path
        they already count; at the root they end."""
        self.evicted_tokens += node.end - node.start
        ids = self.by_node.pop(node.id, None)
        if not ids:
            return
        parent = node.parent
        for lease_id in ids:
            lease = self.by_id[lease_id]
            if parent is None or parent.parent is None:
                del self.by_id[lease_id]  # NOTE: the root counts no leases; nothing to undo
            else:
                lease.node = parent
                self.by_node.setdefault(parent.id, set()).add(lease_id)

    # ---- internals -------------------------------------------------------------------------

    def _drop(self, lease: Lease) -> None:
        del self.by_id[lease.id]
        held = self.by_node.get(lease.node.id)
        if held is not None:
            held.discard(lease.id)
            if not held:
                del self.by_node[lease.node.id]
        self._add_path(lease.node, -1)

    def _add_path(self, node: TreeNode, delta: int) -> None:
        changed = []
        while node is not None and node.parent is not None:
            before = node.lease_ref
            node.lease_ref = before + delta
            if node.lease_ref < 0:
                raise RuntimeError(f"lease_ref below zero on {node!r}")
            if (before == 0) != (node.lease_ref == 0):
                changed.append(node)
            node = node.parent
        for n in changed:  # NOTE: after the whole path is updated (callbacks read lease_ref)
            (self.on_leased if n.lease_ref else self.on_unleased)(n)


def lease_spec(obj: dict | tuple | None) -> tuple[str, float] | None:
    """Normalize a request's ``cache_lease`` (``{"id": str, "ttl_s": float}`` or ``(id, ttl_s)``;
    ``ttl_s`` defaults to 60) into ``(id, ttl_s)``. Raises ValueError for a bad id or TTL."""
    if obj is None:
        return None
    lease_id, ttl = (obj.get("id"), obj.get("ttl_s", 60.0)) if isinstance(obj, dict) else obj
    if not isinstance(lease_id, str) or not lease_id:
        raise ValueError("cache_lease.id must be a non-empty string")
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
        raise ValueError("cache_lease.ttl_s must be a number > 0")
    return lease_id, float(ttl)
