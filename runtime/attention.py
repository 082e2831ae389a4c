"""Attention over the KV pool: the torch path (reference for the Triton kernels in ``kernels/``).

Both modes first store the new tokens' K/V into their slots, then read every key of a request
through ``req_to_token`` so cached prefixes (radix-cache hits) and new tokens are treated alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixlm.runtime.forward_batch import ForwardBatch, ForwardMode


class TorchAttentionBackend:
    """Gathers each request's K/V from the pool and calls ``scaled_dot_product_attention``.

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
        """q ``[T, H*D]``, k/v ``[T, KH*D]`` -> attention output ``[T, H*D]``."""
        t = q.shape[0]
        q = q.view(t, self.num_heads, self.head_dim)
        fb.kv_pool.set_kv(
            layer_id,
            fb.out_cache_loc,
            k.view(t, self.num_kv_heads, self.head_dim),
            v.view(t, self.num_kv_heads, self.head_dim),
        )
        k_buf, v_buf = fb.kv_pool.k_buffer[layer_id], fb.kv_pool.v_buffer[layer_id]
        if fb.mode == ForwardMode.DECODE:
            o = self._decode(q, k_buf, v_buf, fb)
        else:
            o = self._extend(q, k_buf, v_buf, fb)
        return o.reshape(t, self.num_heads * self.head_dim)

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # q [B, H, Lq, D], k/v [B, KH, Lk, D], mask bool [B, 1, Lq, Lk] (True = attend)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=self.num_heads != self.num_kv_heads
        )

    def _decode(self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        max_len = max(fb.seq_lens_cpu)
        # NOTE: padded positions read slot 0 (the padding slot) and are masked out.
        slots = fb.req_to_token[fb.req_pool_indices, :max_len].long()
        ar = torch.arange(max_len, device=q.device)
        valid = ar[None, :] < fb.seq_lens[:, None]
        slots = torch.where(valid, slots, torch.zeros_like(slots))
        k = k_buf[slots].transpose(1, 2)  # [B, KH, L, D]
        v = v_buf[slots].transpose(1, 2)
        o = self._sdpa(q.unsqueeze(2), k, v, valid[:, None, None, :])
        return o.squeeze(2)

    def _extend(self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        assert fb.prefix_lens_cpu is not None and fb.extend_lens_cpu is not None
        out = torch.empty_like(q)
        start = 0
        for i, (prefix, ext) in enumerate(zip(fb.prefix_lens_cpu, fb.extend_lens_cpu)):
            total = prefix + ext
            slots = fb.req_to_token[fb.req_pool_indices[i], :total].long()
            k = k_buf[slots].transpose(0, 1).unsqueeze(0)  # [1, KH, L, D]
            v = v_buf[slots].transpose(0, 1).unsqueeze(0)
            qi = q[start : start + ext].transpose(0, 1).unsqueeze(0)  # [1, H, ext, D]
            q_pos = torch.arange(prefix, total, device=q.device)
            mask = torch.arange(total, device=q.device)[None, :] <= q_pos[:, None]
            out[start : start + ext] = self._sdpa(qi, k, v, mask[None, None]).squeeze(0).transpose(0, 1)
            start += ext
        return out
