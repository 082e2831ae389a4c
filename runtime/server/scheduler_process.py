"""The scheduler process: receives tokenized requests, runs ``Scheduler.step()`` in the shared
loop (:func:`~radixlm.runtime.scheduler_loop.run_scheduler_loop`, as the in-process Engine does)
and pushes one :class:`BatchTokenIDOut` per step to the detokenizer.

Under tensor parallelism there is one scheduler process per rank (:mod:`radixlm.runtime.tp_worker`):
rank 0 owns the sockets and broadcasts the messages it received before each step; the other ranks
handle the same messages, step in lockstep and send nothing."""

from __future__ import annotations

import logging
import os
import traceback
from multiprocessing.connection import Connection

import zmq

from radixlm.runtime import distributed as dist
from radixlm.runtime.request import Req, build_req
from radixlm.runtime.scheduler import Scheduler
from radixlm.runtime.scheduler_loop import run_scheduler_loop
from radixlm.runtime.warmup import warm_up
from radixlm.runtime.server.io_struct import (
    AbortReq, BatchTokenIDOut, ControlReply, ControlReq, IpcPaths, MalformedMessage, SchedulerSnapshot,
    TokenIDOut, TokenizedGenerateReq, decode, encode,
)
from radixlm.runtime.server.procs import child_init, freeze_startup_objects
from radixlm.runtime.server.tracing import maybe_trace
from radixlm.runtime.server_args import ServerArgs
from radixlm.runtime.speculative_worker import spec_meta_info

logger = logging.getLogger("radixlm.scheduler")

IDLE_POLL_S = 1.0  # longest wait for input when idle


class SchedulerServer:
    """Owns one :class:`Scheduler` and (on TP rank 0) its sockets; :meth:`serve` never returns."""

    def __init__(self, args: ServerArgs, paths: IpcPaths, rank: int = 0) -> None:
        from radixlm.runtime.model_runner import ModelRunner
        from radixlm.runtime.tokenizer import load_tokenizer
        from radixlm.runtime.tp_worker import GrammarGate

        self.args, self.rank = args, rank
        self.tokenizer, eos_ids = load_tokenizer(args.tokenizer_path or args.model_path, args.model_path)
        # NOTE: the server always has a tokenizer (ServerConfig rejects skip_tokenizer_init)
        self.runner = ModelRunner(args, args.model_path, eos_ids)
        self.scheduler = Scheduler.create(args, self.runner, self.tokenizer)
        warm_up(self.scheduler)  # NOTE: before ready: no request meets the first compiles
        self.gate = GrammarGate(self.scheduler.grammar) if args.tp_size > 1 else None
        self.pending: list[Req] = []  # finished outside a step (add errors, aborts)
        self._last_prefills = 0
        self._last_prompt = 0
        self._last_cached = 0
        self._trace = maybe_trace("scheduler")
        if rank > 0:
            return  # NOTE: followers get their input from rank 0 and send nothing
        ctx = zmq.Context()
        self.recv_sock = ctx.socket(zmq.PULL)
        self.recv_sock.bind(paths.scheduler_in)
        self.detok_sock = ctx.socket(zmq.PUSH)
        self.detok_sock.connect(paths.detokenizer_in)
        self.reply_sock = ctx.socket(zmq.PUSH)
        self.reply_sock.connect(paths.tokenizer_in)

    def ready_info(self) -> dict:
        return {
            "status": "ready",
            "context_len": self.runner.context_len,
            "max_total_tokens": self.runner.max_total_tokens,
            "vocab_size": len(self.tokenizer),
            "device": str(self.runner.device),
            "dtype": str(self.runner.dtype).replace("torch.", ""),
        }

    # ------------------------------------------------------------ inbox
    def _receive(self, wait_s: float) -> list[Req]:
        """Apply the messages waiting (rank 0 waits up to ``wait_s`` for the first). Under TP they
        are broadcast, with the newly compiled grammars, and every rank handles the same list.
        Returns the requests finished here (rejected arrivals, aborts)."""
        msgs: list = []
        if self.rank == 0 and (not wait_s or self.recv_sock.poll(max(1, round(wait_s * 1000)))):
            while True:
                try:
                    msgs.append(decode(self.recv_sock.recv(zmq.NOBLOCK)))
                except zmq.Again:
                    break
                except MalformedMessage as e:  # NOTE: log and drop; the scheduler goes on
                    logger.error("dropped a malformed message: %s", e)
        if self.gate is not None:
            ready = self.gate.compiled(self.scheduler.waiting) if self.rank == 0 else None
            msgs, ready = dist.broadcast_objects([msgs, ready] if self.rank == 0 else None)
            self.gate.open(ready)
        for msg in msgs:
            try:
                self._handle(msg)
            except Exception:  # NOTE: one bad message must not stop the scheduler
                logger.exception("handling %s failed", type(msg).__name__)
        pending, self.pending = self.pending, []
        return pending

    def _handle(self, msg: object) -> None:
        if isinstance(msg, TokenizedGenerateReq):
            self._add(msg)
        elif isinstance(msg, AbortReq):
            sched = self.scheduler
            if msg.abort_all:
                live = list(sched.waiting) + list(sched.running) + ([sched.chunked_req] if sched.chunked_req else [])
                rids = [r.rid for r in live]
            else:
                rids = [msg.rid]
            for rid in rids:
                req = sched.abort(rid, msg.message)
                logger.info("abort %s (%s): %s", rid, msg.message, "done" if req else "not found")
                if req is not None:
                    self.pending.append(req)
        elif isinstance(msg, ControlReq):
            # NOTE: every TP rank runs the control (flush_cache changes scheduler state); rank 0 replies
            reply = ControlReply(msg.req_id, self._control(msg.kind, msg.args))
            if self.rank == 0:
                self.reply_sock.send(encode(reply))

    def _add(self, msg: TokenizedGenerateReq) -> None:
        try:
            req = build_req(msg.rid, msg.input_ids, msg.sampling_params, sample=msg.sample,
                            return_logprob=msg.return_logprob, logprob_start_len=msg.logprob_start_len,
                            top_logprobs_num=msg.top_logprobs_num, cache_lease=msg.cache_lease,
                            device=self.runner.device, detok_init=msg.detok)
        except Exception as e:  # NOTE: a bad request must not take the scheduler down
            req = Req(rid=msg.rid, origin_input_ids=list(msg.input_ids), sampling_params=msg.sampling_params,
                      detok_init=msg.detok)
            self._reject(req, e)
            return
        try:
            self.scheduler.add_request(req)
        except Exception as e:
            self._reject(req, e)

    def _reject(self, req: Req, e: Exception) -> None:
        logger.warning("request %s rejected: %s", req.rid, e)
        req.finish_reason = {"type": "abort", "message": f"{type(e).__name__}: {e}", "status_code": 400}
        self.pending.append(req)

    def _control(self, kind: str, args: dict | None = None):
        if kind == "flush_cache":
            return self.scheduler.flush_cache()
        if kind == "ping":
            return True
        if kind == "release_cache_lease":
            return self.scheduler.tree_cache.release_leases((args or {}).get("ids", []))
        if kind == "server_info":
            return {**vars(self.args), **self.ready_info(), **self.scheduler.server_info(), **vars(self._snapshot())}
        return None

    # ------------------------------------------------------------ outputs
    def _snapshot(self) -> SchedulerSnapshot:
        s = self.scheduler
        total = self.runner.allocator.size
        used = total - self.runner.allocator.available_size() - s.tree_cache.evictable_size()
        return SchedulerSnapshot(
            num_running=len(s.running) + (1 if s.chunked_req else 0),
            num_waiting=len(s.waiting),
            kv_used_tokens=used,
            kv_total_tokens=total,
            cache_hit_rate=s.stats.cache_hit_rate,
            num_retracted=s.stats.num_retracted,
            **({k: getattr(s.spec_drafter.stats, k) for k in ("spec_verify_ct", "spec_draft_tokens", "spec_accepted_tokens")}
               if s.spec_drafter is not None else {}),
        )

    def _out(self, req: Req) -> TokenIDOut:
        sent = req.sent or (0, 0, 0)
        inp, outp = req.input_logprobs, req.output_logprobs
        first = req.sent is None
        req.sent = (len(req.output_ids), len(inp), len(outp))
        return TokenIDOut(
            rid=req.rid,
            new_output_ids=req.output_ids[sent[0]:],
            finish_reason=req.finish_reason,
            prompt_tokens=len(req.origin_input_ids),
            cached_tokens=req.cached_tokens,
            completion_tokens=len(req.output_ids),
            new_input_logprobs=list(inp[sent[1]:]),
            new_output_logprobs=list(outp[sent[2]:]),
            detok=req.detok_init if first else None,
            spec_info=spec_meta_info(req) or None,
        )

    def _send(self, reqs: list[Req]) -> None:
        if self._trace is not None:  # NOTE: one event per turn (RADIXLM_TRACE_DIR)
            st = self.scheduler.stats
            self._trace.mark("turn", n=len(reqs), prefill=st.prompt_tokens - st.cached_tokens,
                             running=len(self.scheduler.running), mask_s=self.scheduler.grammar.mask_seconds,
                             jumps=getattr(self.scheduler, "jump_steps", 0),
                             overlap=getattr(self.scheduler, "inflight", None) is not None,
                             mode=getattr(getattr(self.scheduler.cur_batch, "mode", None), "name", ""))
        if not reqs or self.rank != 0:
            return
        batch = BatchTokenIDOut([], self._snapshot())
        rids, ids, prompt, cached, done = (batch.plain_rids, batch.plain_new_ids, batch.plain_prompt_tokens,
                                           batch.plain_cached_tokens, batch.plain_completion_tokens)
        for req in reqs:
            sent = req.sent
            if sent is None or req.finish_reason is not None or req.return_logprob or req.spec_verify_ct:
                batch.outputs.append(self._out(req))
                continue
            out = req.output_ids  # NOTE: the common case: new token ids only, sent as columns
            rids.append(req.rid)
            ids.append(out[sent[0]:])
            prompt.append(len(req.origin_input_ids))
            cached.append(req.cached_tokens)
            done.append(len(out))
            req.sent = (len(out), sent[1], sent[2])
        self.detok_sock.send(encode(batch))

    def _log_prefill(self) -> None:
        st = self.scheduler.stats
        if st.num_prefill_batches == self._last_prefills or self.rank > 0:
            return
        new_prompt, new_cached = st.prompt_tokens - self._last_prompt, st.cached_tokens - self._last_cached
        self._last_prefills, self._last_prompt, self._last_cached = st.num_prefill_batches, st.prompt_tokens, st.cached_tokens
        snap = self._snapshot()
        logger.info(
            "Prefill batch. #new-token: %d, #cached-token: %d, cache hit rate: %.2f%%, token usage: %.2f, "
            "#running-req: %d, #queue-req: %d",
            new_prompt - new_cached, new_cached, 100 * st.cache_hit_rate,
            snap.kv_used_tokens / max(snap.kv_total_tokens, 1), snap.num_running, snap.num_waiting,
        )

    def serve(self) -> None:
        """Run the shared scheduler loop (runtime/scheduler_loop.py) over the sockets; never
        returns (a lost TP peer raises from the broadcast)."""
        run_scheduler_loop(self.scheduler, self._receive, self._send, idle_wait_s=IDLE_POLL_S,
                           after_step=self._log_prefill, follower=self.rank > 0)


def run_scheduler_process(args: ServerArgs, paths: IpcPaths, ready: Connection, rank: int = 0,
                          init_method: str | None = None) -> None:
    """Process entry of TP rank ``rank`` (0 without TP): join the TP group at ``init_method``
    (``tcp://host:port``) when ``args.tp_size > 1``, build the scheduler, report ``ready`` (a dict)
    on ``ready``, serve forever. A startup failure is reported as
    ``{"status": "error", "message": traceback}``; a lost peer rank ends the process (status 1)."""
    child_init(args.log_level, "scheduler" if rank == 0 else f"tp{rank}", paths.dir)
    try:
        if args.tp_size > 1:
            dist.init_distributed(args.tp_size, rank, init_method, args.resolved_device(),
                                  ranks_per_node=args.tp_size // args.nnodes)
        server = SchedulerServer(args, paths, rank)
    except Exception:
        ready.send({"status": "error", "message": traceback.format_exc()})
        raise SystemExit(1)
    freeze_startup_objects()  # NOTE: model, tokenizer, grammar tables: out of full collections
    ready.send(server.ready_info())
    ready.close()
    try:
        server.serve()
    except Exception as e:  # NOTE: a collective failed: a peer rank is gone
        if args.tp_size == 1:
            raise
        logger.error("TP rank %d lost its peers (%s: %s); exiting", rank, type(e).__name__, e)
        logging.shutdown()
        os._exit(1)  # NOTE: no interpreter teardown (a broken process group or zmq context may block it)
