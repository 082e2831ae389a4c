"""RadixCache: a radix tree over token ids whose nodes own KV slots, with LRU eviction.

RadixAttention (Zheng et al., "SGLang: Efficient Execution of Structured Language Model Programs",
2024). Each node holds one edge of token ids and the KV slots of those tokens; a request reuses the
slots of its longest cached prefix and inserts its prompt+output when it finishes. The contract
(what mutates, what must be locked) is documented on :class:`radixlm.radix.base.PrefixCache`.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import torch

from radixlm.radix.base import MatchResult, PrefixCache
from radixlm.radix.node import TreeNode, prefix_len

if TYPE_CHECKING:
    from radixlm.runtime.memory import ReqToTokenPool, TokenToKVPoolAllocator
    from radixlm.runtime.request import Req


class RadixCache(PrefixCache):
    """Radix-tree prefix cache.

    Args:
        token_to_kv_allocator: allocator the cached slots are freed to on eviction (``None`` gives a
            key-only tree, e.g. the policies' temporary tree: evicted slots are just dropped).
        page_size: tokens per page; only whole pages are matched and inserted.
        req_to_token_pool: the request rows read/written by ``cache_finished_req`` /
            ``cache_unfinished_req`` (only those two need it).
    """

    def __init__(
        self,
        token_to_kv_allocator: TokenToKVPoolAllocator | None,
        page_size: int = 1,
        req_to_token_pool: ReqToTokenPool | None = None,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.allocator = token_to_kv_allocator
        self.req_to_token_pool = req_to_token_pool
        self.page_size = page_size
        self.device = token_to_kv_allocator.device if token_to_kv_allocator else torch.device("cpu")
        self._empty = torch.empty(0, dtype=torch.int64, device=self.device)
        self.reset()

    # ---- state -------------------------------------------------------------------------------

    def reset(self) -> None:
        old_root = getattr(self, "_root", None)
        if old_root is not None and self.allocator is not None:
            slots = [n.value for n in self._iter_nodes() if n is not old_root]
            if slots:
                self.allocator.free(torch.cat(slots))
        self._clock = 0
        self._root = TreeNode([], self._empty, None)
        self._root.lock_ref = 1  # NOTE: the root is never evictable
        self._evictable = 0
        self._protected = 0
        self._num_nodes = 1
        # NOTE: lazy LRU heap of (access time, node): every unlocked leaf has an entry with its
        # current time; stale entries (time changed, locked, not a leaf, evicted) are skipped.
        self._lru: list[tuple[int, TreeNode]] = []

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

    @staticmethod
    def _lru_valid(t: int, node: TreeNode) -> bool:
        """Is ``(t, node)`` the live heap entry of an evictable leaf?"""
        return (
            node.parent is not None
            and not node.children
            and node.lock_ref == 0
            and node.last_access_time == t
        )

    def _lru_push(self, node: TreeNode) -> None:
        """Record ``node``'s current access time if it is an evictable leaf."""
        if node.children or node.lock_ref or node.parent is None:
            return
        heapq.heappush(self._lru, (node.last_access_time, node))
        if len(self._lru) > 2 * self._num_nodes + 64:
            live = {n.id: (t, n) for t, n in self._lru if self._lru_valid(t, n)}
            self._lru = list(live.values())
            heapq.heapify(self._lru)

    # ---- match / insert ----------------------------------------------------------------------

    def match_prefix(self, token_ids: list[int]) -> MatchResult:
        ids = token_ids if type(token_ids) is list else list(token_ids)
        page = self.page_size
        n = len(ids) - len(ids) % page
        now = self._tick()
        node = self._root
        node.last_access_time = now
        values = []
        i = 0
        while i < n:
            child = node.children.get(ids[i] if page == 1 else tuple(ids[i : i + page]))
            if child is None:
                break
            key = child.key
            k = len(key) if ids[i : i + len(key)] == key else prefix_len(key, ids, i)
            k = min(k, n - i)
            if page > 1:
                k -= k % page
            if k < len(key):  # NOTE: k >= 1 page here: the child was found by its first page
                child = self._split(child, k)
                i = n  # the match ends inside this edge
            else:
                i += k
            child.last_access_time = now
            values.append(child.value)
            node = child
        if node.parent is not None and not node.children:
            self._lru_push(node)
        if not values:
            return MatchResult(self._empty, node)
        return MatchResult(values[0].clone() if len(values) == 1 else torch.cat(values), node)

    def insert(self, token_ids: list[int], indices: torch.Tensor) -> int:
        ids = token_ids if type(token_ids) is list else list(token_ids)
        n = len(ids) - len(ids) % self.page_size
        if indices.numel() < n:
            raise ValueError(f"insert: {indices.numel()} slots for {n} tokens")
        return self._insert(ids if n == len(ids) else ids[:n], indices, self._root)[0]

    def _insert(
        self, ids: list[int], indices: torch.Tensor, node: TreeNode
    ) -> tuple[int, TreeNode]:
        """Insert ``ids`` (whole pages) below ``node``: ``ids[j]`` is the token at depth
        ``depth(node) + j`` and ``indices[j]`` its slot. Starting below a request's locked
        ``last_node`` spares comparing the prefix it matched.

        Returns the length (relative to ``node``) that was already cached and the node where
        ``ids`` ends.
        """
        page = self.page_size
        n = len(ids)
        now = self._tick()
        up = node
        while up is not None:  # NOTE: the whole path counts as accessed (parents >= children)
            up.last_access_time = now
            up = up.parent
        i = 0
        while i < n:
            child = node.children.get(ids[i] if page == 1 else tuple(ids[i : i + page]))
            if child is None:
                return i, self._add_leaf(node, ids[i:], indices[i:n].clone(), now)
            key = child.key
            k = len(key) if ids[i : i + len(key)] == key else prefix_len(key, ids, i)
            k = min(k, n - i)
            if page > 1:
                k -= k % page
            if k < len(key):  # then the next lookup misses (or i == n)
                child = self._split(child, k)
            child.last_access_time = now
            node = child
            i += k
        self._lru_push(node)
        return n, node

    def _start_of(self, req: Req) -> tuple[TreeNode, int]:
        """Where inserting ``req``'s tokens may start: its locked node, if consistent."""
        node, p = req.last_node, req.prefix_indices.numel()
        if node is None or node is self._root or p == 0 or p > req.kv_len:
            return self._root, 0
        depth, up = 0, node
        while up is not None:
            depth += len(up.key)
            up = up.parent
        return (node, p) if depth == p else (self._root, 0)

    @staticmethod
    def _path_values(node: TreeNode) -> list[torch.Tensor]:
        values = []
        while node.parent is not None:
            values.append(node.value)
            node = node.parent
        values.reverse()
        return values

    def _add_leaf(
        self, parent: TreeNode, key: list[int], value: torch.Tensor, now: int
    ) -> TreeNode:
        leaf = TreeNode(key, value, parent, now)
        parent.children[self._child_key(key, 0)] = leaf
        self._num_nodes += 1
        self._evictable += len(key)
        self._lru_push(leaf)
        return leaf

    def _split(self, child: TreeNode, k: int) -> TreeNode:
        """Cut ``child``'s edge after ``k`` tokens; returns the new upper node.

        NOTE: ``child`` keeps the lower part, so a node held as some request's ``last_node`` still
        ends at the same token position and its lock path is unchanged.
        """
        parent = child.parent
        upper = TreeNode(child.key[:k], child.value[:k], parent, child.last_access_time)
        upper.lock_ref = child.lock_ref
        child.key = child.key[k:]
        child.value = child.value[k:]
        child.parent = upper
        upper.children[self._child_key(child.key, 0)] = child
        parent.children[self._child_key(upper.key, 0)] = upper
        self._num_nodes += 1
        return upper

    # ---- locking -----------------------------------------------------------------------------

    def inc_lock_ref(self, node: TreeNode) -> int:
        moved = 0
        while node is not self._root:
            if node.lock_ref == 0:
                moved += len(node.key)
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
                moved += len(node.key)
                if not node.children:
                    self._lru_push(node)
            node = node.parent
        self._evictable += moved
        self._protected -= moved
        return moved

    # ---- eviction ----------------------------------------------------------------------------

    def evict(self, num_tokens: int) -> int:
        if num_tokens <= 0 or self._evictable == 0:
            return 0
        heap, root, valid = self._lru, self._root, self._lru_valid
        freed = 0
        slots = []
        while freed < num_tokens and heap:
            t, node = heapq.heappop(heap)
            if not valid(t, node):
                continue
            parent = node.parent
            del parent.children[self._child_key(node.key, 0)]
            node.parent = None
            self._num_nodes -= 1
            slots.append(node.value)
            freed += len(node.key)
            if parent is not root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access_time, parent))
        self._evictable -= freed
        if self.allocator is not None and slots:
            self.allocator.free(torch.cat(slots))  # NOTE: one free call: it copies the free list
        return freed

    # ---- request helpers ---------------------------------------------------------------------

    def cache_finished_req(self, req: Req) -> None:
        if req.req_pool_idx is not None:
            kv, aligned, n, _ = self._insert_req(req)
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
        values = self._path_values(new_node)
        new_indices = torch.cat(values) if values else self._empty
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
        n, node = self._insert(_token_range(req, p, aligned), kv[p:] if p else kv, start_node)
        return kv, aligned, p + n, node

    def _free(self, slots: torch.Tensor) -> None:
        if self.allocator is not None and slots.numel():
            self.allocator.free(slots)

    # ---- self-check --------------------------------------------------------------------------

    def check_integrity(self, held: torch.Tensor | None = None) -> list[str]:
        from radixlm.radix.integrity import check_tree

        return check_tree(self, held)


def _token_range(req: Req, start: int, end: int) -> list[int]:
    """``req.all_ids[start:end]`` without building ``all_ids`` (it copies every token)."""
    prompt = req.origin_input_ids
    if end <= len(prompt):
        return prompt[start:end]
    if start >= len(prompt):
        return req.output_ids[start - len(prompt) : end - len(prompt)]
    return prompt[start:] + req.output_ids[: end - len(prompt)]
