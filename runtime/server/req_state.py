"""The tokenizer manager's per-sample state (:class:`ReqState`: what the HTTP handlers read) and
a batched histogram update for its per-step metrics."""

from __future__ import annotations

import asyncio
import bisect
import json
import time
from dataclasses import dataclass, field
from typing import Any

_JSON = json.JSONEncoder(ensure_ascii=False)  # NOTE: what json.dumps(obj, ensure_ascii=False) uses
_escape = json.encoder.encode_basestring  # NOTE: the string encoder of ensure_ascii=False


@dataclass(slots=True)
class ReqState:
    """Accumulated output of one sample; ``queue`` (shared by a submission) gets its ``index``
    after an update unless it is already there (``queued``), and only after the last update unless
    ``stream`` (:meth:`TokenizerManager.wait_all` clears it, since it reads nothing before the end)."""

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
    # NOTE: its index is in ``queue`` and not yet taken: later updates need no wake-up of their
    # own (the consumer reads the latest state when it takes the index; one put per step per
    # request was the HTTP process's largest cost at 2,048 streams)
    queued: bool = False
    # NOTE: sse_chunk's incremental JSON: the text and ids encoded so far
    _sse_text: str = field(default="", init=False, repr=False)
    _sse_text_json: str = field(default="", init=False, repr=False)
    _sse_ids_n: int = field(default=0, init=False, repr=False)
    _sse_ids_json: str = field(default="", init=False, repr=False)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def _meta(self) -> dict:
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
        return meta

    def result(self) -> dict:
        """The native ``/generate`` response (cumulative)."""
        return {"text": self.text, "output_ids": list(self.output_ids), "meta_info": self._meta()}

    def sse_chunk(self, index: int | None = None) -> str:
        """The native streaming handler's event for :meth:`result` (with ``"index": index``
        last when given): ``data: <json>`` and a blank line, the same string as
        ``json.dumps(..., ensure_ascii=False)`` gives, but built incrementally: the JSON of the
        text and of the ids is extended by what was added since the previous call instead of
        re-encoding them (per step O(new output), not O(output); ``meta_info`` is encoded whole)."""
        text, done = self.text, self._sse_text
        if text is not done and text != done:
            if not text.startswith(done):  # NOTE: replaced (a stop string cut it back): start over
                done, self._sse_text_json = "", ""
            # NOTE: JSON string escaping is per character: escape(a + b) == escape(a) + escape(b)
            self._sse_text_json += _escape(text[len(done):])[1:-1]
            self._sse_text = text
        ids, n = self.output_ids, self._sse_ids_n
        if len(ids) != n:
            if len(ids) < n:
                n, self._sse_ids_json = 0, ""
            new = ", ".join(map(str, ids[n:]))  # NOTE: json.dumps writes an int as str() does
            self._sse_ids_json = f"{self._sse_ids_json}, {new}" if n else new
            self._sse_ids_n = len(ids)
        tail = "" if index is None else f", \"index\": {_JSON.encode(index)}"
        if self.spec_info or self.return_logprob:
            meta = _JSON.encode(self._meta())
        else:  # NOTE: _meta()'s keys in its order, as the encoder writes them (floats by repr)
            reason = self.finish_reason
            if reason is not None and "status_code" in reason:
                reason = {k: v for k, v in reason.items() if k != "status_code"}
            meta = (f'{{"id": {_escape(self.rid)}, "finish_reason": {"null" if reason is None else _JSON.encode(reason)}, '
                    f'"prompt_tokens": {self.prompt_tokens}, "completion_tokens": {self.completion_tokens}, '
                    f'"cached_tokens": {self.cached_tokens}, '
                    f'"e2e_latency": {_JSON.encode(time.perf_counter() - self.t0)}}}')
        return (f'data: {{"text": "{self._sse_text_json}", "output_ids": [{self._sse_ids_json}], '
                f'"meta_info": {meta}{tail}}}\n\n')


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
