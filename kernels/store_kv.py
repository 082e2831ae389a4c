"""Store the K/V of new tokens into their pool slots: ``k_buffer[loc[i]] = k[i]`` (and V).

One launch writes both K and V (torch needs two ``index_put_``); one program per token copies its
``KH * D`` contiguous elements of K and of V.
"""

from __future__ import annotations

import torch

from radixlm.kernels._triton import check_triton, next_pow2, tl, to_kv, triton


def store_kv_ref(
    k_buffer: torch.Tensor, v_buffer: torch.Tensor, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Torch reference: ``k_buffer[loc] = k; v_buffer[loc] = v`` (cast to the buffer dtype; torch's
    cast to float8_e4m3fn saturates at +-448)."""
    k_buffer[loc] = k.to(k_buffer.dtype)
    v_buffer[loc] = v.to(v_buffer.dtype)


@triton.jit(do_not_specialize_on_alignment=["loc_ptr"])  # NOTE: row views, see extend_attention.py
def _store_kv_kernel(
    k_buf_ptr, v_buf_ptr, loc_ptr, k_ptr, v_ptr,
    stride_kbs, stride_vbs, stride_k, stride_v,
    NUMEL: tl.constexpr, BLOCK: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    slot = tl.load(loc_ptr + i).to(tl.int64)
    for start in range(0, NUMEL, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < NUMEL
        k = tl.load(k_ptr + i * stride_k + offs, mask=mask)
        tl.store(k_buf_ptr + slot * stride_kbs + offs, to_kv(k, k_buf_ptr), mask=mask)
        v = tl.load(v_ptr + i * stride_v + offs, mask=mask)
        tl.store(v_buf_ptr + slot * stride_vbs + offs, to_kv(v, v_buf_ptr), mask=mask)


def _rows_contiguous(x: torch.Tensor) -> bool:
    """``[N, KH, D]`` whose each row ``x[i]`` is one contiguous run of ``KH * D`` elements."""
    return x.stride(2) == 1 and (x.shape[1] == 1 or x.stride(1) == x.shape[2])


def store_kv(
    k_buffer: torch.Tensor, v_buffer: torch.Tensor, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Write ``k``, ``v`` (``[N, KH, D]``) into pool slots ``loc`` (int ``[N]``) in place (Triton).

    ``k_buffer``/``v_buffer`` are ``[num_slots + 1, KH, D]`` with contiguous rows; ``k``/``v`` may be
    strided views along dim 0 (e.g. slices of a fused qkv) but each token's ``[KH, D]`` must be
    contiguous. Values are cast to the buffer dtype (an fp8 e4m3 pool saturates at +-448, see
    :func:`radixlm.kernels._triton.to_kv`). Duplicate slots in ``loc`` are undefined.
    """
    N = loc.shape[0]
    assert loc.dim() == 1 and loc.dtype in (torch.int32, torch.int64), (loc.shape, loc.dtype)
    assert k_buffer.dim() == 3 and k_buffer.shape == v_buffer.shape, (k_buffer.shape, v_buffer.shape)
    KH, D = k_buffer.shape[1:]
    assert k.shape == (N, KH, D) and v.shape == (N, KH, D), (k.shape, v.shape, (N, KH, D))
    for t in (k_buffer, v_buffer, k, v):
        assert _rows_contiguous(t), f"rows must be contiguous, got strides {t.stride()}"
    check_triton(k_buffer, v_buffer, loc, k, v)
    if N == 0:
        return
    numel = KH * D
    block = min(next_pow2(numel), 4096)
    _store_kv_kernel[(N,)](
        k_buffer, v_buffer, loc, k, v,
        k_buffer.stride(0), v_buffer.stride(0), k.stride(0), v.stride(0),
        NUMEL=numel, BLOCK=block, num_warps=4,
    )
