"""Confining a failed scheduler step to the request that caused it (and the scheduler's other
ways of giving resources back: retraction, aborts, the idle integrity check).

When the model runner raises for a batch, no request of that batch has been processed: the step's
KV slots are freed and, for a batch of one, that request is the culprit and ends with an error
(``status_code`` 500). A larger batch is split: every request is put back in the waiting queue
(its computed KV goes to the prefix cache, like a retraction) marked ``isolate``, and isolated
requests run alone (prefill) or alone on alternate steps (decode) until they finish, so the
culprit fails on its own and the others finish with the outputs they would have had.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from radixlm.runtime.batch import ScheduleBatch
from radixlm.runtime.request import Req, ReqStatus

if TYPE_CHECKING:
    from radixlm.runtime.scheduler import Scheduler

logger = logging.getLogger(__name__)


def free_step_slots(sched: "Scheduler", batch: ScheduleBatch) -> None:
    """Give back the slots allocated for ``batch``'s slices that were never processed."""
    for sl in batch.slices:
        req = sl.req
        if req.req_pool_idx is not None and req.kv_len < sl.end and not req.finished:
            sched.allocator.free(sched.req_to_token_pool.read(req.req_pool_idx, sl.end, sl.start))


def recover_failed_batch(sched: "Scheduler", batch: ScheduleBatch, exc: BaseException) -> list[Req]:
    """Undo ``batch`` after the runner raised ``exc``; returns the requests that finished."""
    free_step_slots(sched, batch)
    reqs = [r for r in batch.reqs if not r.finished]
    if sched.chunked_req in reqs:
        sched.chunked_req = None
    for req in reqs:
        if req in sched.running:
            sched.running.remove(req)
    if len(reqs) == 1:
        req = reqs[0]
        logger.error("request %s failed a step on its own; aborting it: %s", req.rid, exc)
        reason = {"type": "abort", "status_code": 500, "message": f"internal error: {type(exc).__name__}: {exc}"}
        sched._finish(req, reason, holds_kv=True)
        return [req]
    logger.warning("a batch of %d requests failed (%s: %s); retrying them one by one", len(reqs),
                   type(exc).__name__, exc)
    for req in reversed(reqs):
        if req.req_pool_idx is not None:
            sched.tree_cache.cache_finished_req(req)
        req.kv_len, req.status = 0, ReqStatus.WAITING
        req.needs_extend = False
        req.isolate = True
        sched.waiting.insert(0, req)
    return []


def pick_decode_reqs(sched: "Scheduler", reqs: list[Req]) -> list[Req]:
    """The decode batch: all non-isolated requests, alternating with one isolated request."""
    isolated = [r for r in reqs if r.isolate]
    if not isolated:
        return reqs
    normal = [r for r in reqs if not r.isolate]
    sched.isolate_turn += 1
    if normal and sched.isolate_turn % 2:
        return normal
    return [isolated[(sched.isolate_turn // 2) % len(isolated)]]


def abort_everything(sched: "Scheduler", message: str) -> list[Req]:
    """Abort every queued, running and in-flight request; their KV goes back."""
    reqs = list(sched.waiting) + list(sched.running) + ([sched.chunked_req] if sched.chunked_req else [])
    if sched.cur_batch is not None:
        free_step_slots(sched, sched.cur_batch)
        reqs += [r for r in sched.cur_batch.reqs if r not in reqs and not r.finished]
        sched.cur_batch = None
    sched.waiting, sched.running, sched.chunked_req = [], [], None
    for req in reqs:
        if not req.finished:
            sched._finish(req, {"type": "abort", "message": message}, holds_kv=req.req_pool_idx is not None)
    return reqs


def abort_bad_grammars(sched: "Scheduler") -> None:
    """Abort waiting requests whose grammar failed to compile (400), even while no request can be
    admitted, so their clients do not wait for capacity."""
    for req in [r for r in sched.waiting if r.grammar_matcher is None
                and (r.grammar_error is not None or r.grammar_future is not None)]:
        ready = sched.grammar.poll(req)
        if isinstance(ready, str):
            sched.waiting.remove(req)
            sched._finish(req, {"type": "abort", "message": ready, "status_code": 400}, holds_kv=False)
            sched._aborted.append(req)


def log_integrity(sched: "Scheduler") -> None:
    """Check free + evictable + protected == pool size (when idle) and log any violation."""
    problems = sched.tree_cache.check_integrity()
    if problems:
        logger.error("KV cache integrity check failed: %s (free=%d evictable=%d protected=%d size=%d)",
                     "; ".join(problems), sched.allocator.available_size(), sched.tree_cache.evictable_size(),
                     sched.tree_cache.protected_size(), sched.allocator.size)


def retract(sched: "Scheduler", need: int) -> None:
    """Preempt running requests, largest KV first, until ``need`` decode slots can be had; their
    computed KV goes to the prefix cache and they wait again (SGLang's retraction)."""
    victims = sorted(sched.running, key=lambda r: (r.kv_len, -r.arrival), reverse=True)
    for req in victims:
        if sched._available() >= len(sched.running) or len(sched.running) == 1:
            break
        sched.running.remove(req)
        sched.tree_cache.cache_finished_req(req)
        req.kv_len, req.status = 0, ReqStatus.WAITING
        req.needs_extend = False
        sched.waiting.insert(0, req)
        sched.stats.num_retracted += 1
        logger.info("retracted request %s (%d tokens) to free KV", req.rid, len(req.all_ids))
    sched.new_token_ratio = min(1.0, sched.new_token_ratio + 0.2)
