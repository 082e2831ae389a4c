"""The tokenizer manager's per-sample state (:class:`ReqState`: what the HTTP handlers read) and
a batched histogram update for its per-step metrics."""

from __future__ import annotations

import asyncio
import bisect
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ReqState:
    """Accumulated output of one sample; ``queue`` (shared by a submission) gets its ``index``
    after every update (only after the last one unless ``stream``: :meth:`TokenizerManager.wait_all`
    clears it, since it reads nothing before the end)."""

    rid: str
    index: int
    queue: asyncio.Queue
    return_logprob: bool
    top_logprobs_num: int
    t0: float = field(default_factory=time.perf_counter)
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    finish_reason: dict | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    input_lp: list = field(default_factory=list)
    input_top: list = field(default_factory=list)
    output_lp: list = field(default_factory=list)
    output_top: list = field(default_factory=list)
    spec_info: dict | None = None  # speculative decoding figures (meta_info)
    started: bool = False
    first_token_t: float | None = None
    last_token_t: float | None = None
    version: int = 0
    stream: bool = True

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def result(self) -> dict:
        """The native ``/generate`` response (cumulative)."""
        reason = self.finish_reason
        if reason is not None and "status_code" in reason:
            reason = {k: v for k, v in reason.items() if k != "status_code"}
        meta: dict[str, Any] = {
            "id": self.rid, "finish_reason": reason, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens, "cached_tokens": self.cached_tokens,
            "e2e_latency": time.perf_counter() - self.t0,
        }
        if self.spec_info:
            meta.update(self.spec_info)
        if self.return_logprob:
            meta.update(input_token_logprobs=self.input_lp, output_token_logprobs=self.output_lp)
            if self.top_logprobs_num:
                meta.update(input_top_logprobs=self.input_top, output_top_logprobs=self.output_top)
        return {"text": self.text, "output_ids": list(self.output_ids), "meta_info": meta}


def observe_many(hist, values: list[float]) -> None:
    """``hist.observe(v)`` for every value, with one update per touched bucket instead of one per
    value where the histogram is prometheus_client's (a labelled child); else one by one."""
    bounds, buckets, total = (getattr(hist, "_upper_bounds", None), getattr(hist, "_buckets", None),
                              getattr(hist, "_sum", None))
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for v in values:
            hist.observe(v)
        return
    counts: dict[int, int] = {}
    for v in values:
        i = bisect.bisect_left(bounds, v)  # NOTE: observe() counts v in the first bucket with v <= bound
        counts[i] = counts.get(i, 0) + 1
    total.inc(sum(values))
    for i, c in counts.items():
        if i < len(buckets):
            buckets[i].inc(c)
