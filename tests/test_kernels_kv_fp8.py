"""An fp8 KV pool (``kv_cache_dtype`` fp8_e4m3 / fp8_e5m2): the Triton stores write what the torch
references write (e4m3 saturating at +-448), and every attention kernel reading the pool (decode,
decode with rotary + store inside, extend, shared-prefix) matches its reference over the same
fp8 contents. Triton runs under TRITON_INTERPRET=1 on CPU (the reads; the stores need a GPU),
compiled on CUDA when a GPU is present.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # NOTE: before anything imports triton (see radixlm/kernels/_triton.py).
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from radixlm.kernels.decode_attention import decode_attention, decode_attention_ref  # noqa: E402
from radixlm.kernels.extend_attention import extend_attention, extend_attention_ref  # noqa: E402
from radixlm.kernels.rotary import compute_cos_sin_cache  # noqa: E402
from radixlm.kernels.rotary_store_kv import NewTokens, rotary_store_kv, rotary_store_kv_ref  # noqa: E402
from radixlm.kernels.store_kv import store_kv, store_kv_ref  # noqa: E402

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
# NOTE: the interpreter's fp32 -> fp8 casts are not IEEE roundings (e4m3: 506 -> 256, -31 -> -16;
# triton 3.6), so the kernels that write the pool are compared on a GPU only; reads are exact.
needs_gpu_store = pytest.mark.skipif(not torch.cuda.is_available(),
                                     reason="fp8 stores: the Triton interpreter's fp8 casts are not exact")


def codes_apart(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance between the 8-bit codes of two fp8 tensors of one sign pattern (1: the
    neighbouring value, a rounding tie broken the other way)."""
    ia, ib = a.cpu().view(torch.uint8).int(), b.cpu().view(torch.uint8).int()
    assert torch.equal(ia >> 7, ib >> 7), "signs differ"
    return int((ia - ib).abs().max())


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float().cpu() - b.float().cpu()).norm() / b.float().cpu().norm().clamp_min(1e-12)).item()


def fp8_pool(n: int, kh: int, d: int, dtype: torch.dtype, gen: torch.Generator, scale: float = 1.0):
    return [(torch.randn(n, kh, d, generator=gen) * scale).to(dtype) for _ in range(2)]


def scattered(lens: list[int], gen: torch.Generator, spare: int = 5):
    """req_to_token rows holding scattered slots for requests of ``lens`` tokens: (r2t, rows, slots)."""
    total = sum(lens)
    r2t = torch.zeros(len(lens) + 2, max(lens) + 3, dtype=torch.int32)
    slots = torch.randperm(total + spare, generator=gen)[:total] + 1
    rows = torch.randperm(len(lens) + 2, generator=gen)[: len(lens)]
    off = 0
    for row, n in zip(rows.tolist(), lens):
        r2t[row, :n] = slots[off : off + n].int()
        off += n
    return r2t, rows.long(), total + spare + 1


@needs_gpu_store
@pytest.mark.parametrize("buf_dtype", FP8)
def test_store_kv_into_fp8_pool(dev, buf_dtype):
    """Values past e4m3's range saturate (never NaN); the kernel and torch round alike (at most
    one code apart on ties); slots not written keep their contents."""
    gen = torch.Generator().manual_seed(1)
    kb, vb = fp8_pool(40, 3, 64, buf_dtype, gen)
    k = torch.randn(6, 3, 64, generator=gen) * 300  # past 448: saturation in e4m3
    v = torch.randn(6, 3, 64, generator=gen)
    loc = torch.randperm(39, generator=gen)[:6] + 1
    kr, vr = kb.clone(), vb.clone()
    store_kv_ref(kr, vr, loc, k, v)
    kd, vd = kb.clone().to(dev), vb.clone().to(dev)
    store_kv(kd, vd, loc.to(dev), k.to(dev), v.to(dev))
    assert codes_apart(kd, kr) <= 1 and codes_apart(vd, vr) <= 1
    assert torch.isfinite(kd.cpu().float()).all()
    if buf_dtype == torch.float8_e4m3fn:
        assert kd.cpu().float().abs().max() == 448.0


@needs_gpu_store
@pytest.mark.parametrize("buf_dtype", FP8)
def test_rotary_store_kv_into_fp8_pool(dev, buf_dtype):
    gen = torch.Generator().manual_seed(2)
    T, hq, hk, D = 5, 9, 3, 64
    qkv = torch.randn(T, (hq + 2 * hk) * D, generator=gen).to(torch.float16)
    kb, vb = fp8_pool(30, hk, D, buf_dtype, gen)
    pos = torch.tensor([0, 5, 77, 1000, 4095])
    loc = torch.randperm(29, generator=gen)[:T] + 1
    cache = compute_cos_sin_cache(D, 4096, 10000.0, None, torch.float32)
    views = lambda x: (x[:, : hq * D].view(T, hq, D), x[:, hq * D : (hq + hk) * D].view(T, hk, D),  # noqa: E731
                       x[:, (hq + hk) * D :].view(T, hk, D))
    ref = [qkv.clone(), kb.clone(), vb.clone()]
    rotary_store_kv_ref(*views(ref[0]), pos, cache, ref[1], ref[2], loc)
    got = [qkv.clone().to(dev), kb.clone().to(dev), vb.clone().to(dev)]
    rotary_store_kv(*views(got[0]), pos.to(dev), cache.to(dev), got[1], got[2], loc.to(dev))
    assert codes_apart(got[1], ref[1]) <= 1 and codes_apart(got[2], ref[2]) <= 1


@pytest.mark.parametrize("buf_dtype", FP8)
@pytest.mark.parametrize("splits", [None, 1])
def test_decode_attention_over_fp8_pool(dev, buf_dtype, splits):
    gen = torch.Generator().manual_seed(3)
    lens, KH, G, D = [1, 37, 70, 5], 2, 4, 32
    r2t, rows, n = scattered(lens, gen)
    kb, vb = fp8_pool(n, KH, D, buf_dtype, gen)
    q = torch.randn(len(lens), KH * G, D, generator=gen).to(torch.float16)
    args = [x.to(dev) for x in (q, kb, vb, r2t, rows, torch.tensor(lens))]
    got = decode_attention(*args, D**-0.5, num_kv_splits=splits, block_n=16)
    want = decode_attention_ref(q, kb, vb, r2t, rows, torch.tensor(lens), D**-0.5)
    assert got.dtype == torch.float16 and rel_err(got, want) < 2e-3


@needs_gpu_store
@pytest.mark.parametrize("buf_dtype", FP8)
def test_decode_attention_with_new_tokens_into_fp8_pool(dev, buf_dtype):
    """Rotary, the fp8 store and attention in one launch == the references one after the other."""
    gen = torch.Generator().manual_seed(4)
    lens, KH, G, D = [1, 37, 20], 3, 3, 64
    B, H = len(lens), KH * G
    r2t, rows, n = scattered(lens, gen)
    kb, vb = fp8_pool(n, KH, D, buf_dtype, gen)
    loc = torch.tensor([int(r2t[r, m - 1]) for r, m in zip(rows.tolist(), lens)])
    qkv = torch.randn(B, (H + 2 * KH) * D, generator=gen).to(torch.float16)
    cache = compute_cos_sin_cache(D, 4096, 10000.0, None, torch.float32)
    pos = torch.tensor(lens) - 1 + 100
    split = lambda x: [x[:, a * D : b * D].view(B, -1, D) for a, b in ((0, H), (H, H + KH), (H + KH, H + 2 * KH))]  # noqa: E731
    qkv_d, kb_d, vb_d = qkv.clone().to(dev), kb.clone().to(dev), vb.clone().to(dev)
    q_d, k_d, v_d = split(qkv_d)
    new = NewTokens(k_d, v_d, loc.to(dev), pos.to(dev), cache.to(dev))
    got = decode_attention(q_d, kb_d, vb_d, r2t.to(dev), rows.to(dev), torch.tensor(lens).to(dev), D**-0.5,
                           block_n=16, new_tokens=new)
    qr, kr, vr = split(qkv.clone())
    kbr, vbr = kb.clone(), vb.clone()
    rotary_store_kv_ref(qr, kr, vr, pos, cache, kbr, vbr, loc)
    want = decode_attention_ref(qr, kbr, vbr, r2t, rows, torch.tensor(lens), D**-0.5)
    assert codes_apart(kb_d, kbr) <= 1 and codes_apart(vb_d, vbr) <= 1
    assert rel_err(got, want) < 2e-2  # NOTE: a key one code apart moves its scores by up to 1/16


@pytest.mark.parametrize("buf_dtype", FP8)
def test_extend_attention_over_fp8_pool(dev, buf_dtype):
    gen = torch.Generator().manual_seed(5)
    prefix, ext, KH, G, D = [0, 7, 30, 5], [5, 1, 12, 9], 2, 2, 32
    r2t, rows, n = scattered([p + e for p, e in zip(prefix, ext)], gen)
    kb, vb = fp8_pool(n, KH, D, buf_dtype, gen)
    q = torch.randn(sum(ext), KH * G, D, generator=gen).to(torch.float16)
    starts = torch.tensor(ext).cumsum(0) - torch.tensor(ext)
    cpu = (q, kb, vb, r2t, rows, torch.tensor(prefix), torch.tensor(ext), starts)
    got = extend_attention(*[x.to(dev) for x in cpu], D**-0.5, max_extend_len=max(ext))
    want = extend_attention_ref(*cpu, D**-0.5)
    assert rel_err(got, want) < 2e-3


def test_shared_prefix_attention_over_fp8_pool(dev):
    """The cascade form reads the shared prefix once from the fp8 pool: equal to plain attention."""
    from radixlm.kernels.shared_prefix_attention import pack_shared_prefix

    gen = torch.Generator().manual_seed(6)
    P, owns, KH, G, D = 37, [1, 5, 20], 2, 4, 32
    lens = [P + u for u in owns]
    total = P + sum(owns)
    slots = torch.randperm(total + 4, generator=gen)[:total] + 1
    r2t = torch.zeros(len(lens), max(lens) + 2, dtype=torch.int32)
    off = P
    for b, u in enumerate(owns):
        r2t[b, :P] = slots[:P].int()
        r2t[b, P : P + u] = slots[off : off + u].int()
        off += u
    kb, vb = fp8_pool(total + 5, KH, D, torch.float8_e4m3fn, gen)
    q = torch.randn(len(lens), KH * G, D, generator=gen).to(torch.float16)
    rows, seq = torch.arange(len(lens)), torch.tensor(lens)
    shared = pack_shared_prefix([(list(range(len(lens))), P, 0)], len(lens), num_chunks=2, chunk_size=4, device=dev)
    want = decode_attention_ref(q, kb, vb, r2t, rows, seq, D**-0.5)
    dev_shared = shared
    got = decode_attention(*[x.to(dev) for x in (q, kb, vb, r2t, rows, seq)], D**-0.5, shared=dev_shared,
                           block_n=16)
    assert rel_err(got, want) < 2e-3
