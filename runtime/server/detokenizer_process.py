"""The detokenizer process: turns each step's token ids into text (incremental, UTF-8 safe,
stop strings trimmed, the same algorithm the scheduler uses to detect stops) and logprob token
texts, and forwards one :class:`BatchStrOut` per step to the tokenizer manager (plain outputs
as columns carrying their appended text)."""

from __future__ import annotations

import logging
import os
import time
import traceback
from multiprocessing.connection import Connection

import zmq

from radixlm.runtime.detokenizer import IncrementalDetokenizer, append_batch
from radixlm.runtime.server.io_struct import (
    BatchStrOut, BatchTokenIDOut, DetokInit, IpcPaths, MalformedMessage, StrOut, TokenIDOut, decode, encode,
)
from radixlm.runtime.server.procs import child_init, freeze_startup_objects
from radixlm.runtime.server.tracing import maybe_trace

logger = logging.getLogger("radixlm.detokenizer")


class _State:
    """One live request: its detokenizer, whether logprob entries get token texts, and how much
    of its text the tokenizer manager has (``sent``: plain outputs carry only what follows)."""

    __slots__ = ("detok", "text_in_logprobs", "sent")

    def __init__(self, detok: IncrementalDetokenizer, text_in_logprobs: bool) -> None:
        self.detok, self.text_in_logprobs, self.sent = detok, text_in_logprobs, 0


def _abort(rid: str, e: Exception, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> StrOut:
    return StrOut(rid, "", [], {"type": "abort", "status_code": 500, "message": f"detokenizer: {e}"},
                  prompt_tokens, cached_tokens, completion_tokens)


class DetokenizerManager:
    """Keeps one :class:`IncrementalDetokenizer` per live request id."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, _State] = {}
        self._single: dict = {}  # one-token window texts (IncrementalDetokenizer's single_cache)

    def _state(self, rid: str, init: DetokInit | None) -> _State:
        st = self.states.get(rid)
        if st is None:
            init = init or DetokInit(prompt_tail=[], stop=[])
            detok = IncrementalDetokenizer(self.tokenizer, init.prompt_tail, init.skip_special_tokens,
                                           init.spaces_between_special_tokens, init.stop, init.stop_regex,
                                           single_cache=self._single)
            st = self.states[rid] = _State(detok, init.text_in_logprobs)
        return st

    def _entries(self, items: list, with_text: bool) -> tuple[list, list]:
        text = (lambda i: self.tokenizer.decode([i])) if with_text else (lambda i: None)
        main, tops = [], []
        for lp, tid, top in items:
            main.append([lp, tid, text(tid)])
            tops.append(None if top is None else [[v, t, text(t)] for v, t in top])
        return main, tops

    def _finish_obj(self, st: _State, out: TokenIDOut) -> StrOut:
        """The per-request message for ``out`` (after its ids were appended)."""
        if out.finish_reason is not None:
            st.detok.flush()
            del self.states[out.rid]
        inp, inp_top = self._entries(out.new_input_logprobs, st.text_in_logprobs) if out.new_input_logprobs else ([], [])
        outp, out_top = self._entries(out.new_output_logprobs, st.text_in_logprobs) if out.new_output_logprobs else ([], [])
        text = st.detok.text
        st.sent = len(text)
        return StrOut(
            rid=out.rid, text=text, new_output_ids=out.new_output_ids, finish_reason=out.finish_reason,
            prompt_tokens=out.prompt_tokens, cached_tokens=out.cached_tokens,
            completion_tokens=out.completion_tokens, new_input_logprobs=inp, new_input_top=inp_top,
            new_output_logprobs=outp, new_output_top=out_top, spec_info=out.spec_info,
        )

    def process(self, out: TokenIDOut) -> StrOut:
        """One request's output as a :class:`StrOut` (cumulative text): the per-request path."""
        st = self._state(out.rid, out.detok)
        for tid in out.new_output_ids:
            st.detok.append(tid)
        return self._finish_obj(st, out)

    def process_batch(self, batch: BatchTokenIDOut) -> BatchStrOut:
        """One step: every request's new ids detokenized together (:func:`append_batch`); plain
        outputs (not finished, no logprob entries, no speculation figures, text not cut back)
        leave as columns carrying their appended text, the others as :class:`StrOut` objects. A
        request whose detokenization fails is aborted (500); the others go on."""
        res = BatchStrOut([], batch.snapshot)
        objs, rids, new_ids = batch.outputs, batch.plain_rids, batch.plain_new_ids
        sts: list[_State | None] = []
        for o in objs:
            try:
                sts.append(self._state(o.rid, o.detok))
            except Exception as e:  # NOTE: e.g. a bad DetokInit; only this request fails
                logger.exception("detokenizing %s failed", o.rid)
                res.outputs.append(_abort(o.rid, e, o.prompt_tokens, o.cached_tokens, o.completion_tokens))
                sts.append(None)
        n_obj, states, state = len(objs), self.states, self._state
        plain_sts = [states.get(rid) or state(rid, None) for rid in rids]
        failed = append_batch([st.detok if st is not None else None for st in sts] + [st.detok for st in plain_sts],
                              [o.new_output_ids if st is not None else () for o, st in zip(objs, sts)] + new_ids)
        texts: list[str | None] = []
        for st in plain_sts:  # NOTE: the hot loop: the text appended since the previous output
            detok = st.detok
            text = detok._text if detok._pending is None else detok.text
            sent = st.sent
            if len(text) >= sent:
                texts.append(text[sent:])
                st.sent = len(text)
            else:
                texts.append(None)
        if not failed and None not in texts:  # NOTE: the usual case: the columns go on as they came
            res.plain_rids, res.plain_text, res.plain_new_ids = rids, texts, new_ids
            res.plain_prompt_tokens, res.plain_cached_tokens, res.plain_completion_tokens = (
                batch.plain_prompt_tokens, batch.plain_cached_tokens, batch.plain_completion_tokens)
        else:
            for j, (rid, text, ids, p, c, n) in enumerate(zip(rids, texts, new_ids, batch.plain_prompt_tokens,
                                                              batch.plain_cached_tokens,
                                                              batch.plain_completion_tokens)):
                err = failed.get(n_obj + j)
                if err is None and text is not None:
                    res.add_plain(rid, text, ids, p, c, n)
                    continue
                try:
                    if err is not None:
                        raise err
                    # NOTE: a stop string cut back text already sent: the cumulative text replaces it
                    res.outputs.append(self._finish_obj(plain_sts[j], TokenIDOut(rid, ids, None, p, c, n)))
                except Exception as e:  # NOTE: one bad decode must not stop the others
                    logger.error("detokenizing %s failed: %s", rid, e)
                    states.pop(rid, None)
                    res.outputs.append(_abort(rid, e, p, c, n))
        for k, o in enumerate(objs):
            st = sts[k]
            if st is None:
                continue
            try:
                if k in failed:
                    raise failed[k]
                text = st.detok.text
                if (o.finish_reason is None and not o.new_input_logprobs and not o.new_output_logprobs
                        and not o.spec_info and len(text) >= st.sent):
                    res.add_plain(o.rid, text[st.sent:], o.new_output_ids, o.prompt_tokens, o.cached_tokens,
                                  o.completion_tokens)
                    st.sent = len(text)
                else:
                    res.outputs.append(self._finish_obj(st, o))
            except Exception as e:  # NOTE: one bad decode must not stop the others
                logger.error("detokenizing %s failed: %s", o.rid, e)
                states.pop(o.rid, None)
                res.outputs.append(_abort(o.rid, e, o.prompt_tokens, o.cached_tokens, o.completion_tokens))
        return res


def run_detokenizer_process(tokenizer_path: str, log_level: str, paths: IpcPaths, ready: Connection) -> None:
    """Process entry: load the tokenizer, report ready on ``ready``, then forward forever."""
    child_init(log_level, "detokenizer", paths.dir)
    # NOTE: one step's windows are decoded in one decode_batch call; keep it on this process's
    # core (no rayon pool spinning beside the scheduler) unless the user chose otherwise.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers import AutoTokenizer

        manager = DetokenizerManager(AutoTokenizer.from_pretrained(tokenizer_path))
        ctx = zmq.Context()
        recv = ctx.socket(zmq.PULL)
        recv.bind(paths.detokenizer_in)
        send = ctx.socket(zmq.PUSH)
        send.connect(paths.tokenizer_in)
    except Exception:
        ready.send({"status": "error", "message": traceback.format_exc()})
        raise SystemExit(1)
    freeze_startup_objects()  # NOTE: the tokenizer and transformers: out of full collections
    ready.send({"status": "ready"})
    ready.close()
    trace = maybe_trace("detokenizer")
    while True:
        try:
            batch = decode(recv.recv())
            if not isinstance(batch, BatchTokenIDOut):
                raise MalformedMessage(f"unexpected {type(batch).__name__}")
        except MalformedMessage as e:  # NOTE: log and drop; the detokenizer goes on
            logger.error("dropped a malformed message: %s", e)
            continue
        t0 = time.monotonic()
        send.send(encode(manager.process_batch(batch)))
        if trace is not None:
            trace.mark("detok", dur=time.monotonic() - t0, n=len(batch.outputs) + len(batch.plain_rids))
