"""Small ops: KV store, RMSNorm (+ fused residual add), rotary (+ cos/sin cache vs HF transformers),
SiLU-and-mul and the grammar bitmask. Triton kernels run under TRITON_INTERPRET=1 on CPU (or compiled
on CUDA when a GPU is present) against the torch references; references against independent
formulas (and HF transformers where installed).
"""

from __future__ import annotations

import math
import os

import torch

if not torch.cuda.is_available():
    # NOTE: before anything imports triton (see radixlm/kernels/_triton.py).
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from radixlm.kernels.activation import silu_and_mul, silu_and_mul_ref  # noqa: E402
from radixlm.kernels.bitmask import apply_token_bitmask_ref, apply_token_bitmask_triton  # noqa: E402
from radixlm.kernels.rmsnorm import fused_add_rmsnorm, fused_add_rmsnorm_ref, rmsnorm, rmsnorm_ref  # noqa: E402
from radixlm.kernels.rotary import (  # noqa: E402
    apply_rotary,
    apply_rotary_ref,
    compute_cos_sin_cache,
    rope_inv_freq,
)
from radixlm.kernels.store_kv import store_kv, store_kv_ref  # noqa: E402

LLAMA31 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]



def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    """Equal up to one rounding of ``dtype`` (both sides compute in fp32 and round once)."""
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    return torch.allclose(a.float().cpu(), b.float().cpu(), rtol=tol, atol=tol)


# ---------------------------------------------------------------- store_kv


@pytest.mark.parametrize("buf_dtype,src_dtype", [(torch.float32, torch.float32), (torch.float16, torch.float32)])
def test_store_kv(dev, buf_dtype, src_dtype):
    gen = torch.Generator().manual_seed(0)
    N, KH, D, slots = 7, 2, 24, 40
    loc = (torch.randperm(slots, generator=gen)[:N] + 1).to(dev)
    # k, v as strided views of a fused qkv row, as the model produces them
    qkv = torch.randn(N, (4 + 2 * KH) * D, generator=gen).to(dev, src_dtype)
    k = qkv[:, 4 * D : (4 + KH) * D].view(N, KH, D)
    v = qkv[:, (4 + KH) * D :].view(N, KH, D)
    bufs = [torch.randn(slots + 1, KH, D, generator=gen).to(dev, buf_dtype) for _ in range(2)]
    want = [b.clone() for b in bufs]
    store_kv(bufs[0], bufs[1], loc, k, v)
    store_kv_ref(want[0], want[1], loc, k, v)
    assert torch.equal(bufs[0], want[0]) and torch.equal(bufs[1], want[1])
    assert torch.equal(want[0][loc.cpu()].cpu(), k.to(buf_dtype).cpu())


# ---------------------------------------------------------------- rmsnorm


def hf_rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm.forward, verbatim."""
    input_dtype = x.dtype
    hidden_states = x.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    return w * hidden_states.to(input_dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 96])
def test_rmsnorm(dev, dtype, hidden):
    gen = torch.Generator().manual_seed(hidden)
    x = (torch.randn(5, hidden, generator=gen) * 3).to(dev, dtype)
    r = torch.randn(5, hidden, generator=gen).to(dev, dtype)
    w = torch.randn(hidden, generator=gen).to(dev, dtype)
    eps = 1e-5
    assert torch.equal(rmsnorm_ref(x, w, eps), hf_rmsnorm(x, w, eps))
    assert close(rmsnorm(x, w, eps), rmsnorm_ref(x, w, eps), dtype)
    y, new_r = fused_add_rmsnorm(x, r, w, eps)
    y_ref, new_r_ref = fused_add_rmsnorm_ref(x, r, w, eps)
    assert torch.equal(new_r_ref, x + r)
    assert close(new_r, x + r, dtype)  # NOTE: the interpreter rounds fp32->bf16 toward zero
    assert close(y, y_ref, dtype) and torch.equal(y_ref, hf_rmsnorm(x + r, w, eps))


def test_rmsnorm_strided_rows(dev):
    base = torch.randn(4, 80).to(dev)
    x = base[:, :48]
    w = torch.rand(48).to(dev)
    assert close(rmsnorm(x, w, 1e-6), rmsnorm_ref(x, w, 1e-6), torch.float32)


# ---------------------------------------------------------------- rotary


def llama3_inv_freq_scalar(head_dim, base, s):
    """Llama 3.1's published frequency rule, one frequency at a time in float64."""
    out = []
    low_wl = s["original_max_position_embeddings"] / s["low_freq_factor"]
    high_wl = s["original_max_position_embeddings"] / s["high_freq_factor"]
    for i in range(0, head_dim, 2):
        f = 1.0 / base ** (i / head_dim)
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(f)
        elif wl > low_wl:
            out.append(f / s["factor"])
        else:
            smooth = (s["original_max_position_embeddings"] / wl - s["low_freq_factor"]) / (
                s["high_freq_factor"] - s["low_freq_factor"]
            )
            out.append((1 - smooth) * f / s["factor"] + smooth * f)
    return torch.tensor(out, dtype=torch.float64)


def test_rope_inv_freq_formulas():
    d, base = 128, 500000.0
    default = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    assert torch.allclose(rope_inv_freq(d, base).double(), default, rtol=1e-6)
    assert torch.allclose(rope_inv_freq(d, base, {"type": "linear", "factor": 4.0}).double(), default / 4, rtol=1e-6)
    got = rope_inv_freq(d, base, LLAMA31).double()
    assert torch.allclose(got, llama3_inv_freq_scalar(d, base, LLAMA31), rtol=1e-5)
    with pytest.raises(NotImplementedError):
        rope_inv_freq(d, base, {"rope_type": "yarn", "factor": 2.0})


@pytest.mark.parametrize("scaling", [None, {"rope_type": "linear", "factor": 2.0}, LLAMA31])
def test_cos_sin_cache_matches_transformers(scaling):
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    d, base, max_pos = 64, 500000.0, 300
    cfg = LlamaConfig(
        hidden_size=2 * d, num_attention_heads=2, head_dim=d, rope_theta=base,
        max_position_embeddings=131072, rope_scaling=scaling,
    )
    cos, sin = LlamaRotaryEmbedding(config=cfg)(torch.zeros(1, 1, d), torch.arange(max_pos)[None])
    cache = compute_cos_sin_cache(d, max_pos, base, scaling, torch.float32)
    assert cache.shape == (max_pos, d)
    assert torch.allclose(cache[:, : d // 2], cos[0, :, : d // 2], atol=1e-6)
    assert torch.allclose(cache[:, d // 2 :], sin[0, :, : d // 2], atol=1e-6)
    assert torch.equal(cos[0, :, : d // 2], cos[0, :, d // 2 :])


def hf_apply_rotary(q, k, cos_sin_cache, positions):
    """transformers' apply_rotary_pos_emb (rotate_half form) on [T, H, D], in fp32."""
    half = q.shape[-1] // 2
    cs = cos_sin_cache[positions].float()
    cos = torch.cat([cs[:, :half], cs[:, :half]], -1)[:, None]
    sin = torch.cat([cs[:, half:], cs[:, half:]], -1)[:, None]

    def rotate_half(x):
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    return q.float() * cos + rotate_half(q.float()) * sin, k.float() * cos + rotate_half(k.float()) * sin


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hk", [(4, 4), (8, 2), (6, 1)])
def test_apply_rotary(dev, dtype, hq, hk):
    gen = torch.Generator().manual_seed(hq * 10 + hk)
    T, D = 6, 32
    cache = compute_cos_sin_cache(D, 4096, 10000.0, LLAMA31, torch.float32, device=dev)
    positions = torch.tensor([0, 1, 5, 4095, 77, 1000]).to(dev)
    qkv = torch.randn(T, (hq + 2 * hk) * D, generator=gen).to(dev, dtype)
    q = qkv[:, : hq * D].view(T, hq, D)
    k = qkv[:, hq * D : (hq + hk) * D].view(T, hk, D)
    q_hf, k_hf = hf_apply_rotary(q, k, cache, positions)
    q_ref, k_ref = apply_rotary_ref(q.clone(), k.clone(), positions, cache)
    assert close(q_ref, q_hf, dtype) and close(k_ref, k_hf, dtype)
    q_out, k_out = apply_rotary(q, k, positions, cache)  # in place, through the qkv view
    assert q_out.data_ptr() == q.data_ptr() and k_out.data_ptr() == k.data_ptr()
    assert close(q, q_ref, dtype) and close(k, k_ref, dtype)


# ---------------------------------------------------------------- silu_and_mul


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(dev, dtype):
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(5, 2 * 1100, generator=gen) * 4).to(dev, dtype)  # I = 1100 spans two blocks
    want = silu_and_mul_ref(x)
    assert torch.equal(want, F.silu(x[:, :1100]) * x[:, 1100:])
    assert close(silu_and_mul(x), want, dtype)


# ---------------------------------------------------------------- bitmask


def bitmask_loop(logits, bitmask, indices):
    """Per-token loop, the spec read literally."""
    out = logits.clone()
    rows = range(logits.shape[0]) if indices is None else indices.tolist()
    for i, row in enumerate(rows):
        for t in range(logits.shape[1]):
            if t // 32 < bitmask.shape[1] and not (int(bitmask[i, t // 32]) >> (t % 32)) & 1:
                out[row, t] = float("-inf")
    return out


@pytest.mark.parametrize(
    "batch,vocab,words,indices",
    [(3, 100, 4, None), (4, 64, 2, [2, 0]), (2, 5000, 157, None), (3, 70, 2, [1])],
)
def test_apply_token_bitmask(dev, batch, vocab, words, indices):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(batch, vocab, generator=gen)
    rows = batch if indices is None else len(indices)
    bitmask = torch.randint(-(2**31), 2**31, (rows, words), generator=gen, dtype=torch.int64).to(torch.int32)
    idx = None if indices is None else torch.tensor(indices)
    want = bitmask_loop(logits, bitmask, idx) if vocab <= 100 else None
    ref = logits.clone()
    apply_token_bitmask_ref(ref, bitmask, idx)
    if want is not None:
        assert torch.equal(ref, want)
    got = logits.to(dev)
    apply_token_bitmask_triton(got, bitmask.to(dev), None if idx is None else idx.to(dev))
    assert torch.equal(got.cpu(), ref)
