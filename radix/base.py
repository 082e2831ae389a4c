"""The prefix-cache contract shared by the scheduler, the schedule policies and ``radix/`` caches.

Ownership of KV slots (see also ``radixlm.runtime.request``): every slot of the
``TokenToKVPoolAllocator`` is at any time exactly one of

* free (in the allocator's free list),
* owned by the cache: *evictable* (no running request locks its node) or *protected* (locked),
* owned by a request: slots of its req_to_token row past ``len(req.prefix_indices)``.

Hence ``free + evictable + protected + request-owned == pool size``; when no request holds KV the
last term is 0 and :meth:`PrefixCache.check_integrity` verifies the identity.

Locking: a request that uses cached slots (``match_prefix`` then writing them into its row) must
``inc_lock_ref(last_node)`` before anything can call ``evict`` and keep it locked until
``cache_finished_req`` (or a retraction's ``dec_lock_ref``). Unlocked cached slots may be freed by
any ``evict`` call.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

if TYPE_CHECKING:
    from radixlm.runtime.request import Req


class MatchResult(NamedTuple):
    """Result of :meth:`PrefixCache.match_prefix`.

    Attributes:
        indices: int64 ``[m]`` KV slots of the matched prefix ``token_ids[:m]``; ``m`` is a multiple
            of the cache's ``page_size``. Read-only: the slots stay owned by the cache.
        last_node: the cache node where the match ends (the root when ``m == 0``); pass it to
            ``inc_lock_ref`` / ``dec_lock_ref``.
    """

    indices: torch.Tensor
    last_node: Any


class PrefixCache(abc.ABC):
    """Abstract prefix cache over token ids whose entries own KV-pool slots.

    Single-threaded: all methods are called from the scheduler's thread.
    """

    #: page granularity in tokens: matches and inserts cover whole pages only.
    page_size: int = 1
    #: ``True`` for the no-op cache (policies that need a tree fall back to ``fcfs``).
    disabled: bool = False

    @property
    @abc.abstractmethod
    def root_node(self) -> Any:
        """The root node (matches of length 0 end here). Never evicted; locking it is a no-op."""

    @abc.abstractmethod
    def match_prefix(self, token_ids: list[int], end: int | None = None, hint: Any = None) -> MatchResult:
        """Longest cached page-aligned prefix of ``token_ids[:end]`` (``end=None``: all).

        ``hint``: optional, a ``last_node`` of an earlier match of a prefix of the same token ids
        (tokens unchanged since); a cache may resume the walk there. It never changes the result.

        Mutates: access times of the matched path (LRU), and the tree shape (an edge where the match
        ends inside it is split in two; slot ownership and lock counts are unchanged, node objects
        previously returned stay valid and keep their meaning). Does NOT lock: call
        ``inc_lock_ref(result.last_node)`` before any ``evict`` can run if the slots will be used.
        """

    @abc.abstractmethod
    def insert(self, token_ids: list[int], indices: torch.Tensor, hint: Any = None) -> int:
        """Add ``token_ids`` (whole pages only) whose KV lives in slots ``indices`` (``[len]``).
        ``hint``: as in :meth:`match_prefix` (never changes the result).

        Returns ``n``, the (page-aligned) length of the prefix that was already cached. Ownership
        after the call: the cache owns ``indices[n:aligned]`` (``aligned`` = length rounded down to
        a page); the caller still owns ``indices[:n]`` (they duplicate cached slots, unless they are
        the cache's own slots it matched earlier) and ``indices[aligned:]``, and must free them.
        Mutates: the tree, access times of the path, ``evictable_size``. Locks nothing.
        """

    @abc.abstractmethod
    def inc_lock_ref(self, node: Any) -> int:
        """Lock ``node`` and its ancestors (counts nest). Returns tokens moved to protected."""

    @abc.abstractmethod
    def dec_lock_ref(self, node: Any) -> int:
        """Undo one ``inc_lock_ref(node)``. Returns tokens moved protected->evictable."""

    @abc.abstractmethod
    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` cached slots (fewer only when not enough are evictable).

        Frees unlocked leaves, least recently used first, through the allocator. Returns the number
        of slots freed (may exceed ``num_tokens`` by part of one node). Never touches locked nodes.
        """

    @abc.abstractmethod
    def evictable_size(self) -> int:
        """Cached tokens (slots) that ``evict`` may free: those of unlocked nodes."""

    @abc.abstractmethod
    def protected_size(self) -> int:
        """Cached tokens (slots) of locked nodes."""

    def total_size(self) -> int:
        """All cached tokens: ``evictable_size() + protected_size()``."""
        return self.evictable_size() + self.protected_size()

    # ---- program leases (radix/lease.py); the defaults keep none -------------------------------

    def lease(self, lease_id: str, node: Any, ttl_s: float) -> None:
        """Lease the path root -> ``node`` as ``lease_id`` for ``ttl_s`` seconds: its nodes are
        evicted only after every unleased one (never blocked). Re-leasing an id moves and renews it.
        The default (caches without eviction order) keeps nothing."""

    def release_leases(self, ids: Any) -> int:
        """End the leases ``ids`` (an iterable of str; unknown ids ignored); returns how many."""
        return 0

    def expire_leases(self) -> int:
        """End the leases whose TTL ran out; returns how many."""
        return 0

    def num_leases(self) -> int:
        """Leases currently held."""
        return 0

    @abc.abstractmethod
    def reset(self) -> None:
        """Drop every entry and free its slots. Precondition: nothing is locked (no request)."""

    @abc.abstractmethod
    def check_integrity(self, held: torch.Tensor | None = None) -> list[str]:
        """Violations of the cache's invariants as readable messages (empty list when consistent).

        Checks the tree's own bookkeeping and the pool identity ``free + evictable + protected +
        held == pool size`` with no slot owned twice. ``held``: slots owned by running requests
        (``None`` = no request holds KV, the scheduler's idle case). Mutates nothing.
        """

    @abc.abstractmethod
    def cache_finished_req(self, req: Req) -> None:
        """Hand a finished (or aborted) request's KV to the cache and release its row.

        Inserts ``req.all_ids[:req.kv_len]`` (whole pages); frees the request's duplicate slots and
        its unaligned tail; unlocks ``req.last_node``; frees the req_to_token row. Afterwards
        ``req.req_pool_idx`` and ``req.last_node`` are ``None`` and ``req.prefix_indices`` is empty.
        """

    @abc.abstractmethod
    def cache_unfinished_req(self, req: Req) -> None:
        """Insert the KV computed so far (a chunk of chunked prefill) and keep the request running.

        After the call ``req.prefix_indices`` covers the cached whole pages of
        ``req.all_ids[:req.kv_len]``, the request's row holds exactly those slots there, the new
        ``req.last_node`` is locked and the old one unlocked. The request keeps its unaligned tail.
        """
