"""Per-step bookkeeping of results: append sampled tokens, collect logprobs, detokenize
incrementally and decide when a request finishes (EOS, stop ids, stop strings, length)."""

from __future__ import annotations

from typing import Sequence

from radixlm.runtime.batch import DecodeFacts, ReqSlice, StepOutput
from radixlm.runtime.detokenizer import IncrementalDetokenizer
from radixlm.runtime.request import Req

FORCED_IDS_CACHE = 4096  # jump-forward: forced strings whose token ids are kept (cleared when full)
# Jump-forward leaves a forced run of fewer tokens to the model: under overlap scheduling (the CUDA
# default) a jump costs the request one step (its in-flight token is dropped), so a one-token jump
# saves nothing there; one rule for both schedulers keeps their outputs equal.
MIN_JUMP_TOKENS = 2


class OutputProcessor:
    """Applies one step's :class:`StepOutput` to its request.

    Per request it keeps (typed ``Req`` fields): ``detok`` (IncrementalDetokenizer), ``logprob_start``
    (absolute position of the first input-logprob entry), ``input_logprobs`` and
    ``output_logprobs`` lists of ``(logprob | None, token_id, top | None)``.
    """

    def __init__(self, tokenizer, eos_token_ids: Sequence[int], context_len: int, jump_forward: bool = False) -> None:
        self.tokenizer = tokenizer
        self.eos = set(eos_token_ids)
        self.context_len = context_len
        self.jump_forward = jump_forward
        self._forced_ids: dict[str, list[int]] = {}  # jump-forward: forced text -> its token ids
        self.single_cache: dict = {}  # one-token window texts, shared by this processor's detokenizers

    def init_req(self, req: Req) -> None:
        sp = req.sampling_params
        prompt_len = len(req.origin_input_ids)
        start = req.logprob_start_len
        if start is None or start < 0:
            start = prompt_len - 1 if sp.max_new_tokens > 0 else prompt_len
        req.logprob_start = min(start, prompt_len)
        req.input_logprobs = []
        req.output_logprobs = []
        req.plain_check = None
        # NOTE: without a grammar (no jump-forward) every id appended to output_ids is also one
        # the detokenizer must see: a lazy one reads them there (no append per decode row)
        grammar = sp.grammar is not None
        if self.tokenizer is None:  # skip_tokenizer_init: ids only
            req.detok = None
        else:
            req.detok = self._detokenizer(req, None if grammar else req.output_ids)
        if not (req.return_logprob or grammar) and (req.detok is None or not (req.detok.stop or req.detok.stop_regex)):
            stop = set(sp.stop_token_ids) | (set() if sp.ignore_eos else self.eos)
            # NOTE: exactly the conditions under which finish_reason() ends a plain request
            req.plain_check = (frozenset(stop), min(sp.max_new_tokens, self.context_len - prompt_len))

    def _detokenizer(self, req: Req, source: list[int] | None) -> IncrementalDetokenizer:
        sp = req.sampling_params
        return IncrementalDetokenizer(
            self.tokenizer,
            req.origin_input_ids,
            sp.skip_special_tokens,
            sp.spaces_between_special_tokens,
            sp.stop,
            sp.stop_regex or (),
            lazy=True,  # NOTE: decoded only when the text is read (never in the server's scheduler)
            single_cache=self.single_cache,
            source=source,  # NOTE: lazy only: then it reads the ids from the request's output_ids
        )

    def process_decode(self, slices: Sequence[ReqSlice], tokens: Sequence[int | None],
                       facts: DecodeFacts | None = None) -> tuple[dict[int, dict], list[int]]:
        """Columnar :meth:`process` of one decode step's rows: ``slices[i]`` sampled
        ``tokens[i]``; each row's ``req.kv_len`` becomes its slice's end (the step's KV
        bookkeeping, in the same pass). A row is plain when its request has ``plain_check`` (no
        logprobs, stop strings nor grammar: its lazy detokenizer reads ``output_ids``) and a valid
        token: the token is appended and one set lookup and one comparison decide whether the
        request may have finished (then :meth:`finish_reason` says why). ``facts``: the batch's
        ``DecodeFacts``, when known; when every row is plain (``facts.plain``) the rows are not
        checked one by one, and the finish checks run only when some token is a stop id of some
        request (``facts.stops``) or some request may have reached its length limit
        (``facts.length_room``). The request states are those :meth:`process` leaves. Returns
        ``({row: finish reason}, rows left to process())``."""
        reasons: dict[int, dict] = {}
        others: list[int] = []
        if facts is not None and facts.plain and slices and min(tokens) >= 0:  # NOTE: the usual decode step
            for s, t in zip(slices, tokens):
                req = s.req
                req.kv_len = s.end
                req.output_ids.append(t)
            if facts.length_room(slices) <= 0 or not facts.stops.isdisjoint(tokens):
                for i, (s, t) in enumerate(zip(slices, tokens)):
                    req = s.req
                    check = req.plain_check
                    if t in check[0] or len(req.output_ids) >= check[1]:
                        reasons[i] = self.finish_reason(req, t)
            return reasons, others
        for i, (s, t) in enumerate(zip(slices, tokens)):
            req = s.req
            req.kv_len = s.end
            check = req.plain_check
            if check is None or req.grammar_matcher is not None or t is None or t < 0:
                others.append(i)
                continue
            out = req.output_ids
            out.append(t)
            if t in check[0] or len(out) >= check[1]:
                reasons[i] = self.finish_reason(req, t)
        return reasons, others

    def process(self, req: Req, s: ReqSlice, out: StepOutput) -> dict | None:
        """Record ``out``; returns the finish reason dict when the request is done, else None."""
        if req.return_logprob and not req.input_logprobs_done:
            self._collect_input_logprobs(req, s, out)
        token = out.next_token_id
        if token is None:
            if s.end >= req.num_tokens and req.sampling_params.max_new_tokens <= len(req.output_ids):
                return {"type": "length", "length": len(req.output_ids)}
            return None
        if token < 0:  # NOTE: the sampler could not sample this row (see sampler.BAD_TOKEN)
            return {"type": "abort", "status_code": 400,
                    "message": "sampling failed: the next-token distribution is not finite "
                               "(check temperature, penalties and the constraint)"}
        matcher = req.grammar_matcher
        drafts, draft_lps = out.accepted_draft_ids, out.accepted_draft_logprobs
        if not drafts and matcher is None and not req.return_logprob:  # NOTE: the usual decode row
            req.output_ids.append(token)
            return self._check_finish(req, token)
        # NOTE: a verify step emits its accepted drafts first; tokens after a finish are dropped.
        for m, tok in enumerate([*drafts, token] if drafts else [token]):
            req.output_ids.append(tok)
            if req.return_logprob:
                lp, top = (out.next_logprob, out.next_top) if m == len(drafts) else draft_lps[m]
                req.output_logprobs.append((lp, tok, top))
            if matcher is not None and not matcher.accept_token(tok):
                return {"type": "abort", "message": f"token {tok} violates the request's grammar"}
            reason = self._check_finish(req, tok)
            if reason is not None:
                return reason
        if matcher is not None and self.jump_forward and not req.return_logprob:
            reason = self._jump_forward(req, matcher)
        return reason

    def _jump_forward(self, req: Req, matcher) -> dict | None:
        """Compressed-FSM jump-forward (SGLang paper §4.3): append the string the grammar forces
        without sampling. Its tokens come from the tokenizer, so they are what it would produce for
        that text; the scheduler prefills them next step (``req.needs_extend``)."""
        text = matcher.find_jump_forward_string()
        if not text:
            return None
        room = req.sampling_params.max_new_tokens - len(req.output_ids)
        ids = self._forced_ids.get(text)
        if ids is None:  # NOTE: forced strings repeat (keys, separators): tokenized once each
            if len(self._forced_ids) >= FORCED_IDS_CACHE:
                self._forced_ids.clear()
            ids = self._forced_ids[text] = self.tokenizer.encode(text, add_special_tokens=False)
        ids = ids[: max(room, 0)]
        if len(ids) < MIN_JUMP_TOKENS:  # NOTE: the rules below only shorten it: no matcher work
            return None
        accepted = 0
        for tid in ids[:-1]:
            if not matcher.accept_token(tid):
                break
            accepted += 1
        # NOTE (retokenization rule, docs/grammar.md): the forced text's last token is jumped only
        # when no allowed token is longer, i.e. none could span the end of the forced text and
        # the free text after it (`"` + `John` -> `"John`); otherwise the model samples it.
        if accepted == len(ids) - 1 and ids:
            longer = getattr(matcher, "allows_longer_token", None)  # NOTE: peers' matchers cannot tell
            if longer is not None and not longer(ids[-1]) and matcher.accept_token(ids[-1]):
                accepted += 1
            else:
                ids = ids[:-1]
        if accepted < len(ids):  # the tokenizer's split is not one the grammar accepts token by token
            matcher.rollback(accepted)
            return None
        if not ids:
            return None
        if len(ids) < MIN_JUMP_TOKENS:  # NOTE: too short to save a step (see MIN_JUMP_TOKENS)
            matcher.rollback(len(ids))
            return None
        req.needs_extend = True
        req.jump_forward_tokens += len(ids)
        reason = None
        for tid in ids:
            req.output_ids.append(tid)
            reason = reason or self._check_finish(req, tid)
        return reason

    def _collect_input_logprobs(self, req: Req, s: ReqSlice, out: StepOutput) -> None:
        entries = req.input_logprobs
        start = req.logprob_start
        if s.start <= start < s.end and start < len(req.origin_input_ids):
            entries.append((None, req.origin_input_ids[start], None))
        for p in sorted(out.input_logprobs):
            lp, top = out.input_logprobs[p]
            entries.append((lp, req.origin_input_ids[p + 1], top))

    def _check_finish(self, req: Req, token: int) -> dict | None:
        if req.detok is not None:
            req.detok.append(token)
        return self.finish_reason(req, token)

    def finish_reason(self, req: Req, token: int) -> dict | None:
        """Why ``req`` ends now that ``token`` is its last output (and its detokenizer has seen
        it): stop ids, EOS, stop strings, grammar end, ``max_new_tokens``, context; else None."""
        sp = req.sampling_params
        detok: IncrementalDetokenizer | None = req.detok
        if token in sp.stop_token_ids:
            return {"type": "stop", "matched": token}
        if token in self.eos and not sp.ignore_eos:
            return {"type": "stop", "matched": token}
        if detok is not None and detok.matched_stop is not None:
            return {"type": "stop", "matched": detok.matched_stop}
        if detok is not None and detok.stop_error is not None:
            return {"type": "abort", "status_code": 400, "message": detok.stop_error}
        grammar = req.grammar_matcher
        if grammar is not None and grammar.is_terminated():
            return {"type": "stop", "matched": None}
        if len(req.output_ids) >= sp.max_new_tokens:
            return {"type": "length", "length": sp.max_new_tokens}
        if len(req.origin_input_ids) + len(req.output_ids) >= self.context_len:  # req.num_tokens
            return {"type": "length", "length": len(req.output_ids)}
        return None

    def finish(self, req: Req) -> None:
        """Flush held-back text at the end of a request."""
        if req.detok is not None:
            req.detok.flush()
