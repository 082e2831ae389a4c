"""Speculative decoding in the runtime: drafts per running request (scheduler side), logits
processing and verification of a verify step (model-runner side), and the KV bookkeeping after it.

A verify step replaces the decode step while ``speculative_algorithm="ngram"``: every running
request with a draft ``d_0..d_{k-1}`` gets a slice of ``1 + k`` positions (its last sampled token,
then the drafts, carried in ``ReqSlice.draft_ids`` since they are not output yet), KV slots for all
of them, and logits at all of them through the extend path. After verification
(:func:`radixlm.runtime.speculative_verify.verify_drafts`) the request keeps the KV of its last
token and of the accepted drafts; the slots of rejected positions go back to the allocator.
Requests without a draft decode as usual (a one-token slice in the same forward).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from radixlm.runtime.memory import to_device
from radixlm.runtime.speculative import NgramIndex, propose_with_source
from radixlm.runtime.speculative_store import NgramStore
from radixlm.runtime.speculative_verify import verify_drafts


@dataclass
class SpecStats:
    """Cumulative speculation counters (scheduler stats, ``server_info``, ``/metrics``).

    ``spec_verify_ct``: request-steps that verified a draft; ``spec_draft_tokens``: draft tokens
    proposed; ``spec_accepted_tokens``: draft tokens accepted (each step also emits one token of
    its own, so tokens per verify step = 1 + accepted / verify_ct)."""

    spec_verify_ct: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0

    @property
    def spec_accept_rate(self) -> float:
        return self.spec_accepted_tokens / self.spec_draft_tokens if self.spec_draft_tokens else 0.0

    @property
    def spec_accept_length(self) -> float:
        """Mean tokens emitted per verify step (accepted drafts + 1)."""
        return 1.0 + self.spec_accepted_tokens / self.spec_verify_ct if self.spec_verify_ct else 0.0

    def as_dict(self) -> dict[str, float]:
        return {"spec_verify_ct": self.spec_verify_ct, "spec_draft_tokens": self.spec_draft_tokens,
                "spec_accepted_tokens": self.spec_accepted_tokens, "spec_accept_rate": self.spec_accept_rate,
                "spec_accept_length": self.spec_accept_length}


def spec_meta_info(req: Any) -> dict[str, float]:
    """The request's speculation figures for ``meta_info`` ({} when no verify step carried a
    draft): ``spec_verify_ct``, ``spec_draft_tokens``, ``spec_accepted_tokens``, ``spec_accept_rate``."""
    if not req.spec_verify_ct:
        return {}
    return {"spec_verify_ct": req.spec_verify_ct, "spec_draft_tokens": req.spec_draft_tokens,
            "spec_accepted_tokens": req.spec_accepted_tokens,
            "spec_accept_rate": req.spec_accepted_tokens / max(req.spec_draft_tokens, 1)}


def speculates(req: Any) -> bool:
    """Whether ``req`` may get drafts: penalties depend on the tokens before each position and the
    verify step reads the model's own logits, so requests with frequency/presence/repetition
    penalties or a ``logit_bias`` decode one token at a time."""
    sp = req.sampling_params
    return not (sp.frequency_penalty or sp.presence_penalty or sp.repetition_penalty != 1.0 or sp.logit_bias)


# Tokens of finished requests written into the global store per drafting step at most (a long
# prompt is spread over several steps: ~0.3 us per token, so the per-step cost stays bounded).
STORE_FEED_PER_STEP = 1024
DEFAULT_STORE_CAPACITY = 1_000_000  # ServerArgs.speculative_ngram_capacity's default


class NgramDrafter:
    """Scheduler-side proposer: one :class:`NgramIndex` per request (kept in ``req.spec_index``)
    and, unless ``capacity`` is 0, one :class:`~radixlm.runtime.speculative_store.NgramStore` over
    the tokens of finished requests, shared by all requests (drafts from other requests).

    Args:
        num_draft_tokens: most drafts per request and step (``speculative_num_draft_tokens``).
        min_window / max_window: n-gram match windows.
        tokenizer: tokenizes grammar-forced strings (None: no forced drafts).
        capacity: tokens the global store holds (``speculative_ngram_capacity``); 0: no store;
            None: read ``sched.args.speculative_ngram_capacity`` at the first verify batch
            (:func:`build_verify_batch`; until then no store, and requests that finish meanwhile
            are kept for it).

    A request's prompt + output enter the store at the first drafting step after it finished
    (the drafter notices it among the requests it has seen; at most :data:`STORE_FEED_PER_STEP`
    tokens are written per step). Running requests' outputs are not shared before they finish.
    """

    def __init__(self, num_draft_tokens: int, min_window: int, max_window: int, tokenizer: Any = None,
                 capacity: int | None = None) -> None:
        self.k = num_draft_tokens
        self.min_window, self.max_window = min_window, max_window
        self.tokenizer = tokenizer
        self.stats = SpecStats()
        # NOTE: keyed by id(): insertion-ordered (finished requests enter the store in a fixed order)
        self._seen: dict[int, Any] = {}  # requests drafted for, until they finish and enter the store
        self._from_store: dict[int, Any] = {}  # requests whose last draft came from the store
        self.store_draft_ct = 0  # verify steps whose draft came from the store
        self.store_draft_tokens = 0  # their draft tokens
        self.store_accepted_tokens = 0  # of which accepted
        self.store, self.store_capacity = None, None
        if capacity is not None:
            self.set_store_capacity(capacity)

    def set_store_capacity(self, capacity: int) -> None:
        """(Re)build the global store with room for ``capacity`` tokens (0: off); it starts empty
        (requests seen before and not finished yet enter it when they finish)."""
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.store = NgramStore(capacity, self.min_window, self.max_window) if capacity else None
        self.store_capacity = capacity
        if not capacity:
            self._seen.clear()
            self._from_store.clear()

    def configure(self, args: Any) -> None:
        """Take ``speculative_ngram_capacity`` from the server args unless the capacity was given."""
        if self.store_capacity is None:
            self.set_store_capacity(getattr(args, "speculative_ngram_capacity", DEFAULT_STORE_CAPACITY))

    def clear_store(self) -> None:
        """Forget the other requests' tokens (benchmarks: no timed request sees earlier outputs)."""
        if self.store is not None:
            self.store.clear()
        self._seen.clear()
        self._from_store.clear()

    def draft(self, req: Any) -> list[int]:
        """The draft for one running request (possibly empty), at most ``k`` tokens and never
        more than the request may still emit minus one (the step always emits a token of its own)."""
        room = min(req.sampling_params.max_new_tokens - len(req.output_ids), req.max_total - req.num_tokens) - 1
        k = min(self.k, room)
        if k <= 0 or not speculates(req):
            return []
        index = req.spec_index
        if index is None:
            index = req.spec_index = NgramIndex(self.min_window, self.max_window)
        index.sync(req.origin_input_ids, req.output_ids)
        draft, source = propose_with_source(index, k, req.grammar_matcher, self.tokenizer, self.store)
        if source == "store":
            self._from_store[id(req)] = req
        elif self._from_store:
            self._from_store.pop(id(req), None)
        return draft

    def _collect_finished(self, reqs: Sequence[Any]) -> None:
        """Queue the prompt + output of requests seen earlier that have finished since; remember
        ``reqs``; write a bounded share of the queue. O(running requests) per step."""
        seen, store = self._seen, self.store
        done = [key for key, r in seen.items() if r.finished]
        for key in done:
            r = seen.pop(key)
            self._from_store.pop(key, None)
            store.add(r.origin_input_ids + r.output_ids)
        for r in reqs:
            seen[id(r)] = r
        store.feed(STORE_FEED_PER_STEP)

    def drafts(self, reqs: Sequence[Any], free_slots: int) -> list[list[int]]:
        """Drafts for ``reqs``; when the ``free_slots`` beyond one per request run short, later
        requests' drafts are cut (speculation never causes a retraction)."""
        if self.store is not None:
            self._collect_finished(reqs)
        elif self.store_capacity is None:  # NOTE: not configured yet: remember them for the store
            seen = self._seen
            for r in reqs:
                seen[id(r)] = r
            if len(seen) > 2 * len(reqs) + 256:  # NOTE: stays bounded if no verify batch ever comes
                for key in [key for key, r in seen.items() if r.finished]:
                    del seen[key]
        spare = free_slots - len(reqs)
        out = []
        for req in reqs:
            d = self.draft(req)[: max(spare, 0)] if spare > 0 else []
            spare -= len(d)
            out.append(d)
        return out

    def record(self, num_drafts: int, num_accepted: int, req: Any) -> None:
        """Count one verify step of ``req`` (per request and globally)."""
        if num_drafts:
            req.spec_verify_ct += 1
            req.spec_draft_tokens += num_drafts
            req.spec_accepted_tokens += num_accepted
            self.stats.spec_verify_ct += 1
            self.stats.spec_draft_tokens += num_drafts
            self.stats.spec_accepted_tokens += num_accepted
            if id(req) in self._from_store:
                self.store_draft_ct += 1
                self.store_draft_tokens += num_drafts
                self.store_accepted_tokens += num_accepted


# Up to this many requests, a verify batch writes req_to_token one slice (one copy kernel) per
# request; beyond, one indexed write whose row/position indices cost a host-to-device copy.
SLICE_WRITES_MAX_REQS = 3


def kept_kv_len(start: int, num_accepted: int, num_tokens: int) -> int:
    """KV positions a verify slice starting at ``start`` keeps: its last token and the accepted
    drafts, but none past the tokens the request really has (a finish among the accepted drafts
    drops the rest)."""
    return min(start + 1 + num_accepted, num_tokens)


# ------------------------------------------------------------------------ model-runner side
def mask_draft_rows(logits: torch.Tensor, reqs: Sequence[Any], drafts: Sequence[Sequence[int]],
                    offsets: Sequence[int], eos_ids: Sequence[int]) -> None:
    """In place on fp32 ``logits [sum(len(d) + 1), V]``: row ``off + j`` of a request gets what the
    sampler would apply after ``d_0..d_{j-1}``: EOS/stop ids blocked while ``min_new_tokens`` is
    pending, and the grammar mask of the matcher state after the prefix (the matcher is advanced
    through the draft, which was checked against it, and rolled back)."""
    vocab = logits.shape[1]
    for req, d, off in zip(reqs, drafts, offsets):
        sp = req.sampling_params
        pending = sp.min_new_tokens - len(req.output_ids)
        if pending > 0:
            banned = [t for t in list(eos_ids) + list(sp.stop_token_ids) if t < vocab]
            if banned:
                rows = torch.arange(off, off + min(pending, len(d) + 1), device=logits.device)
                logits[rows[:, None], to_device(banned, logits.device)[None, :]] = float("-inf")
    constrained = [(req, d, off) for req, d, off in zip(reqs, drafts, offsets) if req.grammar_matcher is not None]
    if not constrained:
        return
    from radixlm.grammar import apply_token_bitmask_inplace

    n_rows = sum(len(d) + 1 for _, d, _ in constrained)
    bitmask = torch.zeros((n_rows, (vocab + 31) // 32), dtype=torch.int32)
    index, r = [], 0
    for req, d, off in constrained:
        m = req.grammar_matcher
        accepted = 0
        for j in range(len(d) + 1):
            m.fill_next_token_bitmask(bitmask, r)
            index.append(off + j)
            r += 1
            if j < len(d):
                if not m.accept_token(d[j]):  # NOTE: drafts were cut by the grammar; stay safe
                    bitmask[r : r + len(d) - j].zero_()
                    index.extend(range(off + j + 1, off + len(d) + 1))
                    r += len(d) - j
                    break
                accepted += 1
        m.rollback(accepted)
    apply_token_bitmask_inplace(logits, to_device(bitmask, logits.device), to_device(index, logits.device))


def run_verify(logits: torch.Tensor, reqs: Sequence[Any], drafts: Sequence[Sequence[int]],
               eos_ids: Sequence[int], generator: torch.Generator | None) -> list[list[int]]:
    """Mask (:func:`mask_draft_rows`) and verify the rows of a verify step; returns per request
    the accepted drafts followed by one new token (see ``verify_drafts``)."""
    offsets, row = [], 0
    for d in drafts:
        offsets.append(row)
        row += len(d) + 1
    mask_draft_rows(logits, reqs, drafts, offsets, eos_ids)
    return verify_drafts(logits, reqs, drafts, generator)


def postprocess_verify(runner: Any, batch: Any, logits: torch.Tensor, per_slice: Sequence[tuple[int, list[int]]],
                       logprobs: torch.Tensor | None, sample_slices: list[int], outs: list) -> list[int]:
    """The model runner's part of a verify step: verify the slices of ``sample_slices`` that carry
    drafts (rows of ``logits`` per ``per_slice``), fill their ``StepOutput`` (accepted drafts,
    next token, logprobs from the raw ``logprobs`` rows when asked) and return the indices of
    the other sampling slices (sampled as usual)."""
    spec = [i for i in sample_slices if batch.slices[i].draft_ids]
    if not spec:
        return sample_slices
    rows = [per_slice[i][0] + j for i in spec for j in range(len(per_slice[i][1]))]
    if len(rows) == logits.shape[0] and rows[0] == 0 and rows[-1] == len(rows) - 1:
        vlogits = logits  # NOTE: every row is a draft row (batch 1, every request drafted): no view op
    elif rows == list(range(rows[0], rows[0] + len(rows))):
        vlogits = logits[rows[0] : rows[0] + len(rows)]
    else:
        vlogits = logits[to_device(rows, logits.device)]
    reqs = [batch.slices[i].req for i in spec]
    drafts = [batch.slices[i].draft_ids for i in spec]
    tokens = run_verify(vlogits, reqs, drafts, runner.eos_token_ids, runner.generator)
    for i, req, toks in zip(spec, reqs, tokens):
        out = outs[i]
        out.accepted_draft_ids, out.next_token_id = toks[:-1], toks[-1]
        if req.return_logprob and logprobs is not None and toks[-1] >= 0:
            row0 = per_slice[i][0]
            entries = [runner._logprob_entry(logprobs[row0 + m], t, req.top_logprobs_num) for m, t in enumerate(toks)]
            out.accepted_draft_logprobs = entries[:-1]
            out.next_logprob, out.next_top = entries[-1]
    return [i for i in sample_slices if not batch.slices[i].draft_ids]


# ---------------------------------------------------------------------------- scheduler side
def build_verify_batch(sched: Any, reqs: Sequence[Any], drafts: Sequence[Sequence[int]]) -> Any:
    """The verify step replacing a decode step: one slice of ``1 + len(draft)`` positions per
    request (KV slots allocated and written to the req_to_token table), as an EXTEND batch with
    ``verify=True``. Returns None when the slots cannot be had (the caller decodes plainly)."""
    from radixlm.runtime.batch import ReqSlice, ScheduleBatch
    from radixlm.runtime.forward_batch import ForwardMode

    if sched.spec_drafter.store_capacity is None:
        sched.spec_drafter.configure(sched.args)
    lens = [1 + len(d) for d in drafts]
    total, alloc = sum(lens), sched.allocator
    if alloc.available_size() < total:
        sched.tree_cache.evict(total - alloc.available_size())
    got = alloc.alloc_with_host(total)
    if got is None:
        return None
    slots, host = got
    pool, whole = sched.req_to_token_pool, len(reqs) == 1  # NOTE: batch 1: no slicing at all
    per_slice_writes = len(reqs) <= SLICE_WRITES_MAX_REQS
    if not per_slice_writes:
        rows = [r.req_pool_idx for r, n in zip(reqs, lens) for _ in range(n)]
        positions = [r.kv_len + j for r, n in zip(reqs, lens) for j in range(n)]
        pool.write_batch(rows, positions, slots)
    slices, off = [], 0
    for r, n, d in zip(reqs, lens, drafts):  # NOTE: each slice keeps its slots' host copy (settle)
        if per_slice_writes:
            pool.write(r.req_pool_idx, r.kv_len, slots if whole else slots[off : off + n])
        cpu = host if whole else host[off : off + n]
        slices.append(ReqSlice(r, r.kv_len, r.kv_len + n, True, slots=cpu, draft_ids=list(d)))
        off += n
    return ScheduleBatch(ForwardMode.EXTEND, slices, out_cache_loc=slots, verify=True)


def settle_verify_slice(sched: Any, s: Any, out: Any) -> None:
    """After a verify slice's output was processed: keep the KV of the accepted positions, give
    the slots of the rejected ones back to the allocator, set ``req.kv_len`` and count the step."""
    req = s.req
    accepted = len(out.accepted_draft_ids)
    keep = kept_kv_len(s.start, accepted, req.num_tokens)
    if keep < s.end and req.req_pool_idx is not None:
        sched.allocator.free(s.slots[keep - s.start :])  # host copy: no device read
    req.kv_len = min(keep, s.end)
    sched.spec_drafter.record(len(s.draft_ids), accepted, req)
