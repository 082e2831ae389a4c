"""Rotary embedding of ``q``/``k`` and the KV store of the new tokens in one launch.

Equivalent to :func:`radixlm.kernels.rotary.apply_rotary` (HF neox / ``rotate_half`` layout, the
``[max_pos, D]`` cos/sin table of :func:`~radixlm.kernels.rotary.compute_cos_sin_cache`) followed
by :func:`radixlm.kernels.store_kv.store_kv` of the rotated ``k`` and of ``v``: one program per
token rotates its query heads in place, rotates its key heads (written back in place too, since
prefill attention may read ``k`` itself) and writes the rotated keys and the values into pool
slot ``loc[t]``. A decode layer thus launches one kernel where it launched two (issue 16: a bs-1
decode step of a small model is bound by its kernel count).

Rounding: each rotated element is computed in fp32, rounded once to ``k.dtype`` and then cast to
the buffer dtype, exactly as the two separate kernels do, so the results are bit-identical to them.
"""

from __future__ import annotations

import torch

from radixlm.kernels._triton import check_triton, next_pow2, tl, triton
from radixlm.kernels.rotary import _rotate_heads, apply_rotary_ref
from radixlm.kernels.store_kv import store_kv_ref


def rotary_store_kv_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    loc: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`rotary_store_kv`: ``apply_rotary_ref`` then ``store_kv_ref``."""
    apply_rotary_ref(q, k, positions, cos_sin_cache)
    store_kv_ref(k_buffer, v_buffer, loc, k, v)
    return q, k


@triton.jit
def _rotary_store_kv_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, cache_ptr, loc_ptr, k_buf_ptr, v_buf_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_c,
    stride_kbs, stride_kbh, stride_vbs, stride_vbh,
    HQ, HK,
    HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    slot = tl.load(loc_ptr + t).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask_d = offs_d < HALF
    cos = tl.load(cache_ptr + pos * stride_c + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * stride_c + HALF + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr, stride_qt, stride_qh, t, cos, sin, HQ, HALF, BLOCK_HQ, BLOCK_HALF)

    offs_h = tl.arange(0, BLOCK_HK)
    mask = (offs_h[:, None] < HK) & mask_d[None, :]
    pk = k_ptr + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :]
    k1 = tl.load(pk, mask=mask, other=0.0).to(tl.float32)
    k2 = tl.load(pk + HALF, mask=mask, other=0.0).to(tl.float32)
    o1 = (k1 * cos[None, :] - k2 * sin[None, :]).to(k_ptr.dtype.element_ty)
    o2 = (k2 * cos[None, :] + k1 * sin[None, :]).to(k_ptr.dtype.element_ty)
    tl.store(pk, o1, mask=mask)
    tl.store(pk + HALF, o2, mask=mask)
    pb = k_buf_ptr + slot * stride_kbs + offs_h[:, None] * stride_kbh + offs_d[None, :]
    tl.store(pb, o1.to(k_buf_ptr.dtype.element_ty), mask=mask)
    tl.store(pb + HALF, o2.to(k_buf_ptr.dtype.element_ty), mask=mask)

    pv = v_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :]
    pvb = v_buf_ptr + slot * stride_vbs + offs_h[:, None] * stride_vbh + offs_d[None, :]
    v1 = tl.load(pv, mask=mask, other=0.0)
    v2 = tl.load(pv + HALF, mask=mask, other=0.0)
    tl.store(pvb, v1.to(v_buf_ptr.dtype.element_ty), mask=mask)
    tl.store(pvb + HALF, v2.to(v_buf_ptr.dtype.element_ty), mask=mask)


def rotary_store_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    loc: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q``, ``k`` in place by ``positions`` and store the rotated ``k`` and ``v`` at ``loc``.

    Args:
        q: ``[T, Hq, D]``; k, v: ``[T, KH, D]``; last dim contiguous (strided views of a fused qkv
            are fine: ``q`` and ``k`` are written through).
        positions: int ``[T]``, each ``< cos_sin_cache.shape[0]``.
        cos_sin_cache: ``[max_pos, D]`` (any float dtype), ``cos | sin`` halves per row.
        k_buffer, v_buffer: ``[num_slots + 1, KH, D]`` (last dim contiguous) of any float dtype;
            values are cast to it.
        loc: int ``[T]`` pool slots; duplicate slots are undefined.

    Returns:
        ``(q, k)``, the same tensors, rotated (fp32 math, one rounding to their dtype).

    Raises:
        AssertionError: shapes, strides or dtypes outside the above; RuntimeError without Triton.
    """
    T, HQ, D = q.shape
    KH = k_buffer.shape[1] if k_buffer.dim() == 3 else -1
    assert k.shape == (T, KH, D) and v.shape == (T, KH, D), (q.shape, k.shape, v.shape, k_buffer.shape)
    assert k_buffer.shape == v_buffer.shape and k_buffer.shape[2] == D, (k_buffer.shape, v_buffer.shape)
    for x in (q, k, v, k_buffer, v_buffer):
        assert x.stride(2) == 1, f"last dim must be contiguous, got strides {x.stride()}"
    assert positions.shape == (T,) and positions.dtype in (torch.int32, torch.int64), positions.shape
    assert loc.shape == (T,) and loc.dtype in (torch.int32, torch.int64), (loc.shape, loc.dtype)
    assert cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] == D and cos_sin_cache.stride(1) == 1
    assert D % 2 == 0, D
    check_triton(q, k, v, positions, cos_sin_cache, k_buffer, v_buffer, loc)
    if T == 0:
        return q, k
    half = D // 2
    _rotary_store_kv_kernel[(T,)](
        q, k, v, positions, cos_sin_cache, loc, k_buffer, v_buffer,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos_sin_cache.stride(0),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        HQ, KH,
        HALF=half, BLOCK_HQ=next_pow2(HQ), BLOCK_HK=next_pow2(KH), BLOCK_HALF=next_pow2(half),
        num_warps=4,
    )
    return q, k
