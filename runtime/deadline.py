"""Run Python work under a wall-clock budget that really stops it.

:func:`call_with_deadline` runs ``fn`` in a fresh daemon thread; when the budget is spent it raises
:class:`DeadlineExceeded` inside that thread (``PyThreadState_SetAsyncExc``), which interrupts
pure-Python work (parsers, template engines, grammar compilers) at its next bytecode, so the CPU is
given back instead of burning on in the background. Work blocked inside one long C call stops
when that call returns.

``duty`` < 1 also time-slices the work (a profile hook sleeps, GIL released, so that it runs at
most that share of the wall clock, in slices of about ``SLICE_S``): background compiles then
cannot starve the thread that runs the model (the GIL convoy effect: every torch call of the model
loop gives the GIL up and waits up to the 5 ms switch interval to get it back).
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable


SLICE_S = 0.001  # run slice of duty-limited work (seconds)


def _duty_hook(duty: Callable[[], float]):
    """A ``sys.setprofile`` hook that, after each slice of ``SLICE_S``, sleeps long enough that
    the work runs ``duty()`` of the wall clock."""
    state = [0, time.perf_counter()]

    def hook(frame, event, arg) -> None:
        state[0] += 1
        if state[0] < 100:  # NOTE: read the clock every 100 events only
            return
        state[0] = 0
        now = time.perf_counter()
        if now - state[1] >= SLICE_S:
            share = duty()
            if share < 1:
                time.sleep((now - state[1]) * (1 - share) / share)
            state[1] = time.perf_counter()

    return hook


class DeadlineExceeded(Exception):
    """Raised in (and reported from) work that ran past its budget."""


def submit_with_deadline(fn: Callable[..., Any], timeout_s: float, *args: Any, name: str = "radixlm-deadline",
                         duty: float | Callable[[], float] = 1.0) -> Future:
    """Start ``fn(*args)`` in its own thread; the returned future gets its result, its exception,
    or :class:`DeadlineExceeded` once ``timeout_s`` seconds have passed (the work is interrupted).
    ``duty`` in (0, 1] (or a function returning it, read after every slice) limits the work's share
    of the wall clock."""
    fut: Future = Future()
    lock = threading.Lock()
    done = [False]
    expired = DeadlineExceeded(f"stopped after {timeout_s:g} s")

    def run() -> None:
        outcome: tuple[bool, Any] | None = None
        if callable(duty) or duty < 1:
            sys.setprofile(_duty_hook(duty if callable(duty) else lambda: duty))  # NOTE: this thread only
        try:
            try:
                outcome = (True, fn(*args))
            except DeadlineExceeded:
                outcome = (False, expired)
            except BaseException as e:  # noqa: BLE001 - handed to the waiter
                outcome = (False, e)
            with lock:
                done[0] = True
        except DeadlineExceeded:  # NOTE: delivered just after fn returned
            outcome = outcome or (False, expired)
        sys.setprofile(None)
        timer.cancel()
        ok, value = outcome
        fut.set_result(value) if ok else fut.set_exception(value)

    def interrupt() -> None:
        with lock:
            if not done[0] and thread.ident is not None:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                                           ctypes.py_object(DeadlineExceeded))

    thread = threading.Thread(target=run, name=name, daemon=True)
    timer = threading.Timer(timeout_s, interrupt)
    timer.daemon = True
    thread.start()
    timer.start()
    return fut


def call_with_deadline(fn: Callable[..., Any], timeout_s: float, *args: Any) -> Any:
    """``fn(*args)`` with a budget; raises :class:`DeadlineExceeded` when it ran past it."""
    return submit_with_deadline(fn, timeout_s, *args).result()
