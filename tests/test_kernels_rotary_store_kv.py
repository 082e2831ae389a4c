"""Rotary + KV store in one kernel (``kernels/rotary_store_kv.py``) against the two kernels it
replaces (``apply_rotary`` then ``store_kv``) and their torch references: q/k rotated the same (in
place, through strided qkv views), the new tokens' k/v slots written, every other slot untouched.
Triton runs under TRITON_INTERPRET=1 on CPU (compiled on CUDA when a GPU is present).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # NOTE: before anything imports triton (see radixlm/kernels/_triton.py).
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from radixlm.kernels.rotary import apply_rotary, compute_cos_sin_cache  # noqa: E402
from radixlm.kernels.rotary_store_kv import rotary_store_kv, rotary_store_kv_ref  # noqa: E402
from radixlm.kernels.store_kv import store_kv  # noqa: E402

LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}


def make(dev, dtype, buf_dtype, T, hq, hk, D, slots=50, seed=0):
    """(q, k, v views of one fused qkv, positions, loc, k_buffer, v_buffer)."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(T, (hq + 2 * hk) * D, generator=gen).to(dev, dtype)
    q = qkv[:, : hq * D].view(T, hq, D)
    k = qkv[:, hq * D : (hq + hk) * D].view(T, hk, D)
    v = qkv[:, (hq + hk) * D :].view(T, hk, D)
    # positions past the start of the table, the last row included
    positions = torch.tensor([4095, 0, 1, 77, 1000, 2048, 3, 4094][:T]).to(dev)
    loc = (torch.randperm(slots, generator=gen)[:T] + 1).to(dev)
    bufs = [torch.randn(slots + 1, hk, D, generator=gen).to(dev, buf_dtype) for _ in range(2)]
    return qkv, q, k, v, positions, loc, bufs


CASES = [  # dtype, buffer dtype, T, Hq, Hk, D
    (torch.float32, torch.float32, 5, 4, 4, 64),
    (torch.float32, torch.float32, 8, 8, 2, 128),  # GQA 4
    (torch.float16, torch.float16, 3, 9, 3, 64),  # SmolLM2-135M heads
    (torch.bfloat16, torch.bfloat16, 4, 6, 1, 128),  # MQA
    (torch.float32, torch.float16, 6, 12, 4, 64),  # cast into a narrower pool
]


@pytest.mark.parametrize("dtype,buf_dtype,T,hq,hk,D", CASES)
def test_rotary_store_kv_equals_rotary_then_store(dev, dtype, buf_dtype, T, hq, hk, D):
    cache = compute_cos_sin_cache(D, 4096, 10000.0, LLAMA31, torch.float32, device=dev)
    qkv, q, k, v, pos, loc, bufs = make(dev, dtype, buf_dtype, T, hq, hk, D, seed=T * 100 + hq)
    qkv2 = qkv.clone()
    q2 = qkv2[:, : hq * D].view(T, hq, D)
    k2 = qkv2[:, hq * D : (hq + hk) * D].view(T, hk, D)
    v2 = qkv2[:, (hq + hk) * D :].view(T, hk, D)
    bufs2 = [b.clone() for b in bufs]
    before = [b.clone() for b in bufs]
    out = rotary_store_kv(q, k, v, pos, cache, bufs[0], bufs[1], loc)
    assert out[0].data_ptr() == q.data_ptr() and out[1].data_ptr() == k.data_ptr()
    apply_rotary(q2, k2, pos, cache)  # the two launches it replaces
    store_kv(bufs2[0], bufs2[1], loc, k2, v2)
    assert torch.equal(qkv, qkv2)  # q, k rotated in place identically; v untouched
    assert torch.equal(bufs[0], bufs2[0]) and torch.equal(bufs[1], bufs2[1])
    # the new slots hold the rotated k and v; the other slots are untouched
    assert torch.equal(bufs[0][loc].cpu(), k.to(buf_dtype).cpu())
    assert torch.equal(bufs[1][loc].cpu(), v.to(buf_dtype).cpu())
    other = torch.ones(bufs[0].shape[0], dtype=torch.bool)
    other[loc.cpu()] = False
    for b, b0 in zip(bufs, before):
        assert torch.equal(b.cpu()[other], b0.cpu()[other])


@pytest.mark.parametrize("dtype,buf_dtype,T,hq,hk,D", CASES[:3])
def test_rotary_store_kv_matches_torch_reference(dev, dtype, buf_dtype, T, hq, hk, D):
    cache = compute_cos_sin_cache(D, 4096, 500000.0, None, torch.float32, device=dev)
    qkv, q, k, v, pos, loc, bufs = make(dev, dtype, buf_dtype, T, hq, hk, D, seed=7)
    qr, kr, vr = (x.clone() for x in (q, k, v))
    bufs_r = [b.clone() for b in bufs]
    rotary_store_kv(q, k, v, pos, cache, bufs[0], bufs[1], loc)
    rotary_store_kv_ref(qr, kr, vr, pos, cache, bufs_r[0], bufs_r[1], loc)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3}[dtype]
    for a, b in ((q, qr), (k, kr), (bufs[0], bufs_r[0]), (bufs[1], bufs_r[1])):
        torch.testing.assert_close(a.float().cpu(), b.float().cpu(), rtol=tol, atol=tol)


def test_rotary_store_kv_empty(dev):
    cache = compute_cos_sin_cache(64, 16, 10000.0, None, torch.float32, device=dev)
    q, k, v = torch.zeros(0, 2, 64, device=dev), torch.zeros(0, 1, 64, device=dev), torch.zeros(0, 1, 64, device=dev)
    bufs = [torch.randn(5, 1, 64, device=dev) for _ in range(2)]
    before = [b.clone() for b in bufs]
    idx = torch.zeros(0, dtype=torch.int64, device=dev)
    rotary_store_kv(q, k, v, idx, cache, bufs[0], bufs[1], idx)
    assert all(torch.equal(a, b) for a, b in zip(bufs, before))


# ---------------------------------------------------------------- inside decode attention (NewTokens)


@pytest.mark.parametrize("lens,KH,G,D,splits,one_launch,window,dtype", [
    ([1, 37, 70], 3, 3, 64, None, True, 0, torch.float32),  # SmolLM2-135M heads; a 1-token row
    ([50, 17], 2, 4, 128, 1, True, 0, torch.float32),  # one split: stage 1 writes the output
    ([80, 9, 33], 1, 8, 64, 4, False, 0, torch.float32),  # two-launch merge
    ([40, 65], 2, 2, 128, 8, True, 20, torch.float32),  # sliding window
    ([33, 7, 64], 2, 4, 64, 4, True, 0, torch.float16),
])
def test_decode_attention_with_new_tokens(dev, lens, KH, G, D, splits, one_launch, window, dtype):
    """Rotary + store + attention in one launch == rotary_store_kv_ref, then decode_attention_ref."""
    from radixlm.kernels.decode_attention import decode_attention, decode_attention_ref
    from radixlm.kernels.rotary_store_kv import NewTokens

    gen = torch.Generator().manual_seed(sum(lens) + D)
    B, H, total = len(lens), KH * G, sum(lens)
    kb = torch.randn(total + 4, KH, D, generator=gen).to(dtype)
    vb = torch.randn(total + 4, KH, D, generator=gen).to(dtype)
    r2t = torch.zeros(B + 2, max(lens) + 3, dtype=torch.int32)
    slots = torch.randperm(total + 3, generator=gen)[:total] + 1
    rows = torch.randperm(B + 2, generator=gen)[:B]
    off = 0
    for row, n in zip(rows.tolist(), lens):
        r2t[row, :n] = slots[off : off + n].int()
        off += n
    loc = torch.tensor([int(r2t[r, n - 1]) for r, n in zip(rows.tolist(), lens)])
    qkv = torch.randn(B, (H + 2 * KH) * D, generator=gen).to(dtype)
    q = qkv[:, : H * D].view(B, H, D)
    k = qkv[:, H * D : (H + KH) * D].view(B, KH, D)
    v = qkv[:, (H + KH) * D :].view(B, KH, D)
    cache = compute_cos_sin_cache(D, 4096, 10000.0, LLAMA31, torch.float32)
    pos = torch.tensor(lens) - 1 + 3000  # positions past the table start (offset: rotary is relative)
    t = [x.clone().to(dev) for x in (qkv, kb, vb, r2t, rows, torch.tensor(lens), loc, pos, cache)]
    qkv_d, kb_d, vb_d, r2t_d, rows_d, lens_d, loc_d, pos_d, cache_d = t
    q_d, k_d, v_d = (qkv_d[:, a * D : b * D].view(B, -1, D) for a, b in ((0, H), (H, H + KH), (H + KH, H + 2 * KH)))
    new = NewTokens(k_d, v_d, loc_d, pos_d, cache_d)
    got = decode_attention(q_d, kb_d, vb_d, r2t_d, rows_d, lens_d, D**-0.5, num_kv_splits=splits, block_n=16,
                           window=window, one_launch=one_launch, new_tokens=new)
    assert torch.equal(qkv_d.cpu(), qkv)  # q, k, v not modified
    qr, kr, vr, kbr, vbr = (x.clone() for x in (q, k, v, kb, vb))
    rotary_store_kv_ref(qr, kr, vr, pos, cache, kbr, vbr, loc)
    want = decode_attention_ref(qr, kbr, vbr, r2t, rows, torch.tensor(lens), D**-0.5, window=window)
    tol = {torch.float32: 2e-5, torch.float16: 2e-3}[dtype]
    err = ((got.cpu().float() - want.float()).norm() / want.float().norm()).item()
    assert err < tol, err
    # the new slots hold the rotated k (rounded as the two kernels round it) and v; others untouched
    torch.testing.assert_close(kb_d.cpu().float(), kbr.float(), rtol=tol, atol=tol)
    assert torch.equal(vb_d.cpu(), vbr)
    other = torch.ones(kb.shape[0], dtype=torch.bool)
    other[loc] = False
    assert torch.equal(kb_d.cpu()[other], kb[other]) and torch.equal(vb_d.cpu()[other], vb[other])
    assert not torch.equal(kb_d.cpu()[loc], kb[loc])


@pytest.mark.parametrize("arch", ["llama", "qwen3"])  # qwen3: q/k RMSNorm before rotary
def test_model_decode_same_with_rotary_in_attention(tiny_models, arch, monkeypatch):
    """Tiny models through the Triton kernels: two requests prefilled, then decoded together, with
    rotary + KV store in their own kernel (default) and inside decode attention: same logits."""
    import radixlm.kernels as K
    from radixlm.runtime.attention import AttentionBackend
    from radixlm.runtime.batch import ReqSlice, ScheduleBatch
    from radixlm.runtime.forward_batch import ForwardMode
    from radixlm.runtime.model_runner import ModelRunner
    from radixlm.runtime.request import Req
    from radixlm.runtime.sampling_params import SamplingParams
    from radixlm.runtime.server_args import ServerArgs

    monkeypatch.setenv("RADIXLM_FORCE_TRITON_OPS", "1")
    if not K.use_triton(torch.zeros(1)):
        pytest.skip("Triton kernels cannot run on CPU tensors here")
    path = tiny_models[arch]
    prompts = [[5, 17, 3, 99, 42, 7, 64, 11, 23], [8, 1, 250, 33]]

    def run(in_attention: bool) -> list[torch.Tensor]:
        monkeypatch.setattr(AttentionBackend, "decode_rotary_in_attention", in_attention)
        runner = ModelRunner(ServerArgs(model_path=path, device="cpu", max_total_tokens=256), path, [])
        reqs = [Req(f"r{i}", list(p), SamplingParams()) for i, p in enumerate(prompts)]
        out = []
        for step in range(4):
            mode = ForwardMode.EXTEND if step == 0 else ForwardMode.DECODE
            slices, slots = [], []
            for r in reqs:
                if step == 0:
                    r.req_pool_idx = runner.req_to_token_pool.alloc()
                start, end = (0, len(r.origin_input_ids)) if step == 0 else (len(r.origin_input_ids) - 1,
                                                                               len(r.origin_input_ids))
                s = runner.allocator.alloc(end - start)
                runner.req_to_token_pool.write(r.req_pool_idx, start, s)
                slots.append(s)
                slices.append(ReqSlice(r, start, end, sample=True, logprob_from=end - 1, logprob_to=end))
            logits, _ = runner.forward_logits(ScheduleBatch(mode, slices, out_cache_loc=torch.cat(slots)))
            out.append(logits)
            for r, row in zip(reqs, logits[-len(reqs):] if len(logits) >= len(reqs) else logits):
                r.origin_input_ids = r.origin_input_ids + [int(row.argmax())]
        return out

    for a, b in zip(run(False), run(True)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
