"""A compile-time budget counted in work, not wall time.

Long grammar-compilation loops call :func:`check_budget` with the work done since their last call
(``cost``: automaton states built, DFA states determinized, trie nodes walked for token masks, in
units of roughly one microsecond of work on an idle core). Once the enclosing
:func:`compile_budget` has spent its units the check raises a clean :class:`GrammarError` naming
the step. A work budget is deterministic: the same grammar compiles, or fails, the same way on an
idle machine and on a loaded one (a wall-clock budget turns load into compile errors).

A generous CPU-time backstop (``RADIXLM_GRAMMAR_BUDGET_S``: seconds of the compiling thread's CPU
time) still bounds a compile that does work the counters miss. It is CPU time, not wall time, for
the same reason: on a loaded machine (a full sweep beside other jobs: 2.2 s of work took 11 s of
wall clock) a wall-clock limit fails compiles that are not too large. The serving path bounds
latency separately (``runtime/constrained.py`` compiles under a wall-clock deadline).

Without an enclosing budget the checks are no-ops, so the automaton code stays usable on its own
(and masks computed on a decode step's first visit are never cut short).
"""

from __future__ import annotations

import contextvars
import ctypes
import gc
import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

from radixlm.grammar.errors import GrammarError

T = TypeVar("T")

# NOTE: ~2 s of compile work on an idle core (the goal: no compile over 5 s); RADIXLM_GRAMMAR_WORK
# overrides it. The CPU-time backstop is generous: it catches work the counters do not see.
DEFAULT_UNITS = int(float(os.environ.get("RADIXLM_GRAMMAR_WORK", "2e6")))
DEFAULT_SECONDS = float(os.environ.get("RADIXLM_GRAMMAR_BUDGET_S", "10.0"))
CLOCK_EVERY = 64  # work units between two reads of the CPU-time clock (see check_budget)


class _Budget:
    __slots__ = ("left", "units", "deadline", "seconds", "spent", "tick")

    def __init__(self, units: int, seconds: float) -> None:
        self.left = self.units = units
        self.seconds = seconds
        self.deadline = time.thread_time() + seconds
        self.spent = 0
        self.tick = 0  # the CPU clock is read when this count of work (and calls) runs out


_current: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("grammar_budget", default=None)


@contextmanager
def compile_budget(units: int | None = None, seconds: float | None = None) -> Iterator[None]:
    """Bound the compilation inside the ``with`` block to ``units`` of work (default
    ``DEFAULT_UNITS``) and a backstop of ``seconds`` of this thread's CPU time (default
    ``DEFAULT_SECONDS``).
    A budget nested in another one shares the outer counters (the outer limits hold)."""
    if _current.get() is not None:
        yield
        return
    token = _current.set(_Budget(DEFAULT_UNITS if units is None else units,
                                 DEFAULT_SECONDS if seconds is None else seconds))
    try:
        yield
    finally:
        _current.reset(token)


def check_budget(what: str, cost: int = 10) -> None:
    """Count ``cost`` units of work; raise GrammarError when the current budget is spent.

    Raises:
        GrammarError: ``"grammar too complex: compile budget of N work units exceeded while
            <what>"`` (or ``"... of N s (CPU time) ..."`` for the backstop).
    """
    got = _current.get()
    if got is None:
        return
    got.left -= cost
    got.spent += cost
    if got.left < 0:
        raise GrammarError(f"grammar too complex: compile budget of {got.units:,} work units exceeded "
                           f"while {what}")
    got.tick -= cost + 1
    if got.tick > 0:
        return
    # NOTE: the clock (~1 us a read) is read once per CLOCK_EVERY units of work and calls (each
    # call counts one more): cheap checks run hundreds of thousands of times in a compile
    got.tick = CLOCK_EVERY
    if time.thread_time() > got.deadline:
        raise GrammarError(f"grammar too complex: compile budget of {got.seconds:g} s (CPU time) "
                           f"exceeded while {what}")


_gc_lock = threading.Lock()
_gc_paused = [0, False]  # compiles running with the collector paused, whether it was enabled


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a grammar compiles (re-entrant, thread-safe:
    it resumes when the last overlapping compile ends, if it was enabled before).

    A compile allocates ~10^5 short-lived tracked objects (automaton edge lists, state sets);
    collector passes over them find no garbage yet cost 2-3x the compile's own work. Memory is
    still freed by reference counting; cycles wait for the next collection after the compile."""
    with _gc_lock:
        if _gc_paused[0] == 0:
            _gc_paused[1] = gc.isenabled()
            gc.disable()
        _gc_paused[0] += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_paused[0] -= 1
            if _gc_paused[0] == 0 and _gc_paused[1]:
                gc.enable()


@contextmanager
def budget_share(fraction: float) -> Iterator[None]:
    """Let the ``with`` block spend at most ``fraction`` of the work units left in the enclosing
    budget (what it spends still counts against the whole); no-op outside a budget. For a first
    attempt that has a cheaper fallback (see ``GrammarCompiler.compile_json_schema``)."""
    got = _current.get()
    if got is None:
        yield
        return
    before, start = got.left, got.spent
    got.left = int(before * fraction)
    try:
        yield
    finally:
        got.left = before - (got.spent - start)


def budget_spent() -> int:
    """Work units counted so far by the enclosing budget (0 outside one)."""
    got = _current.get()
    return 0 if got is None else got.spent


DEEP_STACK_BYTES = 512 << 20  # the stack of a deep compile's thread ...
DEEP_RECURSION = 30_000  # ... and its Python recursion limit (~15x the default)
_deep_lock = threading.Lock()


def deep_stack(fn: "Callable[[], T]") -> "T":
    """Run ``fn()`` in a thread with a ``DEEP_STACK_BYTES`` stack and the recursion limit raised
    to ``DEEP_RECURSION`` (restored after; one such run at a time), returning its result or
    raising its exception here. For compiles that recurse once per nesting level of a deep but
    finite schema. The limit is interpreter-wide: while it is raised, other threads may recurse
    deeper than usual too.

    The worker runs under the caller's profile hook (the serving path's duty-cycle hook, see
    ``runtime/deadline.py``), and an asynchronous exception raised in the caller while it waits
    (a compile deadline) is raised in the worker too, so a deep compile is throttled and stopped
    like any other."""
    out: list = []
    hook = sys.getprofile()

    def run() -> None:
        if hook is not None:
            sys.setprofile(hook)
        try:
            out.append((True, fn()))
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            out.append((False, e))

    while not _deep_lock.acquire(timeout=0.01):  # NOTE: a Python loop: interruptible, unlike one wait
        pass
    try:
        old_limit = sys.getrecursionlimit()
        old_size = threading.stack_size()
        sys.setrecursionlimit(max(old_limit, DEEP_RECURSION))
        try:
            threading.stack_size(DEEP_STACK_BYTES)
            try:
                worker = threading.Thread(target=run, name="radixlm-deep-compile", daemon=True)
                worker.start()
            finally:
                threading.stack_size(old_size)
            _join_forwarding(worker)
        finally:
            sys.setrecursionlimit(old_limit)
    finally:
        _deep_lock.release()
    ok, value = out[0]
    if ok:
        return value
    raise value


def _join_forwarding(worker: threading.Thread) -> None:
    """Wait for ``worker``; an exception raised in this thread meanwhile (an asynchronous one: a
    deadline) is raised in ``worker`` as well, which is then waited for before it propagates."""
    try:
        while worker.is_alive():
            worker.join(0.01)
    except BaseException as e:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(type(e)))
        worker.join()
        raise
