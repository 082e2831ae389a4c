"""Decode/extend attention: Triton kernels (under TRITON_INTERPRET=1, on CPU) against the torch
references, and the references against dense SDPA on gathered, contiguous KV.

Inputs are fresh random pools with page-size-1 scattered slots (a random permutation of the pool),
ragged batches, prefixes of length 0 and GQA ratios 1/4/8. bf16 is left to the GPU script: the
interpreter's ``tl.dot`` mishandles bf16 (triton 3.9).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # NOTE: before anything imports triton (see radixlm/kernels/_triton.py).
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from radixlm.kernels.decode_attention import decode_attention, decode_attention_ref  # noqa: E402
from radixlm.kernels.extend_attention import extend_attention, extend_attention_ref  # noqa: E402

TOL = {torch.float32: 2e-5, torch.float16: 2e-3}



def on(dev, *tensors):
    return [t.to(dev) for t in tensors]


def make_pool(lens, kv_heads, head_dim, dtype, max_reqs=8, gen=None):
    """Random K/V pool and a req_to_token table with scattered slots; returns (k, v, r2t, rows)."""
    total = sum(lens)
    num_slots = total + 13
    k = torch.randn(num_slots + 1, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(num_slots + 1, kv_heads, head_dim, generator=gen).to(dtype)
    max_len = max(max(lens), 1) + 5
    r2t = torch.zeros(max_reqs, max_len, dtype=torch.int32)
    slots = torch.randperm(num_slots, generator=gen)[:total] + 1
    rows = torch.randperm(max_reqs, generator=gen)[: len(lens)]
    off = 0
    for row, n in zip(rows.tolist(), lens):
        r2t[row, :n] = slots[off : off + n].int()
        off += n
    return k, v, r2t, rows.long()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


# ---------------------------------------------------------------- references vs dense SDPA


def sdpa(q, k, v, scale, prefix_len=None, window=0):
    """Dense SDPA: q [Lq, H, D], k/v [Lk, KH, D]; causal aligned bottom-right when prefix_len given;
    ``window > 0``: query at position p sees keys (p - window, p] (queries are the last Lq positions)."""
    H, KH = q.shape[1], k.shape[1]
    qt, kt, vt = (x.float().transpose(0, 1) for x in (q, k, v))
    kt, vt = kt.repeat_interleave(H // KH, 0), vt.repeat_interleave(H // KH, 0)
    Lq, Lk = q.shape[0], k.shape[0]
    key, qpos = torch.arange(Lk)[None, :], (Lk - Lq + torch.arange(Lq))[:, None]
    mask = None
    if prefix_len is not None:
        assert prefix_len == Lk - Lq
        mask = key <= qpos
    if window > 0:
        mask = (key > qpos - window) if mask is None else mask & (key > qpos - window)
    return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale).transpose(0, 1)


@pytest.mark.parametrize("group", [1, 4, 8])
def test_decode_ref_matches_dense_sdpa(group):
    gen = torch.Generator().manual_seed(group)
    lens, KH, D = [1, 9, 33, 64], 2, 16
    k, v, r2t, rows = make_pool(lens, KH, D, torch.float32, gen=gen)
    q = torch.randn(len(lens), KH * group, D, generator=gen)
    o = decode_attention_ref(q, k, v, r2t, rows, torch.tensor(lens), D**-0.5)
    for b, n in enumerate(lens):
        slots = r2t[rows[b], :n].long()
        want = sdpa(q[b : b + 1], k[slots], v[slots], D**-0.5)[0]
        assert torch.allclose(o[b], want, atol=1e-5), b


@pytest.mark.parametrize("group", [1, 4, 8])
def test_extend_ref_matches_dense_sdpa(group):
    gen = torch.Generator().manual_seed(10 + group)
    prefix, ext, KH, D = [0, 7, 30, 5], [5, 1, 12, 9], 2, 16
    k, v, r2t, rows = make_pool([p + e for p, e in zip(prefix, ext)], KH, D, torch.float32, gen=gen)
    T = sum(ext)
    q = torch.randn(T, KH * group, D, generator=gen)
    starts = torch.tensor(ext).cumsum(0) - torch.tensor(ext)
    o = extend_attention_ref(q, k, v, r2t, rows, torch.tensor(prefix), torch.tensor(ext), starts, D**-0.5)
    for b, (p, e) in enumerate(zip(prefix, ext)):
        slots = r2t[rows[b], : p + e].long()
        s0 = int(starts[b])
        want = sdpa(q[s0 : s0 + e], k[slots], v[slots], D**-0.5, prefix_len=p)
        assert torch.allclose(o[s0 : s0 + e], want, atol=1e-5), b


def test_decode_ref_equals_extend_ref_last_token():
    """A decode step is an extend of one token on a prefix of seq_len - 1."""
    gen = torch.Generator().manual_seed(3)
    lens, KH, D = [4, 17, 2], 2, 8
    k, v, r2t, rows = make_pool(lens, KH, D, torch.float32, gen=gen)
    q = torch.randn(3, 8, D, generator=gen)
    n = torch.tensor(lens)
    dec = decode_attention_ref(q, k, v, r2t, rows, n, 0.3)
    ext = extend_attention_ref(q, k, v, r2t, rows, n - 1, torch.ones(3, dtype=torch.long), torch.arange(3), 0.3)
    assert torch.allclose(dec, ext, atol=1e-6)


# ---------------------------------------------------------------- Triton (interpreted) vs references


@pytest.mark.parametrize(
    "group,dtype,splits",
    [(1, torch.float32, None), (4, torch.float16, None), (8, torch.float32, 3), (4, torch.float32, 1)],
)
def test_decode_kernel_matches_ref(dev, group, dtype, splits):
    gen = torch.Generator().manual_seed(100 + group)
    lens, KH, D = [1, 37, 70, 5], 2, 32
    k, v, r2t, rows = make_pool(lens, KH, D, dtype, gen=gen)
    q = torch.randn(len(lens), KH * group, D, generator=gen).to(dtype)
    args = on(dev, q, k, v, r2t, rows, torch.tensor(lens))
    got = decode_attention(*args, D**-0.5, num_kv_splits=splits, block_n=16)
    want = decode_attention_ref(*args, D**-0.5)
    assert got.dtype == dtype and got.shape == q.shape
    assert rel_err(got, want) < TOL[dtype], rel_err(got, want)


def test_decode_kernel_edge_cases(dev):
    """Strided q (view of a fused qkv), head_dim not a power of 2, seq_len 0, more splits than tiles."""
    gen = torch.Generator().manual_seed(7)
    lens, KH, G, D = [0, 3, 21], 2, 4, 24
    k, v, r2t, rows = make_pool(lens, KH, D, torch.float32, gen=gen)
    qkv = torch.randn(3, (KH * G + 2 * KH) * D, generator=gen).to(dev)
    q = qkv[:, : KH * G * D].view(3, KH * G, D)
    assert not q.is_contiguous()
    args = [q, *on(dev, k, v, r2t, rows, torch.tensor(lens))]
    want = decode_attention_ref(*args, 0.2)
    for splits in (8, 1):  # 1: stage 1 writes the output itself
        got = decode_attention(*args, 0.2, num_kv_splits=splits, block_n=16)
        assert torch.equal(got[0], torch.zeros_like(got[0])), splits
        assert rel_err(got, want) < TOL[torch.float32], splits


@pytest.mark.parametrize(
    "group,dtype,prefix,ext",
    [
        (1, torch.float32, [0, 37, 5], [19, 1, 40]),
        (4, torch.float16, [0, 0], [33, 8]),
        (8, torch.float32, [21, 0, 64, 3], [17, 0, 16, 2]),
    ],
)
def test_extend_kernel_matches_ref(dev, group, dtype, prefix, ext):
    gen = torch.Generator().manual_seed(200 + group)
    KH, D = 2, 32
    k, v, r2t, rows = make_pool([p + e for p, e in zip(prefix, ext)], KH, D, dtype, gen=gen)
    T = sum(ext)
    q = torch.randn(T, KH * group, D, generator=gen).to(dtype)
    E = torch.tensor(ext)
    args = on(dev, q, k, v, r2t, rows, torch.tensor(prefix), E, E.cumsum(0) - E)
    got = extend_attention(*args, D**-0.5, block_m=16, block_n=16)
    want = extend_attention_ref(*args, D**-0.5)
    assert got.dtype == dtype and got.shape == q.shape
    assert rel_err(got, want) < TOL[dtype], rel_err(got, want)


def test_extend_kernel_block_sizes_and_strided_q(dev):
    """Larger blocks (one tile covers everything) and a strided q view, D not a power of 2."""
    gen = torch.Generator().manual_seed(5)
    prefix, ext, KH, G, D = [3, 0], [5, 11], 1, 4, 20
    k, v, r2t, rows = make_pool([p + e for p, e in zip(prefix, ext)], KH, D, torch.float32, gen=gen)
    qkv = torch.randn(16, (KH * G + 2 * KH) * D, generator=gen).to(dev)
    q = qkv[:, : KH * G * D].view(16, KH * G, D)
    E = torch.tensor(ext)
    args = [q, *on(dev, k, v, r2t, rows, torch.tensor(prefix), E, E.cumsum(0) - E)]
    want = extend_attention_ref(*args, 0.25)
    for bm, bn in [(64, 64), (16, 32)]:
        got = extend_attention(*args, 0.25, max_extend_len=11, block_m=bm, block_n=bn)
        assert rel_err(got, want) < TOL[torch.float32], (bm, bn)


def test_dispatcher_uses_reference_on_cpu(monkeypatch):
    import radixlm.kernels as K

    gen = torch.Generator().manual_seed(1)
    k, v, r2t, rows = make_pool([3, 4], 1, 8, torch.float32, gen=gen)
    q = torch.randn(2, 2, 8, generator=gen)
    n = torch.tensor([3, 4])
    assert not K.use_triton(q)
    assert torch.equal(K.decode_attention(q, k, v, r2t, rows, n, 0.5), decode_attention_ref(q, k, v, r2t, rows, n, 0.5))
    monkeypatch.setenv("RADIXLM_FORCE_TORCH_OPS", "1")
    assert not K.use_triton(q)


# ---------------------------------------------------------------- sliding window (Mistral, Qwen2/3)

WINDOWS = [1, 5, 16, 40]


@pytest.mark.parametrize("window", WINDOWS)
def test_windowed_refs_match_dense_sdpa(window):
    """Window W: a query at position p sees keys (p - W, p], W keys including its own (HF)."""
    gen = torch.Generator().manual_seed(300 + window)
    prefix, ext, KH, G, D = [0, 7, 30, 5], [25, 1, 12, 9], 2, 2, 16
    lens = [p + e for p, e in zip(prefix, ext)]
    k, v, r2t, rows = make_pool(lens, KH, D, torch.float32, gen=gen)
    q = torch.randn(sum(ext), KH * G, D, generator=gen)
    E = torch.tensor(ext)
    starts = E.cumsum(0) - E
    o = extend_attention_ref(q, k, v, r2t, rows, torch.tensor(prefix), E, starts, D**-0.5, window=window)
    qd = torch.randn(len(lens), KH * G, D, generator=gen)
    od = decode_attention_ref(qd, k, v, r2t, rows, torch.tensor(lens), D**-0.5, window=window)
    for b, (p, e) in enumerate(zip(prefix, ext)):
        slots = r2t[rows[b], : p + e].long()
        s0 = int(starts[b])
        want = sdpa(q[s0 : s0 + e], k[slots], v[slots], D**-0.5, prefix_len=p, window=window)
        assert torch.allclose(o[s0 : s0 + e], want, atol=1e-5), b
        want_d = sdpa(qd[b : b + 1], k[slots], v[slots], D**-0.5, window=window)[0]
        assert torch.allclose(od[b], want_d, atol=1e-5), b


def test_window_changes_output_only_past_the_window():
    """A window >= the sequence is full attention; a shorter one changes the output."""
    gen = torch.Generator().manual_seed(9)
    lens, KH, D = [12], 1, 8
    k, v, r2t, rows = make_pool(lens, KH, D, torch.float32, gen=gen)
    q = torch.randn(1, 2, D, generator=gen)
    n = torch.tensor(lens)
    full = decode_attention_ref(q, k, v, r2t, rows, n, 0.5)
    assert torch.equal(decode_attention_ref(q, k, v, r2t, rows, n, 0.5, window=12), full)
    assert not torch.allclose(decode_attention_ref(q, k, v, r2t, rows, n, 0.5, window=11), full, atol=1e-4)
    qe = torch.randn(12, 2, D, generator=gen)
    args = (qe, k, v, r2t, rows, torch.tensor([0]), n, torch.tensor([0]), 0.5)
    full_e = extend_attention_ref(*args)
    win_e = extend_attention_ref(*args, window=4)
    assert torch.equal(win_e[:4], full_e[:4]) and not torch.allclose(win_e[4:], full_e[4:], atol=1e-4)


@pytest.mark.parametrize("window,splits", [(1, None), (5, 3), (16, 1), (40, None), (200, 2)])
def test_windowed_decode_kernel_matches_ref(dev, window, splits):
    gen = torch.Generator().manual_seed(400 + window)
    lens, KH, G, D = [1, 37, 70, 5, 0], 2, 4, 32
    k, v, r2t, rows = make_pool(lens, KH, D, torch.float32, gen=gen)
    q = torch.randn(len(lens), KH * G, D, generator=gen)
    args = on(dev, q, k, v, r2t, rows, torch.tensor(lens))
    got = decode_attention(*args, D**-0.5, num_kv_splits=splits, window=window, block_n=16)
    want = decode_attention_ref(*args, D**-0.5, window=window)
    assert rel_err(got, want) < TOL[torch.float32], rel_err(got, want)


@pytest.mark.parametrize(
    "window,prefix,ext,block",
    [
        (1, [0, 9], [20, 3], (16, 16)),
        (7, [0, 37, 5], [19, 1, 40], (16, 16)),
        (16, [21, 0, 64, 3], [17, 0, 16, 2], (16, 16)),
        (24, [0, 50], [45, 30], (16, 32)),
        (40, [3, 0], [5, 50], (32, 16)),
    ],
)
def test_windowed_extend_kernel_matches_ref(dev, window, prefix, ext, block):
    gen = torch.Generator().manual_seed(500 + window)
    KH, G, D = 2, 2, 16
    k, v, r2t, rows = make_pool([p + e for p, e in zip(prefix, ext)], KH, D, torch.float32, gen=gen)
    q = torch.randn(sum(ext), KH * G, D, generator=gen)
    E = torch.tensor(ext)
    args = on(dev, q, k, v, r2t, rows, torch.tensor(prefix), E, E.cumsum(0) - E)
    got = extend_attention(*args, D**-0.5, window=window, block_m=block[0], block_n=block[1])
    want = extend_attention_ref(*args, D**-0.5, window=window)
    assert not got.isnan().any()
    assert rel_err(got, want) < TOL[torch.float32], rel_err(got, want)


def test_windowed_sdpa_prefill_matches_extend_ref():
    """The SDPA fresh-prefill path (used on CUDA) honours the window (run here on CPU directly)."""
    from types import SimpleNamespace

    from radixlm.runtime.attention import AttentionBackend

    gen = torch.Generator().manual_seed(11)
    ext, KH, G, D, W = [20, 3, 9], 2, 2, 8, 6
    k, v, r2t, rows = make_pool(ext, KH, D, torch.float32, gen=gen)
    T = sum(ext)
    q = torch.randn(T, KH * G, D, generator=gen)
    E = torch.tensor(ext)
    starts = E.cumsum(0) - E
    slots = torch.cat([r2t[rows[b], :n].long() for b, n in enumerate(ext)])
    fb = SimpleNamespace(extend_lens_cpu=ext)
    got = AttentionBackend(KH * G, KH, D)._prefill_no_prefix(q, k[slots], v[slots], fb.extend_lens_cpu, window=W)
    want = extend_attention_ref(q, k, v, r2t, rows, torch.zeros(3, dtype=torch.long), E, starts, D**-0.5, window=W)
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_windowed_kernels_at_real_sizes_gpu():
    """bf16, head_dim 128, windows 4096 (Mistral 7B v0.1) and 1000 over sequences up to 12k, and a
    decode CUDA graph captured with a window and replayed with other lengths."""
    gen = torch.Generator().manual_seed(0)
    KH, G, D, dt = 8, 4, 128, torch.bfloat16
    for window in (4096, 1000):
        lens = [1, 77, 4096, 4097, 12000, 999, 1001, 3]
        k, v, r2t, rows = on("cuda", *make_pool(lens, KH, D, dt, max_reqs=12, gen=gen))
        q = torch.randn(len(lens), KH * G, D, generator=gen).to("cuda", dt)
        n = torch.tensor(lens, device="cuda")
        want = decode_attention_ref(q, k, v, r2t, rows, n, D**-0.5, window=window)
        for splits in (None, 1, 8):
            got = decode_attention(q, k, v, r2t, rows, n, D**-0.5, num_kv_splits=splits, window=window)
            assert rel_err(got, want) < 1e-2, (window, splits)
        out = torch.empty_like(q)
        decode_attention(q, k, v, r2t, rows, n, D**-0.5, out=out, window=window)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            decode_attention(q, k, v, r2t, rows, n, D**-0.5, out=out, window=window)
        n.copy_(torch.tensor([12000, 5, 4096, 1, 2000, 4097, 3, 777], device="cuda"))
        graph.replay()
        assert rel_err(out, decode_attention_ref(q, k, v, r2t, rows, n, D**-0.5, window=window)) < 1e-2
        prefix, ext = [0, 3000, 4096, 17], [5000, 1, 4096, 700]
        k, v, r2t, rows = on("cuda", *make_pool([p + e for p, e in zip(prefix, ext)], KH, D, dt, gen=gen))
        q = torch.randn(sum(ext), KH * G, D, generator=gen).to("cuda", dt)
        E = torch.tensor(ext, device="cuda")
        args = (q, k, v, r2t, rows, torch.tensor(prefix, device="cuda"), E, E.cumsum(0) - E, D**-0.5)
        got = extend_attention(*args, window=window)
        assert rel_err(got, extend_attention_ref(*args, window=window)) < 1e-2, window
