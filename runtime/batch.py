"""One scheduler step's batch: which requests run, how many new tokens each, and where logits are
needed. Built by the scheduler from ``Req`` objects; turned into tensors by the model runner."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from radixlm.runtime.forward_batch import ForwardMode
from radixlm.runtime.request import Req


@dataclass(slots=True)
class ReqSlice:
    """The part of one request computed this step: ``all_ids[start:end]`` with KV written at
    positions ``start..end-1``. ``sample`` is True when ``end`` reaches the end of the request's
    tokens (a next token is drawn). Positions ``p`` in ``[logprob_from, logprob_to)`` yield the
    input logprob of ``all_ids[p + 1]`` (an empty range when none are asked for).
    ``draft_ids`` (speculative verify step): draft tokens that follow ``all_ids[start:]`` in this
    slice (not yet output); every position of the slice then yields logits. Slotted, with an
    immutable ``draft_ids`` default: a decode step builds one per running request."""

    req: Req
    start: int
    end: int
    sample: bool
    logprob_from: int = 0
    logprob_to: int = 0
    slots: object = None  # int64 [length] KV slots of this slice (prefill: device; verify: host copy)
    draft_ids: Sequence[int] = ()

    @property
    def length(self) -> int:
        return self.end - self.start

    def token_ids(self) -> list[int]:
        """The slice's input token ids: the request's tokens, then the drafts."""
        if not self.draft_ids:
            return self.req.token_slice(self.start, self.end)
        return self.req.token_slice(self.start, self.end - len(self.draft_ids)) + list(self.draft_ids)

    def logit_positions(self) -> list[int]:
        """Absolute positions whose logits this step needs."""
        if self.draft_ids:
            return list(range(self.end - 1 - len(self.draft_ids), self.end))
        lo, hi = max(self.logprob_from, self.start), min(self.logprob_to, self.end)
        positions = list(range(lo, hi)) if lo < hi else []
        if self.sample and (not positions or positions[-1] != self.end - 1):
            positions.append(self.end - 1)
        return positions


@dataclass
class ScheduleBatch:
    """A prefill (EXTEND) or decode batch. ``out_cache_loc`` holds the slots allocated for the
    new tokens, in request order (int64 tensor ``[sum of lengths]``). A mixed batch is an EXTEND
    batch whose last ``num_decode`` slices are one-token decode steps of running requests."""

    mode: ForwardMode
    slices: list[ReqSlice]
    out_cache_loc: object = None
    num_decode: int = 0
    verify: bool = False  # speculative verify step: an EXTEND batch of running requests only
    drop: set[int] = field(default_factory=set)  # overlap: id()s of requests whose token is void
    host_loc: object = None  # overlap: CPU copy of out_cache_loc (frees without reading the device)
    facts: "DecodeFacts | None" = None  # DECODE: facts of its request set (None: not worked out)
    # Scheduler.num_finished when the batch was built (-1: unknown): a request of the batch can
    # have finished since (overlap: while in flight; an abort) only if that count has moved
    finished_mark: int = -1

    @property
    def reqs(self) -> list[Req]:
        return [s.req for s in self.slices]

    @property
    def num_tokens(self) -> int:
        return sum(s.length for s in self.slices)


@dataclass(slots=True)
class DecodeFacts:
    """What a DECODE batch's request set implies for every step it decodes unchanged (same
    requests, same order: the overlap scheduler's follow-up steps carry it along), worked out once
    by :meth:`of` from settings that never change while a request runs (its sampling parameters,
    ``plain_check``, its grammar matcher, its ``req_to_token`` row).

    reqs: the requests, in row order (read-only).
    rows: their ``req_pool_idx`` (the rows of ``req_to_token``), in the same order.
    greedy: every request samples greedily (the sampler takes the row-wise argmax alone).
    grammar: some request is grammar-constrained.
    plain: every request's rows take the columnar path of ``OutputProcessor.process_decode``.
    host_always: some request needs host-side logits processing every step (logprobs, penalties).
    host_until: ``(req, n)`` of the requests that need it while their output is shorter than ``n``
        (a pending ``min_new_tokens``).
    spare: overlap: the slices of the step before the last one (processed, so free to reuse for
        the next step: a follow-up then allocates no ``ReqSlice``), or None.
    stops: plain: the union of the requests' stop ids (``plain_check[0]``): a step whose tokens
        miss it finished no request by a stop id.
    room: plain: ``(req, n, k)``: when ``req`` had ``n`` outputs, no request was closer than
        ``k`` tokens to its length limit (``plain_check[1]``); None: not worked out.
    columns: the rows' ``sampler.SamplingColumns`` (a batch that samples, not greedy; built on
        its first step; False: its settings are not numbers), or None.
    next_index: overlap: the ``req_to_token`` entries (``ReqToTokenPool.flat_index``, on its
        device) of the next follow-up's new tokens; each follow-up adds 1 (or None: not built yet).
    """

    reqs: list[Req]
    rows: list[int]
    greedy: bool
    grammar: bool
    plain: bool
    host_always: bool
    host_until: list[tuple[Req, float]]
    spare: list[ReqSlice] | None = None
    stops: frozenset = frozenset()
    room: tuple | None = None
    columns: object = None
    next_index: object = None

    @classmethod
    def of(cls, reqs: list[Req]) -> "DecodeFacts":
        greedy = plain = True
        grammar = host_always = False
        host_until = []
        for r in reqs:
            greedy = greedy and r.sampling_params.is_greedy
            has_grammar = r.grammar_matcher is not None
            grammar = grammar or has_grammar
            plain = plain and r.plain_check is not None and not has_grammar
            until = host_logits_until(r)
            if until == float("inf"):
                host_always = True
            elif until > 0:
                host_until.append((r, until))
        facts = cls(reqs, [r.req_pool_idx for r in reqs], greedy, grammar, plain, host_always, host_until)
        if plain:
            facts.stops = frozenset().union(*(r.plain_check[0] for r in reqs))
        return facts

    def length_room(self, slices: list[ReqSlice]) -> int:
        """plain: how many more tokens every request of ``slices`` (a subset of ``reqs``, which
        all decode in step) takes before one may reach its length limit (0: one may now)."""
        room = self.room
        if room is None or room[0].finish_reason is not None:  # NOTE: worked out again when its anchor is gone
            req = slices[0].req
            k = min(s.req.plain_check[1] - len(s.req.output_ids) for s in slices)
            room = self.room = (req, len(req.output_ids), k)
        return room[2] - (len(room[0].output_ids) - room[1])

    def needs_host_logits(self) -> bool:
        """Whether some request's next token needs host-side logits processing."""
        return self.host_always or any(len(r.output_ids) < n for r, n in self.host_until)


def host_logits_until(req: Req) -> float:
    """The output length below which ``req``'s next token needs host-side logits processing
    (logprobs, penalties, a logit bias: always, ``inf``; a pending ``min_new_tokens``: until it is
    reached).
    Worked out once per request (``Req.host_logits_until``): its settings never change."""
    until = req.host_logits_until
    if until is None:
        sp = req.sampling_params
        static = (req.return_logprob or sp.frequency_penalty or sp.presence_penalty
                  or sp.repetition_penalty != 1.0 or sp.logit_bias)
        until = req.host_logits_until = float("inf") if static else sp.min_new_tokens - 1
    return until


@dataclass
class StepOutput:
    """What the model runner returns for one request of a batch (plain Python values).

    next_token_id: sampled token, or ``None`` when the slice did not reach the request's end.
    next_logprob / next_top: logprob of that token and ``[(logprob, id), ...]`` top entries.
    input_logprobs: ``{position p: (logprob of all_ids[p+1], top list)}`` for requested positions.
    accepted_draft_ids / accepted_draft_logprobs: verify step: the accepted drafts, emitted before
    ``next_token_id``, with their ``(logprob, top)`` when logprobs are asked for.
    """

    next_token_id: int | None = None
    next_logprob: float | None = None
    next_top: list[tuple[float, int]] | None = None
    input_logprobs: dict[int, tuple[float, list[tuple[float, int]] | None]] = field(default_factory=dict)
    accepted_draft_ids: list[int] = field(default_factory=list)
    accepted_draft_logprobs: list[tuple[float, list[tuple[float, int]] | None]] = field(default_factory=list)
