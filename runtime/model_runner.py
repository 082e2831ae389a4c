"""The model runner: owns the model, the KV pool and the req_to_token table; turns a
``ScheduleBatch`` into one forward pass, and logits into sampled tokens and logprobs.
It makes no policy decisions (DESIGN.md §6.2)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from radixlm.kernels import SKINNY_GEMM_DEFAULT, set_skinny_gemm
from radixlm.runtime.attention import AttentionBackend
from radixlm.runtime.batch import ScheduleBatch, StepOutput
from radixlm.runtime.cascade import CascadePlan, CascadePlanner, cascade_shape, shared_views
from radixlm.runtime.distributed import all_reduce_min, local_device
from radixlm.runtime.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.memory import KVPool, ReqToTokenPool, TokenToKVPoolAllocator, to_device
from radixlm.runtime.model_config import ModelConfig
from radixlm.runtime.model_loader import load_model, resolve_dtype, resolve_kv_dtype
from radixlm.runtime.sampler import apply_penalties, block_tokens_before_min, sample
from radixlm.runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)

CPU_DEFAULT_MAX_TOTAL_TOKENS = 16384
# max_running_requests derived from the KV pool: one request per this many KV tokens, clamped.
TOKENS_PER_RUNNING_REQUEST = 256
MAX_RUNNING_REQUESTS_RANGE = (16, 1024)
CUDA_GRAPH_DEFAULT_MAX_BS = 512
# Extend slices up to this many tokens may run as decode rows through the decode CUDA graphs.
FLAT_DECODE_MAX_SLICE = 16
# An EXTEND batch past cuda_graph_max_extend_tokens still replays the decode graphs, one row per
# new token, while those rows read at most this many KV bytes in all (row p reads positions 0..p,
# which the extend kernel reads once per query tile), since an eager step pays ~0.5-1 ms of host
# launches per layer whatever its size. H200, batch 1 (benchmarks/bench_prefill_graph.py), eager
# vs graphs: 8B dims, 512 fresh tokens (16.8 GB of reads) 16.5 vs 17.5 ms; 8B, 128 tokens after a
# 256-token prefix (5.2 GB) 15.4 vs 7.8 ms; 135M, 512 after 256 (6 GB) 14.0 vs 3.8 ms.
FLAT_DECODE_KV_BYTES = 8 << 30
# Piecewise CUDA graphs of EXTEND batches cover chunks up to this many prefill tokens (plus the
# decode rows): the static buffers and the pool of the pieces' temporaries grow with it.
PIECEWISE_MAX_CHUNK = 8192

# Hook the grammar layer installs: (next-token logits [S, V] fp32, batch, indices of the S
# sampling slices in batch.slices) -> None; masks the logits in place.
LogitsMaskFn = Callable[[torch.Tensor, ScheduleBatch, list[int]], None]


@dataclass
class DecodeHandle:
    """A launched decode step: sampled ids on the device and in (pinned) host memory, and the
    CUDA event that marks the host copy done (``None`` on CPU)."""

    next_ids: torch.Tensor
    host_ids: torch.Tensor
    event: object = None

    @classmethod
    def start(cls, next_ids: torch.Tensor) -> "DecodeHandle":
        """Start the (non-blocking on CUDA) copy of ``next_ids`` to pinned host memory."""
        cuda = next_ids.is_cuda
        host = torch.empty(next_ids.shape, dtype=next_ids.dtype, pin_memory=cuda)
        host.copy_(next_ids, non_blocking=cuda)
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record()
        return cls(next_ids, host, event)


class ModelRunner:
    """Loads ``model_path`` per ``args`` and runs forward passes over the KV pool.

    Attributes: ``model``, ``cfg`` (ModelConfig), ``device``, ``dtype``, ``kv_dtype`` (the KV pool's), ``kv_pool`` (KVPool),
    ``req_to_token_pool`` (ReqToTokenPool), ``allocator`` (TokenToKVPoolAllocator),
    ``max_total_tokens`` (KV pool size in tokens), ``max_running_requests`` (the concurrency cap:
    the server arg, or derived from the KV pool), ``context_len``.
    """

    def __init__(self, args: ServerArgs, model_path: str, eos_token_ids: list[int]) -> None:
        self.args = args
        self.device = torch.device(local_device(args.resolved_device()))  # cuda:<local rank> under TP
        self.cfg = ModelConfig.from_pretrained(model_path)
        self.dtype = resolve_dtype(args.dtype, self.cfg, self.device)
        self.kv_dtype = resolve_kv_dtype(args.kv_cache_dtype, self.dtype)
        self.model = load_model(model_path, self.cfg, self.dtype, self.device, args.load_format, args.random_seed)
        self.context_len = args.context_length or self.cfg.max_position_embeddings
        self.eos_token_ids = eos_token_ids
        self.max_total_tokens = self._kv_pool_size()
        c = self.cfg
        self.kv_pool = KVPool(
            self.max_total_tokens, c.num_hidden_layers, self.model.tp.num_kv_heads, c.head_dim, self.kv_dtype, self.device
        )
        self.allocator = TokenToKVPoolAllocator(self.max_total_tokens, self.device)
        lo, hi = MAX_RUNNING_REQUESTS_RANGE
        derived = min(hi, max(lo, self.max_total_tokens // TOKENS_PER_RUNNING_REQUEST))
        if self.device.type == "cuda" and not args.disable_cuda_graph:
            # NOTE: decode batches past the largest captured graph run eagerly, host-bound: on the
            # H200, SmolLM2 dims, 2,048 requests at once, 1,024 running took 16.6 s (ITL p50 22 ms)
            # and 512 running 12.1 s (ITL p50 5.3 ms).
            derived = min(derived, args.cuda_graph_max_bs or CUDA_GRAPH_DEFAULT_MAX_BS)
        self.max_running_requests = args.max_running_requests or derived
        rows = self.max_running_requests + 8  # NOTE: headroom for requests being admitted/finished
        self.req_to_token_pool = ReqToTokenPool(rows + 1, self.context_len + 8, self.device)
        pad_row = self.req_to_token_pool.alloc()  # NOTE: reserved all-zero row for padded graph rows
        self.kv_bytes_per_token = KVPool.bytes_per_token(c.num_hidden_layers, self.model.tp.num_kv_heads, c.head_dim,
                                                         self.kv_dtype)
        self.attn_backend = AttentionBackend(
            self.model.tp.num_heads, self.model.tp.num_kv_heads, c.head_dim, c.layer_windows
        )
        self.generator = torch.Generator(device=self.device).manual_seed(args.random_seed)
        self.logits_mask_fn: LogitsMaskFn | None = None
        # NOTE: with RADIXLM_SKINNY_GEMM=1, speculation still keeps one-row decodes on cuBLAS like
        # its verify rows (M > 1), or greedy outputs would change with speculation on. The flag is
        # process-wide (one engine per process in a server), baked into the CUDA graphs below.
        set_skinny_gemm(SKINNY_GEMM_DEFAULT and not args.speculative_algorithm)
        self.cascade = None
        if args.enable_cascade_attention:
            self.cascade = CascadePlanner(self.kv_bytes_per_token // c.num_hidden_layers)
        self.cuda_graph = None
        if self.device.type == "cuda" and not args.disable_cuda_graph:
            from radixlm.runtime.cuda_graph import CudaGraphRunner

            try:
                max_bs = min(args.cuda_graph_max_bs or CUDA_GRAPH_DEFAULT_MAX_BS, self.max_running_requests)
                self.cuda_graph = CudaGraphRunner(self, max_bs, pad_row)
            except RuntimeError as e:  # NOTE: serve eagerly rather than not at all
                logger.error("CUDA graph capture failed, decoding eagerly: %s", e)
                torch.cuda.synchronize()
        self.piecewise = None
        if self.cuda_graph is not None and args.enable_piecewise_cuda_graph and self.model.tp.tp_size == 1:
            from radixlm.runtime.piecewise_graph import PIECEWISE_MIN_TOKENS, PiecewiseGraphRunner, host_bound_tokens

            # NOTE: the largest EXTEND batch: a prefill or mixed chunk beside every running decode
            # (chunks past PIECEWISE_MAX_CHUNK run eagerly: their GPU time dwarfs their launches),
            # and no larger than a host-bound step (past it, padding only adds GPU time)
            chunk = min(max(args.chunked_prefill_size, args.mixed_chunk_size or 0, 2048), PIECEWISE_MAX_CHUNK)
            layers = self.model.model.layers
            bound = host_bound_tokens(sum(p.numel() for p in layers.parameters()) // len(layers))
            most = min(chunk + self.max_running_requests, bound)
            try:
                if most >= PIECEWISE_MIN_TOKENS:
                    self.piecewise = PiecewiseGraphRunner(self, most)
            except RuntimeError as e:
                logger.error("piecewise CUDA graph capture failed, extend batches run eagerly: %s", e)
                torch.cuda.synchronize()

    def release(self) -> None:
        """Free CUDA graphs eagerly (they hold a private memory pool and a reference cycle)."""
        if self.cuda_graph is not None:
            self.cuda_graph.release()
            self.cuda_graph = None
        if self.piecewise is not None:
            self.piecewise.release()
            self.piecewise = None

    def _kv_pool_size(self) -> int:
        c = self.cfg
        per_token = KVPool.bytes_per_token(c.num_hidden_layers, self.model.tp.num_kv_heads, c.head_dim, self.kv_dtype)
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            used_by_others = total - free
            budget = total * self.args.mem_fraction_static - used_by_others
            size = int(budget // per_token)
            if self.args.max_total_tokens:
                size = min(size, self.args.max_total_tokens)
            if size < 16:
                raise RuntimeError(
                    f"not enough GPU memory for the KV cache (budget {budget / 2**30:.2f} GiB); "
                    "raise mem_fraction_static"
                )
        else:
            size = self.args.max_total_tokens or CPU_DEFAULT_MAX_TOTAL_TOKENS
        size = all_reduce_min(size)  # NOTE: every TP rank must hold the same pool (same schedules)
        logger.info("KV pool: %d tokens (%.1f MiB)", size, size * per_token / 2**20)
        return size

    # ---------------------------------------------------------------- forward
    def _forward_batch(self, batch: ScheduleBatch, input_ids: torch.Tensor | None = None) -> ForwardBatch:
        ids, pos = [], []
        for s in batch.slices:
            ids.extend(s.token_ids() if input_ids is None else [0] * s.length)
            pos.extend(range(s.start, s.end))
        seq_lens = [s.end for s in batch.slices]
        per_req = [[s.req.req_pool_idx for s in batch.slices], seq_lens]
        extend = batch.mode == ForwardMode.EXTEND
        if extend:
            prefix = [s.start for s in batch.slices]
            lens = [s.length for s in batch.slices]
            starts = [0]
            for n in lens[:-1]:
                starts.append(starts[-1] + n)
            per_req += [prefix, lens, starts]
        # NOTE: two host-to-device copies per step (per-token and per-request fields).
        tok = to_device([ids, pos], self.device)
        req = to_device(per_req, self.device)
        fb = ForwardBatch(
            mode=batch.mode,
            input_ids=tok[0] if input_ids is None else input_ids,
            positions=tok[1],
            out_cache_loc=batch.out_cache_loc,
            req_pool_indices=req[0],
            seq_lens=req[1],
            seq_lens_cpu=seq_lens,
            kv_pool=self.kv_pool,
            req_to_token=self.req_to_token_pool.req_to_token,
            attn_backend=self.attn_backend,
        )
        n = len(seq_lens) if batch.mode == ForwardMode.DECODE else batch.num_decode  # decode rows, last
        if n >= 2 and self.cascade is not None:
            nc = cascade_shape(n, self.cascade.chunk)[0]
            plan = self._cascade_plan(batch.slices[-n:], per_req[0][-n:], seq_lens[-n:], nc)
            if plan is not None:
                buf = to_device(plan.flat(n, self.cascade.chunk), self.device)
                fb.cascade = shared_views(buf, n, self.cascade.chunk)
        if extend:
            fb.prefix_lens_cpu, fb.extend_lens_cpu = prefix, lens
            fb.prefix_lens, fb.extend_lens, fb.extend_start_loc = req[2], req[3], req[4]
            fb.num_decode = batch.num_decode
        return fb

    @torch.inference_mode()
    def forward_logits(
        self, batch: ScheduleBatch, input_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[tuple[int, list[int]]]]:
        """Forward ``batch`` (slots already allocated and written to req_to_token).

        ``input_ids`` (int64 ``[T]`` on the device) replaces the token ids read from the requests
        (overlap scheduling feeds the previous step's sampled ids without a host round trip).
        Returns fp32 logits ``[N, vocab]`` for the positions each slice needs, and per slice
        ``(first row in logits, absolute positions)``.
        """
        if self.cuda_graph is not None:
            if batch.mode == ForwardMode.DECODE and self.cuda_graph.can_run(len(batch.slices)):
                return self._replay_decode(batch, input_ids)
            if self._flat_decode_ok(batch):
                return self._forward_flat_decode(batch, input_ids)
        fb = self._forward_batch(batch, input_ids)
        if self.piecewise is not None and batch.mode == ForwardMode.EXTEND and self.piecewise.can_run(batch.num_tokens):
            hidden = self.piecewise.forward(fb)  # NOTE: attention eager, the rest from graphs
        else:
            hidden = self.model(fb.input_ids, fb.positions, fb)
        index, offset, per_slice = [], 0, []
        for s in batch.slices:
            positions = s.logit_positions()
            per_slice.append((len(index), positions))
            index.extend(offset + p - s.start for p in positions)
            offset += s.length
        rows = to_device(index, self.device)
        return self.model.compute_logits(hidden[rows]), per_slice

    def _flat_decode_ok(self, batch: ScheduleBatch) -> bool:
        """A small EXTEND batch (a short prefill, speculative verify rows, jump-forward tokens, a
        mixed batch's decodes with a short prefill) replays a decode CUDA graph instead of running
        eagerly: within the graph capacity, slices of at most FLAT_DECODE_MAX_SLICE tokens, or
        what :meth:`flat_decode_fits` allows."""
        if batch.mode != ForwardMode.EXTEND or self.cuda_graph is None:
            return False
        if all(s.length <= FLAT_DECODE_MAX_SLICE for s in batch.slices) and self.cuda_graph.can_run(batch.num_tokens):
            return True
        return self.flat_decode_fits(batch.num_tokens, [(s.start, s.end) for s in batch.slices])

    def flat_decode_fits(self, rows: int, spans: Sequence[tuple[int, int]]) -> bool:
        """Whether an EXTEND batch of ``rows`` new tokens (decode rows included), whose slices
        cover positions ``[start, end)`` of their requests, replays the decode CUDA graphs: within
        the graph capacity, and ``rows <= cuda_graph_max_extend_tokens`` (None: any) or, unless
        that is 0, the rows read at most FLAT_DECODE_KV_BYTES of KV (a row at position ``p``
        reads ``p + 1`` tokens' KV). False without CUDA graphs."""
        if self.cuda_graph is None or not self.cuda_graph.can_run(rows):
            return False
        limit = self.args.cuda_graph_max_extend_tokens
        if limit is None or rows <= limit:
            return True
        kv_tokens = sum((e * (e + 1) - b * (b + 1)) // 2 for b, e in spans if e - b > 1)
        return limit > 0 and kv_tokens * self.kv_bytes_per_token <= FLAT_DECODE_KV_BYTES

    def _replay_decode(self, batch: ScheduleBatch, input_ids: torch.Tensor | None):
        """A DECODE batch through its CUDA graph (one row per request)."""
        slices = batch.slices
        pos = [s.start for s in slices]
        ids = [] if input_ids is not None else [t for s in slices for t in s.req.token_slice(s.start, s.end)]
        rows = [s.req.req_pool_idx for s in slices]
        plan = self._cascade_plan(slices, rows, [p + 1 for p in pos], self.cuda_graph.cascade_chunks(len(rows)))
        logits = self.cuda_graph.replay(ids, pos, rows, batch.out_cache_loc, input_ids, cascade=plan, decode=True)
        return logits, [(i, [p]) for i, p in enumerate(pos)]

    def _cascade_plan(self, slices, rows: list[int], seq_lens: list[int], max_chunks: int) -> CascadePlan | None:
        """The cascade plan of decode rows (``slices`` of one token each, or the per-token rows
        of flat slices: then ``rows`` repeats a request's row), or None."""
        if self.cascade is None or max_chunks <= 0:
            return None
        reqs = [s.req for s in slices] if len(slices) == len(rows) else [s.req for s in slices for _ in range(s.length)]
        return self.cascade.plan(reqs, rows, seq_lens, max_chunks)

    def _forward_flat_decode(
        self, batch: ScheduleBatch, input_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[tuple[int, list[int]]]]:
        """Every new token as its own decode row: row ``p`` of a slice reads the request's
        ``req_to_token`` row up to position ``p`` (its KV, and that of the tokens before it in this
        step, is stored before attention), which is causal attention over prefix + slice. Same
        contract as :meth:`forward_logits` (``input_ids``: all ``batch.num_tokens`` ids, on the
        device, in slice order)."""
        ids, pos, rows, index, per_slice = [], [], [], [], []
        for s in batch.slices:
            per_slice.append((len(index), s.logit_positions()))
            index.extend(len(pos) + p - s.start for p in per_slice[-1][1])
            if input_ids is None:
                ids.extend(s.token_ids())
            pos.extend(range(s.start, s.end))
            rows.extend([s.req.req_pool_idx] * s.length)
        # NOTE: a verify batch's slices keep their slots' host copy: they join the graph inputs'
        # host-to-device copy (no device copy of out_cache_loc on the step's critical path)
        slots = [t for s in batch.slices for t in s.slots.tolist()] if batch.verify else None
        plan = self._cascade_plan(batch.slices, rows, [p + 1 for p in pos], self.cuda_graph.cascade_chunks(len(rows)))
        logits = self.cuda_graph.replay(ids, pos, rows, batch.out_cache_loc, input_ids, slots=slots, cascade=plan)
        if len(index) == len(pos) and index[-1] == len(pos) - 1:  # every row samples: no gather
            return logits, per_slice
        return logits[to_device(index, self.device)], per_slice

    def collect(self, handle: DecodeHandle) -> list[StepOutput]:
        """Wait for a launched decode step and return its sampled tokens."""
        if handle.event is not None:
            handle.event.synchronize()
        return [StepOutput(next_token_id=t) for t in handle.host_ids.tolist()]

    @torch.inference_mode()
    def run(self, batch: ScheduleBatch) -> list[StepOutput]:
        """Forward ``batch``, sample the requests whose slice reaches their end, and compute the
        logprobs they asked for."""
        logits, per_slice = self.forward_logits(batch)
        return self._postprocess(batch, logits, per_slice)

    def _postprocess(self, batch: ScheduleBatch, logits: torch.Tensor, per_slice) -> list[StepOutput]:
        outs = [StepOutput() for _ in batch.slices]
        need_logprobs = any(s.req.return_logprob for s in batch.slices)
        logprobs = torch.log_softmax(logits, dim=-1) if need_logprobs else None
        # Input logprobs: logits at position p score token all_ids[p + 1].
        for out, s, (row0, positions) in zip(outs, batch.slices, per_slice if need_logprobs else ()):
            for j, p in enumerate(positions):
                if s.logprob_from <= p < s.logprob_to:
                    out.input_logprobs[p] = self._logprob_entry(logprobs[row0 + j], s.req.token_slice(p + 1, p + 2)[0], s.req.top_logprobs_num)
        # Sampling rows: the last logits row of every slice that samples.
        sample_slices = [i for i, s in enumerate(batch.slices) if s.sample]
        if batch.verify:  # speculative verify step: slices with drafts are verified, not sampled
            from radixlm.runtime.speculative_worker import postprocess_verify

            sample_slices = postprocess_verify(self, batch, logits, per_slice, logprobs, sample_slices, outs)
        if not sample_slices:
            return outs
        row_ids = [per_slice[i][0] + len(per_slice[i][1]) - 1 for i in sample_slices]
        reqs = [batch.slices[i].req for i in sample_slices]
        if row_ids == list(range(logits.shape[0])):  # decode: every row samples, no gather
            next_logits = logits.clone()
        else:
            next_logits = logits[to_device(row_ids, self.device)]
        rows = row_ids
        apply_penalties(next_logits, reqs)
        block_tokens_before_min(next_logits, reqs, self.eos_token_ids)
        if self.logits_mask_fn is not None:
            self.logits_mask_fn(next_logits, batch, sample_slices)
        next_ids = sample(next_logits, reqs, self.generator).tolist()
        for k, i in enumerate(sample_slices):
            out = outs[i]
            out.next_token_id = next_ids[k]
            if reqs[k].return_logprob and logprobs is not None:
                lp, top = self._logprob_entry(logprobs[rows[k]], next_ids[k], reqs[k].top_logprobs_num)
                out.next_logprob, out.next_top = lp, top
        return outs

    @staticmethod
    def _logprob_entry(row: torch.Tensor, token: int, top_n: int):
        lp = float(row[token])
        if top_n and top_n > 0:
            vals, ids = row.topk(min(top_n, row.shape[-1]))
            return lp, list(zip(vals.tolist(), ids.tolist()))
        return lp, None
