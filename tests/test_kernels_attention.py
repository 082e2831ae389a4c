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

from radixlm.kernels._triton import HAS_TRITON, interpreter_ready, interpreting  # noqa: E402
from radixlm.kernels.decode_attention import decode_attention, decode_attention_ref  # noqa: E402
from radixlm.kernels.extend_attention import extend_attention, extend_attention_ref  # noqa: E402

TOL = {torch.float32: 2e-5, torch.float16: 2e-3}


@pytest.fixture(scope="module")
def dev() -> str:
    """Device of the kernel tests: CPU under the Triton interpreter, else CUDA; skip without triton."""
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    if interpreting():
        if not interpreter_ready():
            pytest.fail("triton was imported before TRITON_INTERPRET=1 was set; set it in tests/conftest.py")
        return "cpu"
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device and TRITON_INTERPRET is not 1")
    return "cuda"


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


def sdpa(q, k, v, scale, prefix_len=None):
    """Dense SDPA: q [Lq, H, D], k/v [Lk, KH, D]; causal aligned bottom-right when prefix_len given."""
    H, KH = q.shape[1], k.shape[1]
    qt, kt, vt = (x.float().transpose(0, 1) for x in (q, k, v))
    kt, vt = kt.repeat_interleave(H // KH, 0), vt.repeat_interleave(H // KH, 0)
    mask = None
    if prefix_len is not None:
        Lq, Lk = q.shape[0], k.shape[0]
        mask = torch.arange(Lk)[None, :] <= (prefix_len + torch.arange(Lq))[:, None]
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
