"""One task that notices disconnected HTTP clients for every waiting request.

A request handler waits on its update queue (``TokenizerManager.updates``). It used to wait under a
0.5 s timeout per ``queue.get()`` so that it could poll ``request.is_disconnected()`` now and
then; with hundreds of streams that is one timer armed and cancelled per token per stream on the
event loop (about a tenth of the HTTP process's loop time at 512 streams, H200 profile). Now the
handler waits on its queue alone, and :class:`DisconnectWatcher` polls, every ``period`` seconds,
the watched requests that have had no update for a whole period; a disconnected one gets
:data:`DISCONNECTED` put on its queue. Streaming responses are also cancelled by Starlette itself
when their client goes away; the watcher covers the waits no stream write would notice (a request
waiting for its first token, a non-streaming request).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

logger = logging.getLogger("radixlm.tokenizer_manager")

DISCONNECTED = object()  # put on a watched queue when its client has gone


class Watch:
    """One watched wait: its ``queue``, HTTP ``request`` and the loop time of its ``last`` update
    (the handler sets ``last`` on each update it takes)."""

    __slots__ = ("queue", "request", "last")

    def __init__(self, queue: asyncio.Queue, request: Any, now: float) -> None:
        self.queue, self.request, self.last = queue, request, now


class DisconnectWatcher:
    """Polls the idle watched requests for a disconnect, one task for all of them (started on the
    first :meth:`watch`, ended when nothing is watched).

    Args:
        period: seconds between polls, and the idle time after which a request is polled.
    """

    def __init__(self, period: float) -> None:
        self.period = period
        self._watches: set[Watch] = set()
        self._task: asyncio.Task | None = None

    def watch(self, queue: asyncio.Queue, request: Any) -> Watch:
        """Start watching ``request`` (call inside the event loop); :meth:`unwatch` when done."""
        loop = asyncio.get_running_loop()
        w = Watch(queue, request, loop.time())
        self._watches.add(w)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run())
        return w

    def unwatch(self, w: Watch) -> None:
        self._watches.discard(w)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._watches:
            await asyncio.sleep(self.period)
            idle_since = loop.time() - self.period
            for w in [w for w in self._watches if w.last <= idle_since]:
                try:
                    gone = await w.request.is_disconnected()
                except Exception:  # noqa: BLE001 (keep watching the others)
                    logger.exception("disconnect poll failed")
                    gone = False
                if gone and w in self._watches:
                    self._watches.discard(w)
                    w.queue.put_nowait(DISCONNECTED)
