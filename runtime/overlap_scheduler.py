"""Overlap scheduling: launch decode step k+1 before processing step k's results, so the host work
of a step (stop checks, detokenization, bookkeeping) runs while the GPU computes the next one
(SGLang's overlap scheduler; the same idea as vLLM's async output processing).

Step k+1's input ids are step k's sampled ids, fed on the device without a host round trip.
A request that finishes at step k has already been launched in step k+1: that extra token is
dropped and its slot freed when step k+1 is processed, so outputs are unchanged. Overlap runs only
while nothing else must happen between steps: no waiting or chunked requests, no jump-forward
extends, enough free KV, and only requests whose sampling needs no host-side logits processing
other than a grammar mask.

Grammar-constrained batches overlap too, in two phases: step k+1's forward is launched first, then
step k's results are processed (its tokens advance the matchers), then step k+1's masks are filled
(host work while the GPU still runs the forward) and its sampling is launched. A request whose
step-k processing appended jump-forward tokens drops its step k+1 token (its context changed) and
is prefilled next, like a finished one.
"""

from __future__ import annotations

import torch

from radixlm.runtime.batch import ReqSlice, ScheduleBatch
from radixlm.runtime.forward_batch import ForwardMode
from radixlm.runtime.model_runner import DecodeHandle
from radixlm.runtime.request import Req
from radixlm.runtime.sampler import sample
from radixlm.runtime.scheduler import Scheduler


def _has_grammar(batch: ScheduleBatch) -> bool:
    return any(r.grammar_matcher is not None for r in batch.reqs)


def _needs_host_logits(req: Req) -> bool:
    sp = req.sampling_params
    return bool(
        req.return_logprob
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
                self.inflight = (batch, self._sample(batch, self._forward(batch)))
                return aborted
            return aborted + self._run_batch(batch)
        prev, handle = self.inflight
        nxt = self._followup(prev)
        logits = self._forward(nxt, handle.next_ids) if nxt is not None else None
        nxt_handle = None
        if nxt is not None and not _has_grammar(nxt):
            nxt_handle = self._sample(nxt, logits)
        outs = self.runner.collect(handle)  # NOTE: the GPU is already busy with step k+1
        self.cur_batch = prev
        touched = self._process(*self._without_dropped(prev, outs))
        if nxt is not None and nxt_handle is None:  # grammar: masks need step k's tokens
            nxt.drop = {id(r) for r in nxt.reqs if r.needs_extend}
            nxt_handle = self._sample(nxt, logits)
        self.inflight = (nxt, nxt_handle) if nxt is not None else None
        self.cur_batch = nxt
        self.ran_batch = True
        return self._take_aborted() + touched

    def _forward(self, batch: ScheduleBatch, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        logits, _ = self.runner.forward_logits(batch, input_ids)
        return logits

    @torch.inference_mode()
    def _sample(self, batch: ScheduleBatch, logits: torch.Tensor) -> DecodeHandle:
        """Mask (grammar rows), sample and start the host copy of ``batch``'s next ids."""
        if _has_grammar(batch):
            self.grammar.mask_logits(logits, batch, list(range(len(batch.slices))))
        return DecodeHandle.start(sample(logits, batch.reqs, self.runner.generator))

    def _without_dropped(self, batch: ScheduleBatch, outs: list) -> tuple[ScheduleBatch, list]:
        """``batch`` and ``outs`` minus the requests whose token must be dropped (jump-forward
        appended text after this step was launched); their slots go back, their state is kept."""
        drop = batch.drop
        if not drop:
            return batch, outs
        keep = [i for i, s in enumerate(batch.slices) if id(s.req) not in drop]
        gone = [i for i, s in enumerate(batch.slices) if id(s.req) in drop]
        self.allocator.free(batch.out_cache_loc[gone])
        kept = ScheduleBatch(batch.mode, [batch.slices[i] for i in keep], out_cache_loc=batch.out_cache_loc[keep])
        return kept, [outs[i] for i in keep]

    def _followup(self, prev: ScheduleBatch) -> ScheduleBatch | None:
        """The decode batch after ``prev`` for the same requests, or None when the scheduler must
        look at results first."""
        reqs = prev.reqs
        if self.waiting or self.chunked_req is not None or self.running != reqs:
            return None
        if any(r.needs_extend or _needs_host_logits(r) for r in reqs):
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
