"""RMSNorm and fused residual-add + RMSNorm over the last dim, rounding like HF's LlamaRMSNorm.

HF computes ``weight * (x.float() * rsqrt(mean(x.float()**2) + eps)).to(dtype)``; the kernels do the
same roundings (normalize in fp32, round to the input dtype, multiply by the weight, round).
"""

from __future__ import annotations

import torch

from radixlm.kernels._triton import check_triton, next_pow2, tl, triton


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Torch reference (HF LlamaRMSNorm). ``x``: ``[T, H]``, ``weight``: ``[H]``; output in ``x.dtype``."""
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight * y).to(x.dtype)


def fused_add_rmsnorm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference: ``new_residual = x + residual`` (in ``x.dtype``), ``y = rmsnorm(new_residual)``."""
    new_residual = x + residual
    return rmsnorm_ref(new_residual, weight, eps), new_residual


@triton.jit
def _rmsnorm_kernel(
    x_ptr, r_ptr, w_ptr, y_ptr, new_r_ptr,
    stride_x, stride_r, stride_y, stride_nr,
    N, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(new_r_ptr + row * stride_nr + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / N + eps)
    y = (xf * rstd).to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + offs, (w * y).to(y_ptr.dtype.element_ty), mask=mask)


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    assert x.dim() == 2 and x.stride(1) == 1, (x.shape, x.stride())
    assert weight.shape == (x.shape[1],) and weight.stride(0) == 1, (weight.shape, x.shape)
    assert x.shape[1] <= 65536, "hidden size too large for one block"


def _launch(x, residual, weight, y, new_residual, eps) -> None:
    T, N = x.shape
    if T == 0:
        return
    block = next_pow2(N)
    has_res = residual is not None
    _rmsnorm_kernel[(T,)](
        x, residual if has_res else x, weight, y, new_residual if has_res else y,
        x.stride(0), residual.stride(0) if has_res else 0, y.stride(0),
        new_residual.stride(0) if has_res else 0,
        N, eps,
        HAS_RESIDUAL=has_res, BLOCK=block, num_warps=min(max(block // 512, 1), 16),
    )


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of each row of ``x`` ``[T, H]`` (last dim contiguous) with ``weight`` ``[H]`` (Triton)."""
    _check(x, weight)
    check_triton(x, weight)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    assert y.shape == x.shape and y.dtype == x.dtype and y.stride(1) == 1
    _launch(x, None, weight, y, None, eps)
    return y


def fused_add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``new_residual = x + residual``; ``y = rmsnorm(new_residual)``; returns ``(y, new_residual)``.

    ``x``, ``residual``: ``[T, H]`` of one dtype, last dim contiguous; ``weight``: ``[H]``. Both
    outputs are new tensors (inputs are not modified).
    """
    _check(x, weight)
    assert residual.shape == x.shape and residual.dtype == x.dtype and residual.stride(1) == 1
    check_triton(x, residual, weight)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    new_residual = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(x, residual, weight, y, new_residual, eps)
    return y, new_residual
