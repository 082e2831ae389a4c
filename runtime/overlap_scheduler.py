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

from radixlm.runtime.batch import DecodeFacts, ReqSlice, ScheduleBatch
from radixlm.runtime.forward_batch import ForwardMode
from radixlm.runtime.memory import to_device
from radixlm.runtime.model_runner import DecodeHandle
from radixlm.runtime.sampler import SamplingColumns, sample
from radixlm.runtime.scheduler import Scheduler


def _facts(batch: ScheduleBatch) -> DecodeFacts:
    """The facts of a batch's request set (``DecodeFacts``), worked out once per batch and carried
    by its follow-ups; an EXTEND batch (a jump step) gets its own."""
    if batch.facts is None:
        batch.facts = DecodeFacts.of(batch.reqs)
    return batch.facts


class OverlapScheduler(Scheduler):
    """A :class:`Scheduler` that keeps one decode step in flight (``enable_overlap_schedule``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.inflight: tuple[ScheduleBatch, DecodeHandle] | None = None
        self.jump_steps = 0  # overlapped steps that carried jump-forward rows

    def has_work(self) -> bool:
        return super().has_work() or self.inflight is not None

    def step(self) -> list[Req]:
        if self.inflight is None:
            jump = self._jump_from_sync()
            if jump is not None:  # NOTE: pending jump-forward extends restart the overlap
                self._checked_idle = False
                self.ran_batch = True
                self.cur_batch = jump[0]
                self.inflight = (jump[0], self._sample(jump[0], self._forward(*jump)))
                return self._take_aborted()
            batch = self._select_batch()
            aborted = self._take_aborted()
            self.ran_batch = batch is not None
            if batch is None:
                self._idle_check()
                return aborted
            if batch.mode == ForwardMode.DECODE and not _facts(batch).needs_host_logits():
                self._checked_idle = False
                self.cur_batch = batch
                self.inflight = (batch, self._sample(batch, self._forward(batch)))
                return aborted
            return aborted + self._run_batch(batch)
        prev, handle = self.inflight
        follow = self._followup(prev, handle.next_ids)
        nxt, logits = (follow[0], self._forward(*follow)) if follow is not None else (None, None)
        nxt_handle = None
        if nxt is not None and not _facts(nxt).grammar:
            nxt_handle = self._sample(nxt, logits)
        # NOTE: the GPU is already busy with step k+1; a decode step's outputs are its ids alone
        outs = self._sampled_ids(handle) if prev.mode == ForwardMode.DECODE else self.runner.collect(handle)
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

    @staticmethod
    def _sampled_ids(handle: DecodeHandle) -> list[int]:
        """Wait for a launched step's host copy and return its sampled ids (``runner.collect``
        without a ``StepOutput`` per row: ``Scheduler._process`` takes a decode step's ids)."""
        if handle.event is not None:
            handle.event.synchronize()
        return handle.host_ids.tolist()

    @torch.inference_mode()
    def _sample(self, batch: ScheduleBatch, logits: torch.Tensor) -> DecodeHandle:
        """Mask (grammar rows), sample and start the host copy of ``batch``'s next ids."""
        facts = _facts(batch)
        if facts.grammar:
            self.grammar.mask_logits(logits, batch, list(range(len(batch.slices))))
        if not facts.greedy and facts.columns is None:  # NOTE: once per request set, not per step
            facts.columns = SamplingColumns.of(facts.reqs, logits.shape[1], logits.device, logits.dtype) or False
        return DecodeHandle.start(sample(logits, facts.reqs, self.runner.generator, all_greedy=facts.greedy,
                                         columns=facts.columns or None))

    def _without_dropped(self, batch: ScheduleBatch, outs: list) -> tuple[ScheduleBatch, list]:
        """``batch`` and ``outs`` minus the requests whose token must be dropped (jump-forward
        appended text after this step was launched) and those finished while it was in flight;
        their slots go back (from the batch's host copy: a device read here would wait for the
        step in flight), a dropped request's state is kept."""
        drop, host = batch.drop, batch.host_loc
        if host is None or not (drop or (batch.finished_mark != self.num_finished
                                         and any(s.req.finish_reason is not None for s in batch.slices))):
            return batch, outs
        keep, gone, off = [], [], 0
        for i, s in enumerate(batch.slices):
            (gone if id(s.req) in drop or s.req.finish_reason is not None else keep).append((i, off, s.length))
            off += s.length
        tokens = lambda rows: [t for _, o, n in rows for t in range(o, o + n)]
        self.allocator.free(host[tokens(gone)])
        kept_tokens = tokens(keep)
        kept = ScheduleBatch(batch.mode, [batch.slices[i] for i, _, _ in keep], verify=batch.verify,
                             out_cache_loc=batch.out_cache_loc[to_device(kept_tokens, batch.out_cache_loc.device)],
                             host_loc=host[kept_tokens], finished_mark=self.num_finished)
        return kept, [outs[i] for i, _, _ in keep]

    def _followup(self, prev: ScheduleBatch, next_ids: torch.Tensor) -> tuple[ScheduleBatch, torch.Tensor] | None:
        """The step after ``prev`` for the same requests and its input ids on the device, or None
        when the scheduler must look at results first. Every request decodes one token (its token
        sampled by ``prev``, ``next_ids``) except those whose processing appended jump-forward text
        after ``prev`` was launched (``prev`` drops their token): their row is an extend of the
        sampled token and the forced tokens, so jumps keep the GPU busy too (a jump step, run as a
        ``verify``-style batch of running requests; only where it replays through a CUDA graph, or
        on CPU)."""
        if self.waiting or self.chunked_req is not None:
            return None
        facts = _facts(prev)
        reqs = facts.reqs
        if self.running != reqs or facts.needs_host_logits():
            return None
        jumped = [r.needs_extend for r in reqs] if facts.grammar else ()  # NOTE: only grammars jump
        if True in jumped:
            return self._jump_step(prev, next_ids, jumped)
        got = self.allocator.alloc_with_host(len(reqs))
        if got is None:
            return None
        # NOTE: a request's KV reaches its prev slice's end once prev is processed.
        pool = self.req_to_token_pool
        if prev.mode == ForwardMode.DECODE and len(reqs) > 1:  # NOTE: one row: write_batch's one copy
            if facts.next_index is None:
                facts.next_index = pool.flat_index(facts.rows, [s.end for s in prev.slices])
            pool.write_flat(facts.next_index, got[0])
            facts.next_index += 1  # NOTE: in place, in stream order after the write
        else:
            pool.write_batch(facts.rows, [s.end for s in prev.slices], got[0])
        if prev.mode != ForwardMode.DECODE:  # a jump step: the decode steps after it have facts of their own
            slices = [ReqSlice(s.req, s.end, s.end + 1, True) for s in prev.slices]
            facts = None
        else:
            slices = facts.spare
            if slices is None:
                slices = [ReqSlice(s.req, s.end, s.end + 1, True) for s in prev.slices]
            else:  # NOTE: the slices of the step before prev, processed: reused
                for s, p in zip(slices, prev.slices):
                    e = p.end
                    s.start, s.end = e, e + 1
            facts.spare = prev.slices
        return ScheduleBatch(ForwardMode.DECODE, slices, out_cache_loc=got[0], facts=facts, host_loc=got[1],
                             finished_mark=self.num_finished), next_ids

    def _jump_step(self, prev: ScheduleBatch, next_ids: torch.Tensor, jumped: list[bool]):
        """:meth:`_followup` with jump-forward rows (see there), or None."""
        if any(j and id(s.req) not in prev.drop for s, j in zip(prev.slices, jumped)):
            return None
        # NOTE: a jumped request's KV stays at its kv_len (prev's row of it is dropped); its row
        # covers the token it sampled before the jump and the forced tokens.
        spans = [(s.req.kv_len, s.req.num_tokens) if j else (s.end, s.end + 1) for s, j in zip(prev.slices, jumped)]
        return self._extend_rows([s.req for s in prev.slices], spans, jumped, next_ids)

    def _jump_from_sync(self):
        """With no step in flight, running requests waiting for their jump-forward extend and
        nothing to admit: every running request's pending tokens (a jumped request's sampled and
        forced tokens, the others' last sampled token) as one jump step launched overlapped, or
        None. Without it, a step after which any of many constrained requests jumps would run
        synchronously (a prefill batch), and with requests jumping at different times the
        overlap could not restart."""
        running = self.running
        if self.waiting or self.chunked_req is not None or not running or not any(r.needs_extend for r in running):
            return None
        reqs = list(running)
        facts = DecodeFacts.of(reqs)
        if not facts.grammar or facts.needs_host_logits():
            return None
        spans = [(r.kv_len, r.num_tokens) for r in reqs]
        if any(hi <= lo for lo, hi in spans):
            return None
        got = self._extend_rows(reqs, spans, [True] * len(reqs), None)
        if got is not None:
            got[0].facts = facts
        return got

    def _extend_rows(self, reqs: list, spans: list[tuple[int, int]], jumped: list[bool],
                     next_ids: torch.Tensor | None):
        """A verify-style EXTEND batch of running ``reqs`` over positions ``spans`` and its input
        ids on the device: a jumped row's tokens come from the host, the others' one token from
        ``next_ids`` (the previous step's sampled ids, device); None when the batch would not
        replay through a CUDA graph (on CUDA) or KV is short."""
        lens = [hi - lo for lo, hi in spans]
        probe = ScheduleBatch(ForwardMode.EXTEND, [ReqSlice(r, lo, hi, True) for r, (lo, hi) in zip(reqs, spans)],
                              verify=True)
        runner = self.runner
        if runner.cuda_graph is not None and not runner._flat_decode_ok(probe):
            return None
        got = self.allocator.alloc_with_host(sum(lens))
        if got is None:
            return None
        slots, host = got
        rows = [r.req_pool_idx for r, n in zip(reqs, lens) for _ in range(n)]
        self.req_to_token_pool.write_batch(rows, [p for lo, hi in spans for p in range(lo, hi)], slots)
        ids, sampled_at, take, off = [], [], [], 0
        for i, (s, j, (lo, hi)) in enumerate(zip(probe.slices, jumped, spans)):
            s.slots = host[off : off + hi - lo]
            if j:
                s.req.needs_extend = False
                ids.extend(s.req.token_slice(lo, hi))
            else:
                ids.append(0)
                sampled_at.append(off)
                take.append(i)
            off += hi - lo
        device = next_ids.device if next_ids is not None else runner.device
        input_ids = to_device(ids, device)  # NOTE: pinned: a pageable copy waits for the GPU
        if take:
            at, src = to_device([sampled_at, take], device)
            input_ids[at] = next_ids[src].to(input_ids.dtype)
        probe.out_cache_loc, probe.host_loc = slots, host
        self.jump_steps += 1
        return probe, input_ids

    def flush_cache(self) -> bool:
        return False if self.inflight is not None else super().flush_cache()

    def abort_all(self, message: str) -> list[Req]:
        if self.inflight is not None:
            batch, _ = self.inflight
            self.inflight = None
            if batch is not self.cur_batch:  # launched, never processed: all its slots go back
                self.allocator.free(batch.out_cache_loc)
        return super().abort_all(message)
