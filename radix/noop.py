"""The prefix cache for ``disable_radix_cache=True``: caches nothing, same interface."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from radixlm.radix.base import MatchResult, PrefixCache
from radixlm.radix.integrity import check_pool
from radixlm.radix.node import Chain, TreeNode

if TYPE_CHECKING:
    from radixlm.runtime.memory import ReqToTokenPool, TokenToKVPoolAllocator
    from radixlm.runtime.request import Req


class NoOpPrefixCache(PrefixCache):
    """A cache that never holds anything: every match is empty and every request frees its KV.

    Args: as :class:`radixlm.radix.cache.RadixCache` (``page_size`` is only recorded).
    """

    disabled = True

    def __init__(
        self,
        token_to_kv_allocator: TokenToKVPoolAllocator | None,
        page_size: int = 1,
        req_to_token_pool: ReqToTokenPool | None = None,
    ) -> None:
        self.allocator = token_to_kv_allocator
        self.req_to_token_pool = req_to_token_pool
        self.page_size = page_size
        device = token_to_kv_allocator.device if token_to_kv_allocator else torch.device("cpu")
        self._empty = torch.empty(0, dtype=torch.int64, device=device)
        self._root = TreeNode(Chain(0, np.empty(0, dtype=np.int64), self._empty), 0, 0, None)
        self._root.lock_ref = 1

    @property
    def root_node(self) -> TreeNode:
        return self._root

    def match_prefix(self, token_ids: list[int], end: int | None = None, hint=None) -> MatchResult:
        return MatchResult(self._empty, self._root)

    def insert(self, token_ids: list[int], indices: torch.Tensor, hint=None) -> int:
        """Stores nothing and returns ``len(token_ids)``: under the ownership rule of
        :meth:`PrefixCache.insert` the caller keeps (and frees) every slot it passed."""
        return len(token_ids)

    def inc_lock_ref(self, node: TreeNode) -> int:
        return 0

    def dec_lock_ref(self, node: TreeNode) -> int:
        return 0

    def evict(self, num_tokens: int) -> int:
        return 0

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def reset(self) -> None:
        pass

    def check_integrity(self, held: torch.Tensor | None = None) -> list[str]:
        if self.allocator is None:
            return []
        return check_pool(self.allocator, self._empty, 0, 0, held)

    def cache_finished_req(self, req: Req) -> None:
        if req.req_pool_idx is not None:
            kv = self.req_to_token_pool.read(req.req_pool_idx, req.kv_len)
            if kv.numel():
                self.allocator.free(kv)
            self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx = None
        req.last_node = None
        req.prefix_indices = self._empty

    def cache_unfinished_req(self, req: Req) -> None:
        pass


ChunkCache = NoOpPrefixCache
