"""Run Python work under a wall-clock budget that really stops it.

:func:`call_with_deadline` runs ``fn`` in a fresh daemon thread; when the budget is spent it raises
:class:`DeadlineExceeded` inside that thread (``PyThreadState_SetAsyncExc``), which interrupts
pure-Python work (parsers, template engines, grammar compilers) at its next bytecode, so the CPU is
given back instead of burning on in the background. Work blocked inside one long C call stops
when that call returns.
"""

from __future__ import annotations

import ctypes
import threading
from concurrent.futures import Future
from typing import Any, Callable


class DeadlineExceeded(Exception):
    """Raised in (and reported from) work that ran past its budget."""


def submit_with_deadline(fn: Callable[..., Any], timeout_s: float, *args: Any, name: str = "radixlm-deadline") -> Future:
    """Start ``fn(*args)`` in its own thread; the returned future gets its result, its exception,
    or :class:`DeadlineExceeded` once ``timeout_s`` seconds have passed (the work is interrupted)."""
    fut: Future = Future()
    lock = threading.Lock()
    done = [False]
    expired = DeadlineExceeded(f"stopped after {timeout_s:g} s")

    def run() -> None:
        outcome: tuple[bool, Any] | None = None
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
