"""Piecewise CUDA graphs for EXTEND batches (prefill and mixed prefill + decode steps).

An EXTEND batch of thousands of tokens runs a few milliseconds of kernels, but eagerly it pays
the host cost of every launch: on the H200 (SmolLM2-135M dims, 8,192 prefill tokens + ~480 decode
rows) ~7 ms of kernels took 37-52 ms of host work (121 GEMMs at ~50 us of host each, ~300 Triton
launches, ~300 small tensor ops; ``benchmarks/results/serving_h200.md``, sessions 11 and 12).

Attention cannot be captured once per token count: its grid and its per-request arrays follow
the batch's requests. So, as SGLang's piecewise CUDA graph runner and vLLM's piecewise
``torch.compile`` graphs do, the forward is cut at attention: piece ``i`` holds everything from
layer ``i - 1``'s attention output to layer ``i``'s attention input (O projection, residual add
+ norm, MLP, the next norm, the QKV projection, rotary and the KV store), captured once per
bucket of token counts; attention runs eagerly between the pieces over the real tokens only.
Piece 0 starts at the embedding, piece ``L`` ends at the final norm.

The pieces communicate through static buffers sized for the largest bucket (token metadata,
the fused QKV, the attention output, the residual stream, the final hidden states), so every
bucket's graphs share them and one memory pool holds only the pieces' temporaries. A batch of
``n`` tokens replays the graphs of the smallest bucket ``>= n``; its padding rows read token 0
at position 0 and write their K/V to the reserved padding slot 0 (as the decode graphs' padding
rows do), never a real slot; attention neither reads nor writes them, and every captured op is
row-wise, so padding leaves real rows as they would be at that row count (cuBLAS may pick another
kernel for another M, as for any batch of that many tokens).
"""

from __future__ import annotations

import bisect
import gc
import logging
import time

import torch

from radixlm import kernels as ops
from radixlm.kernels.decode_attention import decode_attention, decode_attention_ref
from radixlm.kernels.extend_attention import extend_attention, extend_attention_ref
from radixlm.runtime.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)

# Smallest bucket: below it extend batches are short prefills, which mostly replay the decode
# graphs one row per token (ModelRunner._flat_decode_ok) or cost little eagerly.
PIECEWISE_MIN_TOKENS = 64


# When the graphs pay: an eager EXTEND step costs about this much host time per decoder layer
# whatever its size (H200, SmolLM2-135M dims: 37-52 ms for 30 layers), while a replay pads the
# batch to its bucket. A step whose GEMMs alone take longer than the eager host work is GPU-bound
# eagerly too (the launches overlap the kernels), and there padding only adds time (H200,
# Llama-3.1-8B dims, ~1,560-token mixed steps: eager 45 ms, padded to 1,792 tokens 50 ms).
EAGER_HOST_S_PER_LAYER = 1.2e-3
# Sustained bf16 FLOP/s of prefill GEMMs (H200, 8B dims: 2 * 7.0e9 * 1,563 tokens in ~45 ms).
PREFILL_GEMM_FLOPS = 5.0e14


def host_bound_tokens(layer_params: int) -> int:
    """Largest EXTEND batch (tokens) whose GEMMs (``2 * layer_params`` FLOPs per token and decoder
    layer, at :data:`PREFILL_GEMM_FLOPS`) take less time than the eager host work
    (:data:`EAGER_HOST_S_PER_LAYER` per layer): the largest bucket worth capturing. About 1,400
    tokens at Llama-3.1-8B dims (218M parameters per layer), ~85,000 at SmolLM2-135M dims."""
    return int(EAGER_HOST_S_PER_LAYER * PREFILL_GEMM_FLOPS / (2.0 * max(layer_params, 1)))


def piecewise_token_sizes(max_tokens: int, min_tokens: int = PIECEWISE_MIN_TOKENS) -> list[int]:
    """Buckets of token counts: powers of two from ``min_tokens`` to 256, then four per octave
    (256, 320, 384, 448, 512, 640, ...: at most 25% padding), and ``max_tokens`` itself last.
    Empty when ``max_tokens < min_tokens``."""
    if max_tokens < min_tokens:
        return []
    sizes, n = [], min_tokens
    while n < 256 and n < max_tokens:
        sizes.append(n)
        n *= 2
    n = max(n, 256)
    while n < max_tokens:
        sizes.append(n)
        n += 1 << (n.bit_length() - 3)  # a quarter of the octave's start
    return sorted(set(sizes + [max_tokens]))


def _linear_into(linear, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, linear.weight, linear.bias)`` written into ``out`` (``[M, N]``, contiguous):
    the same cuBLAS call as ``F.linear`` on a 2-D input (``mm``, or ``addmm`` with a bias)."""
    w, b = linear.weight, linear.bias
    if b is None:
        return torch.mm(x, w.t(), out=out)
    return torch.addmm(b, x, w.t(), out=out)


class PiecewiseGraphRunner:
    """Captures and replays piecewise graphs of a ``ModelRunner``'s model (tensor parallel size 1,
    a :class:`~radixlm.runtime.models.layers.CausalLM`).

    Args:
        runner: the ModelRunner (model, KV pool, attention backend, device, dtype).
        max_tokens: the largest EXTEND batch (new tokens, decode rows included) replayed; larger
            ones run eagerly.
        min_tokens: the smallest bucket (default :data:`PIECEWISE_MIN_TOKENS`); smaller batches
            replay it padded.
        capture: ``False`` runs the same pieces eagerly, padding included, with no graphs (tests
            of the decomposition on the CPU).

    Raises:
        ValueError: ``max_tokens < min_tokens`` (no bucket).
        RuntimeError: a capture failed (the caller serves eagerly then).
    """

    def __init__(self, runner, max_tokens: int, min_tokens: int = PIECEWISE_MIN_TOKENS, capture: bool = True) -> None:
        self.runner = runner
        self.model = runner.model.model  # DecoderModel: embed_tokens, layers, norm
        self.layers = list(self.model.layers)
        self.sizes = piecewise_token_sizes(max_tokens, min_tokens)
        if not self.sizes:
            raise ValueError(f"no token bucket: max_tokens {max_tokens} < min_tokens {min_tokens}")
        attn = self.layers[0].self_attn
        self.q_size, self.kv_size = attn.q_size, attn.kv_size
        self.head_dim, self.num_heads = attn.cfg.head_dim, attn.num_heads
        hidden = attn.cfg.hidden_size
        n, dev, dt = self.sizes[-1], runner.device, runner.dtype
        # NOTE: static buffers shared by every bucket (a bucket uses the first rows): the host
        # fields (input ids, positions, KV slots), the fused QKV (attention's input), the attention
        # output, the residual stream and the final hidden states. Zeros: padding rows read
        # token 0 at position 0 and write slot 0.
        self.meta = torch.zeros((3, n), dtype=torch.int64, device=dev)
        self.qkv = torch.zeros((n, self.q_size + 2 * self.kv_size), dtype=dt, device=dev)
        self.attn_out = torch.zeros((n, self.q_size), dtype=dt, device=dev)
        self.residual = torch.zeros((n, hidden), dtype=dt, device=dev)
        self.hidden = torch.zeros((n, hidden), dtype=dt, device=dev)
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.pool = None
        self.capture_s = 0.0
        self.captured = capture
        if capture:
            self._capture_all()

    @property
    def max_tokens(self) -> int:
        return self.sizes[-1]

    def can_run(self, num_tokens: int) -> bool:
        """Whether an EXTEND batch of ``num_tokens`` new tokens replays the pieces."""
        return 0 < num_tokens <= self.sizes[-1]

    # ------------------------------------------------------------------ pieces
    def _piece(self, i: int, n: int) -> None:
        """Piece ``i`` of ``L + 1`` over the first ``n`` rows of the static buffers."""
        layers = self.layers
        ids, pos, loc = self.meta[0, :n], self.meta[1, :n], self.meta[2, :n]
        if i == 0:
            x = self.model.embed_tokens(ids)
            residual = x
            x = layers[0].input_layernorm(x)
        else:
            prev = layers[i - 1]
            x = prev.self_attn.o_proj(self.attn_out[:n])
            x, residual = prev.post_attention_layernorm(x, self.residual[:n])
            x = prev.mlp(x)
            if i == len(layers):
                x, _ = self.model.norm(x, residual)
                self.hidden[:n].copy_(x)
                return
            x, residual = layers[i].input_layernorm(x, residual)
        self.residual[:n].copy_(residual)
        attn = layers[i].self_attn
        q, k, v = attn.split_qkv(_linear_into(attn.qkv_proj, x, self.qkv[:n]), in_place=True)
        backend = self.runner.attn_backend
        kv = self.runner.kv_pool
        k_buf, v_buf = kv.k_buffer[attn.layer_id], kv.v_buffer[attn.layer_id]
        cos_sin = attn.rotary.cos_sin_cache
        # NOTE: the backend's switch is read at capture: the graphs keep the setting they saw
        if backend.fuse_rotary_store:
            ops.rotary_store_kv(q, k, v, pos, cos_sin, k_buf, v_buf, loc)
        else:
            ops.apply_rotary(q, k, pos, cos_sin)
            ops.store_kv(k_buf, v_buf, loc, k, v)

    def _attention(self, layer_id: int, fb: ForwardBatch, n: int) -> None:
        """Layer ``layer_id``'s attention over the ``n`` real rows, eagerly (its K/V are stored):
        the prefill rows through the extend kernel (or SDPA, as the backend chooses for long
        fresh prompts), the decode rows of a mixed batch through decode attention, written into
        the static attention output."""
        backend = fb.attn_backend
        d, heads, kv = self.head_dim, self.num_heads, self.kv_size
        qkv = self.qkv[:n]
        q = qkv[:, : self.q_size].view(n, heads, d)
        out = self.attn_out[:n].view(n, heads, d)
        k_buf, v_buf = fb.kv_pool.k_buffer[layer_id], fb.kv_pool.v_buffer[layer_id]
        window = backend.window(layer_id)
        nd = fb.num_decode
        nt, nb = n - nd, fb.batch_size - nd
        if nt:
            lens = fb.extend_lens_cpu[:nb]
            if q.is_cuda and backend._sdpa_ok(lens, window) and not any(fb.prefix_lens_cpu[:nb]):
                k = qkv[:nt, self.q_size: self.q_size + kv].view(nt, -1, d)
                v = qkv[:nt, self.q_size + kv:].view(nt, -1, d)
                out[:nt].copy_(backend._prefill_no_prefix(q[:nt], k, v, lens, window))
            else:
                extend = extend_attention if ops.use_triton(q) else extend_attention_ref
                extend(q[:nt], k_buf, v_buf, fb.req_to_token, fb.req_pool_indices[:nb], fb.prefix_lens[:nb],
                       fb.extend_lens[:nb], fb.extend_start_loc[:nb], backend.scale,
                       max_extend_len=max(lens), out=out[:nt], window=window)
        if nd:
            rows, lens = fb.req_pool_indices[nb:], fb.seq_lens[nb:]
            if fb.cascade is None or window > 0:
                decode = decode_attention if ops.use_triton(q) else decode_attention_ref
                decode(q[nt:], k_buf, v_buf, fb.req_to_token, rows, lens, backend.scale, window=window,
                       one_launch=backend.decode_one_launch, out=out[nt:])
            else:  # NOTE: the backend's cascade path (shared-prefix plan of the decode rows)
                out[nt:].copy_(backend._decode(q[nt:], k_buf, v_buf, rows, lens, fb, window))

    # ------------------------------------------------------------------ capture / replay
    @torch.inference_mode()
    def _capture_all(self) -> None:
        t0 = time.perf_counter()
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        self.pool = torch.cuda.graph_pool_handle()
        # NOTE: no garbage collection during capture (see CudaGraphRunner._capture_all)
        gc.collect()
        gc.disable()
        try:
            with torch.cuda.stream(stream):
                for n in reversed(self.sizes):  # largest first: smaller buckets reuse its pool blocks
                    for i in range(len(self.layers) + 1):  # warm-up: cuBLAS and Triton first uses
                        self._piece(i, n)
                    graphs = []
                    for i in range(len(self.layers) + 1):
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph, pool=self.pool, stream=stream, capture_error_mode="thread_local"):
                            self._piece(i, n)
                        graphs.append(graph)
                    self.graphs[n] = graphs
        finally:
            gc.enable()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self.capture_s = time.perf_counter() - t0
        logger.info("captured piecewise CUDA graphs for %d token buckets up to %d in %.1f s",
                    len(self.sizes), self.sizes[-1], self.capture_s)

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """The model's final hidden states ``[T, hidden]`` (a view of the static buffer, valid
        until the next call) for the EXTEND batch ``fb`` of ``T = len(fb.positions)`` tokens,
        ``can_run(T)``; its input ids, positions and slots are copied into the static buffers
        and the padding rows' reset to 0."""
        n = fb.positions.shape[0]
        bs = self.sizes[bisect.bisect_left(self.sizes, n)]
        self.meta[0, :n].copy_(fb.input_ids)
        self.meta[1, :n].copy_(fb.positions)
        self.meta[2, :n].copy_(fb.out_cache_loc)
        if bs > n:  # NOTE: a larger batch may have left real slots there: padding writes slot 0
            self.meta[:, n:bs].zero_()
        run = [g.replay for g in self.graphs[bs]] if self.captured else [
            lambda i=i: self._piece(i, bs) for i in range(len(self.layers) + 1)]
        run[0]()
        for i, layer in enumerate(self.layers):
            self._attention(layer.self_attn.layer_id, fb, n)
            run[i + 1]()
        return self.hidden[:n]

    def release(self) -> None:
        """Drop the graphs and their memory pool now."""
        self.graphs.clear()
        self.pool = None
        self.runner = None
