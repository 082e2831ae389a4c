"""What one model forward pass needs to know about its batch (built by the model runner)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch


class ForwardMode(Enum):
    EXTEND = "extend"  # prefill: new tokens of each request, attending to a cached prefix
    DECODE = "decode"  # one new token per request


@dataclass
class ForwardBatch:
    """Tensors of one forward pass over the token-granular KV pool.

    Shapes: ``T`` new tokens in total, ``B`` requests.
        input_ids, positions, out_cache_loc: int64 ``[T]`` (token ids, absolute positions, the KV
            slots the new tokens are written to).
        req_pool_indices: int64 ``[B]`` rows of ``req_to_token``.
        seq_lens: int64 ``[B]`` total tokens per request after this pass (prefix + new).
        prefix_lens, extend_lens, extend_start_loc: int64 ``[B]`` (EXTEND only; DECODE: None):
            cached tokens, new tokens, and where each request's new tokens start in ``[T]``.
        seq_lens_cpu, prefix_lens_cpu, extend_lens_cpu: the same as Python lists, for loops on host.
        kv_pool, req_to_token: the ``KVPool`` and the int32 ``[rows, max_context]`` table.
        attn_backend: object with ``forward(q, k, v, layer_id, forward_batch) -> o``.
        cascade: a ``radixlm.kernels.decode_attention.SharedPrefix`` (device tensors) over the
            decode rows (all of a DECODE batch, the last ``num_decode`` of a mixed one) when they
            read a shared cached prefix together (cascade attention), else None.
    """

    mode: ForwardMode
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: list[int]
    kv_pool: Any
    req_to_token: torch.Tensor
    attn_backend: Any = None
    prefix_lens: torch.Tensor | None = None
    extend_lens: torch.Tensor | None = None
    extend_start_loc: torch.Tensor | None = None
    prefix_lens_cpu: list[int] | None = None
    extend_lens_cpu: list[int] | None = None
    num_decode: int = 0  # EXTEND only: the last num_decode requests are one-token decodes (mixed)
    cascade: Any = None

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_cpu)
