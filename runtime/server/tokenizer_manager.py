"""The tokenizer manager (main process, asyncio): validates and tokenizes requests, sends them to
the scheduler, and collects the detokenizer's per-step outputs into per-request state."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from radixlm.runtime.request import sample_rids
from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.server.config import ServerConfig
from radixlm.runtime.server.disconnect_watch import DISCONNECTED, DisconnectWatcher
from radixlm.runtime.server.io_struct import (
    AbortReq, BatchStrOut, ControlReply, ControlReq, DetokInit, IpcPaths, MalformedMessage, SchedulerSnapshot,
    StrOut, TokenizedGenerateReq, decode, encode,
)
from radixlm.runtime.server.metrics import ServerMetrics
from radixlm.runtime.server.protocol import MAX_TOP_LOGPROBS
from radixlm.runtime.server.req_state import ReqState, observe_many  # noqa: F401 (ReqState: re-exported)
from radixlm.runtime.server.tokenize_batch import TokenizeBatcher
from radixlm.runtime.server.tracing import maybe_trace

logger = logging.getLogger("radixlm.tokenizer_manager")

DISCONNECT_POLL_S = 0.5


class RequestError(Exception):
    """A request the server refuses: ``status`` 400 (bad input) or 503 (overloaded)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param = message, status, param


@dataclass
class GenSpec:
    """One prompt of a submission (before ``n`` expansion)."""

    input_ids: list[int]
    sampling_params: SamplingParams  # validated at the edge (protocol.py)
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    rid: str | None = None
    cache_lease: dict | None = None  # {"id": str, "ttl_s": float} (docs/server.md)
    # NOTE: SGLang/OpenAI: an explicit max_new_tokens past the context is refused; the default
    # (``clamp_max_new``) is clamped to the context by the scheduler instead.
    clamp_max_new: bool = False


class TokenizerManager:
    """Talks to the scheduler (PUSH) and hears from the detokenizer and scheduler (PULL).

    Args:
        config: the server configuration.
        paths: the instance's IPC endpoints.
        tokenizer: the HF tokenizer.
        info: the scheduler's ready report (``context_len``, ``max_total_tokens``, ...).
    """

    _trace = None  # NOTE: the RADIXLM_TRACE_DIR timeline (set in __init__ when enabled)

    def __init__(self, config: ServerConfig, paths: IpcPaths, tokenizer, info: dict) -> None:
        self.config, self.paths, self.tokenizer, self.info = config, paths, tokenizer, info
        self.context_len: int = info["context_len"]
        self.max_total_tokens: int = info["max_total_tokens"]
        self.model_name = config.served_model_name or str(config.model_path)
        self.metrics = ServerMetrics(self.model_name)
        self.states: dict[str, ReqState] = {}
        self.snapshot: SchedulerSnapshot | None = None
        self._control: dict[str, asyncio.Future] = {}
        self._disconnects = DisconnectWatcher(DISCONNECT_POLL_S)
        self._send = zmq.Context.instance().socket(zmq.PUSH)
        self._send.connect(paths.scheduler_in)
        self._recv: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task | None = None
        self._trace = maybe_trace("http")  # NOTE: RADIXLM_TRACE_DIR only
        self._lag_task: asyncio.Task | None = None
        self.groups: dict[str, list[str]] = {}  # submitted rid -> its sample rids (n > 1)
        # NOTE: tokenization and template rendering run here, never on the event loop
        self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="radixlm-tokenize")
        self.batcher = TokenizeBatcher(tokenizer, self.run_off_loop)  # NOTE: arrivals, batched

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Bind the receive socket and start the receive loop (call inside the server's loop).
        Messages the children pushed earlier wait in their PUSH queues until the bind."""
        if self._task is None:
            self._recv = zmq.asyncio.Context.instance().socket(zmq.PULL)
            self._recv.bind(self.paths.tokenizer_in)
            self._task = asyncio.get_running_loop().create_task(self._recv_loop())
            if self._trace is not None:
                self._lag_task = asyncio.get_running_loop().create_task(self._trace.probe_loop_lag())

    async def _recv_loop(self) -> None:
        while True:
            try:
                msg = decode(await self._recv.recv())
            except MalformedMessage as e:  # NOTE: log and drop
                logger.error("dropped a malformed message: %s", e)
                continue
            try:
                if isinstance(msg, BatchStrOut):
                    self._on_batch(msg)
                elif isinstance(msg, ControlReply):
                    fut = self._control.pop(msg.req_id, None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg.payload)
            except Exception:  # NOTE: keep receiving; one malformed output must not stop the server
                logger.exception("handling scheduler output failed")

    def _on_batch(self, msg: BatchStrOut) -> None:
        """Apply one step's outputs: the per-request objects, then the plain columns."""
        self.snapshot = msg.snapshot
        self.metrics.observe_snapshot(msg.snapshot)
        if self._trace is not None:
            self._trace.mark("batch", n=len(msg.outputs) + len(msg.plain_rids))
        now = time.perf_counter()
        for out in msg.outputs:
            self._apply(out, now)
        if msg.plain_rids:
            self._apply_plain(msg, now)

    def _apply_plain(self, msg: BatchStrOut, now: float) -> None:
        """The plain columns: append each request's new text and ids (never finished here)."""
        states, itl = self.states, []
        for rid, text, ids, prompt, cached, done in zip(msg.plain_rids, msg.plain_text, msg.plain_new_ids,
                                                        msg.plain_prompt_tokens, msg.plain_cached_tokens,
                                                        msg.plain_completion_tokens):
            st = states.get(rid)
            if st is None:
                continue
            if ids:
                self._token_times(st, len(ids), now, itl)
                st.output_ids += ids
            st.started = True
            if text:
                st.text += text
            st.prompt_tokens, st.cached_tokens, st.completion_tokens = prompt, cached, done
            st.version += 1
            if st.stream and not st.queued:
                st.queued = True
                st.queue.put_nowait(st.index)
        if itl:
            observe_many(self.metrics.itl, itl)

    def _token_times(self, st: ReqState, n: int, now: float, itl: list[float]) -> None:
        """``n`` tokens of ``st`` arrived at ``now``: observe its TTFT (first tokens) or append
        the inter-token latency per token to ``itl``."""
        if st.first_token_t is None:
            st.first_token_t = now
            self.metrics.ttft.observe(now - st.t0)
        elif st.last_token_t is not None:
            itl.append((now - st.last_token_t) / n)
        st.last_token_t = now

    def _apply(self, out: StrOut, now: float | None = None) -> None:
        """One per-request output (cumulative text)."""
        st = self.states.get(out.rid)
        if st is None:
            return
        now = time.perf_counter() if now is None else now
        if out.new_output_ids:
            itl: list[float] = []
            self._token_times(st, len(out.new_output_ids), now, itl)
            if itl:
                self.metrics.itl.observe(itl[0])
        st.started = True
        st.text = out.text
        st.output_ids.extend(out.new_output_ids)
        st.prompt_tokens, st.cached_tokens, st.completion_tokens = out.prompt_tokens, out.cached_tokens, out.completion_tokens
        st.spec_info = out.spec_info or st.spec_info
        st.input_lp.extend(out.new_input_logprobs)
        st.input_top.extend(out.new_input_top)
        st.output_lp.extend(out.new_output_logprobs)
        st.output_top.extend(out.new_output_top)
        st.version += 1
        if out.finish_reason is not None:
            st.finish_reason = out.finish_reason
            del self.states[out.rid]
            self.groups.pop(out.rid, None)
            self.metrics.observe_finish(st.prompt_tokens, st.completion_tokens, st.cached_tokens,
                                        now - st.t0, out.finish_reason.get("type") == "abort")
        elif not st.stream:
            return
        if not st.queued:
            st.queued = True
            st.queue.put_nowait(st.index)

    # ------------------------------------------------------------ requests
    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    async def run_off_loop(self, fn, *args):
        """Run blocking work (tokenization, template rendering) in the tokenizer threads."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def encode_async(self, text: str) -> list[int]:
        """Tokenize one text (batched with other arrivals, off the event loop); raises
        RequestError(400) for text the tokenizer refuses."""
        return (await self.encode_many([text]))[0]

    async def encode_many(self, texts: list[str], add_special_tokens: bool = True,
                          param: str = "text") -> list[list[int]]:
        """Tokenize ``texts`` (one request's prompts) in one tokenizer call shared with the
        requests arriving alongside (:class:`~radixlm.runtime.server.tokenize_batch.TokenizeBatcher`),
        off the event loop. Raises RequestError(400, ``param``) for text the tokenizer refuses."""
        try:
            return await self.batcher.encode(texts, add_special_tokens)
        except (TypeError, ValueError, UnicodeError) as e:
            raise RequestError(f"the {param} cannot be tokenized: {e}", param=param) from None

    def num_queued(self) -> int:
        return sum(1 for s in self.states.values() if not s.started)

    def _validate(self, spec: GenSpec, where: str) -> SamplingParams:
        """The checks that need the model (context length, pool size, vocabulary); the fields
        themselves were validated at the edge. Raises :class:`RequestError` (400)."""
        sp = spec.sampling_params
        n = len(spec.input_ids)
        if n == 0:
            raise RequestError(f"{where}the prompt is empty", param="prompt")
        if n >= self.context_len:
            raise RequestError(f"{where}the prompt has {n} tokens; the context length is {self.context_len}",
                               param="prompt")
        if n + 1 > self.max_total_tokens:
            raise RequestError(f"{where}the prompt needs {n + 1} KV slots; the pool has {self.max_total_tokens}",
                               param="prompt")
        vocab = self.info.get("vocab_size")
        ids = spec.input_ids  # NOTE: C-level passes (this runs on the event loop, thousands of ids per prompt)
        if vocab and ids and (not set(map(type, ids)) <= {int} or min(ids) < 0 or max(ids) >= vocab):
            raise RequestError(f"{where}input_ids must be token ids in [0, {vocab})", param="input_ids")
        if vocab and any(t >= vocab for t in sp.stop_token_ids):
            raise RequestError(f"{where}stop_token_ids must be token ids in [0, {vocab})", param="stop_token_ids")
        if vocab and sp.logit_bias and max(sp.logit_bias) >= vocab:
            raise RequestError(f"{where}logit_bias keys must be token ids in [0, {vocab})", param="logit_bias")
        if not spec.clamp_max_new and n + sp.max_new_tokens > self.context_len:
            raise RequestError(
                f"{where}requested token count exceeds the model's maximum context length of {self.context_len} "
                f"tokens: {n} in the prompt + max_new_tokens={sp.max_new_tokens}", param="max_new_tokens")
        if spec.logprob_start_len is not None and spec.logprob_start_len < -1:
            raise RequestError(f"{where}logprob_start_len must be >= -1", param="logprob_start_len")
        if spec.logprob_start_len is not None and spec.logprob_start_len > n:
            raise RequestError(f"{where}logprob_start_len={spec.logprob_start_len} exceeds the prompt length {n}",
                               param="logprob_start_len")
        if not 0 <= spec.top_logprobs_num <= MAX_TOP_LOGPROBS:
            raise RequestError(f"{where}top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}]", param="top_logprobs_num")
        return sp

    async def submit(self, specs: list[GenSpec]) -> tuple[list[ReqState], asyncio.Queue]:
        """Validate every spec, expand ``n``, send to the scheduler. Returns the per-sample states
        (prompt-major order) and the queue that receives their indices on each update.
        Raises :class:`RequestError` (400 bad input, 503 over ``max_queued_requests``)."""
        reqs: list[tuple[TokenizedGenerateReq, GenSpec]] = []
        groups: dict[str, list[str]] = {}
        for i, spec in enumerate(specs):
            where = f"request {i}: " if len(specs) > 1 else ""
            sp = self._validate(spec, where)
            # NOTE: grammars are compiled once, by the scheduler (time-limited); the protocol
            # models did the cheap syntax checks. A compile failure aborts that request with 400.
            base = spec.rid or uuid.uuid4().hex
            detok = DetokInit(spec.input_ids[-5:], list(sp.stop), list(sp.stop_regex or []), sp.skip_special_tokens,
                              sp.spaces_between_special_tokens, spec.return_text_in_logprobs)
            rids = sample_rids(base, sp.n)
            for k, rid in enumerate(rids):
                reqs.append((TokenizedGenerateReq(rid, spec.input_ids, sp, spec.return_logprob,
                                                  spec.logprob_start_len, spec.top_logprobs_num, k, detok,
                                                  spec.cache_lease), spec))
            if sp.n > 1:
                groups[base] = rids
        rids = [r.rid for r, _ in reqs]
        if (len(set(rids)) != len(rids) or any(r in self.states or r in self.groups for r in rids)
                or any(g in self.states or g in self.groups for g in groups)):
            raise RequestError("duplicate request id (rid)", param="rid")
        limit = self.config.max_queued_requests
        if limit is not None and self.num_queued() + len(reqs) > limit:
            raise RequestError(f"too many queued requests (max_queued_requests={limit}); retry later", status=503)
        queue: asyncio.Queue = asyncio.Queue()
        self.groups.update(groups)
        states = []
        for idx, (r, spec) in enumerate(reqs):
            st = ReqState(r.rid, idx, queue, spec.return_logprob, spec.top_logprobs_num)
            self.states[r.rid] = st
            states.append(st)
            self._send.send(encode(r))
        return states, queue

    def abort(self, rid: str, message: str = "aborted") -> None:
        """Abort exactly ``rid`` (a request submitted with ``n > 1`` under ``rid``: its samples)."""
        for r in self.groups.pop(rid, None) or [rid]:
            self._send.send(encode(AbortReq(rid=r, message=message)))

    def abort_all(self) -> None:
        self._send.send(encode(AbortReq(abort_all=True)))

    async def updates(self, states: list[ReqState], queue: asyncio.Queue, request=None) -> AsyncIterator[ReqState]:
        """Yield a state each time it changed, until all are finished. When the HTTP ``request``
        disconnects (or the consumer stops early), the unfinished samples are aborted."""
        pending = {s.index for s in states if not s.finished}
        seen = {s.index: s.version for s in states}
        # NOTE: one watcher task polls idle requests for a disconnect (no timer per queue.get())
        watch = self._disconnects.watch(queue, request) if request is not None and pending else None
        loop = asyncio.get_running_loop()
        try:
            while pending:
                idx = queue.get_nowait() if not queue.empty() else await queue.get()
                if idx is DISCONNECTED:
                    logger.info("client disconnected; aborting %s", [states[i].rid for i in pending])
                    return
                if watch is not None:
                    watch.last = loop.time()
                st = states[idx]
                st.queued = False  # NOTE: read below, after this: a later update queues it again
                if st.version == seen[idx]:
                    continue  # NOTE: several updates may be coalesced into one state read
                seen[idx] = st.version
                if st.finished:
                    pending.discard(idx)
                yield st
        finally:
            if watch is not None:
                self._disconnects.unwatch(watch)
            self.abort_unfinished(states)

    def abort_unfinished(self, states: list[ReqState], message: str = "client disconnected") -> None:
        for st in states:
            if not st.finished:
                self.abort(st.rid, message)

    async def wait_all(self, states: list[ReqState], queue: asyncio.Queue, request=None) -> list[ReqState]:
        """Wait until every sample finished; raises RequestError (400) when the scheduler rejected one.
        The states are woken only when they finish (``ReqState.stream`` cleared)."""
        for s in states:
            s.stream = False
        async for _ in self.updates(states, queue, request):
            pass
        if any(not s.finished for s in states):
            raise RequestError("client disconnected", status=499)
        for s in states:
            if s.finish_reason.get("status_code"):
                raise RequestError(s.finish_reason.get("message", "bad request"), status=s.finish_reason["status_code"])
        return states

    async def control(self, kind: str, timeout: float = 60.0, args: dict | None = None) -> Any:
        """Ask the scheduler (``flush_cache`` / ``server_info`` / ``release_cache_lease`` with
        ``args``) and await its answer."""
        req_id = uuid.uuid4().hex
        fut = asyncio.get_running_loop().create_future()
        self._control[req_id] = fut
        self._send.send(encode(ControlReq(req_id, kind, args)))
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._control.pop(req_id, None)

    async def scheduler_alive(self, timeout: float) -> bool:
        """Whether the scheduler loop answers a ping within ``timeout`` seconds (it answers
        between steps, so a step longer than ``timeout`` also reads as not alive)."""
        try:
            return bool(await self.control("ping", timeout))
        except asyncio.TimeoutError:
            return False
