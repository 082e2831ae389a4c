"""CUDA graphs for decode: the whole decode forward (all layers + lm_head) is captured once per
padded batch size and replayed, removing per-kernel launch overhead (as in vLLM and SGLang).

A batch of ``n`` requests replays the graph of the smallest captured size ``>= n``; padded rows
point at a reserved req_to_token row whose only slot is the padding slot 0, with length 1, so they
read and write only slot 0. Batches larger than ``cuda_graph_max_bs`` run eagerly.

With cascade attention (``runtime/cascade.py``) a second set of graphs, from
:data:`CASCADE_MIN_BS` rows up on a coarser grid, runs decode attention with a shared-prefix plan
read from a per-graph device buffer.

The plain graphs also replay small EXTEND batches one row per token ("flat decode"), where a row
reads keys that other rows of the same launch store, so they keep rotary + KV store as a launch
before attention. True decode steps (one row per request) up to :data:`FUSED_DECODE_MAX_BS` rows
replay a third set in which decode attention applies rotary and stores the new key and value
itself (``AttentionBackend.decode_rotary_in_attention``): one launch per layer fewer where launches
dominate a step.
"""

from __future__ import annotations

import bisect
import gc
import logging
from array import array

import torch

from radixlm.runtime.cascade import CascadePlan, cascade_shape, shared_views
from radixlm.runtime.forward_batch import ForwardBatch, ForwardMode

logger = logging.getLogger(__name__)


def capture_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to 256 and every 16 beyond, up to ``max_bs`` (inclusive when
    it is on that grid)."""
    sizes = [b for b in (1, 2, 4) if b <= max_bs] + list(range(8, min(max_bs, 256) + 1, 8))
    sizes += list(range(272, max_bs + 1, 16))
    return sorted(set(sizes))


# Smallest batch with cascade graphs: below it KV reads are a small part of a step.
CASCADE_MIN_BS = 32
# Largest batch with fused decode graphs (rotary + KV store inside attention): above it a step is
# no longer bound by kernel launches, and the graphs would double capture time for little.
FUSED_DECODE_MAX_BS = 64


def cascade_batch_sizes(sizes: list[int]) -> list[int]:
    """The sizes of ``sizes`` that get a cascade graph: multiples of 32 up to 256, of 64 beyond,
    and the largest (a coarser grid: padding rows cost little next to the KV reads saved)."""
    grid = [b for b in sizes if b >= CASCADE_MIN_BS and b % (32 if b <= 256 else 64) == 0]
    return sorted(set(grid + [sizes[-1]])) if sizes and sizes[-1] >= CASCADE_MIN_BS else []


class CudaGraphRunner:
    """Captures and replays decode graphs for a ``ModelRunner``.

    Args:
        runner: the ModelRunner (its model, pools and attention backend are used).
        max_bs: largest captured batch size.
        pad_row: a req_to_token row reserved for padding (kept all zeros).
    """

    def __init__(self, runner, max_bs: int, pad_row: int) -> None:
        self.runner = runner
        self.sizes = capture_batch_sizes(max_bs)
        self.max_bs = self.sizes[-1]
        self.pad_row = pad_row
        dev = runner.device
        n = self.max_bs
        # NOTE: the per-row inputs a step brings from the host live in one buffer, filled by one
        # host-to-device copy per replay (rows: input ids, positions, req_to_token rows, seq lens,
        # KV slots; the slots are copied on the device instead when the caller has no host copy).
        self.meta = torch.zeros((5, n), dtype=torch.int64, device=dev)
        self.input_ids, self.positions, self.req_pool_indices, self.seq_lens, self.out_cache_loc = self.meta.unbind(0)
        self.req_pool_indices.fill_(pad_row)
        self.seq_lens.fill_(1)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self._views: dict[tuple[str, int], tuple[int, torch.Tensor, torch.Tensor]] = {}  # (set, n) -> (bs, meta[:, :bs], out[:n])
        self.pool = None
        # Cascade graphs, per size: graph, logits, plan buffer, and the plan last copied into it.
        planner = runner.cascade
        self.cascade_sizes = cascade_batch_sizes(self.sizes) if planner is not None else []
        self.chunk = planner.chunk if planner is not None else 0
        self.cascade_bufs = {
            bs: torch.zeros(cascade_shape(bs, self.chunk)[1], dtype=torch.int64, device=dev) for bs in self.cascade_sizes
        }
        self.cascade_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.cascade_outputs: dict[int, torch.Tensor] = {}
        self._cascade_copied: dict[int, CascadePlan] = {}
        # Fused decode graphs (true decode steps only), when the backend fuses rotary into attention.
        fused = runner.attn_backend.decode_rotary_in_attention
        self.fused_sizes = [b for b in self.sizes if b <= FUSED_DECODE_MAX_BS] if fused else []
        self.fused_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.fused_outputs: dict[int, torch.Tensor] = {}
        self._capture_all()

    def _fb(self, bs: int, cascade: bool = False) -> ForwardBatch:
        r = self.runner
        return ForwardBatch(
            mode=ForwardMode.DECODE,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=[1] * bs,
            kv_pool=r.kv_pool,
            req_to_token=r.req_to_token_pool.req_to_token,
            attn_backend=r.attn_backend,
            cascade=shared_views(self.cascade_bufs[bs], bs, self.chunk) if cascade else None,
        )

    def _forward(self, bs: int, cascade: bool = False) -> torch.Tensor:
        fb = self._fb(bs, cascade)
        hidden = self.runner.model(fb.input_ids, fb.positions, fb)
        return self.runner.model.compute_logits(hidden)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        # NOTE: a garbage-collection pass during capture may destroy another engine's graphs,
        # whose cudaFree invalidates this capture; collect now and keep the collector off.
        gc.collect()
        gc.disable()
        try:
            self._capture_on(stream)
        finally:
            gc.enable()
        torch.cuda.current_stream().wait_stream(stream)
        logger.info("captured decode CUDA graphs for batch sizes %s (cascade: %s)", self.sizes, self.cascade_sizes)

    def _sets(self, kind: str) -> tuple[list[int], dict[int, torch.cuda.CUDAGraph], dict[int, torch.Tensor]]:
        """Sizes, graphs and logits buffers of a graph set: "plain", "cascade" or "fused"."""
        if kind == "cascade":
            return self.cascade_sizes, self.cascade_graphs, self.cascade_outputs
        if kind == "fused":
            return self.fused_sizes, self.fused_graphs, self.fused_outputs
        return self.sizes, self.graphs, self.outputs

    def _capture_on(self, stream: torch.cuda.Stream) -> None:
        todo = [(bs, kind) for kind in ("plain", "cascade", "fused") for bs in self._sets(kind)[0]]
        backend = self.runner.attn_backend
        own = vars(backend).get("decode_rotary_in_attention")  # NOTE: restored after the captures
        with torch.cuda.stream(stream):
            for bs, kind in sorted(todo, reverse=True):  # largest first so smaller graphs reuse its pool
                # NOTE: an instance attribute for the capture only: plain graphs (flat decode) keep
                # the store before attention, fused graphs do it inside; eager steps use the default.
                backend.decode_rotary_in_attention = kind == "fused"
                try:
                    for _ in range(2):  # warm-up: Triton JIT and autotuning happen outside capture
                        self._forward(bs, kind == "cascade")
                    graph = torch.cuda.CUDAGraph()
                    # NOTE: thread_local: CUDA calls of other threads (tokenizers, grammar workers,
                    # a previous engine being collected) must not invalidate this capture.
                    with torch.cuda.graph(graph, pool=self.pool, stream=stream, capture_error_mode="thread_local"):
                        out = self._forward(bs, kind == "cascade")
                finally:
                    if own is None:
                        del backend.decode_rotary_in_attention
                    else:
                        backend.decode_rotary_in_attention = own
                self.pool = graph.pool()
                _, graphs, outputs = self._sets(kind)
                outputs[bs] = out
                graphs[bs] = graph

    def release(self) -> None:
        """Drop the graphs and their memory pool now (not at some later garbage collection)."""
        self.graphs.clear()
        self.outputs.clear()
        self.cascade_graphs.clear()
        self.cascade_outputs.clear()
        self.fused_graphs.clear()
        self.fused_outputs.clear()
        self.cascade_bufs.clear()
        self._cascade_copied.clear()
        self._views.clear()
        self.pool = None
        self.runner = None

    def can_run(self, batch_size: int) -> bool:
        return batch_size <= self.max_bs

    def cascade_chunks(self, n: int) -> int:
        """Most chunks of a cascade plan for ``n`` rows (0: no cascade graph runs ``n`` rows)."""
        if n < CASCADE_MIN_BS or not self.cascade_sizes or n > self.cascade_sizes[-1]:
            return 0
        return cascade_shape(self.cascade_sizes[bisect.bisect_left(self.cascade_sizes, n)], self.chunk)[0]

    def replay(self, ids: list[int], positions: list[int], rows: list[int], out_cache_loc: torch.Tensor | None,
               input_ids: torch.Tensor | None = None, slots: list[int] | None = None,
               cascade: CascadePlan | None = None, decode: bool = False) -> torch.Tensor:
        """Run ``n = len(positions)`` decode rows through the graph of the next captured size.

        Row ``i`` is token ``ids[i]`` at position ``positions[i]`` of the request whose
        ``req_to_token`` row is ``rows[i]`` (it attends to positions ``0..positions[i]``), written
        to KV slot ``out_cache_loc[i]`` (int64 ``[n]`` on the device), or ``slots[i]`` when the
        caller has the slots on the host (then ``out_cache_loc`` is ignored and may be None).
        ``input_ids`` (int64 ``[n]`` on the device) replaces ``ids`` (overlap scheduling; pass
        ``ids=[]`` then). The host fields travel in one pinned, non-blocking copy; padding rows
        read the zero row and write slot 0. ``cascade`` (at most :meth:`cascade_chunks` chunks)
        replays the cascade graph with that plan (copied only when it changed). ``decode``: the
        rows are a true decode step (one row per request, no row reads another's new key), so a
        fused decode graph may run them.
        Returns fp32 logits ``[n, V]``, a view of the graph's output buffer (valid until the next
        replay)."""
        n = len(positions)
        if cascade is not None:
            kind = "cascade"
        else:
            kind = "fused" if decode and self.fused_sizes and n <= self.fused_sizes[-1] else "plain"
        key = (kind, n)
        views = self._views.get(key)
        if views is None:  # NOTE: the views of the persistent buffers are made once per row count
            sizes, _, outputs = self._sets(kind)
            bs = sizes[bisect.bisect_left(sizes, n)]
            views = self._views[key] = (bs, self.meta[:, :bs], outputs[bs][:n])
        bs, meta, out = views
        pad = [0] * (bs - n)
        # NOTE: array + frombuffer builds the [5, bs] host rows ~3x faster than torch.tensor(lists)
        host = array("q", ids if input_ids is None else [0] * n)
        host.extend(pad)
        host.extend(positions)
        host.extend(pad)
        host.extend(rows)
        host.extend([self.pad_row] * (bs - n))
        host.extend([p + 1 for p in positions])
        host.extend([1] * (bs - n))
        host.extend(slots if slots is not None else [0] * n)
        host.extend(pad)
        meta.copy_(torch.frombuffer(host, dtype=torch.int64).view(5, bs).pin_memory(), non_blocking=True)
        if input_ids is not None:
            self.input_ids[:n].copy_(input_ids)
        if slots is None:
            self.out_cache_loc[:n].copy_(out_cache_loc)
        if cascade is not None:
            if self._cascade_copied.get(bs) is not cascade:
                flat = array("q", cascade.flat(bs, self.chunk))
                self.cascade_bufs[bs].copy_(torch.frombuffer(flat, dtype=torch.int64).pin_memory(), non_blocking=True)
                self._cascade_copied[bs] = cascade
            self.cascade_graphs[bs].replay()
        else:
            (self.fused_graphs if kind == "fused" else self.graphs)[bs].replay()
        return out
