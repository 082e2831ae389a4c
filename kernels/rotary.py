"""Rotary position embedding in HF's (GPT-NeoX, ``rotate_half``) convention, with llama3 scaling.

``cos_sin_cache[pos] = [cos(pos * inv_freq) | sin(pos * inv_freq)]``, each half ``D / 2`` wide. For
``x = [x1 | x2]`` (halves of a head) the rotation is ``[x1 cos - x2 sin | x2 cos + x1 sin]``, i.e.
HF's ``x * cos + rotate_half(x) * sin`` with ``cos``/``sin`` repeated over both halves.
"""

from __future__ import annotations

import math

import torch

from radixlm.kernels._triton import check_triton, next_pow2, tl, triton


def rope_inv_freq(head_dim: int, base: float, rope_scaling: dict | None = None) -> torch.Tensor:
    """Inverse frequencies ``[head_dim // 2]`` (fp32), as HF's ``ROPE_INIT_FUNCTIONS`` compute them.

    ``rope_scaling``: None / ``{"rope_type": "default"}``, ``{"rope_type": "linear", "factor"}`` or
    ``{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"}`` (the older key ``"type"`` is accepted too).

    Raises:
        NotImplementedError: for other rope types (dynamic, yarn, ...).
    """
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = "default"
    if rope_scaling:
        rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / rope_scaling["factor"]
    if rope_type == "llama3":
        # Same operations as transformers' _compute_llama3_parameters.
        factor = rope_scaling["factor"]
        low_freq_factor = rope_scaling["low_freq_factor"]
        high_freq_factor = rope_scaling["high_freq_factor"]
        old_context_len = rope_scaling["original_max_position_embeddings"]
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
        is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)
    raise NotImplementedError(f"rope_type {rope_type!r} is not supported")


def compute_cos_sin_cache(
    head_dim: int,
    max_pos: int,
    base: float,
    rope_scaling: dict | None,
    dtype: torch.dtype,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """``[max_pos, head_dim]`` table: ``cos`` in the first half of each row, ``sin`` in the second.

    Angles are computed in fp32 exactly as HF does (``pos * inv_freq`` in fp32), then cast to
    ``dtype`` (HF casts cos/sin to the activation dtype; an fp32 table is slightly more accurate).
    """
    assert head_dim % 2 == 0, head_dim
    inv_freq = rope_inv_freq(head_dim, base, rope_scaling)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.int64).float(), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(device=device, dtype=dtype)


def _rotate_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def apply_rotary_ref(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`apply_rotary` (fp32 math, in place, returns ``(q, k)``)."""
    half = q.shape[-1] // 2
    cs = cos_sin_cache[positions.long()].float()  # [T, D]
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    q.copy_(_rotate_ref(q, cos, sin))
    k.copy_(_rotate_ref(k, cos, sin))
    return q, k


@triton.jit
def _rotate_heads(x_ptr, stride_t, stride_h, t, cos, sin, NUM_HEADS, HALF: tl.constexpr,
                  BLOCK_HEADS: tl.constexpr, BLOCK_HALF: tl.constexpr):
    offs_h = tl.arange(0, BLOCK_HEADS)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask = (offs_h[:, None] < NUM_HEADS) & (offs_d[None, :] < HALF)
    p1 = x_ptr + t * stride_t + offs_h[:, None] * stride_h + offs_d[None, :]
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p1 + HALF, mask=mask, other=0.0).to(tl.float32)
    o1 = x1 * cos[None, :] - x2 * sin[None, :]
    o2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(p1, o1.to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(p1 + HALF, o2.to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _cos_sin(cache_ptr, pos, stride_c, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """fp32 ``cos`` and ``sin`` halves ``[BLOCK_HALF]`` of table row ``pos`` (zeros past ``HALF``)."""
    offs_d = tl.arange(0, BLOCK_HALF)
    mask_d = offs_d < HALF
    row = cache_ptr + pos * stride_c
    cos = tl.load(row + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    sin = tl.load(row + HALF + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    return cos, sin


@triton.jit(do_not_specialize_on_alignment=["pos_ptr"])  # NOTE: row views, see extend_attention.py
def _rotary_kernel(
    q_ptr, k_ptr, pos_ptr, cache_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_c,
    HQ, HK,
    HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    cos, sin = _cos_sin(cache_ptr, tl.load(pos_ptr + t).to(tl.int64), stride_c, HALF, BLOCK_HALF)
    _rotate_heads(q_ptr, stride_qt, stride_qh, t, cos, sin, HQ, HALF, BLOCK_HQ, BLOCK_HALF)
    _rotate_heads(k_ptr, stride_kt, stride_kh, t, cos, sin, HK, HALF, BLOCK_HK, BLOCK_HALF)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q`` ``[T, Hq, D]`` and ``k`` ``[T, Hk, D]`` in place by ``positions`` (Triton).

    Args:
        q, k: last dim contiguous; may be strided views of a fused qkv (written through).
        positions: int ``[T]`` positions, each ``< cos_sin_cache.shape[0]``.
        cos_sin_cache: ``[max_pos, D]`` from :func:`compute_cos_sin_cache` (any float dtype).

    Returns:
        ``(q, k)``, the same tensors, rotated (math in fp32, one rounding).
    """
    T, HQ, D = q.shape
    assert k.dim() == 3 and k.shape[0] == T and k.shape[2] == D, (q.shape, k.shape)
    assert q.stride(2) == 1 and k.stride(2) == 1, (q.stride(), k.stride())
    assert positions.shape == (T,) and positions.dtype in (torch.int32, torch.int64), positions.shape
    assert cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] == D and cos_sin_cache.stride(1) == 1
    assert D % 2 == 0
    check_triton(q, k, positions, cos_sin_cache)
    if T == 0:
        return q, k
    HK = k.shape[1]
    half = D // 2
    _rotary_kernel[(T,)](
        q, k, positions, cos_sin_cache,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
        HQ, HK,
        HALF=half, BLOCK_HQ=next_pow2(HQ), BLOCK_HK=next_pow2(HK), BLOCK_HALF=next_pow2(half),
        num_warps=4,
    )
    return q, k
