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

from typing import NamedTuple

import torch

from radixlm.kernels._triton import check_triton, next_pow2, tl, to_kv, triton
from radixlm.kernels.rotary import _cos_sin, _rotate_heads, apply_rotary_ref
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


@triton.jit(do_not_specialize_on_alignment=["pos_ptr", "loc_ptr"])  # NOTE: row views, see extend_attention.py
def _rotary_store_kv_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, cache_ptr, loc_ptr, k_buf_ptr, v_buf_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_c,
    stride_kbs, stride_kbh, stride_vbs, stride_vbh,
    HQ, HK,
    HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(loc_ptr + t).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask_d = offs_d < HALF
    cos, sin = _cos_sin(cache_ptr, tl.load(pos_ptr + t).to(tl.int64), stride_c, HALF, BLOCK_HALF)
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
    tl.store(pb, to_kv(o1, k_buf_ptr), mask=mask)
    tl.store(pb + HALF, to_kv(o2, k_buf_ptr), mask=mask)

    pv = v_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :]
    pvb = v_buf_ptr + slot * stride_vbs + offs_h[:, None] * stride_vbh + offs_d[None, :]
    v1 = tl.load(pv, mask=mask, other=0.0)
    v2 = tl.load(pv + HALF, mask=mask, other=0.0)
    tl.store(pvb, to_kv(v1, v_buf_ptr), mask=mask)
    tl.store(pvb + HALF, to_kv(v2, v_buf_ptr), mask=mask)


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


class NewTokens(NamedTuple):
    """The current token of each decode row, not yet rotated, for decode attention to finish:
    it rotates the queries in registers and the keys, and stores keys and values into the pool
    (``k_buffer[loc[b]]``, ``v_buffer[loc[b]]``) before reading them (one launch for the three).

    Attributes:
        k, v: ``[B, KH, D]`` (last dim contiguous; views of a fused qkv are fine; not modified).
        loc: int ``[B]`` pool slots, ``loc[b] == req_to_token[row b, seq_lens[b] - 1]``.
        positions: int ``[B]``, ``seq_lens[b] - 1`` in decode.
        cos_sin_cache: ``[max_pos, D]`` rotary table (:func:`~radixlm.kernels.rotary.compute_cos_sin_cache`).
    """

    k: torch.Tensor
    v: torch.Tensor
    loc: torch.Tensor
    positions: torch.Tensor
    cos_sin_cache: torch.Tensor


@triton.jit
def _rope_rows(rows_ptr, offs_d, mask, cache_row_ptr, HALF: tl.constexpr):
    """Rotate rows ``rows_ptr[:, None] + offs_d`` (a ``[R, BLOCK_D]`` tile over the whole head,
    ``mask`` its valid part) by the table row ``cache_row_ptr``: fp32, as :func:`_rotate_heads`."""
    lo = offs_d < HALF
    partner = tl.where(lo, offs_d + HALF, offs_d - HALF)
    j = tl.where(lo, offs_d, offs_d - HALF)
    mask_d = offs_d < 2 * HALF
    cos = tl.load(cache_row_ptr + j, mask=mask_d, other=0.0).to(tl.float32)
    sin = tl.load(cache_row_ptr + HALF + j, mask=mask_d, other=0.0).to(tl.float32)
    x = tl.load(rows_ptr + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(rows_ptr + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    return tl.where(lo[None, :], x * cos[None, :] - xp * sin[None, :], x * cos[None, :] + xp * sin[None, :])


@triton.jit
def _rope_q_store_kv(
    q_rows_ptr, mask_q, offs_d, b, kvh, store, pos_ptr, cache_ptr, stride_c, loc_ptr,
    kn_ptr, vn_ptr, stride_knb, stride_knh, stride_vnb, stride_vnh,
    k_ptr, v_ptr, stride_ks, stride_kh, stride_vs, stride_vh, HEAD_DIM: tl.constexpr,
):
    """For decode attention's program of (row ``b``, kv head ``kvh``): the rotated query tile
    (``q.dtype``); with ``store``, also rotates the row's new key of head ``kvh`` and writes it and
    its value into slot ``loc[b]`` of the pool, then syncs the block (its tiles read that slot)."""
    row = cache_ptr + tl.load(pos_ptr + b).to(tl.int64) * stride_c
    q = _rope_rows(q_rows_ptr, offs_d, mask_q, row, HEAD_DIM // 2).to(q_rows_ptr.dtype.element_ty)
    if store:
        slot = tl.load(loc_ptr + b).to(tl.int64)
        one = tl.zeros([1, 1], dtype=tl.int64)
        mask = (offs_d < HEAD_DIM)[None, :]
        k = _rope_rows(kn_ptr + b * stride_knb + kvh * stride_knh + one, offs_d, mask, row, HEAD_DIM // 2)
        k = to_kv(k.to(kn_ptr.dtype.element_ty), k_ptr)  # rounded as rotary then store_kv
        tl.store(k_ptr + slot * stride_ks + kvh * stride_kh + one + offs_d[None, :], k, mask=mask)
        v = tl.load(vn_ptr + b * stride_vnb + kvh * stride_vnh + offs_d, mask=offs_d < HEAD_DIM)
        tl.store(v_ptr + slot * stride_vs + kvh * stride_vh + offs_d, to_kv(v, v_ptr),
                 mask=offs_d < HEAD_DIM)
        tl.debug_barrier()
    return q


def new_token_args(new: NewTokens | None, q: torch.Tensor, k_buffer: torch.Tensor) -> tuple[tuple, tuple]:
    """Checked launch arguments of :class:`NewTokens` for decode attention's stage 1: pointers
    ``(positions, cos_sin_cache, loc, k, v)`` and strides (placeholders, unread, when ``new`` is None).

    Raises:
        ValueError: ``new`` of the wrong shapes, dtypes, strides or device for ``q`` ``[B, H, D]``.
    """
    if new is None:
        return (q, q, q, q, q), (0, 0, 0, 0, 0)
    B, KH, D = q.shape[0], k_buffer.shape[1], q.shape[2]
    ok = (isinstance(new, NewTokens) and new.k.shape == (B, KH, D) and new.v.shape == (B, KH, D)
          and new.k.stride(2) == 1 and new.v.stride(2) == 1 and new.k.dtype == new.v.dtype
          and new.loc.shape == (B,) and new.positions.shape == (B,) and D % 2 == 0
          and new.loc.dtype in (torch.int32, torch.int64) and new.positions.dtype in (torch.int32, torch.int64)
          and new.cos_sin_cache.dim() == 2 and new.cos_sin_cache.shape[1] == D and new.cos_sin_cache.stride(1) == 1
          and all(t.device == q.device for t in new))
    if not ok:
        raise ValueError(f"new_tokens do not fit q {tuple(q.shape)} and a pool of {KH} kv heads: "
                         f"{[(tuple(t.shape), t.dtype, t.device) for t in new] if isinstance(new, NewTokens) else new}")
    ptrs = (new.positions, new.cos_sin_cache, new.loc, new.k, new.v)
    return ptrs, (new.cos_sin_cache.stride(0), new.k.stride(0), new.k.stride(1), new.v.stride(0), new.v.stride(1))
