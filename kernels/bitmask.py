"""Apply a grammar token bitmask to logits in place: disallowed tokens get ``-inf``.

Bitmask layout (xgrammar's): int32 ``[rows, ceil(V / 32)]``; token ``t`` is allowed when bit
``t % 32`` of word ``t // 32`` is 1. Row ``i`` of the bitmask applies to logits row ``indices[i]``
(or row ``i`` when ``indices`` is None). Tokens at or past ``32 * bitmask.shape[1]`` (a logits row
wider than the mask) are left unchanged.
"""

from __future__ import annotations

import torch

from radixlm.kernels._triton import check_triton, tl, triton


def _rows(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None) -> torch.Tensor:
    if indices is None:
        assert bitmask.shape[0] == logits.shape[0], (bitmask.shape, logits.shape)
        return torch.arange(logits.shape[0], device=logits.device)
    indices = torch.as_tensor(indices, device=logits.device).long()
    assert indices.dim() == 1 and indices.shape[0] <= bitmask.shape[0], (indices.shape, bitmask.shape)
    return indices


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool ``[rows, vocab_size]`` (True = allowed) of an int32 bitmask; tokens past the mask are True."""
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().flatten(-2)  # [rows, 32 * W]
    if bits.shape[-1] >= vocab_size:
        return bits[..., :vocab_size]
    pad = torch.ones((*bits.shape[:-1], vocab_size - bits.shape[-1]), dtype=torch.bool, device=bits.device)
    return torch.cat([bits, pad], dim=-1)


def apply_token_bitmask_ref(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None
) -> None:
    """Torch reference of :func:`apply_token_bitmask_triton` (in place)."""
    assert logits.dim() == 2 and bitmask.dim() == 2 and bitmask.dtype == torch.int32
    rows = _rows(logits, bitmask, indices)
    allowed = unpack_bitmask(bitmask[: rows.shape[0]].to(logits.device), logits.shape[1])
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))


@triton.jit
def _bitmask_kernel(
    logits_ptr, bitmask_ptr, indices_ptr,
    stride_l, stride_b, V,
    HAS_INDICES: tl.constexpr, BLOCK: tl.constexpr,
):
    i = tl.program_id(0)
    if HAS_INDICES:
        row = tl.load(indices_ptr + i).to(tl.int64)
    else:
        row = i.to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < V
    words = tl.load(bitmask_ptr + i.to(tl.int64) * stride_b + offs // 32, mask=mask, other=-1)
    allowed = ((words >> (offs % 32)) & 1) != 0
    # NOTE: read-modify-write of whole rows: full-line stores beat sparse masked stores.
    ptrs = logits_ptr + row * stride_l + offs
    x = tl.load(ptrs, mask=mask, other=0.0)
    tl.store(ptrs, tl.where(allowed, x, float("-inf")), mask=mask)


def apply_token_bitmask_triton(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    indices: torch.Tensor | None = None,
    block: int = 1024,
    num_warps: int = 4,
) -> None:
    """Set disallowed logits to ``-inf`` in place (Triton).

    Args:
        logits: float ``[B, V]``, last dim contiguous.
        bitmask: int32 ``[R, W]`` (``W = ceil(V / 32)`` normally), last dim contiguous, same device.
        indices: optional int ``[R']`` (``R' <= R``): bitmask row ``i`` applies to logits row
            ``indices[i]``; None means row ``i`` to row ``i`` (then ``R == B``).
        block, num_warps: tuning knobs (tokens per program).
    """
    assert logits.dim() == 2 and logits.stride(1) == 1 and logits.is_floating_point(), logits.shape
    assert bitmask.dim() == 2 and bitmask.dtype == torch.int32 and bitmask.stride(1) == 1, bitmask.dtype
    if indices is None:
        assert bitmask.shape[0] == logits.shape[0], (bitmask.shape, logits.shape)
        n_rows = logits.shape[0]
    else:
        indices = torch.as_tensor(indices, device=logits.device)
        assert indices.dim() == 1 and indices.shape[0] <= bitmask.shape[0], (indices.shape, bitmask.shape)
        assert indices.dtype in (torch.int32, torch.int64), indices.dtype
        n_rows = indices.shape[0]
    check_triton(logits, bitmask)
    V = min(logits.shape[1], 32 * bitmask.shape[1])
    if n_rows == 0 or V == 0:
        return
    _bitmask_kernel[(n_rows, triton.cdiv(V, block))](
        logits, bitmask, indices if indices is not None else bitmask,
        logits.stride(0), bitmask.stride(0), V,
        HAS_INDICES=indices is not None, BLOCK=block, num_warps=num_warps,
    )
