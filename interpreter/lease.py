"""Program-aware cache leases, frontend side (the cache side is ``radix/lease.py``).

While a program runs, every request its state sends carries ``cache_lease = {"id": <the state's
lease id>, "ttl_s": global_config.cache_lease_ttl_s}``: the runtime leases the cached sequence of
that request, so the prefix the state will extend next is evicted only after every unleased one.
Each call moves and renews the lease; when the state's executor ends (the program returned, or
the state was dropped) the lease is released. A forked branch has its own lease.

The lease id reaches the request bodies through the executor's worker thread (:func:`leasing`):
every request built on that thread by ``Backend`` carries it, without changing the backends'
method signatures. ``join`` releases the branches' leases (they will not be extended again). Backends that cannot keep leases (``supports_cache_lease`` False: SGLang's
server, API backends) send nothing. Releases over HTTP go through one background thread that sends
the ids gathered so far in one ``POST /release_cache_lease`` (:class:`LeaseReleaser`), so a program
end never waits on the network.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from radixlm.lang.global_config import global_config

logger = logging.getLogger(__name__)

_local = threading.local()


@contextmanager
def leasing(holder: Any) -> Iterator[None]:
    """Requests built on this thread inside the block carry ``holder.lease_id`` (read at each
    request, so the holder may change it; ``None``: no lease). The holder is the executor."""
    prev = getattr(_local, "holder", None)
    _local.holder = holder
    try:
        yield
    finally:
        _local.holder = prev


def current_lease() -> dict[str, Any] | None:
    """The ``cache_lease`` field for a request built now on this thread, or ``None``."""
    lease_id = getattr(getattr(_local, "holder", None), "lease_id", None)
    if lease_id is None or not global_config.enable_cache_leases:
        return None
    return {"id": lease_id, "ttl_s": float(global_config.cache_lease_ttl_s)}


class LeaseReleaser:
    """Sends lease releases from one daemon thread, batching the ids that queued meanwhile.

    Args:
        send: called with a non-empty list of ids (e.g. one HTTP ``POST``); errors are logged.
    """

    def __init__(self, send: Callable[[list[str]], Any]) -> None:
        self._send = send
        self._queue: queue.Queue[str] = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def release(self, ids: list[str]) -> None:
        """Queue ``ids`` for release (returns at once)."""
        if not ids:
            return
        with self._lock:
            self._idle.clear()
            for lease_id in ids:
                self._queue.put(lease_id)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name="radixlm-lease-release")
                self._thread.start()

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until every queued id was sent; False on timeout."""
        return self._idle.wait(timeout)

    def _loop(self) -> None:
        while True:
            batch = [self._queue.get()]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._send(batch)
            except Exception as exc:  # noqa: BLE001 - a lost release only waits out its TTL
                logger.warning("releasing %d cache leases failed: %s", len(batch), exc)
            with self._lock:
                if self._queue.empty():
                    self._idle.set()
