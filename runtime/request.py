"""The scheduler's request object. It owns its own cache bookkeeping (DESIGN.md §6.3).

KV bookkeeping invariants (shared by the scheduler and ``radix/``):

* ``req_to_token[req.req_pool_idx, :req.kv_len]`` holds the KV slots of ``req.all_ids[:req.kv_len]``.
* ``req.prefix_indices`` are the slots of that row that the prefix cache owns (matched at admission
  or re-inserted by ``cache_unfinished_req``); ``req.last_node`` is the cache node locked for them.
  Slots past ``len(req.prefix_indices)`` belong to the request until it is cached or freed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable

import torch

_counter = itertools.count()


class ReqStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Req:
    """One generation request (one sample: ``n > 1`` becomes ``n`` requests sharing the prompt).

    Attributes:
        rid: request id (unique per engine).
        origin_input_ids: prompt token ids.
        sampling_params: a ``radixlm.runtime.sampling_params.SamplingParams``.
        output_ids: generated token ids so far.
        kv_len: number of leading tokens of ``all_ids`` whose KV is stored in the req_to_token row.
        req_pool_idx: row in ``ReqToTokenPool`` while the request holds KV, else ``None``.
        prefix_indices: int64 ``[m]`` slots owned by the prefix cache (see module docstring).
        last_node: prefix-cache node locked on behalf of this request (``None`` when unlocked).
        cached_tokens: prompt tokens served from the prefix cache (summed over re-admissions).
    """

    rid: str
    origin_input_ids: list[int]
    sampling_params: Any
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False
    output_ids: list[int] = field(default_factory=list)
    kv_len: int = 0
    req_pool_idx: int | None = None
    prefix_indices: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    last_node: Any = None
    cached_tokens: int = 0
    status: ReqStatus = ReqStatus.WAITING
    finish_reason: dict | None = None
    arrival: int = field(default_factory=lambda: next(_counter))

    # ---- scheduling (scheduler.py, schedule_policy.py, scheduler_recovery.py)
    max_total: int = 0  # prompt + max_new_tokens, capped by the context length (set when queued)
    admitted_once: bool = False  # counted in the prompt/cached-token statistics
    match_len: int = 0  # cached prefix length seen by the schedule policy (lpm / dfs-weight)
    deprioritized: bool = False  # the policy defers it behind a request sharing its prefix
    isolate: bool = False  # under suspicion after a failed batch: runs alone
    needs_extend: bool = False  # jump-forward appended tokens that the next step must prefill
    jump_forward_tokens: int = 0  # tokens appended by jump-forward so far

    # ---- outputs (output_processor.py)
    logprob_start: int = 0  # absolute position of the first input-logprob entry
    input_logprobs: list = field(default_factory=list)  # [(logprob | None, token id, top | None)]
    output_logprobs: list = field(default_factory=list)  # same entries for generated tokens
    input_logprobs_done: bool = False  # every requested input logprob has been computed
    detok: Any = None  # IncrementalDetokenizer (None with skip_tokenizer_init)
    # (stop ids incl. EOS, output length that ends it) of a request whose decode rows take the
    # columnar path (no logprobs, no stop strings); None for the others
    plain_check: tuple[frozenset, int] | None = None

    # ---- constrained decoding (constrained.py)
    grammar_future: Any = None  # concurrent.futures.Future of the compiled grammar
    grammar_matcher: Any = None  # the request's matcher once the grammar is ready
    grammar_error: str | None = None  # why the grammar cannot run (aborts the request)

    # ---- speculative decoding (speculative_worker.py)
    spec_index: Any = None  # NgramIndex over prompt + output (built on the first draft)
    spec_verify_ct: int = 0  # verify steps that carried a draft
    spec_draft_tokens: int = 0  # draft tokens proposed
    spec_accepted_tokens: int = 0  # draft tokens accepted

    # ---- cascade attention (cascade.py)
    cascade_anchor: Any = None  # (last_node, its topmost ancestor >= CASCADE_MIN_SHARED deep)

    # ---- sampling and delivery
    generator: torch.Generator | None = None  # per-request generator of a seeded request
    host_logits_until: float | None = None  # overlap: output length below which logits go to the host
    sink: Callable[["Req"], None] | None = None  # in-process Engine: called with each update
    t0: float | None = None  # perf_counter() at arrival (Engine; for e2e_latency)
    sent: tuple[int, int, int] | None = None  # scheduler process: (outputs, input lps, output lps) sent
    detok_init: Any = None  # scheduler process: detokenizer settings sent with the first output
    cache_lease: tuple[str, float] | None = None  # (id, ttl_s): lease the cached sequence (radix/lease.py)

    @property
    def all_ids(self) -> list[int]:
        """Prompt followed by the generated tokens."""
        return self.origin_input_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        """``len(all_ids)`` without building the list."""
        return len(self.origin_input_ids) + len(self.output_ids)

    def token_slice(self, start: int, end: int) -> list[int]:
        """``all_ids[start:end]`` without concatenating the whole sequence (decode hot path)."""
        n = len(self.origin_input_ids)
        if start >= n:
            return self.output_ids[start - n : end - n]
        if end <= n:
            return self.origin_input_ids[start:end]
        return self.origin_input_ids[start:] + self.output_ids[: end - n]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def sample_rids(base: str, n: int) -> list[str]:
    """Request ids of the ``n`` samples of one prompt submitted as ``base``: ``[base]`` for
    ``n == 1``, else ``base-0 .. base-{n-1}`` (the Engine and the server name them alike)."""
    return [base] if n == 1 else [f"{base}-{k}" for k in range(n)]


def build_req(rid: str, input_ids: list[int], sampling_params: Any, *, sample: int = 0,
              return_logprob: bool = False, logprob_start_len: int = -1, top_logprobs_num: int = 0,
              cache_lease: dict | tuple | None = None, device: Any = "cpu", detok_init: Any = None) -> Req:
    """The one way to build a :class:`Req` (the in-process Engine and the scheduler process both
    call it).

    Args:
        rid: the sample's request id (see :func:`sample_rids`).
        input_ids: prompt token ids (copied).
        sampling_params: the validated ``runtime.sampling_params.SamplingParams`` (shared by the
            samples of one prompt; never modified).
        sample: index ``k`` of this sample among the prompt's ``n``: a seeded request samples with
            its own generator seeded ``seed + k`` on ``device``.
        return_logprob / logprob_start_len / top_logprobs_num: logprob options (DESIGN.md §3.2).
        cache_lease: ``{"id": str, "ttl_s": float}`` or ``(id, ttl_s)`` (``radix/lease.py``).
        detok_init: the scheduler process's detokenizer settings (sent with the first output).
    Raises:
        ValueError: for a bad ``cache_lease``.
    """
    import time

    from radixlm.radix.lease import lease_spec

    req = Req(rid=rid, origin_input_ids=list(input_ids), sampling_params=sampling_params,
              return_logprob=bool(return_logprob),
              logprob_start_len=-1 if logprob_start_len is None else logprob_start_len,
              top_logprobs_num=top_logprobs_num or 0, cache_lease=lease_spec(cache_lease), detok_init=detok_init)
    if sampling_params.seed is not None:
        from radixlm.runtime.sampler import make_generator

        req.generator = make_generator(sampling_params.seed + sample, device)
    req.t0 = time.perf_counter()
    return req
