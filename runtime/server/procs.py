"""Helpers shared by the server's processes: logging, dying with the parent, and freezing startup
objects out of the garbage collector's full collections."""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import shutil
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1


def setup_logging(log_level: str, name: str) -> None:
    """Log to stderr as ``[time name LEVEL] message``."""
    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.INFO),
        format=f"[%(asctime)s {name} %(levelname)s] %(message)s",
        stream=sys.stderr,
        force=True,
    )


def die_with_parent(cleanup_dir: str | None = None) -> None:
    """Make the kernel send SIGTERM to this process when its parent exits (Linux); elsewhere a
    thread polls the parent pid. SIGTERM removes ``cleanup_dir`` (the server's socket directory,
    so a SIGKILLed server leaves nothing behind) and exits. Either way no child outlives the server."""
    parent = os.getppid()

    def on_term(*_) -> None:
        # NOTE: SIGTERM comes from the parent's shutdown (which removes the dir too) or from the
        # kernel when the parent died (then nobody else can): remove it either way.
        if cleanup_dir:
            shutil.rmtree(cleanup_dir, ignore_errors=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
        return
    except OSError:
        pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        if cleanup_dir:
            shutil.rmtree(cleanup_dir, ignore_errors=True)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def freeze_startup_objects() -> None:
    """Collect, then move every live object to the permanent generation (``gc.freeze``): call once
    a process has loaded what it keeps for its lifetime (model, tokenizer, and the modules they
    import: transformers and torch alone are millions of objects). Full collections while serving
    then traverse only what serving allocates. Without it the HTTP process's full collections
    took ~300 ms on the H200 host, pausing every stream at once (``benchmarks/itl_tail.py``)."""
    gc.collect()
    gc.freeze()


PR_SET_NAME = 15


def set_process_name(name: str) -> None:
    """Set the kernel's process name (``/proc/PID/comm``, shown by ps/top; 15 chars max)."""
    try:
        ctypes.CDLL("libc.so.6").prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except OSError:
        pass


def child_init(log_level: str, name: str, cleanup_dir: str | None = None) -> None:
    """Common start of every child: logging, process name ``radixlm-<name>``, parent-death
    signal (removing ``cleanup_dir`` when orphaned), SIGINT left to the parent."""
    setup_logging(log_level, name)
    set_process_name(f"radixlm-{name}"[:15])
    die_with_parent(cleanup_dir)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # NOTE: Ctrl-C reaches the group; the parent decides
    from radixlm.runtime.server.profiling import maybe_profile

    maybe_profile(name)  # NOTE: RADIXLM_CPROFILE_DIR only (benchmarks/h200_profile.sh)
    from radixlm.runtime.server.tracing import maybe_trace

    maybe_trace(name)  # NOTE: RADIXLM_TRACE_DIR only (benchmarks/itl_tail.py)
