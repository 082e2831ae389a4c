"""The one scheduler loop, shared by the in-process Engine (a thread: ``runtime/engine.py``) and
the server's scheduler process (``runtime/server/scheduler_process.py``).

Each turn: take the arrivals (requests, aborts, calls) from the input source, step the scheduler
once, contain a failing step to the requests in flight (they are aborted, the loop goes on), hand
every request the turn touched to the output sink, then choose how long the next receive may wait:
long when idle, a millisecond when only grammar compiles are pending, not at all otherwise.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from radixlm.runtime.request import Req

logger = logging.getLogger(__name__)

GRAMMAR_WAIT_S = 0.001  # only grammar compiles pending: wait this long for input instead of spinning


def run_scheduler_loop(
    scheduler,
    receive: Callable[[float], list[Req]],
    deliver: Callable[[list[Req]], None],
    *,
    idle_wait_s: float = 1.0,
    should_stop: Callable[[], bool] = lambda: False,
    sync: Callable[[], bool] | None = None,
    after_step: Callable[[], None] | None = None,
    follower: bool = False,
) -> None:
    """Run ``scheduler`` until ``should_stop()`` (or ``sync`` fails).

    Args:
        scheduler: a :class:`~radixlm.runtime.scheduler.Scheduler` (``has_work``, ``step``,
            ``abort_all``, ``ran_batch``).
        receive: ``receive(wait_s)`` applies the inputs that arrived, waiting up to ``wait_s``
            seconds for the first (0: do not wait); returns the requests that finished outside a
            step (rejected arrivals, aborts), delivered with the step's outputs.
        deliver: the output sink, called once per turn with the touched requests (maybe none).
        idle_wait_s: how long ``receive`` may wait when nothing is queued or running.
        should_stop: checked before every turn.
        sync: called after ``receive``, before the step (tensor parallelism: the Engine's leader
            broadcasts what it applied); returning False ends the loop (a rank is gone).
        after_step: called after every step (e.g. the server's prefill log line).
        follower: a TP follower rank never waits in ``receive`` (it waits in the broadcast).
    Raises:
        whatever ``receive``, ``sync`` or ``deliver`` raise (a failing step does not escape).
    """
    wait_s = 0.0
    while not should_stop():
        touched = list(receive(wait_s))
        if sync is not None and not sync():
            return
        try:
            touched += scheduler.step()  # NOTE: when idle it runs the integrity self-check
        except Exception as e:  # NOTE: contain the failure to the requests in flight
            logger.exception("scheduler step failed")
            touched += scheduler.abort_all(f"internal error: {type(e).__name__}: {e}")
        if after_step is not None:
            after_step()
        deliver(touched)
        if follower:
            wait_s = 0.0
        elif not scheduler.has_work():
            wait_s = idle_wait_s
        elif not getattr(scheduler, "ran_batch", True) and not touched:
            wait_s = GRAMMAR_WAIT_S
        else:
            wait_s = 0.0
