"""RadixCache and NoOpPrefixCache request helpers (cache_finished_req, cache_unfinished_req) over
real pools: prefix reuse, chunked prefill, concurrent duplicates, no slot leaked; and the token-id
containers match and insert accept."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from radixlm.radix import NoOpPrefixCache, RadixCache, pack_ids
from radixlm.runtime.memory import ReqToTokenPool, TokenToKVPoolAllocator
from radixlm.runtime.request import Req


class Pools:
    def __init__(self, cache_cls=RadixCache, page_size: int = 1, size: int = 256) -> None:
        self.alloc = TokenToKVPoolAllocator(size)
        self.rows = ReqToTokenPool(4, 128)
        self.cache = cache_cls(self.alloc, page_size=page_size, req_to_token_pool=self.rows)
        self.size = size

    def admit(self, req: Req, upto: int) -> None:
        """Scheduler-like admission: match, lock, take a row, prefill ``upto`` tokens."""
        idx, node = self.cache.match_prefix(req.all_ids[: len(req.origin_input_ids) - 1])
        self.cache.inc_lock_ref(node)
        req.prefix_indices, req.last_node = idx, node
        req.cached_tokens += idx.numel()
        req.req_pool_idx = self.rows.alloc()
        self.rows.write(req.req_pool_idx, 0, idx)
        req.kv_len = idx.numel()
        self.extend(req, upto - req.kv_len)

    def extend(self, req: Req, n: int) -> None:
        """Compute KV for the next ``n`` tokens (a prefill chunk or decode steps)."""
        new = self.alloc.alloc(n)
        self.rows.write(req.req_pool_idx, req.kv_len, new)
        req.kv_len += n

    def decode(self, req: Req, tokens: list[int]) -> None:
        """Sample ``tokens`` one by one; each step computes the KV of the previous token."""
        for t in tokens:
            if req.kv_len < len(req.all_ids):
                self.extend(req, 1)
            req.output_ids.append(t)

    def idle_ok(self) -> None:
        assert self.cache.check_integrity() == []
        assert self.rows.available_size() == self.rows.size
        self.cache.reset()
        assert self.alloc.available_size() == self.size


def make_req(prompt: list[int], max_new_tokens: int = 8) -> Req:
    params = SimpleNamespace(max_new_tokens=max_new_tokens)
    return Req(rid=str(prompt[:4]), origin_input_ids=prompt, sampling_params=params)


def row_of(p: Pools, req: Req) -> list[int]:
    return p.rows.read(req.req_pool_idx, req.kv_len).tolist()


@pytest.mark.parametrize("page", [1, 4])
def test_cache_finished_req_reuse_and_no_leak(page: int) -> None:
    p = Pools(page_size=page)
    a = make_req(list(range(100, 130)))
    p.admit(a, 30)
    p.decode(a, [7, 8, 9])  # KV for 32 of the 33 tokens (the last output has none yet)
    assert a.kv_len == 32
    p.cache.cache_finished_req(a)
    assert a.req_pool_idx is None and a.last_node is None and a.prefix_indices.numel() == 0
    assert p.cache.total_size() == 32 - 32 % page and p.cache.protected_size() == 0
    assert p.cache.check_integrity() == []
    b = make_req(list(range(100, 130)) + [7, 8, 50, 51])
    p.admit(b, 34)
    assert b.cached_tokens == 32 - 32 % page
    p.cache.cache_finished_req(b)
    p.idle_ok()


@pytest.mark.parametrize("page", [1, 4])
def test_concurrent_duplicates_are_freed(page: int) -> None:
    p = Pools(page_size=page)
    a, b = make_req(list(range(50))), make_req(list(range(50)))
    p.admit(a, 50), p.admit(b, 50)  # both miss: two copies of the same KV
    p.cache.cache_finished_req(a)
    p.cache.cache_finished_req(b)
    assert p.cache.total_size() == 50 - 50 % page
    p.idle_ok()


@pytest.mark.parametrize("page", [1, 4])
def test_cache_unfinished_req_chunked_prefill(page: int) -> None:
    p = Pools(page_size=page)
    prompt = list(range(200, 240))
    a, b = make_req(prompt), make_req(prompt)
    p.admit(a, 10), p.admit(b, 10)  # first chunk of both, duplicated
    p.cache.cache_unfinished_req(a)
    p.cache.cache_unfinished_req(b)
    aligned = 10 - 10 % page
    for req in (a, b):
        assert req.prefix_indices.numel() == aligned
        assert row_of(p, req)[:aligned] == req.prefix_indices.tolist()
        assert req.last_node.path_token_ids() == prompt[:aligned]
    assert row_of(p, a)[:aligned] == row_of(p, b)[:aligned]  # b now shares a's slots
    assert p.cache.protected_size() == aligned and p.cache.evict(1000) == 0
    held = torch.cat([p.rows.read(r.req_pool_idx, r.kv_len, aligned) for r in (a, b)])
    assert p.cache.check_integrity(held=held) == []  # tails stay with the requests
    for req in (a, b):
        p.extend(req, 39 - req.kv_len)
        p.cache.cache_unfinished_req(req)
        p.decode(req, [1, 2])
    p.cache.cache_finished_req(a)
    p.cache.cache_finished_req(b)
    assert p.cache.protected_size() == 0
    p.idle_ok()


def test_noop_cache_frees_everything() -> None:
    p = Pools(cache_cls=NoOpPrefixCache)
    a = make_req(list(range(20)))
    p.admit(a, 20)
    assert a.cached_tokens == 0 and p.cache.match_prefix(list(range(20))).indices.numel() == 0
    p.cache.cache_unfinished_req(a)
    assert a.prefix_indices.numel() == 0 and p.cache.total_size() == 0
    p.decode(a, [1, 2, 3])
    p.cache.cache_finished_req(a)
    assert p.cache.evict(10) == 0 and p.cache.disabled
    p.idle_ok()


def test_token_id_containers_match_alike() -> None:
    """Lists, tuples, int64/int32 arrays, array.array and tensors give the same match and insert;
    pack_ids returns a read-only int64 array and leaves the caller's array writable."""
    import array

    import numpy as np

    alloc = TokenToKVPoolAllocator(64)
    cache = RadixCache(alloc)
    seq = [3, 1, 4, 1, 5, 9, 2, 6]
    idx = alloc.alloc(8)
    assert cache.insert(np.array(seq, dtype=np.int32), idx) == 0
    own = np.array(seq[:6] + [0, 0], dtype=np.int64)
    for ids in (seq[:6] + [0, 0], tuple(own), own, own.astype(np.int32), array.array("q", own),
                torch.tensor(own), pack_ids(own)):
        res = cache.match_prefix(ids)
        assert res.indices.tolist() == idx[:6].tolist(), type(ids)
    assert own.flags.writeable and not pack_ids(own).flags.writeable
    assert pack_ids(seq).dtype == np.int64 and pack_ids(seq).tolist() == seq
    with pytest.raises(ValueError):
        cache.match_prefix(np.zeros((2, 2), dtype=np.int64))
    assert cache.check_integrity() == []
