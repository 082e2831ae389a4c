"""Attention over the token-granular KV pool, through ``radixlm.kernels`` (Triton on CUDA, the
torch references on CPU).

Both modes first store the new tokens' K/V into their slots, then read every key of a request
through ``req_to_token``, so cached prefixes (radix-cache hits) and new tokens are treated alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
        elif q.is_cuda and not any(fb.prefix_lens_cpu):
            o = self._prefill_no_prefix(q, k, v, fb)
        else:
            o = ops.extend_attention(
                q, k_buf, v_buf, fb.req_to_token, fb.req_pool_indices, fb.prefix_lens, fb.extend_lens,
                fb.extend_start_loc, self.scale, max_extend_len=max(fb.extend_lens_cpu),
            )
        return o.reshape(q.shape[0], self.num_heads * self.head_dim)

    def _prefill_no_prefix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """No cached prefix anywhere in the batch: causal attention over each request's own new
        tokens with torch SDPA (FlashAttention on CUDA), which measures faster here than the
        extend kernel for long fresh prompts."""
        o = torch.empty_like(q)
        start = 0
        for n in fb.extend_lens_cpu:
            qs, ks, vs = (t[start : start + n].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
            o[start : start + n] = F.scaled_dot_product_attention(
                qs, ks, vs, is_causal=True, scale=self.scale, enable_gqa=self.num_heads != self.num_kv_heads
            )[0].transpose(0, 1)
            start += n
        return o
