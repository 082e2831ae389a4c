"""Schedule policies: ordering tables over a small cache, in-batch prefix sharing, no locking."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from radixlm.radix import NoOpPrefixCache, RadixCache
from radixlm.runtime.memory import TokenToKVPoolAllocator
from radixlm.runtime.request import Req
from radixlm.runtime.schedule_policy import SchedulePolicy

SYS_A = list(range(1000, 1040))  # 40 cached tokens
SYS_B = list(range(2000, 2010))  # 10 cached tokens
SHARED = list(range(3000, 3100))  # 100 tokens several requests share, not cached


def make_cache(*seqs: list[int], page_size: int = 1) -> RadixCache:
    alloc = TokenToKVPoolAllocator(4096)
    cache = RadixCache(alloc, page_size=page_size)
    for seq in seqs:
        idx = alloc.alloc(len(seq))
        alloc.free(idx[: cache.insert(seq, idx)])
    return cache


def reqs(*specs: tuple[str, list[int], int]) -> list[Req]:
    """``(rid, prompt, max_new_tokens)``; arrival order = argument order."""
    return [Req(rid=r, origin_input_ids=p, sampling_params=SimpleNamespace(max_new_tokens=m))
            for r, p, m in specs]


def order(policy: SchedulePolicy, waiting: list[Req]) -> list[str]:
    policy.calc_priority(waiting)
    return [r.rid for r in waiting]


CACHE = (SYS_A, SYS_B, SYS_A + [7, 7, 7])
WAITING = (
    ("none", [5, 6, 7], 10),
    ("b", SYS_B + [1, 2], 30),
    ("a", SYS_A + [1], 20),
    ("a777", SYS_A + [7, 7, 7, 7], 5),
    ("b2", SYS_B + [3], 30),
)
TABLE = [
    ("fcfs", ["none", "b", "a", "a777", "b2"]),
    ("lof", ["b", "b2", "a", "none", "a777"]),
    ("lpm", ["a777", "a", "b", "b2", "none"]),
    # root: {A: a777 at A+777, a at A} (2), {B: b, b2} (2) -> ties by first arrival: B first.
    ("dfs-weight", ["b", "b2", "a777", "a", "none"]),
]


@pytest.mark.parametrize(("name", "expected"), TABLE)
def test_ordering_table(name: str, expected: list[str]) -> None:
    cache = make_cache(*CACHE)
    waiting = reqs(*WAITING)
    assert order(SchedulePolicy(name, cache), waiting) == expected
    assert all(r.deprioritized is False for r in waiting)
    if name in ("lpm", "dfs-weight"):
        lens = {r.rid: r.match_len for r in waiting}
        assert lens == {"none": 0, "b": 10, "a": 40, "a777": 43, "b2": 10}


def test_dfs_weight_prefers_heavier_subtree() -> None:
    cache = make_cache(SYS_A, SYS_B)
    waiting = reqs(("a1", SYS_A + [1], 1), ("b1", SYS_B + [1], 1), ("b2", SYS_B + [2], 1),
                   ("a2", SYS_A + [2], 1), ("b3", SYS_B + [3], 1))
    assert order(SchedulePolicy("dfs-weight", cache), waiting) == ["b1", "b2", "b3", "a1", "a2"]


def test_lpm_falls_back_to_fcfs_on_long_queue() -> None:
    cache = make_cache(SYS_A)
    waiting = reqs(("x", [1, 2], 1), ("y", SYS_A + [1], 1), ("z", [3], 1))
    policy = SchedulePolicy("lpm", cache, lpm_fallback_queue_len=2)
    waiting.reverse()
    assert order(policy, waiting) == ["x", "y", "z"]
    assert order(SchedulePolicy("lpm", cache), waiting)[0] == "y"


@pytest.mark.parametrize("name", ["lpm", "dfs-weight"])
def test_disabled_cache_means_fcfs(name: str) -> None:
    waiting = reqs(("x", [1], 1), ("y", [2], 1))
    waiting.reverse()
    assert order(SchedulePolicy(name, NoOpPrefixCache(None)), waiting) == ["x", "y"]


def test_random_is_a_seeded_permutation() -> None:
    ids = [str(i) for i in range(20)]
    runs = []
    for _ in range(2):
        waiting = reqs(*[(i, [int(i)], 1) for i in ids])
        runs.append(order(SchedulePolicy("random", make_cache(), seed=3), waiting))
    assert runs[0] == runs[1] and sorted(runs[0]) == sorted(ids) and runs[0] != ids


def test_unknown_policy() -> None:
    with pytest.raises(ValueError, match="unknown schedule policy"):
        SchedulePolicy("sjf", make_cache())


# ---- in-batch prefix sharing ------------------------------------------------------------------

SHARING = [
    # (policy, cached, waiting specs, expected order, deprioritized rids)
    ("lpm", [], [("s1", SHARED + [1]), ("s2", SHARED + [2]), ("u", [9, 9]), ("s3", SHARED)],
     ["s1", "u", "s2", "s3"], {"s2", "s3"}),
    ("dfs-weight", [], [("s1", SHARED + [1]), ("u", [9, 9]), ("s2", SHARED + [2])],
     ["s1", "u", "s2"], {"s2"}),
    # The shared part is cached: everyone hits the cache, nobody waits.
    ("lpm", [SHARED], [("s1", SHARED + [1]), ("s2", SHARED + [2])], ["s1", "s2"], set()),
    # Cached 90 of the 100 shared tokens: only 10 uncached shared tokens (< 32).
    ("lpm", [SHARED[:90]], [("s1", SHARED + [1]), ("s2", SHARED + [2])], ["s1", "s2"], set()),
    # Short shared prefix (< 32 tokens).
    ("lpm", [], [("s1", SHARED[:20] + [1]), ("s2", SHARED[:20] + [2])], ["s1", "s2"], set()),
    # Behind a cached system prompt only the uncached shared part counts (100 tokens here).
    ("lpm", [SYS_A], [("s1", SYS_A + SHARED), ("s2", SYS_A + SHARED + [5]), ("x", SYS_B)],
     ["s1", "x", "s2"], {"s2"}),
    # Non-cache-aware policies never deprioritize.
    ("fcfs", [], [("s1", SHARED + [1]), ("s2", SHARED + [2])], ["s1", "s2"], set()),
]


@pytest.mark.parametrize(("name", "cached", "specs", "expected", "deprio"), SHARING)
def test_in_batch_prefix_sharing(name, cached, specs, expected, deprio) -> None:
    cache = make_cache(*cached)
    waiting = reqs(*[(r, p, 1) for r, p in specs])
    assert order(SchedulePolicy(name, cache), waiting) == expected
    assert {r.rid for r in waiting if r.deprioritized} == deprio


@pytest.mark.parametrize("name", ["lpm", "dfs-weight", "fcfs", "lof", "random"])
def test_policy_does_not_lock_or_change_contents(name: str) -> None:
    cache = make_cache(*CACHE)
    before = (cache.evictable_size(), cache.protected_size(), cache.allocator.available_size())
    waiting = reqs(*WAITING, ("s1", SHARED, 1), ("s2", SHARED + [1], 1))
    SchedulePolicy(name, cache).calc_priority(waiting)
    after = (cache.evictable_size(), cache.protected_size(), cache.allocator.available_size())
    assert before == after and cache.check_integrity() == []
