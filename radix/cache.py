"""RadixCache: a radix tree over token ids whose nodes own KV slots, with LRU eviction.

RadixAttention (Zheng et al., "SGLang: Efficient Execution of Structured Language Model Programs",
2024). Each node holds one edge of token ids and the KV slots of those tokens; a request reuses the
slots of its longest cached prefix and inserts its prompt+output when it finishes. The contract
(what mutates, what must be locked) is documented on :class:`radixlm.radix.base.PrefixCache`.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from typing import TYPE_CHECKING

import numpy as np
import torch

from radixlm.radix.base import MatchResult, PrefixCache
from radixlm.radix.eviction import EvictionMixin
from radixlm.radix.lease import LeaseTable
from radixlm.radix.node import Chain, TreeNode, as_ids, common_len, pack

if TYPE_CHECKING:
    from radixlm.runtime.memory import ReqToTokenPool, TokenToKVPoolAllocator
    from radixlm.runtime.request import Req


class RadixCache(EvictionMixin, PrefixCache):
    """Radix-tree prefix cache.

    Args:
        token_to_kv_allocator: allocator the cached slots are freed to on eviction (``None`` gives a
            key-only tree, e.g. the policies' temporary tree: evicted slots are just dropped).
        page_size: tokens per page; only whole pages are matched and inserted.
        req_to_token_pool: the request rows read/written by ``cache_finished_req`` /
            ``cache_unfinished_req`` (only those two need it).
        clock: seconds (monotonic) for lease TTLs (``radix/lease.py``); tests pass a fake one.
    """

    def __init__(
        self,
        token_to_kv_allocator: TokenToKVPoolAllocator | None,
        page_size: int = 1,
        req_to_token_pool: ReqToTokenPool | None = None,
        clock=time.monotonic,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.allocator = token_to_kv_allocator
        self.req_to_token_pool = req_to_token_pool
        self.page_size = page_size
        self.device = token_to_kv_allocator.device if token_to_kv_allocator else torch.device("cpu")
        self._empty = torch.empty(0, dtype=torch.int64, device=self.device)
        self.leases = LeaseTable(self._lru_push, self._lru_push, clock)
        self.reset()

    # ---- state -------------------------------------------------------------------------------

    def reset(self) -> None:
        old_root = getattr(self, "_root", None)
        if old_root is not None:
            nodes = [n for n in self._iter_nodes() if n is not old_root]
            if nodes and self.allocator is not None:
                self.allocator.free(torch.cat([n.value for n in nodes]))
            for node in nodes:  # NOTE: detached nodes are no longer valid match hints
                node.parent = None
        self._clock = 0
        self._root = TreeNode(Chain(0, _EMPTY_IDS, self._empty), 0, 0, None)
        self._root.lock_ref = 1  # NOTE: the root is never evictable
        self._evictable = 0
        self._protected = 0
        self._num_nodes = 1
        # NOTE: lazy LRU heaps of (access time, node), one per eviction tier (unleased, leased):
        # every unlocked leaf has an entry with its current time in its tier's heap; stale entries
        # (time changed, locked, not a leaf, evicted, other tier) are skipped.
        self._lru: list[tuple[int, TreeNode]] = []
        self._lru_leased: list[tuple[int, TreeNode]] = []
        self.leases.clear()

    @property
    def root_node(self) -> TreeNode:
        return self._root

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def num_nodes(self) -> int:
        """Nodes in the tree, root included (diagnostics and benchmarks)."""
        return self._num_nodes

    def _iter_nodes(self):
        stack = [self._root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _child_key(self, ids: list[int], i: int):
        return ids[i] if self.page_size == 1 else tuple(ids[i : i + self.page_size])

    # ---- match / insert ----------------------------------------------------------------------

    def match_prefix(self, token_ids, end: int | None = None, hint: TreeNode | None = None) -> MatchResult:
        """See :meth:`PrefixCache.match_prefix`; ``token_ids`` may also be pre-packed
        (:func:`radixlm.radix.node.pack_ids`), ``end`` / ``hint`` as in :meth:`match_node`."""
        node = self.match_node(token_ids, end, hint)
        return MatchResult(self._path_slots(node), node)

    def match_node(self, token_ids, end: int | None = None, hint: TreeNode | None = None) -> TreeNode:
        """:meth:`match_prefix` without building the slot tensor: the node where the match ends
        (``node.end`` is the matched length). Same effects on the cache (access time, splits).

        Args:
            token_ids: ``list[int]``, or an int64 ``np.ndarray`` packed once by the caller
                (``pack_ids``; saves re-packing when the same ids are matched and inserted).
            end: match ``token_ids[:end]`` only (clamped to ``0..len``; no copy is made).
            hint: a node of this cache returned by an earlier match of a prefix of these same
                token ids (the caller guarantees the tokens did not change): the walk resumes
                there, or at its deepest ancestor within ``end``, when it is still in the tree;
                else from the root. The result and the effects are those of a match from the root.

        Returns:
            The node where the match ends (the root for an empty match).
        """
        ids = token_ids if type(token_ids) is list else as_ids(token_ids)
        n = len(ids) if end is None else min(max(end, 0), len(ids))
        n -= n % self.page_size
        start = self._root if hint is None else self._resume_at(hint, n)
        _, node, _ = self._walk(ids, start.end, n, start)
        node.t = self._tick()  # NOTE: stamps the whole path (see TreeNode.last_access_time)
        if node.parent is not None and not node.children:
            self._lru_push(node)
        return node

    def insert(self, token_ids, indices: torch.Tensor, hint: TreeNode | None = None) -> int:
        """See :meth:`PrefixCache.insert`; ``token_ids`` may also be an int64 ``np.ndarray``;
        ``hint`` as in :meth:`match_node` (e.g. the ``last_node`` of a match of the same ids just
        before: the insert then compares only what lies past it). Same result and effects."""
        ids = token_ids if type(token_ids) is list else as_ids(token_ids)
        n = len(ids) - len(ids) % self.page_size
        if indices.numel() < n:
            raise ValueError(f"insert: {indices.numel()} slots for {n} tokens")
        start = self._root if hint is None else self._resume_at(hint, n)
        return self._insert(ids, start.end, n, indices, start)[0]

    def _resume_at(self, hint: TreeNode, n: int) -> TreeNode:
        """Where a match of ``n`` tokens may start: ``hint`` or its deepest ancestor ending by
        ``n`` when ``hint`` is still in this tree (evicted and reset nodes are detached), else the
        root. One bisection per chain on the way up."""
        if hint.parent is None:
            return self._root
        node = hint
        while node.end > n:
            chain = node.chain
            j = bisect_right(chain.ends, n) - 1  # NOTE: chain.nodes is a path, parent first
            node = chain.nodes[j] if j >= 0 else chain.nodes[0].parent
        return node

    def _walk(self, ids, i: int, n: int, node: TreeNode) -> tuple[int, TreeNode, np.ndarray]:
        """Follow ``ids[i:n]`` (whole pages; ``ids[i]`` is the token at depth ``node.end``) down
        from ``node``. Returns the index where the match stops, the node where it ends (an edge the
        match ends inside is split there) and the packed ids (int64, ``ids[a0:]`` for some ``a0``
        covering what was compared; ``ids`` itself when it is an array).

        NOTE: one step per chain, not per node: the rest of ``ids`` is compared with the child's
        chain down to its last live node in one array operation, and the stop is located by
        bisecting the chain's ends. A list is packed lazily, as far as compared.
        """
        page = self.page_size
        off = node.end - i  # depth of ids[k] is k + off
        is_list = type(ids) is list
        arr, a0 = (_EMPTY_IDS, i) if is_list else (ids, 0)  # arr[k - a0] == ids[k]
        while i < n:
            if page == 1:
                key = ids[i] if is_list else int(ids[i])
            else:
                key = tuple(ids[i : i + page] if is_list else ids[i : i + page].tolist())
            child = node.children.get(key)
            if child is None:
                break
            chain, d = child.chain, i + off
            ends = chain.ends
            hi = min(n + off, ends[-1]) - off
            if hi - a0 > len(arr):  # NOTE: lists only: pack what gets compared (a memcpy to extend)
                more = pack(ids[a0 + len(arr) : hi])
                arr = np.concatenate((arr, more)) if len(arr) else more
            m = common_len(arr, i - a0, chain.array(), d - chain.base, hi - i)
            if page > 1:
                m -= m % page
            stop = d + m  # NOTE: > d: the child was found by its first page
            j = bisect_right(ends, stop) - 1  # the deepest chain node ending by ``stop``
            if j >= 0 and ends[j] > d:
                node = chain.nodes[j]
            if node.end < stop:  # the match ends inside the next chain node
                node = self._split(chain.nodes[j + 1], stop - node.end)
                return stop - off, node, arr
            i = stop - off
        return i, node, arr

    def _insert(self, ids, i: int, n: int, indices: torch.Tensor, node: TreeNode) -> tuple[int, TreeNode]:
        """Insert ``ids[i:n]`` (whole pages) below ``node``: ``ids[i]`` is the token at depth
        ``node.end`` and ``indices[j]`` the slot of ``ids[j]``. Starting below a request's locked
        ``last_node`` spares comparing the prefix it matched.

        Returns the index in ``ids`` up to which it was already cached and the node where
        ``ids[:n]`` ends.
        """
        i, node, _ = self._walk(ids, i, n, node)
        now = self._tick()
        if i < n:
            tail = ids[i:n]
            if type(tail) is np.ndarray:
                tail = tail.copy()  # NOTE: the caller's array may change later
            return i, self._add_leaf(node, tail, indices[i:n].clone(), now)
        node.t = now  # NOTE: stamps the whole path (see TreeNode.last_access_time)
        self._lru_push(node)
        return n, node

    def _start_of(self, req: Req) -> tuple[TreeNode, int]:
        """Where inserting ``req``'s tokens may start: its locked node, if consistent."""
        node, p = req.last_node, req.prefix_indices.numel()
        if node is None or node is self._root or p == 0 or p > req.kv_len or node.parent is None:
            return self._root, 0
        return (node, p) if node.end == p else (self._root, 0)

    def _path_slots(self, node: TreeNode) -> torch.Tensor:
        """int64 slots of the path root -> ``node`` (a new tensor): one slice per chain."""
        parts = []
        while node.parent is not None:
            chain = node.chain
            parts.append(chain.slots[: node.end - chain.base])
            node = chain.nodes[0].parent  # NOTE: the chain's first node starts at chain.base
        if not parts:
            return self._empty
        if len(parts) == 1:
            return parts[0].clone()
        parts.reverse()
        return torch.cat(parts)

    def _key_at(self, chain: Chain, depth: int):
        """The children-dict key of the edge of ``chain`` starting at ``depth``."""
        p = depth - chain.base
        return int(chain.tokens[p]) if self.page_size == 1 else tuple(chain.ids(p, p + self.page_size))

    def _add_leaf(
        self, parent: TreeNode, tokens: list[int], value: torch.Tensor, now: int
    ) -> TreeNode:
        chain = Chain(parent.end, tokens, value)
        leaf = TreeNode(chain, parent.end, parent.end + len(tokens), parent, now)
        chain.add(leaf)
        parent.children[self._key_at(chain, parent.end)] = leaf
        self._num_nodes += 1
        self._evictable += len(tokens)
        self._lru_push(leaf)
        return leaf

    def _split(self, child: TreeNode, k: int) -> TreeNode:
        """Cut ``child``'s edge after ``k`` tokens; returns the new upper node.

        NOTE: ``child`` keeps the lower part, so a node held as some request's ``last_node`` still
        ends at the same token position and its lock path is unchanged. The upper node's access
        time is its subtree's (``t = 0``), as it was ``child``'s.
        """
        parent, chain = child.parent, child.chain
        upper = TreeNode(chain, child.start, child.start + k, parent)
        upper.lock_ref = child.lock_ref
        upper.lease_ref = child.lease_ref  # NOTE: the leases stay on ``child`` (same end depth)
        child.start += k
        child.parent = upper
        upper.children[self._key_at(chain, child.start)] = child
        parent.children[self._key_at(chain, upper.start)] = upper
        chain.add(upper)
        self._num_nodes += 1
        return upper

    # ---- locking -----------------------------------------------------------------------------

    def inc_lock_ref(self, node: TreeNode) -> int:
        moved = 0
        while node is not self._root:
            if node.lock_ref == 0:
                moved += node.end - node.start
            node.lock_ref += 1
            node = node.parent
        self._evictable -= moved
        self._protected += moved
        return moved

    def dec_lock_ref(self, node: TreeNode) -> int:
        moved = 0
        while node is not self._root:
            if node.lock_ref <= 0:
                raise RuntimeError(f"dec_lock_ref on unlocked {node!r}")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                moved += node.end - node.start
                if not node.children:
                    self._lru_push(node)
            node = node.parent
        self._evictable += moved
        self._protected -= moved
        return moved

    # ---- request helpers ---------------------------------------------------------------------

    def cache_finished_req(self, req: Req) -> None:
        if req.req_pool_idx is not None:
            kv, aligned, n, node = self._insert_req(req)
            if req.cache_lease is not None:  # NOTE: before the unlock below: node stays alive
                self.leases.lease(req.cache_lease[0], node, req.cache_lease[1])
            p = req.prefix_indices.numel()
            # NOTE: kv[:p] are the cache's own slots; kv[p:n] duplicate cached ones.
            waste = []
            if n > p:
                waste.append(kv[p:n])
            if kv.numel() > max(aligned, p):
                waste.append(kv[max(aligned, p) :])
            if waste:
                self._free(waste[0] if len(waste) == 1 else torch.cat(waste))
            self.req_to_token_pool.free(req.req_pool_idx)
        if req.last_node is not None:
            self.dec_lock_ref(req.last_node)
        req.req_pool_idx = None
        req.last_node = None
        req.prefix_indices = self._empty

    def cache_unfinished_req(self, req: Req) -> None:
        kv, aligned, n, new_node = self._insert_req(req)
        p = req.prefix_indices.numel()
        new_indices = self._path_slots(new_node)
        if n > p:
            self._free(kv[p:n])
            self.req_to_token_pool.write(req.req_pool_idx, p, new_indices[p:n])
        self.inc_lock_ref(new_node)
        if req.last_node is not None:
            self.dec_lock_ref(req.last_node)
        req.prefix_indices = new_indices
        req.last_node = new_node

    def _insert_req(self, req: Req) -> tuple[torch.Tensor, int, int, TreeNode]:
        """Insert the whole pages of ``req``'s computed tokens, starting at its locked node.

        Returns the row's slots ``kv`` (``[kv_len]``), the aligned length, the length that was
        already cached and the node where the inserted pages end.
        """
        kv = self.req_to_token_pool.read(req.req_pool_idx, req.kv_len)
        if kv.device != self.device:
            kv = kv.to(self.device)
        aligned = req.kv_len - req.kv_len % self.page_size
        start_node, p = self._start_of(req)
        ids = _token_range(req, p, aligned)
        n, node = self._insert(ids, 0, len(ids), kv[p:] if p else kv, start_node)
        return kv, aligned, p + n, node

    def _free(self, slots: torch.Tensor) -> None:
        if self.allocator is not None and slots.numel():
            self.allocator.free(slots)

    # ---- self-check --------------------------------------------------------------------------

    def check_integrity(self, held: torch.Tensor | None = None) -> list[str]:
        from radixlm.radix.integrity import check_tree

        return check_tree(self, held)


_EMPTY_IDS = np.empty(0, dtype=np.int64)


def _token_range(req: Req, start: int, end: int) -> list[int]:
    """``req.all_ids[start:end]`` without building ``all_ids`` (it copies every token)."""
    prompt = req.origin_input_ids
    if end <= len(prompt):
        return prompt[start:end]
    if start >= len(prompt):
        return req.output_ids[start - len(prompt) : end - len(prompt)]
    return prompt[start:] + req.output_ids[: end - len(prompt)]
