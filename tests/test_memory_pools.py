"""KV slot bookkeeping: the req_to_token table writes and the allocator's host copies."""

from __future__ import annotations

import random

import torch

from radixlm.runtime.memory import ReqToTokenPool, TokenToKVPoolAllocator


def test_write_batch_matches_elementwise_writes():
    """Every shape of write (one request's consecutive positions, scattered rows, one row with
    gaps or out of order) leaves the table as element-by-element writes would."""
    rng = random.Random(0)
    cases = [([2, 2, 2], [3, 4, 5]), ([1, 3], [0, 0]), ([0, 0], [1, 3]), ([2, 2, 2], [2, 5, 4]),
             ([3], [7]), ([1, 1, 2], [4, 5, 6])]
    cases += [([rng.randrange(4) for _ in range(n)], rng.sample(range(16), n)) for n in range(1, 9)]
    for rows, positions in cases:
        pool, want = ReqToTokenPool(4, 16), torch.zeros((4, 16), dtype=torch.int32)
        slots = torch.tensor([rng.randrange(1, 1000) for _ in rows], dtype=torch.int64)
        pool.write_batch(rows, positions, slots)
        for r, p, v in zip(rows, positions, slots.tolist()):
            want[r, p] = v
        assert torch.equal(pool.req_to_token, want), (rows, positions)


def test_alloc_with_host_returns_the_same_slots_and_frees_them_back():
    alloc = TokenToKVPoolAllocator(10)
    dev, host = alloc.alloc_with_host(4)
    assert host.tolist() == dev.tolist() and len(set(host.tolist())) == 4
    assert alloc.available_size() == 6 and alloc.alloc_with_host(7) is None
    alloc.free(host[2:])
    assert alloc.available_size() == 8
    rest = alloc.alloc(8).tolist()
    assert sorted(rest + host[:2].tolist()) == list(range(1, 11))


def test_to_device_lists_match_torch_tensor():
    """to_device's fast int64 path (array + frombuffer) gives torch.tensor's values and shapes."""
    import torch

    from radixlm.runtime.memory import to_device

    for data in ([3, 1, 2], [[1, 2, 3], [4, 5, 6]], [], [[]], [True, 7], [1.5, 2.0]):
        got, want = to_device(data, "cpu"), torch.tensor(data, dtype=torch.int64)
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), data
    assert to_device([0.5, 1.5], "cpu", torch.float32).tolist() == [0.5, 1.5]
