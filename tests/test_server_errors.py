"""A bug in a route is a logged 500 for that request only: the keep-alive connection and the
server go on (issue 13, finding 6)."""

from __future__ import annotations

import http.client
import json
import threading
import time

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from radixlm.runtime.server.http_native import ContainErrors
from radixlm.runtime.server.testing import free_port


def _app() -> Starlette:
    async def boom(request):
        raise RuntimeError("a bug")

    async def ok(request):
        return PlainTextResponse("ok")

    # NOTE: placed as create_app places it: inside Starlette's ServerErrorMiddleware
    return Starlette(routes=[Route("/boom", boom), Route("/ok", ok)], middleware=[Middleware(ContainErrors)])


def test_500_keeps_the_connection(caplog):
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(_app(), host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/ok")
        assert conn.getresponse().read() == b"ok"
        sock = conn.sock
        conn.request("GET", "/boom")
        bad = conn.getresponse()
        body = json.loads(bad.read())
        assert bad.status == 500 and "a bug" in body["error"]["message"]
        assert not bad.will_close, "the 500 closes the keep-alive connection"
        conn.request("GET", "/ok")
        again = conn.getresponse()
        assert again.status == 200 and again.read() == b"ok"
        assert conn.sock is sock  # the same connection served all three
        conn.close()
        assert "a bug" in caplog.text  # the traceback is logged
    finally:
        server.should_exit = True
        thread.join(10)
