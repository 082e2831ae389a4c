"""The detokenizer process: turns each step's token ids into text (incremental, UTF-8 safe,
stop strings trimmed, the same algorithm the scheduler uses to detect stops) and logprob token
texts, and forwards one :class:`BatchStrOut` per step to the tokenizer manager."""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

import zmq

from radixlm.runtime.detokenizer import IncrementalDetokenizer
from radixlm.runtime.server.io_struct import (
    BatchStrOut, BatchTokenIDOut, DetokInit, IpcPaths, MalformedMessage, StrOut, TokenIDOut, decode, encode,
)
from radixlm.runtime.server.procs import child_init

logger = logging.getLogger("radixlm.detokenizer")


@dataclass
class _State:
    detok: IncrementalDetokenizer
    text_in_logprobs: bool


class DetokenizerManager:
    """Keeps one :class:`IncrementalDetokenizer` per live request id."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, _State] = {}

    def _state(self, out: TokenIDOut) -> _State:
        st = self.states.get(out.rid)
        if st is None:
            init = out.detok or DetokInit(prompt_tail=[], stop=[])
            detok = IncrementalDetokenizer(self.tokenizer, init.prompt_tail, init.skip_special_tokens,
                                           init.spaces_between_special_tokens, init.stop, init.stop_regex)
            st = self.states[out.rid] = _State(detok, init.text_in_logprobs)
        return st

    def _entries(self, items: list, with_text: bool) -> tuple[list, list]:
        text = (lambda i: self.tokenizer.decode([i])) if with_text else (lambda i: None)
        main, tops = [], []
        for lp, tid, top in items:
            main.append([lp, tid, text(tid)])
            tops.append(None if top is None else [[v, t, text(t)] for v, t in top])
        return main, tops

    def process(self, out: TokenIDOut) -> StrOut:
        st = self._state(out)
        for tid in out.new_output_ids:
            st.detok.append(tid)
        if out.finish_reason is not None:
            st.detok.flush()
            del self.states[out.rid]
        inp, inp_top = self._entries(out.new_input_logprobs, st.text_in_logprobs)
        outp, out_top = self._entries(out.new_output_logprobs, st.text_in_logprobs)
        return StrOut(
            rid=out.rid, text=st.detok.text, new_output_ids=out.new_output_ids, finish_reason=out.finish_reason,
            prompt_tokens=out.prompt_tokens, cached_tokens=out.cached_tokens,
            completion_tokens=out.completion_tokens, new_input_logprobs=inp, new_input_top=inp_top,
            new_output_logprobs=outp, new_output_top=out_top, spec_info=out.spec_info,
        )


def run_detokenizer_process(tokenizer_path: str, log_level: str, paths: IpcPaths, ready: Connection) -> None:
    """Process entry: load the tokenizer, report ready on ``ready``, then forward forever."""
    child_init(log_level, "detokenizer", paths.dir)
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
    ready.send({"status": "ready"})
    ready.close()
    while True:
        try:
            batch = decode(recv.recv())
            if not isinstance(batch, BatchTokenIDOut):
                raise MalformedMessage(f"unexpected {type(batch).__name__}")
        except MalformedMessage as e:  # NOTE: log and drop; the detokenizer goes on
            logger.error("dropped a malformed message: %s", e)
            continue
        outs = []
        for out in batch.outputs + batch.plain():
            try:
                outs.append(manager.process(out))
            except Exception as e:  # NOTE: one bad decode must not stop the others
                logger.exception("detokenizing %s failed", out.rid)
                manager.states.pop(out.rid, None)
                outs.append(StrOut(out.rid, "", [], {"type": "abort", "status_code": 500,
                                                     "message": f"detokenizer: {e}"},
                                   out.prompt_tokens, out.cached_tokens, out.completion_tokens))
        send.send(encode(BatchStrOut(outs, batch.snapshot)))
