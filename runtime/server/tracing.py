"""Opt-in event timeline of the server's processes, for explaining latency tails (ITL p99).

With ``RADIXLM_TRACE_DIR=/some/dir`` in the environment, every server process (scheduler,
detokenizer, and the HTTP process with the tokenizer manager) records timestamped events in
memory and writes them to ``<dir>/<name>-<pid>.jsonl`` at exit (SIGTERM, the server's normal
shutdown, or interpreter exit). Each line is ``{"t": seconds, "ev": kind, ...fields}``; ``t`` is
``time.monotonic()``, which on Linux is the system-wide CLOCK_MONOTONIC that
``time.perf_counter()`` also reads, so a client's chunk times on the same machine line up with it
(``benchmarks/bench_serving.py --chunk-log``, read together by ``benchmarks/itl_tail.py``).

Events recorded by every traced process: ``gc`` (a garbage collection: ``gen``, ``dur`` seconds,
``collected``). The scheduler adds ``turn`` (one output message: ``n`` requests touched,
``prefill`` prompt tokens prefilled so far, ``running``, and the running totals ``mask_s``, host
seconds spent filling grammar masks, and ``jumps``, overlapped steps that carried jump-forward
rows; ``benchmarks/turn_stats.py`` summarizes them), the detokenizer ``detok`` (``dur``
seconds of one batch), the tokenizer manager ``batch`` (one step's outputs applied: ``n``) and
``lag`` (the event loop woke ``late`` seconds after its 2 ms timer, logged when over 5 ms).
Off (no cost beyond one environment lookup) when the variable is unset.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import json
import os
import signal
import time

ENV = "RADIXLM_TRACE_DIR"
LAG_PERIOD_S = 0.002  # the event-loop probe's timer
LAG_LOG_S = 0.005  # a wake-up later than this is recorded


class Trace:
    """In-memory event list of one process, written once as JSON lines.

    Args:
        path: the output file (``<dir>/<name>-<pid>.jsonl``).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.events: list[tuple] = []
        self._gc_start: float | None = None
        self._written = False

    def mark(self, ev: str, **fields) -> None:
        """Record event ``ev`` now with ``fields`` (JSON-serializable values)."""
        self.events.append((time.monotonic(), ev, fields))

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.monotonic()
        elif self._gc_start is not None:
            now = time.monotonic()
            self.events.append((self._gc_start, "gc", {"gen": info.get("generation"), "dur": now - self._gc_start,
                                                       "collected": info.get("collected")}))
            self._gc_start = None

    def write(self) -> None:
        """Write the events (once; later calls do nothing)."""
        if self._written:
            return
        self._written = True
        with open(self.path, "w") as f:
            for t, ev, fields in self.events:
                f.write(json.dumps({"t": t, "ev": ev, **fields}) + "\n")

    async def probe_loop_lag(self) -> None:
        """Run forever in an event loop: record ``lag`` events when a 2 ms sleep overruns by
        more than 5 ms (the loop was busy or the process paused)."""
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(LAG_PERIOD_S)
            late = time.monotonic() - t0 - LAG_PERIOD_S
            if late > LAG_LOG_S:
                self.events.append((t0 + LAG_PERIOD_S, "lag", {"late": late}))


_TRACE: Trace | None = None


def maybe_trace(name: str) -> Trace | None:
    """This process's :class:`Trace` when ``RADIXLM_TRACE_DIR`` is set (created on the first
    call, with garbage-collection events and a write at SIGTERM / exit), else None."""
    global _TRACE
    out_dir = os.environ.get(ENV)
    if not out_dir:
        return None
    if _TRACE is None:
        os.makedirs(out_dir, exist_ok=True)
        trace = _TRACE = Trace(os.path.join(out_dir, f"{name}-{os.getpid()}.jsonl"))
        gc.callbacks.append(trace._on_gc)
        atexit.register(trace.write)
        previous = signal.getsignal(signal.SIGTERM)

        def on_term(signum, frame) -> None:
            trace.write()
            if callable(previous):
                previous(signum, frame)
            else:
                raise SystemExit(0)

        signal.signal(signal.SIGTERM, on_term)
    return _TRACE
