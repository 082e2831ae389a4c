"""Overlap scheduling: launch decode step k+1 before processing step k's results, so the host work
of a step (stop checks, detokenization, bookkeeping) runs while the GPU computes the next one
(SGLang's overlap scheduler; the same idea as vLLM's async output processing).

Step k+1's input ids are step k's sampled ids, fed on the device without a host round trip.
A request that finishes at step k has already been launched in step k+1: that extra token is
dropped and its slot freed when step k+1 is processed, so outputs are unchanged. Overlap runs only
while nothing else must happen between steps: no waiting or chunked requests, no jump-forward
extends, enough free KV, and only requests whose sampling needs no host-side logits processing.
"""

from __future__ import annotations

from radixlm.runtime.batch import ReqSlice, ScheduleBatch
from radixlm.runtime.forward_batch import ForwardMode
from radixlm.runtime.model_runner import DecodeHandle
from radixlm.runtime.request import Req
from radixlm.runtime.scheduler import Scheduler


def _needs_host_logits(req: Req) -> bool:
    sp = req.sampling_params
    return bool(
        req.return_logprob
        or sp.grammar is not None
        or sp.frequency_penalty
        or sp.presence_penalty
        or sp.repetition_penalty != 1.0
        or len(req.output_ids) + 1 < sp.min_new_tokens
    )


class OverlapScheduler(Scheduler):
    """A :class:`Scheduler` that keeps one decode step in flight (``enable_overlap_schedule``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.inflight: tuple[ScheduleBatch, DecodeHandle] | None = None

    def has_work(self) -> bool:
        return super().has_work() or self.inflight is not None

    def step(self) -> list[Req]:
        if self.inflight is None:
            batch = self._select_batch()
            aborted = self._take_aborted()
            self.ran_batch = batch is not None
            if batch is None:
                self._idle_check()
                return aborted
            if batch.mode == ForwardMode.DECODE and not any(map(_needs_host_logits, batch.reqs)):
                self._checked_idle = False
                self.cur_batch = batch
                self.inflight = (batch, self.runner.launch_decode(batch))
                return aborted
            return aborted + self._run_batch(batch)
        prev, handle = self.inflight
        nxt = self._followup(prev)
        nxt_handle = self.runner.launch_decode(nxt, input_ids=handle.next_ids) if nxt is not None else None
        outs = self.runner.collect(handle)  # NOTE: the GPU is already busy with step k+1
        self.cur_batch = prev
        touched = self._process(prev, outs)
        self.inflight = (nxt, nxt_handle) if nxt is not None else None
        self.cur_batch = nxt
        self.ran_batch = True
        return self._take_aborted() + touched

    def _followup(self, prev: ScheduleBatch) -> ScheduleBatch | None:
        """The decode batch after ``prev`` for the same requests, or None when the scheduler must
        look at results first."""
        reqs = prev.reqs
        if self.waiting or self.chunked_req is not None or self.running != reqs:
            return None
        if any(r.extra.get("needs_extend") or _needs_host_logits(r) for r in reqs):
            return None
        if self.allocator.available_size() < len(reqs):
            return None
        slots = self.allocator.alloc(len(reqs))
        # NOTE: kv_len is still step k's start; step k+1 writes one position further.
        self.req_to_token_pool.write_batch([r.req_pool_idx for r in reqs], [r.kv_len + 1 for r in reqs], slots)
        slices = [ReqSlice(r, r.kv_len + 1, r.kv_len + 2, True) for r in reqs]
        return ScheduleBatch(ForwardMode.DECODE, slices, out_cache_loc=slots)

    def flush_cache(self) -> bool:
        return False if self.inflight is not None else super().flush_cache()

    def abort_all(self, message: str) -> list[Req]:
        if self.inflight is not None:
            batch, _ = self.inflight
            self.inflight = None
            if batch is not self.cur_batch:  # launched, never processed: all its slots go back
                self.allocator.free(batch.out_cache_loc)
        return super().abort_all(message)
