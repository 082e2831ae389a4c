"""Shared-prefix (cascade) decode attention: ``decode_attention(..., shared=SharedPrefix)`` under
TRITON_INTERPRET=1 on CPU, and its torch reference, against plain decode attention.

The pools really share slots: every member of a group has the group's prefix slots in the first
``P`` entries of its req_to_token row (then its own slots); the chunk reads the prefix through
``chunk_req``, which is either a member's row or a row outside the batch (holding the prefix then
unrelated slots). Members sit at scattered batch positions; rows outside every chunk, a group
split over two chunks, an unused chunk (length 0), empty member places in the middle of a chunk,
a member with no own keys (``seq_len == start``; decode never makes one, the kernel handles it)
and a seq_len-0 row are all in the batch. bf16 is left to the GPU test (interpreter, triton 3.9).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # NOTE: before anything imports triton (see radixlm/kernels/_triton.py).
    os.environ.setdefault("TRITON_INTERPRET", "1")

import dataclasses  # noqa: E402

import pytest  # noqa: E402

from radixlm.kernels.decode_attention import SharedPrefix, decode_attention, decode_attention_ref  # noqa: E402
from radixlm.kernels.shared_prefix_attention import pack_shared_prefix  # noqa: E402

TOL = {torch.float32: 2e-5, torch.float16: 2e-3}

# (prefix length, own lengths of the members); chunk_len 37 and 21 are not multiples of block_n 16
GROUPS = [(37, [1, 5, 20]), (16, [3, 0]), (21, [2, 9, 1, 4, 7])]
LOOSE = [0, 9, 50]  # rows in no chunk (one with seq_len 0)


def make_shared_batch(groups, loose, kv_heads, head_dim, dtype, gen, chunk_size, num_chunks, outside_row=(0,)):
    """Pool, req_to_token, a shuffled batch and its SharedPrefix; group ``i in outside_row`` reads its
    prefix from a req_to_token row outside the batch, the others from their first member's row."""
    lens = [p + u for p, owns in groups for u in owns] + list(loose)
    total = sum(p for p, _ in groups) + sum(sum(owns) for _, owns in groups) + sum(loose) + 40
    k = torch.randn(total + 1, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(total + 1, kv_heads, head_dim, generator=gen).to(dtype)
    free = (torch.randperm(total, generator=gen) + 1).tolist()
    n_rows = len(lens) + len(groups)
    r2t = torch.zeros(n_rows + 2, max(lens) + 8, dtype=torch.int32)
    pool_rows = torch.randperm(n_rows + 2, generator=gen).tolist()
    order = torch.randperm(len(lens), generator=gen).tolist()  # batch position of the i-th row
    seq_lens = torch.zeros(len(lens), dtype=torch.int64)
    req_pool = torch.zeros(len(lens), dtype=torch.int64)

    def take(n):
        out = [free.pop() for _ in range(n)]
        return torch.tensor(out, dtype=torch.int32)

    i, packed = 0, []
    for gi, (p, owns) in enumerate(groups):
        prefix = take(p)
        members = []
        for u in owns:
            b, row = order[i], pool_rows[i]
            r2t[row, :p] = prefix
            r2t[row, p : p + u] = take(u)
            seq_lens[b], req_pool[b] = p + u, row
            members.append(b)
            i += 1
        if gi in outside_row:
            row = pool_rows[len(lens) + gi]
            r2t[row, :p] = prefix
            r2t[row, p:] = torch.randint(1, total + 1, (r2t.shape[1] - p,), generator=gen).int()  # never read
        else:
            row = int(req_pool[members[0]])
        packed.append((members, p, row))
    for n in loose:
        b, row = order[i], pool_rows[i]
        r2t[row, :n] = take(n)
        seq_lens[b], req_pool[b] = n, row
        i += 1
    shared = pack_shared_prefix(packed, len(lens), num_chunks, chunk_size)
    return k, v, r2t, req_pool, seq_lens, shared


def with_gap(shared: SharedPrefix) -> SharedPrefix:
    """Move each chunk's last member one place right when there is room (a -1 in the middle)."""
    rows = shared.chunk_rows.clone()
    for c in range(rows.shape[0]):
        n = int((rows[c] >= 0).sum())
        if 1 < n < rows.shape[1]:
            rows[c, n], rows[c, n - 1] = rows[c, n - 1].item(), -1
    return dataclasses.replace(shared, chunk_rows=rows)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def on(dev, shared: SharedPrefix, *tensors):
    return [t.to(dev) for t in tensors], SharedPrefix(*(t.to(dev) for t in dataclasses.astuple(shared)))


@pytest.mark.parametrize("group,dtype", [(4, torch.float32), (1, torch.float32), (3, torch.float16)])
def test_shared_ref_is_cascade_of_plain(group, dtype):
    gen = torch.Generator().manual_seed(group)
    KH, D = 2, 16
    k, v, r2t, rows, lens, shared = make_shared_batch(GROUPS, LOOSE, KH, D, dtype, gen, chunk_size=3, num_chunks=5)
    q = torch.randn(len(lens), KH * group, D, generator=gen).to(dtype)
    want = decode_attention_ref(q, k, v, r2t, rows, lens, D**-0.5)
    got = decode_attention_ref(q, k, v, r2t, rows, lens, D**-0.5, shared=with_gap(shared))
    assert rel_err(got, want) < TOL[dtype]
    assert torch.equal(got[lens == 0], torch.zeros_like(got[lens == 0]))


@pytest.mark.parametrize(
    "H,KH,D,dtype,chunk_size,shared_splits,kv_splits",
    [
        (8, 2, 64, torch.float32, 4, 1, None),  # GQA 4; group 2 split over two chunks of 4
        (8, 2, 48, torch.float32, 8, 3, 2),  # D not a power of 2; more shared splits than tiles
        (2, 2, 64, torch.float16, 3, 2, 1),  # MHA
        (6, 2, 48, torch.float32, 2, None, None),  # GQA 3 (SmolLM2's), default shared splits
    ],
)
def test_shared_kernel_matches_plain_ref(dev, H, KH, D, dtype, chunk_size, shared_splits, kv_splits):
    gen = torch.Generator().manual_seed(H * 100 + D + chunk_size)
    k, v, r2t, rows, lens, shared = make_shared_batch(
        GROUPS, LOOSE, KH, D, dtype, gen, chunk_size=chunk_size, num_chunks=8, outside_row=(0, 2))
    shared = with_gap(shared)
    assert int((shared.chunk_len == 0).sum()) >= 1  # an unused chunk
    q = torch.randn(len(lens), H, D, generator=gen).to(dtype)
    (q, k, v, r2t, rows, lens), shared = on(dev, shared, q, k, v, r2t, rows, lens)
    want = decode_attention_ref(q, k, v, r2t, rows, lens, D**-0.5)
    got = decode_attention(q, k, v, r2t, rows, lens, D**-0.5, num_kv_splits=kv_splits, block_n=16,
                           shared=shared, num_shared_splits=shared_splits, shared_block_n=16)
    assert got.dtype == dtype and got.shape == q.shape
    assert rel_err(got, want) < TOL[dtype], rel_err(got, want)
    assert torch.equal(got[lens == 0], torch.zeros_like(got[lens == 0]))


def test_shared_kernel_strided_q_and_out_buffer(dev):
    """q a view of a fused qkv, an ``out`` buffer, int32 SharedPrefix tensors, shared block 32 over
    a 37-token prefix."""
    gen = torch.Generator().manual_seed(5)
    KH, G, D = 1, 4, 32
    k, v, r2t, rows, lens, shared = make_shared_batch(GROUPS[:1], [4], KH, D, torch.float32, gen,
                                                      chunk_size=4, num_chunks=1)
    B = len(lens)
    qkv = torch.randn(B, (KH * G + 2 * KH) * D, generator=gen)
    shared = SharedPrefix(*(t.int() for t in dataclasses.astuple(shared)))
    (qkv, k, v, r2t, rows, lens), shared = on(dev, shared, qkv, k, v, r2t, rows, lens)
    q = qkv[:, : KH * G * D].view(B, KH * G, D)
    out = torch.full_like(q, float("nan"))
    got = decode_attention(q, k, v, r2t, rows, lens, 0.2, out=out, block_n=16, shared=shared,
                           num_shared_splits=2, shared_block_n=32)
    assert got is out
    assert rel_err(got, decode_attention_ref(q, k, v, r2t, rows, lens, 0.2)) < TOL[torch.float32]


def test_shared_contract_violations_raise():
    gen = torch.Generator().manual_seed(11)
    KH, D = 2, 8
    k, v, r2t, rows, lens, shared = make_shared_batch(GROUPS, LOOSE, KH, D, torch.float32, gen,
                                                      chunk_size=3, num_chunks=5)
    q = torch.randn(len(lens), KH * 2, D, generator=gen)
    args = (q, k, v, r2t, rows, lens, 0.3)
    decode_attention_ref(*args, shared=shared)  # the valid one passes

    member = int(shared.chunk_rows[0, 0])
    start = shared.start.clone()
    start[member] += 1
    with pytest.raises(ValueError, match="start"):
        decode_attention_ref(*args, shared=dataclasses.replace(shared, start=start))
    loose = int((shared.start == 0).nonzero()[0])
    start = shared.start.clone()
    start[loose] = 1
    with pytest.raises(ValueError, match="in no chunk"):
        decode_attention_ref(*args, shared=dataclasses.replace(shared, start=start))
    bad = r2t.clone()  # a member whose slot at shared position 3 is not the chunk's
    bad[int(rows[member]), 3] = bad[int(rows[member]), 3] % 50 + 1
    with pytest.raises(ValueError, match="differ"):
        decode_attention_ref(q, k, v, bad, rows, lens, 0.3, shared=shared)
    twice = shared.chunk_rows.clone()
    twice[1, 0] = twice[0, 0]
    with pytest.raises(ValueError, match="chunks"):
        decode_attention_ref(*args, shared=dataclasses.replace(shared, chunk_rows=twice))
    with pytest.raises(ValueError, match="window"):
        decode_attention_ref(*args, window=8, shared=shared)
    with pytest.raises(ValueError, match="start"):
        decode_attention_ref(*args, shared=dataclasses.replace(shared, start=shared.start[:-1]))


def test_shared_kernel_rejects_window_and_bad_shapes(dev):
    gen = torch.Generator().manual_seed(12)
    k, v, r2t, rows, lens, shared = make_shared_batch(GROUPS[:1], [3], 1, 16, torch.float32, gen,
                                                      chunk_size=4, num_chunks=1)
    q = torch.randn(len(lens), 2, 16, generator=gen)
    (q, k, v, r2t, rows, lens), shared = on(dev, shared, q, k, v, r2t, rows, lens)
    with pytest.raises(ValueError, match="window"):
        decode_attention(q, k, v, r2t, rows, lens, 0.3, window=4, shared=shared)
    with pytest.raises(ValueError, match="chunk_len"):
        decode_attention(q, k, v, r2t, rows, lens, 0.3,
                         shared=dataclasses.replace(shared, chunk_len=shared.chunk_len.float()))


def test_pack_shared_prefix():
    s = pack_shared_prefix([([4, 0, 2], 10, 7), ([1], 3, 5)], 6, num_chunks=4, chunk_size=2)
    assert s.chunk_rows.tolist() == [[4, 0], [2, -1], [1, -1], [-1, -1]]
    assert s.chunk_len.tolist() == [10, 10, 3, 0] and s.chunk_req.tolist() == [7, 7, 5, 0]
    assert s.start.tolist() == [10, 3, 10, 0, 10, 0]
    with pytest.raises(ValueError, match="more than"):
        pack_shared_prefix([([0, 1, 2], 4, 0)], 3, num_chunks=1, chunk_size=2)
    with pytest.raises(ValueError, match="two groups"):
        pack_shared_prefix([([0], 4, 0), ([0], 2, 1)], 3, num_chunks=2, chunk_size=2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_shared_kernel_real_sizes_and_cuda_graph_gpu():
    """bf16, Llama-3.1-8B heads (32/8, D 128): 3 groups x 20 members (chunks of 16) over prefixes
    of 2048 / 700 / 1, a CUDA graph captured with ``shared`` and replayed after the chunk values
    changed (other prefix lengths and members, same shapes)."""
    gen = torch.Generator().manual_seed(0)
    H, KH, D, dt = 32, 8, 128, torch.bfloat16
    groups = [(2048, [1 + 13 * i for i in range(20)]), (700, [5] * 20), (1, list(range(1, 21)))]
    k, v, r2t, rows, lens, shared = make_shared_batch(groups, [300, 1, 4000], KH, D, dt, gen,
                                                      chunk_size=16, num_chunks=8)
    q = torch.randn(len(lens), H, D, generator=gen).to(dt)
    (q, k, v, r2t, rows, lens), shared = on("cuda", shared, q, k, v, r2t, rows, lens)
    want = decode_attention_ref(q, k, v, r2t, rows, lens, D**-0.5)
    for splits in (None, 1, 4):
        got = decode_attention(q, k, v, r2t, rows, lens, D**-0.5, shared=shared, num_shared_splits=splits)
        assert rel_err(got, want) < 1e-2, splits
    out = torch.empty_like(q)
    decode_attention(q, k, v, r2t, rows, lens, D**-0.5, out=out, shared=shared)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attention(q, k, v, r2t, rows, lens, D**-0.5, out=out, shared=shared)
    # the same pool viewed as other groups: the first group only shares its first 1000 positions,
    # the second is split into rows in no chunk
    new = dataclasses.replace(shared, start=shared.start.clone(), chunk_len=shared.chunk_len.clone())
    members = shared.chunk_rows[shared.chunk_len == 700]
    members = members[members >= 0]
    new.start[shared.start == 2048] = 1000
    new.chunk_len[shared.chunk_len == 2048] = 1000
    new.start[members] = 0
    new.chunk_len[shared.chunk_len == 700] = 0
    for t in dataclasses.fields(shared):
        getattr(shared, t.name).copy_(getattr(new, t.name))
    graph.replay()
    assert rel_err(out, want) < 1e-2
    # NOTE: both references compute in fp32; bf16 rounding of the output differs at ~1e-5
    assert rel_err(decode_attention_ref(q, k, v, r2t, rows, lens, D**-0.5, shared=shared), want) < 1e-4
