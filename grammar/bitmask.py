"""Token bitmasks: allocation and application to logits.

Layout (xgrammar's): int32 ``[batch, ceil(vocab_size / 32)]``; token ``t`` is allowed when bit
``t % 32`` of word ``t // 32`` is set.
"""

from __future__ import annotations

import numpy as np
import torch

_SHIFTS: dict[torch.device, torch.Tensor] = {}


def allocate_token_bitmask(batch_size: int, vocab_size: int) -> torch.Tensor:
    """A CPU int32 bitmask ``[batch_size, ceil(vocab_size / 32)]`` with every token allowed (-1).

    Args:
        batch_size: rows (one per constrained sequence).
        vocab_size: the model's logits width (may exceed the tokenizer's size).
    """
    if batch_size < 0 or vocab_size <= 0:
        raise ValueError(f"bad bitmask shape ({batch_size}, {vocab_size})")
    return torch.full((batch_size, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool ``[rows, vocab_size]`` (True = allowed); tokens past ``32 * W`` are allowed."""
    dev = bitmask.device
    if dev.type == "cpu":  # NOTE: numpy's unpackbits is ~10x faster than shifts on the CPU
        flat = np.ascontiguousarray(bitmask.numpy()).view(np.uint8)
        bits = torch.from_numpy(np.unpackbits(flat, axis=-1, bitorder="little").view(np.bool_))
        if bits.shape[-1] >= vocab_size:
            return bits[..., :vocab_size]
        pad = torch.ones((*bits.shape[:-1], vocab_size - bits.shape[-1]), dtype=torch.bool)
        return torch.cat([bits, pad], dim=-1)
    shifts = _SHIFTS.get(dev)
    if shifts is None:
        shifts = _SHIFTS[dev] = torch.arange(32, dtype=torch.int32, device=dev)
    bits = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().flatten(-2)
    if bits.shape[-1] >= vocab_size:
        return bits[..., :vocab_size]
    pad = torch.ones((*bits.shape[:-1], vocab_size - bits.shape[-1]), dtype=torch.bool, device=dev)
    return torch.cat([bits, pad], dim=-1)


def _apply_torch(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None) -> None:
    width = min(logits.shape[1], 32 * bitmask.shape[1])
    if indices is None:
        rows = bitmask.shape[0]
        allowed = unpack_bitmask(bitmask.to(logits.device), width)
        logits[:rows, :width].masked_fill_(~allowed, float("-inf"))
        return
    idx = torch.as_tensor(indices, device=logits.device).long()
    allowed = unpack_bitmask(bitmask[: idx.shape[0]].to(logits.device), width)
    sub = logits[idx, :width].masked_fill(~allowed, float("-inf"))
    logits[idx, :width] = sub


def apply_token_bitmask_inplace(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: list[int] | torch.Tensor | None = None
) -> None:
    """Set the logits of disallowed tokens to ``-inf``, in place.

    Args:
        logits: float ``[B, V]`` (any device).
        bitmask: int32 ``[R, ceil(V / 32)]`` (CPU or the logits' device). Tokens at or past
            ``32 * bitmask.shape[1]`` are left unchanged.
        indices: optional ``[R']`` logits rows: bitmask row ``i`` applies to logits row
            ``indices[i]`` (the convention of ``radixlm.kernels.bitmask``); None: row ``i`` to row
            ``i`` for every bitmask row.
    On CUDA the Triton kernel ``radixlm.kernels.bitmask.apply_token_bitmask_triton`` is used when
    it is importable; otherwise (and on CPU) a torch implementation.
    """
    if logits.dim() != 2 or bitmask.dim() != 2 or bitmask.dtype != torch.int32:
        raise ValueError(f"expected logits [B, V] and int32 bitmask [R, W], got {tuple(logits.shape)}, "
                         f"{tuple(bitmask.shape)} {bitmask.dtype}")
    if logits.is_cuda:
        kernel = _triton_kernel()
        if kernel is not None:
            if bitmask.device != logits.device:
                bitmask = bitmask.to(logits.device, non_blocking=True)
            if indices is not None and not isinstance(indices, torch.Tensor):
                indices = torch.tensor(indices, dtype=torch.int64, device=logits.device)
            kernel(logits, bitmask, indices)
            return
    _apply_torch(logits, bitmask, indices)


_KERNEL: list = []


def _triton_kernel():  # noqa: ANN202
    if not _KERNEL:
        try:
            from radixlm.kernels.bitmask import apply_token_bitmask_triton

            _KERNEL.append(apply_token_bitmask_triton)
        except Exception:  # noqa: BLE001 - no triton / no kernel module: torch path
            _KERNEL.append(None)
    return _KERNEL[0]
