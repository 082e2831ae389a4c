"""RadixCache: hypothesis state machine against a plain reference model, plus match / insert unit
tests (request helpers with real pools: tests/test_radix_requests.py).

The reference keeps every cached page as ``prefix tuple (ending with that page) -> page's slots``
with an access tick and a lock count; the tree must agree with it after every step.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixlm.radix import (
    ChunkCache,
    MatchResult,
    NoOpPrefixCache,
    PrefixCache,
    RadixCache,
    TreeNode,
    pack_ids,
)
from radixlm.runtime.memory import ReqToTokenPool, TokenToKVPoolAllocator
from radixlm.runtime.request import Req

POOL = 1024


class RadixMachine(RuleBasedStateMachine):
    page = 1
    max_len = 12

    def __init__(self) -> None:
        super().__init__()
        self.alloc = TokenToKVPoolAllocator(POOL)
        self.rows = ReqToTokenPool(2, 64)
        self.cache = RadixCache(self.alloc, page_size=self.page, req_to_token_pool=self.rows)
        self.slot: dict[tuple, tuple] = {}  # cached prefix (whole pages) -> its last page's slots
        self.time: dict[tuple, int] = {}  # cached prefix -> last access tick
        self.locks: dict[tuple, int] = {}  # cached prefix -> lock count
        self.held: list[tuple[TreeNode, tuple]] = []  # (locked node, matched prefix)
        self.seen: list[list[int]] = []
        self.hints: list[tuple[tuple, TreeNode]] = []  # (matched prefix, last_node) of recent matches
        self.clock = 0

    # ---- helpers -----------------------------------------------------------------------------

    def draw_seq(self, data) -> list[int]:
        fresh = st.lists(st.integers(0, 2), max_size=self.max_len)
        if self.seen and data.draw(st.booleans()):
            base = data.draw(st.sampled_from(self.seen))
            cut = data.draw(st.integers(0, len(base)))
            seq = base[:cut] + data.draw(st.lists(st.integers(0, 2), max_size=4))
        else:
            seq = data.draw(fresh)
        self.seen.append(seq)
        return seq

    def aligned(self, seq: list[int]) -> int:
        return len(seq) - len(seq) % self.page

    def ref_match(self, seq: list[int]) -> int:
        k = 0
        while k + self.page <= len(seq) and tuple(seq[: k + self.page]) in self.slot:
            k += self.page
        return k

    def pages(self, k: int) -> range:
        """Ends of the whole pages of a k-token prefix."""
        return range(self.page, k + 1, self.page)

    def touch(self, seq: list[int], k: int) -> None:
        self.clock += 1
        for j in self.pages(k):
            self.time[tuple(seq[:j])] = self.clock

    def check_match(self, seq: list[int], data=None, hint: TreeNode | None = None) -> MatchResult:
        """Match ``seq`` (with ``data``: maybe packed, maybe up to a drawn ``end``, maybe with a
        drawn earlier result as ``hint``) and compare with the reference."""
        ids, end = seq, None
        if data is not None:
            if data.draw(st.booleans()):
                ids = pack_ids(seq)
            if data.draw(st.booleans()):
                end = data.draw(st.integers(0, len(seq) + 2))
            usable = [node for prefix, node in self.hints if list(prefix) == seq[: len(prefix)]]
            if hint is None and usable and data.draw(st.booleans()):
                hint = data.draw(st.sampled_from(usable))  # NOTE: may be evicted or split since
        res = self.cache.match_prefix(ids, end=end, hint=hint)
        seq = seq if end is None else seq[:end]
        k = self.ref_match(seq)
        assert res.indices.dtype == torch.int64
        assert res.indices.tolist() == [s for j in self.pages(k) for s in self.slot[tuple(seq[:j])]]
        assert res.last_node.path_token_ids() == seq[:k]
        self.touch(seq, k)
        self.hints = (self.hints + [(tuple(seq[:k]), res.last_node)])[-8:]
        return res

    # ---- rules -------------------------------------------------------------------------------

    @rule(data=st.data())
    def insert(self, data) -> None:
        seq = self.draw_seq(data)
        idx = self.alloc.alloc(len(seq))
        usable = [node for prefix, node in self.hints if list(prefix) == seq[: len(prefix)]]
        hint = data.draw(st.sampled_from(usable)) if usable and data.draw(st.booleans()) else None
        n = self.cache.insert(pack_ids(seq) if data.draw(st.booleans()) else seq, idx, hint=hint)
        assert n == self.ref_match(seq)
        end = self.aligned(seq)
        for j in self.pages(end)[n // self.page :]:
            self.slot[tuple(seq[:j])] = tuple(idx[j - self.page : j].tolist())
            self.locks[tuple(seq[:j])] = 0
        self.touch(seq, end)
        self.alloc.free(torch.cat([idx[:n], idx[end:]]))

    @rule(data=st.data())
    def match(self, data) -> None:
        self.check_match(self.draw_seq(data), data)

    @precondition(lambda self: self.hints)
    @rule(data=st.data())
    def match_with_hint(self, data) -> None:
        """Resume from an earlier result (maybe since evicted, split or reset) for a longer or
        shorter sequence: the result must be the plain match's."""
        prefix, node = data.draw(st.sampled_from(self.hints))
        seq = list(prefix) + data.draw(st.lists(st.integers(0, 2), max_size=6))
        self.seen.append(seq)
        self.check_match(seq, data, hint=node)

    @rule(data=st.data())
    def lock(self, data) -> None:
        seq = self.draw_seq(data)
        res = self.check_match(seq)
        self.cache.inc_lock_ref(res.last_node)
        k = res.indices.numel()
        for j in self.pages(k):
            self.locks[tuple(seq[:j])] += 1
        self.held.append((res.last_node, tuple(seq[:k])))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def unlock(self, data) -> None:
        node, prefix = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        self.cache.dec_lock_ref(node)
        for j in self.pages(len(prefix)):
            self.locks[prefix[:j]] -= 1

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def finish_request(self, data) -> None:
        """A request that locked a match computes more tokens, then cache_finished_req."""
        node, prefix = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        seq = list(prefix) + data.draw(st.lists(st.integers(0, 2), max_size=6))
        self.seen.append(seq)
        p = len(prefix)
        cached = [s for j in self.pages(p) for s in self.slot[prefix[:j]]]
        kv = torch.cat([torch.tensor(cached, dtype=torch.int64), self.alloc.alloc(len(seq) - p)])
        row = self.rows.alloc()
        self.rows.write(row, 0, kv)
        req = Req(rid="r", origin_input_ids=seq, sampling_params=None, kv_len=len(seq))
        req.req_pool_idx, req.prefix_indices, req.last_node = row, kv[:p], node
        n = self.ref_match(seq)
        self.cache.cache_finished_req(req)
        assert req.req_pool_idx is None and req.last_node is None
        end = self.aligned(seq)
        for j in self.pages(end)[n // self.page :]:
            self.slot[tuple(seq[:j])] = tuple(kv[j - self.page : j].tolist())
            self.locks[tuple(seq[:j])] = 0
        self.touch(seq, end)
        for j in self.pages(p):
            self.locks[prefix[:j]] -= 1

    @rule(num=st.integers(0, 10))
    def evict(self, num: int) -> None:
        evictable = self.cache.evictable_size()
        free_before = set(self.alloc.free_slots().tolist())
        freed = self.cache.evict(num)
        newly_free = set(self.alloc.free_slots().tolist()) - free_before
        assert freed == len(newly_free)
        assert freed >= min(num, evictable)
        gone = [p for p, s in self.slot.items() if s[0] in newly_free]
        assert len(gone) * self.page == freed
        assert all(set(self.slot[p]) <= newly_free for p in gone), "page partly evicted"
        assert all(self.locks[p] == 0 for p in gone), "a locked token was evicted"
        for p in gone:
            del self.slot[p]
        page = self.page
        assert all(p[:-page] in self.slot for p in self.slot if len(p) > page), "evicted a non-leaf"
        # LRU: nothing evicted is newer than any remaining unlocked leaf.
        has_child = {p[:-page] for p in self.slot}
        leaves = [self.time[p] for p in self.slot if p not in has_child and self.locks[p] == 0]
        if gone and leaves:
            assert max(self.time[p] for p in gone) <= min(leaves)
        for p in gone:
            del self.time[p], self.locks[p]

    @precondition(lambda self: not self.held)
    @rule()
    def reset(self) -> None:
        self.cache.reset()
        self.slot.clear(), self.time.clear(), self.locks.clear()
        assert self.alloc.available_size() == POOL

    # ---- invariants --------------------------------------------------------------------------

    @invariant()
    def consistent(self) -> None:
        assert self.cache.check_integrity() == []
        locked = sum(1 for c in self.locks.values() if c)
        assert self.cache.protected_size() == locked * self.page
        assert self.cache.evictable_size() == (len(self.slot) - locked) * self.page
        assert self.alloc.available_size() + self.cache.total_size() == POOL
        assert self.rows.available_size() == self.rows.size
        # Tree content == reference; access ticks uniform within a node and order-consistent.
        tree: dict[tuple, int] = {}
        pairs = []
        stack = [((), self.cache.root_node)]
        while stack:
            prefix, node = stack.pop()
            ticks = set()
            slots = node.value.tolist()
            for j in range(0, len(node.key), self.page):
                prefix = prefix + tuple(node.key[j : j + self.page])
                tree[prefix] = tuple(slots[j : j + self.page])
                ticks.add(self.time[prefix])
            assert len(ticks) <= 1, "tokens of one node accessed at different times"
            if ticks:
                pairs.append((node.last_access_time, ticks.pop()))
            stack.extend((prefix, c) for c in node.children.values())
        assert tree == self.slot
        pairs.sort()
        for (t1, r1), (t2, r2) in zip(pairs, pairs[1:]):
            assert (t1 < t2) == (r1 < r2) and (t1 == t2) == (r1 == r2), "LRU clock disagrees"


class PagedRadixMachine(RadixMachine):
    page = 4
    max_len = 16


class DeepTrunkMachine(RadixMachine):
    """Most sequences are a prefix of one long trunk plus a short suffix: many branch points on one
    path (the chain walk, splits inside long chains, evictions of chain tails)."""

    max_len = 48
    trunk = [(7 * i * i + 3 * i) % 3 for i in range(44)]

    def draw_seq(self, data) -> list[int]:
        if data.draw(st.integers(0, 3)) == 0:
            return super().draw_seq(data)
        cut = data.draw(st.integers(0, len(self.trunk)))
        seq = self.trunk[:cut] + data.draw(st.lists(st.integers(0, 2), max_size=4))
        self.seen.append(seq)
        return seq


class PagedDeepTrunkMachine(DeepTrunkMachine):
    page = 4


_settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
TestRadixMachine = RadixMachine.TestCase
TestRadixMachine.settings = _settings
TestPagedRadixMachine = PagedRadixMachine.TestCase
TestPagedRadixMachine.settings = _settings
TestDeepTrunkMachine = DeepTrunkMachine.TestCase
TestDeepTrunkMachine.settings = _settings
TestPagedDeepTrunkMachine = PagedDeepTrunkMachine.TestCase
TestPagedDeepTrunkMachine.settings = _settings


def test_empty_tree_match() -> None:
    cache = RadixCache(TokenToKVPoolAllocator(8))
    res = cache.match_prefix([1, 2, 3])
    assert isinstance(res, MatchResult) and res.indices.numel() == 0
    assert res.last_node is cache.root_node
    assert isinstance(cache, PrefixCache) and ChunkCache is NoOpPrefixCache


def test_split_keeps_locked_node_meaning() -> None:
    alloc = TokenToKVPoolAllocator(32)
    cache = RadixCache(alloc)
    cache.insert(list(range(10)), alloc.alloc(10))
    node = cache.match_prefix(list(range(10))).last_node
    cache.inc_lock_ref(node)
    mid = cache.match_prefix([0, 1, 2, 3, 99]).last_node  # splits the locked edge
    assert mid.path_token_ids() == [0, 1, 2, 3] and node.path_token_ids() == list(range(10))
    assert cache.protected_size() == 10 and cache.evict(100) == 0
    cache.dec_lock_ref(node)
    assert cache.evict(1) == 6 and cache.evictable_size() == 4  # the leaf part only
    assert cache.check_integrity() == []


def test_paged_insert_and_match_whole_pages() -> None:
    alloc = TokenToKVPoolAllocator(64)
    cache = RadixCache(alloc, page_size=4)
    idx = alloc.alloc(10)
    assert cache.insert(list(range(10)), idx) == 0
    alloc.free(idx[8:])
    assert cache.total_size() == 8
    assert cache.match_prefix(list(range(7))).indices.tolist() == idx[:4].tolist()
    assert cache.match_prefix([0, 1, 2, 3, 4, 5, 9, 9]).indices.numel() == 4  # partial page
    assert cache.check_integrity() == []


def leaf_paths(cache: RadixCache) -> set[tuple]:
    """Cached sequences (root-to-leaf paths), read without touching access times."""
    out, stack = set(), [cache.root_node]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if not node.children and node is not cache.root_node:
            out.add(tuple(node.path_token_ids()))
    return out


def test_evict_lru_order_and_cascade() -> None:
    alloc = TokenToKVPoolAllocator(64)
    cache = RadixCache(alloc)
    for seq in ([1, 2, 3], [1, 2, 4], [5, 6]):
        idx = alloc.alloc(len(seq))
        n = cache.insert(seq, idx)
        alloc.free(idx[:n])
    cache.match_prefix([5, 6])  # [5, 6] is now the most recent, [1, 2, 3] the least
    assert cache.evict(1) == 1
    assert leaf_paths(cache) == {(1, 2, 4), (5, 6)}
    assert cache.evict(2) == 3  # leaf [4], then its parent [1, 2] (now a leaf, older than [5, 6])
    assert leaf_paths(cache) == {(5, 6)}
    assert cache.evict(10) == 2 and cache.total_size() == 0
    assert alloc.available_size() == 64 and cache.check_integrity() == []


@pytest.mark.parametrize("page", [1, 4])
def test_deep_trunk_matches_and_evicts_in_lru_order(page: int) -> None:
    """A trunk cut at every page by branches inserted in random order: every match returns the
    trunk's own slots, the trunk is one walk, and eviction follows the last accesses exactly."""
    rng = random.Random(page)
    trunk = [rng.randrange(100, 1000) for _ in range(96 * page)]
    alloc = TokenToKVPoolAllocator(4096)
    cache = RadixCache(alloc, page_size=page)
    cuts = list(range(page, len(trunk) + 1, page))
    rng.shuffle(cuts)
    done: list[int] = []
    slots: list[int] = []  # slots of the trunk's cached tokens
    for cut in cuts:
        seq = trunk[:cut] + [1000 + cut] * page
        res = cache.match_prefix(seq)
        k = max((min(c, cut) for c in done), default=0)
        assert res.indices.tolist() == slots[:k] and res.last_node.path_token_ids() == seq[:k]
        kv = torch.cat([res.indices, alloc.alloc(len(seq) - k)])
        assert cache.insert(seq, kv) == k
        slots += kv[len(slots) : cut].tolist()
        done.append(cut)
        assert cache.check_integrity() == []
    # root + a branch point at every trunk page but the last (it ends inside its branch's edge)
    # + one leaf per branch
    assert cache.num_nodes() == 1 + (len(cuts) - 1) + len(cuts)
    res = cache.match_prefix(trunk + [5] * page)
    assert res.indices.tolist() == slots and res.last_node.path_token_ids() == trunk
    for cut in rng.sample(cuts, 20):  # refresh some branches; the order of access is the LRU order
        cache.match_prefix(trunk[:cut] + [1000 + cut] * page)
        done.remove(cut)
        done.append(cut)
    cache.inc_lock_ref(res.last_node)  # the whole trunk is protected
    assert cache.protected_size() == len(trunk)
    for cut in done:
        before = leaf_paths(cache)
        assert cache.evict(1) == page
        assert before - leaf_paths(cache) == {tuple(trunk[:cut] + [1000 + cut] * page)}
    assert cache.evict(1) == 0 and cache.evictable_size() == 0
    cache.dec_lock_ref(res.last_node)
    assert cache.evict(page) == page  # the trunk's deepest page: its ancestors are all newer
    assert leaf_paths(cache) == {tuple(trunk[:-page])}
    assert cache.check_integrity() == []
    cache.reset()
    assert alloc.available_size() == 4096


def test_check_integrity_reports_leaks_and_double_ownership() -> None:
    alloc = TokenToKVPoolAllocator(16)
    cache = RadixCache(alloc)
    idx = alloc.alloc(4)
    cache.insert([1, 2, 3, 4], idx)
    assert cache.check_integrity() == []
    leaked = alloc.alloc(2)
    assert any("pool accounting" in e for e in cache.check_integrity())
    assert cache.check_integrity(held=leaked) == []
    alloc.free(torch.cat([leaked, idx[:1]]))  # idx[0] is now free AND cached
    errors = cache.check_integrity()
    assert any("owned twice" in e for e in errors) and any("pool accounting" in e for e in errors)
