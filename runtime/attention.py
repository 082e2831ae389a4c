"""Attention over the token-granular KV pool, through ``radixlm.kernels`` (Triton on CUDA, the
torch references on CPU).

Both modes first store the new tokens' K/V into their slots, then read every key of a request
through ``req_to_token``, so cached prefixes (radix-cache hits) and new tokens are treated alike.
"""

from __future__ import annotations

import torch

from radixlm import kernels as ops
from radixlm.runtime.forward_batch import ForwardBatch, ForwardMode


class AttentionBackend:
    """Decode: split-KV attention of one query per request; extend: ragged new tokens attending to
    their cached prefix and causally to themselves.

    Args:
        num_heads, num_kv_heads, head_dim: attention shape (GQA when ``num_heads > num_kv_heads``).
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: ForwardBatch
    ) -> torch.Tensor:
        """q ``[T, H, D]``, k/v ``[T, KH, D]`` -> attention output ``[T, H*D]``."""
        k_buf, v_buf = fb.kv_pool.k_buffer[layer_id], fb.kv_pool.v_buffer[layer_id]
        ops.store_kv(k_buf, v_buf, fb.out_cache_loc, k, v)
        if fb.mode == ForwardMode.DECODE:
            o = ops.decode_attention(
                q, k_buf, v_buf, fb.req_to_token, fb.req_pool_indices, fb.seq_lens, self.scale
            )
        else:
            o = ops.extend_attention(
                q, k_buf, v_buf, fb.req_to_token, fb.req_pool_indices, fb.prefix_lens, fb.extend_lens,
                fb.extend_start_loc, self.scale, max_extend_len=max(fb.extend_lens_cpu),
            )
        return o.reshape(q.shape[0], self.num_heads * self.head_dim)
