"""SiLU-and-mul of the fused gate/up projection: ``silu(x[:, :I]) * x[:, I:]``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixlm.kernels._triton import check_triton, tl, triton


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """Torch reference, HF's ``act_fn(gate) * up`` in the input dtype. ``x``: ``[T, 2I]`` -> ``[T, I]``."""
    inter = x.shape[-1] // 2
    return F.silu(x[..., :inter]) * x[..., inter:]


@triton.jit
def _silu_and_mul_kernel(x_ptr, o_ptr, stride_x, stride_o, INTER, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < INTER
    gate = tl.load(x_ptr + t * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + t * stride_x + INTER + offs, mask=mask, other=0.0).to(tl.float32)
    y = gate * tl.sigmoid(gate) * up
    tl.store(o_ptr + t * stride_o + offs, y.to(o_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(
    x: torch.Tensor, out: torch.Tensor | None = None, block: int = 1024, num_warps: int = 4
) -> torch.Tensor:
    """``silu(x[:, :I]) * x[:, I:]`` (Triton, fp32 math, one rounding).

    Args:
        x: ``[T, 2I]``, last dim contiguous.
        out: optional ``[T, I]`` buffer of ``x.dtype``.
        block, num_warps: tuning knobs (elements of one row per program).
    """
    assert x.dim() == 2 and x.shape[1] % 2 == 0 and x.stride(1) == 1, (x.shape, x.stride())
    T, inter = x.shape[0], x.shape[1] // 2
    if out is None:
        out = torch.empty((T, inter), dtype=x.dtype, device=x.device)
    assert out.shape == (T, inter) and out.dtype == x.dtype and out.stride(1) == 1
    check_triton(x, out)
    if T == 0:
        return out
    _silu_and_mul_kernel[(T, triton.cdiv(inter, block))](
        x, out, x.stride(0), out.stride(0), inter, BLOCK=block, num_warps=num_warps
    )
    return out
