"""Program-aware cache leases (radix/lease.py): eviction order, TTL, release, no blocking, no leaks.

Cache-level tests use a fake clock; scheduler- and Engine-level tests use a tiny random model with
a KV pool too small for every request, and check that leases never block admission and that the
pool accounting returns to its baseline.
"""

from __future__ import annotations

import random

import pytest
import torch

from radixlm.radix import RadixCache
from radixlm.radix.lease import lease_spec
from radixlm.runtime.memory import ReqToTokenPool, TokenToKVPoolAllocator


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_cache(pool: int = 256):
    alloc = TokenToKVPoolAllocator(pool)
    clock = Clock()
    return RadixCache(alloc, req_to_token_pool=ReqToTokenPool(2, 64), clock=clock), alloc, clock


def put(cache, alloc, ids):
    """Insert ``ids`` with fresh slots; returns the node where they end."""
    slots = alloc.alloc(len(ids))
    n = cache.insert(ids, slots)
    if n:
        alloc.free(slots[:n])
    return cache.match_prefix(ids).last_node


def cached(cache, ids) -> int:
    """Cached prefix length of ``ids``, found without touching access times (match_prefix would)."""
    node, i = cache.root_node, 0
    while i < len(ids):
        child = node.children.get(ids[i])
        if child is None:
            break
        key = child.key
        m = 0
        while m < len(key) and i + m < len(ids) and key[m] == ids[i + m]:
            m += 1
        i += m
        if m < len(key):
            break
        node = child
    return i


A, B, C = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]


def test_leased_prefixes_are_evicted_after_every_unleased_one():
    cache, alloc, _ = make_cache()
    a = put(cache, alloc, A)  # oldest
    put(cache, alloc, B)
    put(cache, alloc, C)
    cache.lease("prog", a, ttl_s=60)
    assert cache.evict(4) == 4
    assert cached(cache, A) == 4 and cached(cache, B) == 0 and cached(cache, C) == 4
    assert cache.evict(4) == 4  # C goes before the older, leased A
    assert cached(cache, A) == 4 and cached(cache, C) == 0
    assert cache.evict(4) == 4  # under pressure the leased prefix goes too (never blocked)
    assert cached(cache, A) == 0 and cache.num_leases() == 0
    assert cache.leases.evicted_tokens == 4
    assert cache.check_integrity() == []


def test_lru_order_among_leased_nodes_and_lease_shrinks_to_parent():
    cache, alloc, _ = make_cache()
    a = put(cache, alloc, A)
    put(cache, alloc, A + [20, 21])  # unleased branch below the leased A
    b = put(cache, alloc, B)
    cache.lease("a", a, 60)
    cache.lease("b", b, 60)
    assert cache.evict(2) == 2  # the unleased extension of A first, though A was leased
    assert cached(cache, A + [20, 21]) == 4
    assert cache.evict(4) == 4  # then leased A (least recently used among leased)
    assert cached(cache, A) == 0 and cached(cache, B) == 4
    assert cache.num_leases() == 1 and cache.check_integrity() == []
    # a lease whose leaf is evicted moves up to the prefix still cached
    d = put(cache, alloc, B + [30, 31])
    cache.lease("b", d, 60)
    assert cache.match_prefix(B).last_node.lease_ref == 1
    assert cache.evict(2) == 2
    assert cached(cache, B + [30, 31]) == 4 and cache.num_leases() == 1
    assert cache.leases.by_id["b"].node.end == 4 and cache.check_integrity() == []


def test_ttl_expiry_and_renewal():
    cache, alloc, clock = make_cache()
    a = put(cache, alloc, A)
    b = put(cache, alloc, B)
    cache.lease("a", a, ttl_s=10)
    cache.lease("b", b, ttl_s=10)
    clock.now = 8
    cache.lease("b", b, ttl_s=10)  # renewed: now expires at 18
    clock.now = 11
    put(cache, alloc, C)
    assert cache.evict(4) == 4  # "a" expired: A is plain LRU again and the oldest
    assert cached(cache, A) == 0 and cache.num_leases() == 1
    assert cache.evict(4) == 4  # C (unleased) before the still-leased B
    assert cached(cache, B) == 4 and cached(cache, C) == 0
    clock.now = 18
    assert cache.expire_leases() == 1 and cache.num_leases() == 0
    assert cache.check_integrity() == []
    # leases nobody releases expire even when nothing is evicted (the table stays bounded)
    for i in range(50):
        cache.lease(f"lost{i}", b, ttl_s=1)
    clock.now = 20
    cache.lease("live", b, ttl_s=10)
    assert cache.num_leases() == 1 and b.lease_ref == 1 and cache.check_integrity() == []


def test_release_and_move():
    cache, alloc, _ = make_cache()
    a = put(cache, alloc, A)
    b = put(cache, alloc, B)
    cache.lease("p", a, 60)
    assert a.lease_ref == 1
    cache.lease("p", b, 60)  # the program moved on: the lease follows its state
    assert a.lease_ref == 0 and b.lease_ref == 1 and cache.num_leases() == 1
    assert cache.evict(4) == 4 and cached(cache, A) == 0 and cached(cache, B) == 4
    assert cache.release_leases(["p", "unknown"]) == 1
    assert b.lease_ref == 0 and cache.num_leases() == 0
    assert cache.release_leases(["p"]) == 0
    with pytest.raises(ValueError):
        cache.lease("p", b, 0)
    cache.lease("p", cache.root_node, 60)  # an empty prefix holds nothing
    assert cache.num_leases() == 0 and cache.check_integrity() == []


def test_split_keeps_lease_counts():
    cache, alloc, _ = make_cache()
    a = put(cache, alloc, A)
    cache.lease("p", a, 60)
    put(cache, alloc, [1, 2, 40])  # splits A's edge after [1, 2]
    upper = cache.match_prefix([1, 2]).last_node
    assert upper is not a and upper.lease_ref == 1 and a.lease_ref == 1
    assert cache.check_integrity() == []
    assert cache.evict(1) == 1 and cached(cache, [1, 2, 40]) == 2  # the unleased branch
    cache.reset()
    assert cache.num_leases() == 0 and alloc.available_size() == alloc.size


@pytest.mark.parametrize("seed", range(6))
def test_random_operations_keep_order_and_accounting(seed):
    rng = random.Random(seed)
    cache, alloc, clock = make_cache(pool=96)
    seqs: list[list[int]] = []
    locked = []
    for _ in range(300):
        op = rng.random()
        if op < 0.35:
            base = rng.choice(seqs)[: rng.randint(0, 6)] if seqs and rng.random() < 0.6 else []
            ids = base + [rng.randint(0, 5) for _ in range(rng.randint(1, 6))]
            need = len(ids) - cached(cache, ids)
            if alloc.available_size() < need:
                cache.evict(need - alloc.available_size())
            if alloc.available_size() >= need:
                seqs.append(ids)
                put(cache, alloc, ids)
        elif op < 0.5 and seqs:
            node = cache.match_prefix(rng.choice(seqs)).last_node
            cache.lease(f"p{rng.randint(0, 5)}", node, ttl_s=rng.choice([1.0, 5.0, 50.0]))
        elif op < 0.58:
            cache.release_leases([f"p{rng.randint(0, 5)}"])
        elif op < 0.66 and seqs:
            node = cache.match_prefix(rng.choice(seqs)).last_node
            cache.inc_lock_ref(node)
            locked.append(node)
        elif op < 0.74 and locked:
            cache.dec_lock_ref(locked.pop(rng.randrange(len(locked))))
        elif op < 0.8:
            clock.now += rng.random() * 3
        else:
            before = cache.leases.evicted_tokens
            cache.evict(rng.randint(1, 12))
            if cache.leases.evicted_tokens > before:  # a leased node went: no unleased one left
                assert unleased_evictable(cache) == 0
        assert cache.check_integrity() == []
    for node in locked:
        cache.dec_lock_ref(node)
    cache.release_leases([f"p{i}" for i in range(6)])
    assert cache.num_leases() == 0
    cache.evict(alloc.size)
    assert alloc.available_size() == alloc.size and cache.check_integrity() == []


def unleased_evictable(cache) -> int:
    total, stack = 0, list(cache.root_node.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if node.lock_ref == 0 and node.lease_ref == 0:
            total += node.end - node.start
    return total


def test_lease_spec():
    assert lease_spec(None) is None
    assert lease_spec({"id": "x"}) == ("x", 60.0)
    assert lease_spec(("x", 5)) == ("x", 5.0)
    for bad in ({"id": ""}, {"id": "x", "ttl_s": 0}, {"id": "x", "ttl_s": True}, {"ttl_s": 3}):
        with pytest.raises(ValueError):
            lease_spec(bad)


# ---------------------------------------------------------------------- scheduler and Engine

def test_leases_never_block_admission_and_leak_nothing(tiny_llama):
    from radixlm.runtime.request import Req
    from radixlm.runtime.sampling_params import SamplingParams
    from radixlm.runtime.testing import make_scheduler, run_to_completion

    sched = make_scheduler(tiny_llama, max_total_tokens=160)
    pool = sched.allocator.size
    rng = random.Random(0)
    prompts = [[rng.randint(3, 200) for _ in range(40)] for _ in range(12)]  # 12 x 48 >> 160 slots
    reqs = [Req(rid=f"r{i}", origin_input_ids=p, sampling_params=SamplingParams(max_new_tokens=8, temperature=0),
                cache_lease=(f"prog{i}", 600.0)) for i, p in enumerate(prompts)]
    run_to_completion(sched, reqs)
    assert all(r.finish_reason["type"] == "length" for r in reqs)  # nothing refused or aborted
    cache = sched.tree_cache
    assert 0 < cache.num_leases() < len(reqs)  # the pool could not keep them all: LRU among leased
    kept = [r for r in reqs if r.cache_lease[0] in cache.leases.by_id]
    for r in kept:  # a kept lease holds the request's cached sequence (prompt + output)
        node = cache.leases.by_id[r.cache_lease[0]].node
        assert node.path_token_ids() == r.all_ids[: node.end] and node.end == r.kv_len
    assert cache.check_integrity() == []
    assert cache.release_leases([r.cache_lease[0] for r in reqs]) == len(kept)
    assert cache.num_leases() == 0
    assert sched.flush_cache()
    assert sched.allocator.available_size() == pool
    assert sched.req_to_token_pool.available_size() == sched.req_to_token_pool.size - 1


def test_program_leases_follow_the_state_and_end_with_it(tiny_llama):
    import radixlm as sgl

    engine = sgl.Engine(model_path=tiny_llama, device="cpu", max_total_tokens=2048)
    try:
        seen = []

        @sgl.function
        def prog(s):
            s += "Turn one: " + sgl.gen("a", max_tokens=4, temperature=0)
            s["a"]  # noqa: B018 - wait for the call
            seen.append(engine.scheduler.tree_cache.num_leases())
            forks = s.fork(2)
            forks += lambda i: f" branch {i}: " + sgl.gen("b", max_tokens=3, temperature=0)
            forks.join()
            s += " done: " + sgl.gen("c", max_tokens=3, temperature=0)

        state = prog.run(backend=engine)
        assert state.error() is None
        assert seen == [1]  # the state's prefix was leased while the program ran
        engine.get_server_info()  # NOTE: a barrier: releases are queued before it on the same inbox
        assert engine.scheduler.tree_cache.num_leases() == 0
        # NOTE: on the scheduler thread, between two steps (read from this thread, the pool's
        # counters could be taken in the middle of a step that frees and caches slots)
        assert engine._call(engine.scheduler.tree_cache.check_integrity) == []
        with pytest.raises(ValueError):
            engine.generate("x", {"max_new_tokens": 1}, cache_lease={"id": "p", "ttl_s": -1})
        engine.generate("lease me", {"max_new_tokens": 2}, cache_lease={"id": "p", "ttl_s": 30})
        assert engine.release_cache_lease("p") == 1 and engine.release_cache_lease(["p"]) == 0
    finally:
        engine.shutdown()
