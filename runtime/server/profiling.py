"""Opt-in cProfile of the server's child processes, for finding where host time goes.

With ``RADIXLM_CPROFILE_DIR=/some/dir`` in the environment, every child (scheduler, detokenizer)
profiles its main thread from start-up and writes ``<dir>/<name>-<pid>.prof`` when it is stopped
with SIGTERM (the server's normal shutdown); the HTTP process profiles its event loop from the
start of serving and writes ``http-<pid>.prof`` at exit. Read with ``python -m pstats`` or ``pstats.Stats``.
Off (no cost) when the variable is unset.
"""

from __future__ import annotations

import atexit
import cProfile
import os
import signal

ENV = "RADIXLM_CPROFILE_DIR"


def maybe_profile(name: str, at_exit: bool = False) -> None:
    """Start profiling this thread when ``RADIXLM_CPROFILE_DIR`` is set. A child writes its
    profile at SIGTERM (the handler installed before this call runs after it); with
    ``at_exit`` (the HTTP process, whose SIGTERM uvicorn handles) it is written at interpreter
    exit instead."""
    out_dir = os.environ.get(ENV)
    if not out_dir:
        return
    os.makedirs(out_dir, exist_ok=True)
    prof = cProfile.Profile()
    if at_exit:
        def dump() -> None:
            prof.disable()
            prof.dump_stats(os.path.join(out_dir, f"{name}-{os.getpid()}.prof"))

        atexit.register(dump)
        prof.enable()
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame) -> None:
        prof.disable()
        prof.dump_stats(os.path.join(out_dir, f"{name}-{os.getpid()}.prof"))
        if callable(previous):
            previous(signum, frame)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    prof.enable()
