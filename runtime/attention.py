"""Attention over the token-granular KV pool, through ``radixlm.kernels`` (Triton on CUDA, the
torch references on CPU).

Both modes first store the new tokens' K/V into their slots, then read every key of a request
through ``req_to_token``, so cached prefixes (radix-cache hits) and new tokens are treated alike.
Sliding-window layers (Mistral, Qwen2/3 with ``use_sliding_window``) pass their window to the
kernels: a query at position ``p`` sees keys ``(p - W, p]``. All KV stays in the pool (the radix
cache may reuse it); the window only masks.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from radixlm import kernels as ops
from radixlm.kernels.decode_attention import decode_attention, decode_attention_ref
from radixlm.kernels.extend_attention import extend_attention, extend_attention_ref
from radixlm.runtime.forward_batch import ForwardBatch, ForwardMode

# NOTE: a windowed fresh prefill longer than this goes to the extend kernel (O(n * W)) instead of
# SDPA with an explicit [n, n] mask.
SDPA_WINDOW_MASK_MAX_LEN = 2048


class AttentionBackend:
    """Decode: split-KV attention of one query per request; extend: ragged new tokens attending to
    their cached prefix and causally to themselves.

    Args:
        num_heads, num_kv_heads, head_dim: attention shape (GQA when ``num_heads > num_kv_heads``).
        layer_windows: per layer, the sliding window in keys (0 = full attention); default none.
    """

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, layer_windows: Sequence[int] = ()
    ) -> None:
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        self.layer_windows = tuple(int(w) for w in layer_windows)

    def window(self, layer_id: int) -> int:
        return self.layer_windows[layer_id] if layer_id < len(self.layer_windows) else 0

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: ForwardBatch
    ) -> torch.Tensor:
        """q ``[T, H, D]``, k/v ``[T, KH, D]`` -> attention output ``[T, H*D]``."""
        k_buf, v_buf = fb.kv_pool.k_buffer[layer_id], fb.kv_pool.v_buffer[layer_id]
        ops.store_kv(k_buf, v_buf, fb.out_cache_loc, k, v)
        window = self.window(layer_id)
        triton = ops.use_triton(q)
        if fb.mode == ForwardMode.DECODE:
            fn = decode_attention if triton else decode_attention_ref
            o = fn(q, k_buf, v_buf, fb.req_to_token, fb.req_pool_indices, fb.seq_lens, self.scale, window=window)
        elif q.is_cuda and not any(fb.prefix_lens_cpu) and self._sdpa_ok(fb, window):
            o = self._prefill_no_prefix(q, k, v, fb, window)
        else:
            fn = extend_attention if triton else extend_attention_ref
            o = fn(
                q, k_buf, v_buf, fb.req_to_token, fb.req_pool_indices, fb.prefix_lens, fb.extend_lens,
                fb.extend_start_loc, self.scale, max_extend_len=max(fb.extend_lens_cpu), window=window,
            )
        return o.reshape(q.shape[0], self.num_heads * self.head_dim)

    @staticmethod
    def _sdpa_ok(fb: ForwardBatch, window: int) -> bool:
        return window <= 0 or max(fb.extend_lens_cpu) <= max(window, SDPA_WINDOW_MASK_MAX_LEN)

    def _prefill_no_prefix(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch, window: int = 0
    ) -> torch.Tensor:
        """No cached prefix anywhere in the batch: causal attention over each request's own new
        tokens with torch SDPA (FlashAttention on CUDA), which measures faster here than the
        extend kernel for long fresh prompts. A window shorter than the prompt becomes an explicit
        boolean mask ``i - W < j <= i``."""
        o = torch.empty_like(q)
        start = 0
        for n in fb.extend_lens_cpu:
            qs, ks, vs = (t[start : start + n].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
            mask = None
            if 0 < window < n:
                i = torch.arange(n, device=q.device)
                mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)
            o[start : start + n] = F.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=mask, is_causal=mask is None, scale=self.scale,
                enable_gqa=self.num_heads != self.num_kv_heads,
            )[0].transpose(0, 1)
            start += n
        return o
