"""Iteration-level continuous batching (Orca, Yu et al. 2022; SGLang's scheduler).

Each :meth:`Scheduler.step` picks one batch: a prefill (EXTEND) batch when waiting requests can be
admitted — matched against the prefix cache, chunked by ``chunked_prefill_size`` — otherwise a
decode batch of all running requests. When decode runs out of KV slots it first evicts cached
prefixes, then retracts (preempts and requeues) the requests holding the most KV. The scheduler
never touches model tensors; KV slot handles go through the allocator and the prefix cache.
Building prefill batches (admission, chunking, mixed batches) is in ``scheduler_admission.py``;
retraction and failure recovery in ``scheduler_recovery.py``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from radixlm.radix import NoOpPrefixCache, PrefixCache, RadixCache
from radixlm.runtime.batch import ReqSlice, ScheduleBatch, StepOutput
from radixlm.runtime.constrained import GrammarBackend
from radixlm.runtime.forward_batch import ForwardMode
from radixlm.runtime.model_runner import ModelRunner
from radixlm.runtime.output_processor import OutputProcessor
from radixlm.runtime.request import Req, ReqStatus
from radixlm.runtime.schedule_policy import SchedulePolicy
from radixlm.runtime.scheduler_admission import PrefillAdmission
from radixlm.runtime.scheduler_recovery import (
    abort_everything, log_integrity, pick_decode_reqs, recover_failed_batch, retract,
)
from radixlm.runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)

# Share of running requests' remaining max_new_tokens kept free at admission (SGLang's
# "new token ratio"): starts high, decays every decode step, is raised after a retraction.
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY = 0.001


@dataclass
class SchedulerStats:
    """Counters the engine and the metrics endpoint report."""

    num_prefill_batches: int = 0
    num_decode_batches: int = 0
    num_mixed_batches: int = 0  # prefill batches that also carried running requests' decodes
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    num_retracted: int = 0

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class Scheduler(PrefillAdmission):
    """Owns the waiting queue, the running batch and the prefix cache of one model runner.

    Not thread-safe: the engine calls :meth:`add_request` and :meth:`step` from one thread.
    :meth:`create` picks this class or the overlapping one from the server args.
    """

    @staticmethod
    def create(args: ServerArgs, runner: ModelRunner, tokenizer) -> "Scheduler":
        """A :class:`Scheduler`, or an ``OverlapScheduler`` when ``args.enable_overlap_schedule``
        (speculative decoding runs its verify steps without overlap)."""
        if args.enable_overlap_schedule and not args.speculative_algorithm:
            from radixlm.runtime.overlap_scheduler import OverlapScheduler

            return OverlapScheduler(args, runner, tokenizer)
        return Scheduler(args, runner, tokenizer)

    def __init__(self, args: ServerArgs, runner: ModelRunner, tokenizer) -> None:
        self.args = args
        self.runner = runner
        self.allocator = runner.allocator
        self.req_to_token_pool = runner.req_to_token_pool
        if args.disable_radix_cache:
            self.tree_cache: PrefixCache = NoOpPrefixCache(self.allocator, req_to_token_pool=self.req_to_token_pool)
        else:
            self.tree_cache = RadixCache(self.allocator, page_size=args.page_size, req_to_token_pool=self.req_to_token_pool)
        self.policy = SchedulePolicy(args.schedule_policy, self.tree_cache)
        self.output_processor = OutputProcessor(
            tokenizer, runner.eos_token_ids, runner.context_len, args.enable_jump_forward
        )
        self.grammar = GrammarBackend(tokenizer, runner.cfg.vocab_size, args.grammar_compile_timeout_s,
                                      backend=args.grammar_backend)
        runner.logits_mask_fn = self.grammar.mask_logits
        self._aborted: list[Req] = []  # requests finished during admission (bad grammar)
        self.ran_batch = False  # whether the last step ran a forward pass
        self.cur_batch: ScheduleBatch | None = None  # the batch being run (for abort_all)
        self._checked_idle = True  # integrity checked since the last work
        self.num_finished = 0  # requests finished so far (_finish): see ScheduleBatch.finished_mark
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.chunked_req: Req | None = None
        self.tokenizer = tokenizer
        self.reset_counters()
        self.isolate_turn = 0  # alternation of isolated decode steps (scheduler_recovery)

    def reset_counters(self) -> None:
        """Start the statistics, the KV reservation ratio, the mixed-chunk cost model's history
        and the speculative n-gram store afresh (at construction, and after the warm-up)."""
        args = self.args
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.stats = SchedulerStats()
        self._admitted_requests = 0
        self.spec_drafter = None  # speculative decoding (speculative_worker.py)
        if args.speculative_algorithm == "ngram":
            from radixlm.runtime.speculative_worker import NgramDrafter

            self.spec_drafter = NgramDrafter(args.speculative_num_draft_tokens, args.speculative_ngram_min_match_window_size,
                                             args.speculative_ngram_max_match_window_size, self.tokenizer,
                                             capacity=args.speculative_ngram_capacity)

    # ------------------------------------------------------------------ API
    def add_request(self, req: Req) -> None:
        """Queue a request. Raises ``ValueError`` when it can never fit the context or KV pool."""
        total = len(req.origin_input_ids) + req.sampling_params.max_new_tokens
        if len(req.origin_input_ids) == 0:
            raise ValueError("the prompt is empty")
        if len(req.origin_input_ids) >= self.runner.context_len:
            raise ValueError(
                f"the prompt has {len(req.origin_input_ids)} tokens; the context length is {self.runner.context_len}"
            )
        vocab = self.runner.cfg.vocab_size
        if min(req.origin_input_ids) < 0 or max(req.origin_input_ids) >= vocab:
            raise ValueError(f"input_ids must be token ids in [0, {vocab})")
        if len(req.origin_input_ids) + 1 > self.allocator.size:
            raise ValueError(f"the prompt needs more KV slots than the pool has ({self.allocator.size})")
        req.max_total = req.max_total or min(total, self.runner.context_len)
        self.output_processor.init_req(req)
        self.grammar.submit(req)
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked_req)

    def abort(self, rid: str, message: str = "aborted") -> Req | None:
        """Abort a request wherever it is; returns it (finished) or ``None`` when unknown."""
        for queue in (self.waiting, self.running):
            for req in queue:
                if req.rid == rid:
                    queue.remove(req)
                    self._finish(req, {"type": "abort", "message": message}, holds_kv=queue is self.running)
                    return req
        if self.chunked_req is not None and self.chunked_req.rid == rid:
            req, self.chunked_req = self.chunked_req, None
            self._finish(req, {"type": "abort", "message": message}, holds_kv=True)
            return req
        return None

    def step(self) -> list[Req]:
        """Run one batch; returns the requests that produced output or finished this step."""
        batch = self._select_batch()
        aborted = self._take_aborted()
        self.ran_batch = batch is not None
        if self.ran_batch:
            self.grammar.model_ran_at = time.monotonic()
        if batch is None:
            self._idle_check()
            return aborted
        return aborted + self._run_batch(batch)

    def _select_batch(self) -> ScheduleBatch | None:
        batch = None if self._waiting_on_compiles() else self._get_prefill_batch()
        if batch is None and self.running:
            batch = self._get_decode_batch()
        return batch

    def _waiting_on_compiles(self) -> bool:
        """True when nothing can be prefilled because every waiting request's grammar is still
        compiling: admission (priority order, prefix matches) is skipped then, so the loop that
        waits for the compile does not compete with it for the GIL. O(1) when some waiting
        request is ready (the scan stops at it); each pending compile is polled once per call
        (a burst of requests with one schema shares one future: one poll, not one per request)."""
        if not self.waiting or self.chunked_req is not None:
            return False
        pending: set[int] = set()  # ids of futures seen not done in this call
        for req in self.waiting:
            fut = req.grammar_future
            if fut is None or req.grammar_matcher is not None or req.grammar_error is not None:
                return False
            if id(fut) in pending:
                continue
            # NOTE: through grammar.poll, which tensor parallelism gates so that all ranks agree
            if self.grammar.poll(req) is not False:
                return False
            pending.add(id(fut))
        return not any(r.needs_extend for r in self.running)

    def _take_aborted(self) -> list[Req]:
        aborted, self._aborted = self._aborted, []
        return aborted

    def _run_batch(self, batch: ScheduleBatch) -> list[Req]:
        self._checked_idle = False
        self.cur_batch = batch
        try:
            outs = self.runner.run(batch)
        except Exception as e:  # NOTE: confine the failure to the request that caused it
            logger.exception("batch of %d failed", len(batch.slices))
            self.cur_batch = None
            return recover_failed_batch(self, batch, e)
        touched = self._process(batch, outs)
        self.cur_batch = None
        return touched

    def abort_all(self, message: str) -> list[Req]:
        """Abort every queued, running and in-flight request (e.g. after a failed step)."""
        return abort_everything(self, message)

    def server_info(self) -> dict:
        """Live counters: pool size and usage, cache hit rate, token counts, retractions."""
        st = self.stats
        return {
            "max_total_num_tokens": self.allocator.size,
            "context_length": self.runner.context_len,
            "max_running_requests": self.runner.max_running_requests,
            "cache_hit_rate": st.cache_hit_rate,
            "prompt_tokens": st.prompt_tokens,
            "cached_tokens": st.cached_tokens,
            "generated_tokens": st.generated_tokens,
            "num_retracted": st.num_retracted,
            "kv_available_tokens": self.allocator.available_size(),
            "kv_evictable_tokens": self.tree_cache.evictable_size(),
            # NOTE: one row is the model runner's reserved padding row
            "req_rows_available": self.req_to_token_pool.available_size(),
            "req_rows_total": self.req_to_token_pool.size - 1,
            **(self.spec_drafter.stats.as_dict() if self.spec_drafter is not None else {}),
        }

    def flush_cache(self) -> bool:
        """Empty the prefix cache; refused (False) while any request is queued or running."""
        if self.has_work():
            return False
        self.tree_cache.reset()
        return True

    # --------------------------------------------------------------- decode
    def _get_decode_batch(self) -> ScheduleBatch | None:
        need = len(self.running)
        if self._available() < need:
            self._retract(need)
        if not self.running:
            return None
        reqs = pick_decode_reqs(self, [r for r in self.running if not r.needs_extend])
        if not reqs:
            return None
        if self.spec_drafter is not None:
            from radixlm.runtime.speculative_worker import build_verify_batch

            drafts = self.spec_drafter.drafts(reqs, self._available())
            batch = build_verify_batch(self, reqs, drafts) if any(drafts) else None
            if batch is not None:
                self.new_token_ratio = max(MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)
                return batch
        slots = self._alloc(len(reqs))
        if slots is None:  # NOTE: one request alone outgrew the pool: it ends, the server goes on
            req = self.running.pop(0)
            self._finish(req, {"type": "abort", "status_code": 503, "message": "the KV cache pool is exhausted"},
                         holds_kv=True)
            self._aborted.append(req)
            return None
        # NOTE: one allocation and one table write for the whole batch (host overhead per step).
        self.req_to_token_pool.write_batch([r.req_pool_idx for r in reqs], [r.kv_len for r in reqs], slots)
        slices = [ReqSlice(req, req.kv_len, req.kv_len + 1, True) for req in reqs]
        self.new_token_ratio = max(MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)
        return ScheduleBatch(ForwardMode.DECODE, slices, out_cache_loc=slots, finished_mark=self.num_finished)

    def _retract(self, need: int) -> None:
        """Preempt running requests, largest KV first, until ``need`` slots can be had."""
        retract(self, need)

    # ------------------------------------------------------------- results
    def _process(self, batch: ScheduleBatch, outs: list[StepOutput]) -> list[Req]:
        if batch.mode == ForwardMode.DECODE and not batch.verify:
            return self._process_decode(batch, outs)
        if batch.mode == ForwardMode.EXTEND and not batch.verify:
            self.stats.num_prefill_batches += 1
            self.stats.num_mixed_batches += batch.num_decode > 0
        else:
            self.stats.num_decode_batches += 1
        touched = []
        first_decode = len(batch.slices) - batch.num_decode  # mixed batch: decode slices at the tail
        for i, (s, out) in enumerate(zip(batch.slices, outs)):
            req = s.req
            if req.finished:  # NOTE: finished while this decode batch was in flight (overlap)
                self.allocator.free(batch.out_cache_loc[i : i + 1])
                continue
            req.kv_len = s.end
            reason = self._process_row(req, s, out)
            if reason is not None:
                if req in self.running:
                    self.running.remove(req)
                self._finish(req, reason, holds_kv=True)
            elif not s.sample and s.end < req.num_tokens:
                self.tree_cache.cache_unfinished_req(req)
                self.chunked_req = req
            elif batch.mode == ForwardMode.EXTEND and i < first_decode and not batch.verify:
                # NOTE: the prompt enters the tree right after prefill, so requests admitted
                # next can share it while this one is still decoding.
                self.tree_cache.cache_unfinished_req(req)
                self.running.append(req)
            touched.append(req)
        return touched

    def _process_row(self, req: Req, s: ReqSlice, out: StepOutput) -> dict | None:
        """One slice's result through ``OutputProcessor.process`` (an error there ends only this
        request), with the step's bookkeeping; returns the finish reason or None."""
        try:
            reason = self.output_processor.process(req, s, out)
        except Exception as e:  # NOTE: a postprocessing error ends only this request
            logger.exception("postprocessing request %s failed", req.rid)
            reason = {"type": "abort", "status_code": 500, "message": f"internal error: {type(e).__name__}: {e}"}
        if s.draft_ids:
            from radixlm.runtime.speculative_worker import settle_verify_slice

            settle_verify_slice(self, s, out)  # NOTE: rejected drafts' slots go back here
        if out.next_token_id is not None:
            self.stats.generated_tokens += 1 + len(out.accepted_draft_ids)
        if s.end >= len(req.origin_input_ids):
            req.input_logprobs_done = True
        return reason

    def _process_decode(self, batch: ScheduleBatch, outs: list[StepOutput] | list[int]) -> list[Req]:
        """:meth:`_process` of a decode batch, columnar: the plain rows go through
        ``OutputProcessor.process_decode`` in one call (all of them in one pass when the batch's
        ``DecodeFacts`` say every row is plain), the others row by row; the finished requests
        leave ``running`` in one pass. Same request states and order as row by row. ``outs``
        may be the sampled ids alone (the overlap scheduler's decode steps)."""
        self.stats.num_decode_batches += 1
        slices = batch.slices
        if batch.finished_mark != self.num_finished and any(s.req.finish_reason is not None for s in slices):
            # NOTE: finished while this batch was in flight (overlap), or aborted since it was built
            keep = [i for i, s in enumerate(slices) if s.req.finish_reason is None]
            self.allocator.free(batch.out_cache_loc[[i for i, s in enumerate(slices) if s.req.finish_reason is not None]])
            slices, outs = [slices[i] for i in keep], [outs[i] for i in keep]
        ids = not outs or type(outs[0]) is int
        tokens = outs if ids else [o.next_token_id for o in outs]
        reasons, others = self.output_processor.process_decode(slices, tokens, batch.facts)
        reqs = [s.req for s in slices]
        self.stats.generated_tokens += len(reqs) - len(others)  # NOTE: plain rows sampled one token each
        for i in others:  # NOTE: _process_row sets input_logprobs_done after process()
            reason = self._process_row(reqs[i], slices[i], StepOutput(next_token_id=tokens[i]) if ids else outs[i])
            if reason is not None:
                reasons[i] = reason
        if reasons:
            done = {id(reqs[i]) for i in reasons}
            self.running = [r for r in self.running if id(r) not in done]
            for i in sorted(reasons):
                self._finish(reqs[i], reasons[i], holds_kv=True)
        return reqs

    def _finish(self, req: Req, reason: dict, holds_kv: bool) -> None:
        if holds_kv and req.req_pool_idx is not None:
            self.tree_cache.cache_finished_req(req)
        req.finish_reason = reason
        req.status = ReqStatus.FINISHED
        self.num_finished += 1
        self.output_processor.finish(req)

    def _idle_check(self) -> None:
        if not (self.has_work() or self._checked_idle):
            self._checked_idle = True
            log_integrity(self)
