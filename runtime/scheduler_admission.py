"""Admission of waiting requests into prefill batches (the prefill half of :class:`Scheduler`).

A mixin: :class:`~radixlm.runtime.scheduler.Scheduler` inherits these methods and owns the state
they use (``waiting``, ``running``, ``chunked_req``, ``tree_cache``, ``allocator``,
``req_to_token_pool``, ``policy``, ``grammar``, ``stats``, ``new_token_ratio``). A prefill batch
takes, in order: running requests' jump-forward tokens, the unfinished chunked prefill, then waiting
requests by the schedule policy while KV (free + evictable, minus a reserve for running requests'
future tokens) and the token budget allow; with ``enable_mixed_chunk`` it also carries one decode
token of every other running request.
"""

from __future__ import annotations

from radixlm.runtime.batch import ReqSlice, ScheduleBatch
from radixlm.runtime.forward_batch import ForwardMode
from radixlm.runtime.memory import KVPool
from radixlm.runtime.mixed_chunk import MACHINE_BALANCE, mixed_chunk_budget, step_fixed_bytes
from radixlm.runtime.request import Req, ReqStatus
from radixlm.runtime.schedule_policy import req_ids, sharing_key
from radixlm.runtime.scheduler_recovery import abort_bad_grammars

# Default mixed-batch prefill: this many tokens for a model of MIXED_CHUNK_PARAMS parameters per
# rank, scaled inversely with the model's size (see ServerArgs.mixed_chunk_size).
MIXED_CHUNK_TOKENS, MIXED_CHUNK_PARAMS = 2048, 8e9
# A mixed step stops admitting where it would outgrow the decode CUDA graphs when at most this
# many requests wait, with at most twice the graphs' rows of tokens in all (see _flat_rows).
FLAT_WAITING_MAX = 64


class PrefillAdmission:
    """Prefill-batch construction for :class:`~radixlm.runtime.scheduler.Scheduler`."""

    _admitted_requests: int  # requests admitted at least once (the mixed-chunk cost model's mean)

    @staticmethod
    def _remaining_decode(r: Req) -> int:
        """Tokens ``r`` may still generate (its ``max_new_tokens`` within ``max_total``)."""
        return max(min(r.sampling_params.max_new_tokens, r.max_total - len(r.origin_input_ids))
                   - len(r.output_ids), 0)

    def _reserved_decode_tokens(self, reqs: list[Req]) -> int:
        """KV slots kept free for ``reqs``' future tokens: their remaining tokens times the ratio."""
        return int(sum(map(self._remaining_decode, reqs)) * self.new_token_ratio)

    @property
    def mixed_chunk_size(self) -> int:
        """Prefill tokens of a mixed batch: ``args.mixed_chunk_size``, or 2,048 per 8B parameters
        of this rank's model scaled inversely (about the same compute per mixed step), within
        [2048, chunked_prefill_size]."""
        got = getattr(self, "_mixed_chunk_size", None)
        if got is None:
            got = self.args.mixed_chunk_size
            if got is None:
                params = sum(p.numel() for p in self.runner.model.parameters())
                got = int(min(max(MIXED_CHUNK_TOKENS * MIXED_CHUNK_PARAMS / max(params, 1), MIXED_CHUNK_TOKENS),
                              max(self.args.chunked_prefill_size, MIXED_CHUNK_TOKENS)))
            self._mixed_chunk_size = got
        return got

    def _mixed_budget(self) -> int:
        """Prefill tokens of this step's mixed batch. ``mixed_chunk_size`` unless
        ``mixed_chunk_policy`` is ``cost`` (validated against the device's cost model) and some
        request was admitted; then, within that size,
        :func:`~radixlm.runtime.mixed_chunk.mixed_chunk_budget` for the decode batch the queue heads
        to: the KV that running requests hold (shared prefixes once) plus, for as many waiting
        requests as may still start, the mean uncached prompt of the requests admitted so far."""
        cap = self.mixed_chunk_size
        if self.args.mixed_chunk_policy != "cost" or not self._admitted_requests:
            return cap
        balance = MACHINE_BALANCE[self.runner.device.type]
        cost = getattr(self, "_decode_cost", None)
        if cost is None:
            c, params = self.runner.cfg, list(self.runner.model.parameters())
            cost = self._decode_cost = (
                sum(p.numel() for p in params),
                sum(p.numel() * p.element_size() for p in params),
                KVPool.bytes_per_token(c.num_hidden_layers, self.runner.model.tp.num_kv_heads, c.head_dim,
                                       self.runner.kv_dtype),
                step_fixed_bytes(c.num_hidden_layers, self.runner.device.type),
            )
        held = self.runner.max_total_tokens - self._available()
        room = max(self.runner.max_running_requests - len(self.running), 0)
        uncached = (self.stats.prompt_tokens - self.stats.cached_tokens) / self._admitted_requests
        params, weights, kv_per_token, fixed = cost
        return mixed_chunk_budget(params, weights, kv_per_token, held + min(len(self.waiting), room) * uncached, cap,
                                  balance, fixed_bytes=fixed)

    def _available(self) -> int:
        return self.allocator.available_size() + self.tree_cache.evictable_size()

    def _alloc(self, n: int):
        if self.allocator.available_size() < n:
            self.tree_cache.evict(n - self.allocator.available_size())
        return self.allocator.alloc(n)

    def _match_cap(self, req: Req) -> int:
        cap = req.num_tokens - 1  # the last token is always recomputed so its logits exist
        if req.return_logprob and not req.input_logprobs_done:
            cap = min(cap, req.logprob_start)
        return cap

    def _get_prefill_batch(self) -> ScheduleBatch | None:
        jumped = [r for r in self.running if r.needs_extend]
        if not self.waiting and self.chunked_req is None and not jumped:
            return None
        budget = min(self.args.chunked_prefill_size, self.args.max_prefill_tokens)
        if self.args.enable_mixed_chunk and self.running:  # NOTE: running decodes wait for this chunk
            budget = min(budget, self._mixed_budget())
        slices: list[ReqSlice] = []
        admitted: list[Req] = []
        for req in jumped:  # jump-forward tokens of running requests are prefilled first
            s = self._slice(req, budget)
            if s is None:
                break
            req.needs_extend = False
            self.running.remove(req)  # NOTE: back into running after this extend (_process)
            slices.append(s)
            budget -= s.length
        if self.chunked_req is not None:  # an unfinished chunked prefill goes first
            req, self.chunked_req = self.chunked_req, None
            s = self._slice(req, budget)
            if s is None:
                self.chunked_req = req
                return None
            slices.append(s)
            budget -= s.length
        abort_bad_grammars(self)
        self.policy.calc_priority(self.waiting)
        num_running = len(self.running) + len(slices)
        isolated = next((r for r in self.waiting if r.isolate), None)
        if isolated is not None and not slices:  # NOTE: a request under suspicion prefills alone
            candidates = [isolated]
        elif any(s.req.isolate for s in slices):
            candidates = []
        else:
            candidates = [r for r in self.waiting if not r.isolate]
        # NOTE: O(1) per candidate: the running requests' remaining tokens are summed once and
        # grow by each admitted request's; requests leave the queue in one pass after the loop
        # (_leaves_graphs is O(slices), only while at most FLAT_WAITING_MAX requests wait).
        flat = self._flat_rows(candidates, slices)
        remaining = None
        taken: set[int] = set()
        sharing: set = set()  # (match node, next tokens) of this batch's requests: see _admit
        for req in candidates:
            if budget <= 0 or self.chunked_req is not None:
                break
            if num_running + len(admitted) >= self.runner.max_running_requests:
                break
            if req.deprioritized and admitted:
                continue
            ready = self.grammar.poll(req)
            if isinstance(ready, str):  # NOTE: a bad grammar aborts only its own request
                taken.add(id(req))
                self._finish(req, {"type": "abort", "message": ready, "status_code": 400}, holds_kv=False)
                self._aborted.append(req)
                continue
            if not ready:
                continue
            if flat is not None and admitted and self._leaves_graphs(*flat, slices, req):
                break  # NOTE: the rest waits a step; this one replays the decode graphs
            if remaining is None:
                remaining = sum(map(self._remaining_decode, self.running))
            own = self._remaining_decode(req)
            got = self._admit(req, budget, remaining + own, sharing)
            if got is None:  # NOTE: shares an uncached prefix with a request of this batch
                continue
            if not got:
                break
            remaining += own
            taken.add(id(req))
            admitted.append(req)
            s = self._slice(req, budget)
            assert s is not None
            slices.append(s)
            budget -= s.length
            if req.isolate:
                break
        if taken:
            self.waiting[:] = [r for r in self.waiting if id(r) not in taken]
        if not slices:
            return None
        batch = ScheduleBatch(ForwardMode.EXTEND, slices)
        return self._finalize(batch, self._mix_decodes(batch) if self.args.enable_mixed_chunk else None)

    def _flat_rows(self, candidates: list[Req], slices: list[ReqSlice]) -> tuple[int, int] | None:
        """(rows, decode rows): the rows (decode rows included) past which a mixed step stops
        admitting, and its decode rows; or None (admit as the token budget allows). A few short
        arrivals beside running decodes (at most FLAT_WAITING_MAX waiting requests, their tokens
        and the decodes at most twice the decode graphs' rows) then replay the graphs over a step
        or two instead of one eager step,
        whose host launches cost several times its GPU work: H200, Llama-3.1-8B dims, 486 prefill
        tokens of 18 prompts beside 18-108 decodes took 33-59 ms eagerly (benchmarks/mixed_steps.py
        --load burst), 16 ms of it kernels. Larger queues keep eager chunks (GPU-efficient)."""
        graphs = self.runner.cuda_graph
        if graphs is None or not self.args.enable_mixed_chunk or len(candidates) > FLAT_WAITING_MAX:
            return None
        decodes = sum(1 for r in self.running if not (r.needs_extend or r.isolate))
        if not decodes:
            return None
        total = decodes + sum(s.length for s in slices) + sum(r.num_tokens for r in candidates)
        return (graphs.max_bs, decodes) if graphs.max_bs < total <= 2 * graphs.max_bs else None

    def _leaves_graphs(self, flat_rows: int, decodes: int, slices: list[ReqSlice], req: Req) -> bool:
        """Whether admitting ``req`` (its whole prompt, at most) takes a step that replays the
        decode graphs (``slices`` and ``decodes`` rows, within ``flat_rows``) past them."""
        rows = decodes + sum(s.length for s in slices)
        return (rows + req.num_tokens > flat_rows
                and self.runner.flat_decode_fits(rows, [(s.start, s.end) for s in slices]))

    def _mix_decodes(self, batch: ScheduleBatch):
        """Mixed batch: append a one-token decode slice for every running request, so a prefill
        does not stall decoding (SGLang's mixed chunk). Returns their slots (int64 ``[n]``), or
        None when there is nothing to mix or too little KV (decode then gets its own step)."""
        if any(s.req.isolate for s in batch.slices):
            return None
        reqs = [r for r in self.running if not (r.needs_extend or r.isolate)]
        if not reqs or self._available() < len(reqs):
            return None
        slots = self._alloc(len(reqs))
        if slots is None:
            return None
        self.req_to_token_pool.write_batch([r.req_pool_idx for r in reqs], [r.kv_len for r in reqs], slots)
        batch.slices.extend(ReqSlice(r, r.kv_len, r.kv_len + 1, True) for r in reqs)
        batch.num_decode = len(reqs)
        return slots

    def _admit(self, req: Req, budget: int, remaining: int, sharing: set | None = None) -> bool | None:
        """Match the prefix, lock it, take a req_to_token row. False when KV is short.

        ``remaining``: tokens the running requests, those admitted this step and ``req`` may still
        generate (a share ``new_token_ratio`` of them stays reserved).
        ``sharing``: keys of the requests admitted this step; None (nothing taken) when ``req``'s
        next ``in_batch_prefix_threshold`` uncached tokens, after the same cache node, are those of
        one of them: it waits a step and then finds that prefix cached instead of computing it
        again (SGLang's in-batch prefix caching; the cache-aware policies already order the queue
        so, this also covers ``fcfs`` and the long-queue fallback of ``lpm``)."""
        ids = req_ids(req)
        match = self.tree_cache.match_prefix(ids, end=self._match_cap(req), hint=self.policy.hint_for(req))
        prefix_len = len(match.indices)
        extend = req.num_tokens - prefix_len
        threshold = self.policy.in_batch_prefix_threshold
        if sharing is not None and threshold > 0 and extend > threshold and not self.tree_cache.disabled:
            key = sharing_key(match.last_node, ids[prefix_len : prefix_len + threshold])
            if key in sharing:
                return None
            sharing.add(key)
        need = min(extend, budget) + int(remaining * self.new_token_ratio)
        self.tree_cache.inc_lock_ref(match.last_node)
        if need > self._available() or self.req_to_token_pool.available_size() == 0:
            self.tree_cache.dec_lock_ref(match.last_node)
            return False
        req.req_pool_idx = self.req_to_token_pool.alloc()
        self.req_to_token_pool.write(req.req_pool_idx, 0, match.indices)
        req.prefix_indices, req.last_node, req.kv_len = match.indices, match.last_node, prefix_len
        if not req.admitted_once:
            req.admitted_once = True
            self._admitted_requests += 1
            req.cached_tokens = prefix_len
            self.stats.prompt_tokens += len(req.origin_input_ids)
            self.stats.cached_tokens += prefix_len
        req.status = ReqStatus.RUNNING
        return True

    def _slice(self, req: Req, budget: int) -> ReqSlice | None:
        """The next part of ``req``'s prefill within ``budget`` new tokens, slots allocated."""
        total = req.num_tokens
        end = min(total, req.kv_len + budget)
        if end <= req.kv_len:
            return None
        slots = self._alloc(end - req.kv_len)
        if slots is None:
            return None
        self.req_to_token_pool.write(req.req_pool_idx, req.kv_len, slots)
        done = req.input_logprobs_done or not req.return_logprob
        lp_from, lp_to = (0, 0) if done else (req.logprob_start, len(req.origin_input_ids) - 1)
        sample = end == total and req.sampling_params.max_new_tokens > len(req.output_ids)
        s = ReqSlice(req, req.kv_len, end, sample, lp_from, lp_to)
        s.slots = slots
        return s

    def _finalize(self, batch: ScheduleBatch, decode_slots=None) -> ScheduleBatch:
        import torch

        slots = [s.slots for s in batch.slices[: len(batch.slices) - batch.num_decode]]
        if decode_slots is not None:
            slots.append(decode_slots)
        batch.out_cache_loc = torch.cat(slots) if slots else None
        return batch
