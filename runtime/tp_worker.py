"""Lockstep schedulers under tensor parallelism (SGLang's design).

Every TP rank runs the same deterministic :class:`Scheduler` over its shard of the model. Only
rank 0 (the leader) receives requests; before each scheduler step it broadcasts what it received
since the last step (``broadcast_objects`` over the CPU group), and every follower applies the same
events in the same order, then steps. Batch decisions are thus identical on every rank, and so
are the sampled tokens: the logits are all-gathered (identical on every rank) and every rank seeds
its samplers alike.

Grammar compiles run in background threads and finish at different times on each rank, so the
leader also broadcasts which requests' grammars it found compiled; a request's grammar counts as
ready on every rank (a follower waits for its own compile) only from that step on (the *gate*).

Events: ``("add", spec)`` (:func:`req_spec`), ``("abort", (rid, message))``, ``("flush", args)``,
``("release_leases", args)``, ``("stop", None)``. The server's scheduler process broadcasts its decoded messages instead
(:mod:`radixlm.runtime.server.scheduler_process`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from radixlm.runtime import distributed as dist
from radixlm.runtime.request import Req

logger = logging.getLogger(__name__)


def req_spec(req: Req) -> dict:
    """The picklable part of a new request a follower needs to rebuild it (no sink, no tensors
    but the seeded generator's state)."""
    return {
        "rid": req.rid, "origin_input_ids": list(req.origin_input_ids), "sampling_params": req.sampling_params,
        "return_logprob": req.return_logprob, "logprob_start_len": req.logprob_start_len,
        "top_logprobs_num": req.top_logprobs_num, "stream": req.stream, "arrival": req.arrival,
        "cache_lease": getattr(req, "cache_lease", None),
        "generator_state": None if req.generator is None else req.generator.get_state(),
    }


def req_from_spec(spec: dict, device: torch.device) -> Req:
    """Rebuild a request from :func:`req_spec` on this rank's ``device``."""
    spec = dict(spec)
    state = spec.pop("generator_state")
    if spec.get("cache_lease") is None:
        spec.pop("cache_lease", None)
    req = Req(**spec)
    if state is not None:
        req.generator = torch.Generator(device=device)
        req.generator.set_state(state)
    return req


class GrammarGate:
    """Makes ``grammar.poll`` agree across ranks: a compiling request is ready only once the
    leader's broadcast named it (:meth:`open`), and then on every rank (waiting for the compile)."""

    def __init__(self, grammar) -> None:
        self.opened: set[str] = set()
        self._poll = grammar.poll
        grammar.poll = self.poll

    def compiled(self, reqs) -> list[str]:
        """Leader: rids of ``reqs`` whose grammar finished compiling and is not yet open."""
        return [r.rid for r in reqs if r.grammar_future is not None and r.grammar_matcher is None
                and r.rid not in self.opened and r.grammar_future.done()]

    def open(self, rids: list[str]) -> None:
        self.opened.update(rids)

    def poll(self, req: Req) -> bool | str:
        pending = req.grammar_future is not None and req.grammar_matcher is None and req.grammar_error is None
        if pending:
            if req.rid not in self.opened:
                return False
            if not req.grammar_future.cancelled():
                req.grammar_future.exception()  # NOTE: blocks a follower until its compile is done
            self.opened.discard(req.rid)
        return self._poll(req)


class TPLeader:
    """Rank 0 of an in-process :class:`~radixlm.runtime.engine.Engine`: records the inbox events
    it applies and broadcasts them before each step (:meth:`sync`).

    Engine calls run as closures on the scheduler thread; the ones that change scheduler state
    (``scheduler.flush_cache``, ``tree_cache.release_leases``) are wrapped on this instance so
    that calling them records a ``flush`` / ``release_leases`` event for the followers."""

    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler
        self.gate = GrammarGate(scheduler.grammar)
        self.events: list[tuple[str, Any]] = []
        self.failed = False
        self._record_calls(scheduler, "flush_cache", "flush")
        if hasattr(scheduler.tree_cache, "release_leases"):
            self._record_calls(scheduler.tree_cache, "release_leases", "release_leases")

    def _record_calls(self, obj, method: str, kind: str) -> None:
        inner = getattr(obj, method)

        def recorded(*args):
            self.events.append((kind, args))
            return inner(*args)

        setattr(obj, method, recorded)

    def record(self, kind: str, payload: Any) -> None:
        """Note an inbox item the leader just applied (``add``: a Req; ``abort``: a rid)."""
        if kind == "add":
            self.events.append(("add", req_spec(payload)))
        elif kind == "abort":
            self.events.append(("abort", (payload, "aborted")))

    def sync(self) -> bool:
        """Broadcast the recorded events and the newly compiled grammars; call once per step.
        Returns False (and logs) when the broadcast failed: a follower rank is gone."""
        ready = self.gate.compiled(self.scheduler.waiting)
        self.gate.open(ready)
        try:
            dist.broadcast_objects([self.events, ready])
        except Exception as e:
            logger.error("a tensor-parallel rank is gone (%s: %s); stopping the engine", type(e).__name__, e)
            self.failed = True
            return False
        self.events = []
        return True

    def stop(self) -> None:
        """Tell the followers to leave their loop (nothing to tell after a failed sync)."""
        if not self.failed:
            dist.broadcast_objects([[("stop", None)], []])


def follower_loop(scheduler, device: torch.device) -> None:
    """Follower ranks: replay the leader's events and step, until a ``stop`` event. Outputs are
    dropped (rank 0 reports them); a failing step aborts what is in flight, as on rank 0."""
    gate = GrammarGate(scheduler.grammar)
    while True:
        events, ready = dist.broadcast_objects(None)
        for kind, payload in events:
            if kind == "stop":
                scheduler.abort_all("engine shut down")
                return
            try:
                if kind == "add":
                    scheduler.add_request(req_from_spec(payload, device))
                elif kind == "abort":
                    scheduler.abort(*payload)
                elif kind == "flush":
                    scheduler.flush_cache(*payload)
                elif kind == "release_leases":
                    scheduler.tree_cache.release_leases(*payload)
            except Exception as e:  # NOTE: rank 0 rejected it the same way
                logger.debug("event %s failed as on rank 0: %s", kind, e)
        gate.open(ready)
        try:
            scheduler.step()
        except Exception:
            logger.exception("scheduler step failed")
            scheduler.abort_all("internal error")


def run_engine_follower(rank: int, args, init_method: str) -> None:
    """Process entry of TP rank ``rank`` (> 0) of an Engine: join the group, build the model
    shard and the scheduler, follow rank 0 until it stops."""
    from radixlm.runtime.model_runner import ModelRunner
    from radixlm.runtime.scheduler import Scheduler
    from radixlm.runtime.tokenizer import load_tokenizer

    dist.init_distributed(args.tp_size, rank, init_method, args.resolved_device())
    try:
        tok, eos = load_tokenizer(args.tokenizer_path or args.model_path, args.model_path, args.skip_tokenizer_init)
        runner = ModelRunner(args, args.model_path, eos)
        scheduler = Scheduler.create(args, runner, tok)
        follower_loop(scheduler, runner.device)
        scheduler.grammar.shutdown()
        runner.release()
    finally:
        dist.destroy_distributed()


def start_engine_ranks(args) -> list:
    """Spawn ranks ``1..tp_size-1`` of an Engine on this node and join the group as rank 0;
    returns the follower processes. Raises ``RuntimeError`` when a follower exits before the
    rendezvous completes (instead of waiting for the collective timeout)."""
    import multiprocessing as mp
    import threading

    init_method = dist.default_init_method(args.dist_init_addr)
    ctx = mp.get_context("spawn")
    procs = []
    for rank in range(1, args.tp_size):
        p = ctx.Process(target=run_engine_follower, args=(rank, args, init_method), name=f"radixlm-tp{rank}",
                        daemon=True)
        p.start()
        procs.append(p)
    error: list[BaseException] = []

    def join() -> None:
        try:
            dist.init_distributed(args.tp_size, 0, init_method, args.resolved_device())
        except BaseException as e:  # NOTE: re-raised in the caller's thread
            error.append(e)

    t = threading.Thread(target=join, name="radixlm-tp-rendezvous", daemon=True)
    t.start()
    while t.is_alive():
        t.join(0.2)
        dead = [(r + 1, p.exitcode) for r, p in enumerate(procs) if not p.is_alive()]
        if dead and t.is_alive():
            for p in procs:
                p.kill()
            raise RuntimeError(f"TP rank {dead[0][0]} exited (status {dead[0][1]}) before joining the group")
    if error:
        raise error[0]
    return procs


def stop_engine_followers(procs: list, timeout_s: float = 10.0) -> None:
    """After rank 0 broadcast ``stop``: wait for the followers to exit (kill stragglers), then
    leave the TP group."""
    for p in procs:
        p.join(timeout_s)
        if p.is_alive():
            p.kill()
            p.join(5)
    dist.destroy_distributed()
