"""Schedule policies with remembered matches (issue 16): same order, match lengths, deferrals and
cache effects as the plain full-match implementation, over random trees, queues and evictions."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixlm.radix import RadixCache
from radixlm.runtime.memory import TokenToKVPoolAllocator
from radixlm.runtime.request import Req
from radixlm.runtime.schedule_policy import SchedulePolicy


class ReferencePolicy(SchedulePolicy):
    """The previous implementation: every request matched from the root with ``match_prefix``
    (slot tensor built), the DFS weights counted by walking each request's path to the root."""

    def _match_all(self, waiting):
        last_nodes = {}
        for req in waiting:
            indices, node = self.tree_cache.match_prefix(req.all_ids)
            req.match_len = int(indices.numel())
            last_nodes[id(req)] = node
        return last_nodes

    def calc_priority(self, waiting):
        policy = self.effective_policy(len(waiting))
        for req in waiting:
            req.deprioritized = False
        last_nodes = self._match_all(waiting)
        if policy == "lpm":
            waiting.sort(key=lambda r: -r.match_len)
        else:
            waiting[:] = _reference_dfs(waiting, last_nodes, self.tree_cache.root_node)
        threshold = self.in_batch_prefix_threshold
        if threshold <= 0 or len(waiting) < 2:
            return
        seen = RadixCache(None)
        eligible, later = [], []
        for req in waiting:
            ids = req.all_ids
            shared = seen.match_prefix(ids).indices.numel()
            if shared - req.match_len >= threshold:
                req.deprioritized = True
                later.append(req)
                continue
            if len(ids) - req.match_len >= threshold:
                seen.insert(ids, torch.empty(len(ids), dtype=torch.int64))
            eligible.append(req)
        waiting[:] = eligible + later


def _reference_dfs(waiting, last_nodes, root):
    at_node, weight, first = {}, {}, {}
    for pos, req in enumerate(waiting):
        node = last_nodes[id(req)]
        at_node.setdefault(node, []).append(req)
        while node is not None:
            weight[node] = weight.get(node, 0) + 1
            first.setdefault(node, pos)
            node = node.parent
    order, stack = [], [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.extend(at_node.get(node, ()))
            continue
        stack.append((node, True))
        kids = sorted((c for c in node.children.values() if c in weight), key=lambda c: (-weight[c], first[c]))
        stack.extend((c, False) for c in reversed(kids))
    return order


def tree_state(cache: RadixCache) -> list[tuple]:
    """Every node's path, own access stamp and lock count, plus the cache's clock."""
    out, stack = [("clock", cache._clock)], [cache.root_node]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        out.append((tuple(node.path_token_ids()), node.t, node.lock_ref))
    return sorted(out, key=repr)


TOKENS = st.lists(st.integers(0, 3), min_size=1, max_size=14)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), TOKENS),
        st.tuples(st.just("evict"), st.integers(1, 12)),
        st.tuples(st.just("queue"), TOKENS, st.booleans()),  # new request (maybe with output)
        st.tuples(st.just("queue"), st.lists(st.integers(0, 1), min_size=1, max_size=8), st.just(False)),
        st.tuples(st.just("grow"), st.integers(0, 50), st.lists(st.integers(0, 3), min_size=1, max_size=4)),
        st.tuples(st.just("admit"), st.integers(0, 50)),
        st.just(("step",)),
        st.just(("step",)),
    ),
    max_size=50,
)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=OPS, policy=st.sampled_from(["lpm", "dfs-weight"]), page=st.sampled_from([1, 2]),
       threshold=st.sampled_from([0, 1, 2, 4]))
def test_remembered_matches_equal_full_matches(ops, policy, page, threshold) -> None:
    caches = [RadixCache(TokenToKVPoolAllocator(512), page_size=page) for _ in range(2)]
    policies = [SchedulePolicy(policy, caches[0], in_batch_prefix_threshold=threshold),
                ReferencePolicy(policy, caches[1], in_batch_prefix_threshold=threshold)]
    queues: list[list[Req]] = [[], []]
    for op in ops:
        if op[0] == "insert":
            aligned = len(op[1]) - len(op[1]) % page
            for cache in caches:
                idx = cache.allocator.alloc(len(op[1]))
                n = cache.insert(list(op[1]), idx)
                cache.allocator.free(torch.cat([idx[:n], idx[aligned:]]))  # the caller's slots
        elif op[0] == "evict":
            assert caches[0].evict(op[1]) == caches[1].evict(op[1])
        elif op[0] == "queue":
            for q in queues:
                req = Req(rid=str(len(q)), origin_input_ids=list(op[1]),
                          sampling_params=SimpleNamespace(max_new_tokens=4))
                req.output_ids = [1, 2] if op[2] else []
                q.append(req)
        elif op[0] == "grow" and queues[0]:  # a request that ran meanwhile (e.g. retracted)
            for q in queues:
                q[op[1] % len(q)].output_ids += op[2]
        elif op[0] == "admit" and queues[0]:  # leaves the queue; a remembered node may go stale
            i = op[1] % len(queues[0])
            for q in queues:
                q.pop(i)
        else:
            for p, q in zip(policies, queues):
                p.calc_priority(q)
            got, want = queues
            assert [r.rid for r in got] == [r.rid for r in want]
            assert [(r.match_len, r.deprioritized) for r in got] == [(r.match_len, r.deprioritized) for r in want]
            assert tree_state(caches[0]) == tree_state(caches[1])
            for r in got:  # a remembered node, when usable, is where the request's match ends
                hint = policies[0].hint_for(r)
                if hint is not None:
                    assert caches[0].match_prefix(r.all_ids).last_node is hint
                    caches[1].match_prefix(r.all_ids)
        for cache in caches:
            assert cache.check_integrity() == []


def test_hint_dropped_when_output_tokens_may_differ() -> None:
    alloc = TokenToKVPoolAllocator(64)
    cache = RadixCache(alloc)
    idx = alloc.alloc(6)
    cache.insert([1, 2, 3, 4, 5, 6], idx)
    policy = SchedulePolicy("lpm", cache)
    req = Req(rid="r", origin_input_ids=[1, 2, 3], sampling_params=SimpleNamespace(max_new_tokens=4))
    req.output_ids = [4, 5]
    policy.calc_priority([req])
    assert req.match_len == 5 and policy.hint_for(req).end == 5
    req.output_ids = [4, 9, 9]  # tokens past the prompt changed: the node no longer applies
    assert policy.hint_for(req) is None
    req.output_ids = [4]
    policy.calc_priority([req])
    assert policy.hint_for(req).end == 4
    req.output_ids = [4, 7]
    assert policy.hint_for(req) is None
    short = Req(rid="s", origin_input_ids=[1, 2], sampling_params=SimpleNamespace(max_new_tokens=4))
    policy.calc_priority([short])
    short.output_ids = [8, 8]  # the node covers the prompt only: still usable
    assert policy.hint_for(short).end == 2


def _reqs(*prompts: list[int]) -> list[Req]:
    return [Req(rid=f"r{i}", origin_input_ids=p, sampling_params=SimpleNamespace(max_new_tokens=4))
            for i, p in enumerate(prompts)]


def test_dfs_weight_ties_by_first_position_in_subtree() -> None:
    """Equal-weight siblings: the one holding the earliest waiting request (anywhere in its
    subtree, its own requests included) goes first."""
    orders = []
    for cls in (SchedulePolicy, ReferencePolicy):
        alloc = TokenToKVPoolAllocator(64)
        cache = RadixCache(alloc)
        for seq in ([1, 1, 1], [2, 2]):
            cache.insert(seq, alloc.alloc(len(seq)))
        waiting = _reqs([1, 1, 5], [2, 2, 9], [2, 2, 8], [1, 1, 1, 7])
        cls("dfs-weight", cache, in_batch_prefix_threshold=0).calc_priority(waiting)
        orders.append([r.rid for r in waiting])
    assert orders[0] == orders[1] == ["r3", "r0", "r1", "r2"]


def test_in_batch_sharing_at_exactly_the_threshold() -> None:
    """A request with exactly ``threshold`` uncached tokens is remembered: a later one sharing them
    waits a round."""
    cache = RadixCache(TokenToKVPoolAllocator(64))
    waiting = _reqs([5, 6], [5, 6, 7])
    SchedulePolicy("lpm", cache, in_batch_prefix_threshold=2).calc_priority(waiting)
    assert [(r.rid, r.deprioritized) for r in waiting] == [("r0", False), ("r1", True)]


def test_in_batch_sharing_threshold_below_page_size() -> None:
    """threshold < page_size: a request sharing part of a page past its match with an earlier one
    (whose match went one page further) waits, as with the key-only tree."""
    alloc = TokenToKVPoolAllocator(64)
    cache = RadixCache(alloc, page_size=2)
    cache.insert([7, 7, 5, 6], alloc.alloc(4))
    waiting = _reqs([7, 7, 5, 0, 3, 3], [7, 7, 5, 6, 9, 9])
    SchedulePolicy("lpm", cache, in_batch_prefix_threshold=1).calc_priority(waiting)
    assert [(r.rid, r.match_len, r.deprioritized) for r in waiting] == [("r1", 4, False), ("r0", 2, True)]
