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
from typing import Any

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
    # Filled by the scheduler while it runs the request.
    extra: dict = field(default_factory=dict)

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
