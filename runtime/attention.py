"""Attention over the token-granular KV pool, through ``radixlm.kernels`` (Triton on CUDA, the
torch references on CPU).

Both modes first store the new tokens' K/V into their slots (applying rotary to q and k in the
same kernel when the caller passes the positions and the cos/sin table; in decode without a
cascade plan, the decode attention kernel does both itself), then read every key of a request
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
from radixlm.kernels.decode_attention import decode_attention, decode_attention_ref, default_num_kv_splits
from radixlm.kernels.extend_attention import extend_attention, extend_attention_ref
from radixlm.kernels.rotary_store_kv import NewTokens
from radixlm.runtime.forward_batch import ForwardBatch, ForwardMode

# NOTE: a windowed fresh prefill longer than this goes to the extend kernel (O(n * W)) instead of
# SDPA with an explicit [n, n] mask.
SDPA_WINDOW_MASK_MAX_LEN = 2048
# NOTE: fresh prompts shorter than this on average go to the extend kernel (one launch per layer
# for the whole batch) instead of SDPA (a launch per request and layer, ~60 us of host time each:
# a 2,048 x 256-token SmolLM2 run spent 2.5 s of scheduler time there, H200 profile); SDPA stays
# for long prompts, where its attention is faster than the extend kernel's.
SDPA_MIN_MEAN_LEN = 512


class AttentionBackend:
    """Decode: split-KV attention of one query per request; extend: ragged new tokens attending to
    their cached prefix and causally to themselves.

    Args:
        num_heads, num_kv_heads, head_dim: attention shape (GQA when ``num_heads > num_kv_heads``).
        layer_windows: per layer, the sliding window in keys (0 = full attention); default none.
    """

    # NOTE: kernel-count switches (issue 16), read at each call, so CUDA graphs keep the setting of
    # their capture: rotary + KV store in one kernel; decode attention merging its splits in its
    # own launch; decode attention doing rotary and the KV store itself (no cascade plan). Off:
    # separate launches; benchmarks/profile_decode_kernels.py --compare measures them.
    # H200, bs 1, graph replay (profile_decode_kernels.py --compare): fused rotary + store saves 2-3%
    # of a step (135M: 989 -> 955 us; 8B: 4,712 -> 4,657 us); merging in the stage-1 launch with
    # arrival counters is slower than the second launch it saves (968 vs 955 us; 4,701 vs 4,657 us).
    fuse_rotary_store: bool = True
    decode_one_launch: bool = False
    # NOTE: safe only for true decode steps (one row per request) and eager DECODE batches: the
    # plain decode CUDA graphs also replay small EXTEND batches one row per token ("flat decode",
    # ModelRunner._flat_decode_ok), where a row reads keys that other rows of the same launch
    # write, so CudaGraphRunner captures those with it off and true decode steps in graphs of their
    # own (runtime/cuda_graph.py). H200, bs 1 graph replay: 135M 955 -> 928 us, 8B 4,657 -> 4,518 us.
    decode_rotary_in_attention: bool = True

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
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: ForwardBatch,
        positions: torch.Tensor | None = None, cos_sin_cache: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q ``[T, H, D]``, k/v ``[T, KH, D]`` -> attention output ``[T, H*D]``.

        With ``positions`` (int ``[T]``) and ``cos_sin_cache`` (``[max_pos, D]``), q and k are
        still unrotated: rotary is applied here, fused with the KV store into one kernel on the
        Triton path (``ops.rotary_store_kv``; q and k rotated in place), or, in decode without a
        cascade plan, inside the decode attention kernel (q and k left unrotated). Without them
        q/k come rotated.
        """
        k_buf, v_buf = fb.kv_pool.k_buffer[layer_id], fb.kv_pool.v_buffer[layer_id]
        window = self.window(layer_id)
        if (fb.mode == ForwardMode.DECODE and cos_sin_cache is not None and self.decode_rotary_in_attention
                and (fb.cascade is None or window > 0)):
            new = NewTokens(k, v, fb.out_cache_loc, positions, cos_sin_cache)
            o = self._decode(q, k_buf, v_buf, fb.req_pool_indices, fb.seq_lens, fb, window, new)
            return o.reshape(q.shape[0], self.num_heads * self.head_dim)
        if cos_sin_cache is not None and self.fuse_rotary_store:
            ops.rotary_store_kv(q, k, v, positions, cos_sin_cache, k_buf, v_buf, fb.out_cache_loc)
        else:
            if cos_sin_cache is not None:
                ops.apply_rotary(q, k, positions, cos_sin_cache)
            ops.store_kv(k_buf, v_buf, fb.out_cache_loc, k, v)
        if fb.mode == ForwardMode.DECODE:
            o = self._decode(q, k_buf, v_buf, fb.req_pool_indices, fb.seq_lens, fb, window)
        elif fb.num_decode:  # mixed batch: the prefill part and the decode tail, each its kernel
            nt, nb = q.shape[0] - fb.num_decode, fb.batch_size - fb.num_decode
            o = torch.empty_like(q)
            o[:nt] = self._extend(q[:nt], k[:nt], v[:nt], k_buf, v_buf, fb, window, nb)
            o[nt:] = self._decode(q[nt:], k_buf, v_buf, fb.req_pool_indices[nb:], fb.seq_lens[nb:], fb, window)
        else:
            o = self._extend(q, k, v, k_buf, v_buf, fb, window, fb.batch_size)
        return o.reshape(q.shape[0], self.num_heads * self.head_dim)

    def _decode(self, q, k_buf, v_buf, req_pool_indices, seq_lens, fb: ForwardBatch, window: int,
                new_tokens: NewTokens | None = None) -> torch.Tensor:
        """One query per request (q ``[B, H, D]``) over its ``seq_lens`` keys; the cascade plan of
        the batch's decode rows applies to its full-attention layers (never with ``new_tokens``)."""
        fn = decode_attention if ops.use_triton(q) else decode_attention_ref
        shared = fb.cascade if window <= 0 else None
        if shared is None:
            return fn(q, k_buf, v_buf, fb.req_to_token, req_pool_indices, seq_lens, self.scale, window=window,
                      one_launch=self.decode_one_launch, new_tokens=new_tokens)
        # NOTE: shared-stage splits sized for the chunks a plan fills (~ rows / chunk), not for
        # the capacity of the buffer (rows / 2), so that a 2,048-token prefix is read in parallel
        chunks = -(-q.shape[0] // shared.chunk_rows.shape[1])
        splits = default_num_kv_splits(chunks, self.num_kv_heads, q.device) if q.is_cuda else 1
        return fn(q, k_buf, v_buf, fb.req_to_token, req_pool_indices, seq_lens, self.scale,
                  shared=shared, num_shared_splits=splits)

    def _extend(self, q, k, v, k_buf, v_buf, fb: ForwardBatch, window: int, nb: int) -> torch.Tensor:
        """The first ``nb`` requests' new tokens (q ``[T', H, D]``) over their prefix and themselves."""
        lens = fb.extend_lens_cpu[:nb]
        if q.is_cuda and self._sdpa_ok(lens, window) and not any(fb.prefix_lens_cpu[:nb]):
            return self._prefill_no_prefix(q, k, v, lens, window)
        fn = extend_attention if ops.use_triton(q) else extend_attention_ref
        return fn(
            q, k_buf, v_buf, fb.req_to_token, fb.req_pool_indices[:nb], fb.prefix_lens[:nb], fb.extend_lens[:nb],
            fb.extend_start_loc[:nb], self.scale, max_extend_len=max(lens), window=window,
        )

    @staticmethod
    def _sdpa_ok(extend_lens: list[int], window: int) -> bool:
        """Whether fresh prompts take SDPA: long ones on average (SDPA's one launch per request
        and layer costs more host time than many short prompts' attention costs the GPU), and a
        window, if any, within what an explicit mask handles."""
        if sum(extend_lens) < SDPA_MIN_MEAN_LEN * len(extend_lens):
            return False
        return window <= 0 or max(extend_lens) <= max(window, SDPA_WINDOW_MASK_MAX_LEN)

    def _prefill_no_prefix(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extend_lens: list[int], window: int = 0
    ) -> torch.Tensor:
        """No cached prefix anywhere in the batch: causal attention over each request's own new
        tokens with torch SDPA (FlashAttention on CUDA), which measures faster here than the
        extend kernel for long fresh prompts. A window shorter than the prompt becomes an explicit
        boolean mask ``i - W < j <= i``."""
        o = torch.empty_like(q)
        start = 0
        for n in extend_lens:
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
