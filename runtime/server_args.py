"""Engine and server configuration: one frozen dataclass; CLI defaults read its defaults."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

SCHEDULE_POLICIES = ("lpm", "dfs-weight", "fcfs", "lof", "random")


@dataclass(frozen=True)
class ServerArgs:
    """Everything that configures an Engine or a server.

    Attributes:
        model_path: HF model folder or ``.gguf`` file; ``None`` means the default model
            (SmolLM2-135M-Instruct, :mod:`radixlm.runtime.default_model`).
        tokenizer_path: defaults to ``model_path``.
        dtype: ``auto`` (float32 on CPU, bfloat16 on CUDA), ``float32``, ``bfloat16``, ``float16``.
        device: ``auto`` (cuda when available), ``cpu`` or ``cuda``.
        kv_cache_dtype: the KV pool's element type: ``auto`` (the model's dtype), ``fp8_e4m3`` or
            ``fp8_e5m2`` (8-bit keys and values, no scales: twice the tokens per GiB and half the
            KV bytes read per decode step, at some accuracy;
            :func:`radixlm.runtime.model_loader.resolve_kv_dtype`).
        load_format: ``auto`` (safetensors) or ``dummy`` (random weights from config.json).
        mem_fraction_static: fraction of GPU memory for weights + KV pool (CUDA).
        max_total_tokens: KV pool size in tokens; required on CPU (default 16384 there).
        chunked_prefill_size: max new tokens in one prefill batch; a longer prompt is split.
        max_prefill_tokens: token budget of one prefill batch (new tokens of all its requests).
        max_running_requests: cap on concurrently running requests; ``None`` (default) derives it
            from the KV pool: ``max_total_tokens // 256`` clamped to [16, 1024], and with CUDA
            graphs at most the largest captured batch (``cuda_graph_max_bs``; larger decode
            batches would run eagerly) (``ModelRunner.max_running_requests``).
        context_length: max prompt + output tokens; defaults to the model's max_position_embeddings.
        schedule_policy: one of lpm, dfs-weight, fcfs, lof, random.
        disable_radix_cache: use the no-op prefix cache.
        page_size: tokens per KV page in the prefix cache (1 = token granular).
        random_seed: seeds unseeded sampling.
        enable_overlap_schedule: launch decode step k+1 before processing step k's results
            (hides host work behind the GPU; outputs unchanged). ``None`` (default): on when the
            device resolves to CUDA, off on CPU (no GPU to overlap with).
        disable_cuda_graph: run decode eagerly on CUDA (graphs are captured by default).
        cuda_graph_max_bs: largest decode batch replayed from a CUDA graph; ``None`` (default):
            ``min(512, max_running_requests)``.
        cuda_graph_max_extend_tokens: an extend batch (prefill, mixed, verify, jump-forward) of
            at most this many new tokens replays the decode CUDA graphs, one row per token (causal
            attention over each request's KV), instead of running eagerly, whose per-kernel launch
            cost dominates short prefills; slices of at most 16 tokens always may. Default 256
            (H200, batch 1, TTFT eager -> graph: 135M dims 13.7 -> 2.4 ms at 256 new tokens; 8B
            dims 17.6 -> 7.1 ms at 128 but 16.5 -> 17.5 ms at 512, where the per-row attention
            reads cost more than the launches saved); beyond it a batch still may while its
            rows read at most ``FLAT_DECODE_KV_BYTES`` (8 GiB) of KV (short prompts: a burst of
            27-token prompts beside decodes, 8B dims, 19 ms per mixed step instead of 29 ms), and
            a mixed step then stops admitting a few short arrivals at the graphs' rows;
            ``None``: up to the largest captured graph; ``0``: only the short slices.
        enable_piecewise_cuda_graph: EXTEND batches (prefills, mixed prefill + decode steps) of up
            to ``min(max(chunked_prefill_size, mixed_chunk_size, 2048), 8192) +
            max_running_requests`` tokens, and no larger than a host-bound step
            (``piecewise_graph.host_bound_tokens``: ~1,400 tokens at 8B dims, where larger steps
            are GPU-bound eagerly too), replay piecewise CUDA graphs captured at bucketed token
            counts (everything but attention, which runs eagerly between the pieces:
            ``runtime/piecewise_graph.py``, as SGLang's piecewise CUDA graphs and vLLM's piecewise
            compile). Only on CUDA with decode graphs on and ``tp_size`` 1. ``None`` (default): on
            when the device resolves to CUDA. H200, SmolLM2-135M dims, 2,048 x 256/256: mixed
            steps 52 -> 19 ms, serving 7.7 -> 6.9 s (session 12 of
            ``benchmarks/results/serving_h200.md``).
        enable_cascade_attention: decode rows whose requests share a cached prefix read its KV
            once per chunk of rows (cascade attention, ``runtime/cascade.py``; vLLM's cascade
            attention, FlashInfer's cascade inference). ``None`` (default): on when the device
            resolves to CUDA; on CPU the torch reference would only add work.
        skip_server_warmup: do not run the warm-up requests before serving on CUDA
            (``runtime/warmup.py``: kernel compiles and first-use loads happen then instead of
            inside the first user requests' steps).
        enable_mixed_chunk: mixed batches: a prefill chunk and one decode token of every running
            request share one forward, so arrivals do not stall decoding (default on).
        mixed_chunk_size: most prefill tokens of a mixed batch: every running request's next
            token waits for its forward, so this bounds ITL while prompts arrive;
            ``chunked_prefill_size`` applies when nothing is decoding. ``None`` (default): 2,048
            for 8B parameters (per rank), scaled inversely with the parameter count so that a
            mixed step costs about the same compute, within [2048, chunked_prefill_size].
            H200, 512 x 1024/256 on Llama-3.1-8B dims: 8,192-token mixed chunks gave ITL p99
            199 ms, 2,048 gave 63 ms at 2% longer duration; 2,048 x 256/256 on SmolLM2-135M dims:
            2,048-token chunks cost 14% throughput and raised ITL p99 (32 vs 10 ms at 8,192),
            a step there being bound by per-step work, not by prefill compute.
        mixed_chunk_policy: ``auto`` (default): ``cost`` on a device with a cost model (CUDA),
            else ``fixed``. ``fixed``: every mixed step takes up to ``mixed_chunk_size`` prefill
            tokens. ``cost`` (ValueError on a device without a model): at most
            ``mixed_chunk_size``, fewer when the decode batch the queue heads to is light (short
            or shared contexts), so that the chunk costs about 2.5 decode steps
            (``runtime/mixed_chunk.py``). H200, 8 x 64 prompts under 2,048 shared tokens: the
            decode-token-weighted step time p99 / p50 3.8 -> 2.6 (``benchmarks/mixed_steps.py``);
            results of the default in ``benchmarks/results/serving_h200.md`` (session 6).
        enable_jump_forward: append the text a grammar forces without sampling it (the forced
            text is kept verbatim, see docs/grammar.md for the retokenization rule). Default on,
            for every device: under overlap scheduling a jump rides the next overlapped step and
            runs shorter than two tokens are left to the model, which made it as fast as off on the
            H200 (128 concurrent, Llama-3.1-8B dims; benchmarks/results/constrained_h200.md).
        grammar_compile_timeout_s: compile time limit per grammar; the request aborts past it.
        grammar_backend: ``radixlm`` (default), ``xgrammar`` or ``llguidance`` (optional extras
            ``radixlm[xgrammar]`` / ``radixlm[llguidance]``).
        tp_size: tensor-parallel ranks (one process each; NCCL on CUDA, gloo on CPU).
        nnodes, node_rank: nodes the ``tp_size`` ranks are spread over, and this node's index.
        dist_init_addr: ``HOST:PORT`` of torch.distributed's rendezvous (rank 0 listens there);
            default a free local port; required with ``nnodes > 1``.
        skip_tokenizer_init: load no tokenizer (e.g. a config-only dummy model); requests must
            pass ``input_ids`` and get no text or stop strings.
        speculative_algorithm: ``None`` (off) or ``"ngram"`` (case-insensitive): prompt-lookup
            drafts (and grammar-forced ones) verified in one forward per step
            (:mod:`radixlm.runtime.speculative_worker`); turns overlap scheduling off.
        speculative_num_draft_tokens: most draft tokens per request and step (k).
        speculative_ngram_min_match_window_size / speculative_ngram_max_match_window_size: the
            shortest and longest suffix matched against the request's prompt and output.
        speculative_ngram_capacity: tokens (prompt + output of finished requests, newest kept) in
            the global n-gram store that drafts from OTHER requests when it matches a longer
            suffix than the request's own history (SGLang's name, whose trie counts entries;
            SuffixDecoding's global tree; :mod:`radixlm.runtime.speculative_store`). Memory at
            most ~125 bytes per token of capacity (~28 MB at the default 1,000,000 and a 49k
            vocabulary). ``0`` turns the store off.
    Raises ``ValueError`` from ``__post_init__`` for out-of-range values.
    """

    model_path: str | None = None
    tokenizer_path: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    kv_cache_dtype: str = "auto"
    load_format: str = "auto"
    mem_fraction_static: float = 0.85
    max_total_tokens: int | None = None
    chunked_prefill_size: int = 8192
    max_prefill_tokens: int = 16384
    max_running_requests: int | None = None
    context_length: int | None = None
    schedule_policy: str = "lpm"
    disable_radix_cache: bool = False
    page_size: int = 1
    random_seed: int = 0
    enable_jump_forward: bool = True
    grammar_compile_timeout_s: float = 30.0
    grammar_backend: str = "radixlm"
    log_level: str = "warning"
    enable_overlap_schedule: bool | None = None
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int | None = None
    cuda_graph_max_extend_tokens: int | None = 256
    enable_piecewise_cuda_graph: bool | None = None
    enable_cascade_attention: bool | None = None
    skip_server_warmup: bool = False
    enable_mixed_chunk: bool = True
    mixed_chunk_size: int | None = None
    mixed_chunk_policy: str = "auto"
    skip_tokenizer_init: bool = False  # token ids in, token ids out (text fields stay empty)
    speculative_algorithm: str | None = None
    speculative_num_draft_tokens: int = 8  # H200, SmolLM2 bs 1: extraction 1.50x -> 1.58x wall vs k=4
    speculative_ngram_min_match_window_size: int = 1
    speculative_ngram_max_match_window_size: int = 12
    speculative_ngram_capacity: int = 1_000_000  # global store of other requests' tokens; 0: off
    tp_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None

    def __post_init__(self) -> None:
        algo = self.speculative_algorithm
        if isinstance(algo, str):
            algo = None if algo.lower() in ("", "none") else algo.lower()
        if algo not in (None, "ngram"):
            raise ValueError(f"speculative_algorithm must be ngram or None, got {self.speculative_algorithm!r}")
        object.__setattr__(self, "speculative_algorithm", algo)
        if self.speculative_num_draft_tokens < 1:
            raise ValueError("speculative_num_draft_tokens must be >= 1")
        if not 1 <= self.speculative_ngram_min_match_window_size <= self.speculative_ngram_max_match_window_size:
            raise ValueError("need 1 <= speculative_ngram_min_match_window_size <= speculative_ngram_max_match_window_size")
        if self.speculative_ngram_capacity < 0:
            raise ValueError("speculative_ngram_capacity must be >= 0 (0: no global n-gram store)")
        if self.mixed_chunk_policy not in ("auto", "fixed", "cost"):
            raise ValueError(f"mixed_chunk_policy must be auto, fixed or cost, got {self.mixed_chunk_policy!r}")
        if self.mixed_chunk_policy != "fixed":
            from radixlm.runtime.mixed_chunk import MACHINE_BALANCE

            kind = self.resolved_device().split(":")[0]
            if self.mixed_chunk_policy == "auto":
                object.__setattr__(self, "mixed_chunk_policy", "cost" if kind in MACHINE_BALANCE else "fixed")
            elif kind not in MACHINE_BALANCE:
                raise ValueError(f"mixed_chunk_policy=cost has no cost model for device {kind!r} "
                                 f"(models: {sorted(MACHINE_BALANCE)})")
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule_policy must be one of {SCHEDULE_POLICIES}, got {self.schedule_policy!r}")
        if not 0 < self.mem_fraction_static < 1:
            raise ValueError("mem_fraction_static must be in (0, 1)")
        for name in ("chunked_prefill_size", "mixed_chunk_size", "max_prefill_tokens", "max_running_requests",
                     "page_size", "cuda_graph_max_bs"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.cuda_graph_max_extend_tokens is not None and self.cuda_graph_max_extend_tokens < 0:
            raise ValueError("cuda_graph_max_extend_tokens must be >= 0")
        if self.max_total_tokens is not None and self.max_total_tokens < 2:
            raise ValueError("max_total_tokens must be >= 2")
        if self.kv_cache_dtype not in ("auto", "fp8_e4m3", "fp8_e5m2"):
            raise ValueError(f"kv_cache_dtype must be auto, fp8_e4m3 or fp8_e5m2, got {self.kv_cache_dtype!r}")
        if self.grammar_backend not in ("radixlm", "xgrammar", "llguidance"):
            raise ValueError(f"grammar_backend must be radixlm, xgrammar or llguidance, got {self.grammar_backend!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.tp_size < 1 or self.nnodes < 1 or self.tp_size % self.nnodes:
            raise ValueError(f"tp_size ({self.tp_size}) must be a positive multiple of nnodes ({self.nnodes})")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank must be in [0, {self.nnodes}), got {self.node_rank}")
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ValueError("nnodes > 1 needs dist_init_addr (HOST:PORT of node 0)")
        if self.enable_cascade_attention is None:
            object.__setattr__(self, "enable_cascade_attention", self.resolved_device().startswith("cuda"))
        if self.enable_piecewise_cuda_graph is None:
            object.__setattr__(self, "enable_piecewise_cuda_graph", self.resolved_device().startswith("cuda"))
        if self.enable_overlap_schedule is None:
            object.__setattr__(self, "enable_overlap_schedule", self.resolved_device().startswith("cuda"))

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "ServerArgs":
        """Build from keyword arguments; raises ``TypeError`` naming unknown ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown server args: {unknown}")
        return cls(**kwargs)

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
