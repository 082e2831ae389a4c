"""``sgl.Runtime``: launch ``radixlm serve`` as a child process and talk to it over HTTP.

Mirrors SGLang's ``Runtime`` (a server started from Python for the frontend language): the keyword
arguments are server arguments (``radixlm.runtime.server.config.ServerConfig`` fields, e.g.
``model_path``, ``max_total_tokens``, ``device``), the constructor returns once the server answers
``/health_generate``, ``.endpoint`` is a :class:`~radixlm.interpreter.runtime_endpoint.RuntimeEndpoint`
and ``.url`` its base URL.  The server runs in its own process group, which ``shutdown()`` (also
called by ``with``-exit, ``atexit`` and garbage collection) terminates: SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import requests

from radixlm.interpreter.runtime_endpoint import RuntimeEndpoint

logger = logging.getLogger(__name__)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _cli_args(kwargs: dict[str, Any]) -> list[str]:
    """``{"max_total_tokens": 4096, "disable_radix_cache": True}`` -> CLI flags.

    Unknown names (SGLang server arguments radixlm does not have) are dropped with a warning.
    """
    from radixlm.runtime.server.config import ServerConfig

    known = {f.name for f in dataclasses.fields(ServerConfig)}
    out: list[str] = []
    for key, value in kwargs.items():
        if key not in known:
            logger.warning("sgl.Runtime: ignoring server argument %r (not a radixlm option)", key)
            continue
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        out += [flag] if value is True else [flag, str(value)]
    return out


class Runtime:
    """A ``radixlm serve`` child process plus a RuntimeEndpoint to it.

    Args:
        log_level: the server's log level (default ``"error"``, as SGLang).
        launch_timeout: seconds to wait for the server to become healthy (default 300).
        **kwargs: server arguments (``model_path=None`` means the default model; ``host`` default
            ``127.0.0.1``; ``port`` default: a free port).
    Raises:
        TypeError: positional server arguments.
        RuntimeError: the server exited during startup (the message has its log tail).
        TimeoutError: not healthy within ``launch_timeout``.
    """

    def __init__(self, log_level: str = "error", launch_timeout: float = 300.0, *args: Any,
                 **kwargs: Any) -> None:
        if args:
            raise TypeError("sgl.Runtime takes server arguments by keyword only")
        self.pid: int | None = None
        host = kwargs.pop("host", None) or "127.0.0.1"
        port = kwargs.pop("port", None) or _free_port(host)
        self.server_args = {**kwargs, "host": host, "port": port, "log_level": log_level}
        self.url = f"http://{host}:{port}"
        self.generate_url = self.url + "/generate"
        self._log = tempfile.NamedTemporaryFile("w+", prefix="radixlm-runtime-", suffix=".log",
                                                delete=False)
        cmd = [sys.executable, "-m", "radixlm.cli", "serve", *_cli_args(self.server_args)]
        self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        self.pid = self._proc.pid
        atexit.register(self.shutdown)
        self._wait_ready(launch_timeout)
        self.endpoint = RuntimeEndpoint(self.url, api_key=kwargs.get("api_key"))

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        headers = {}
        if self.server_args.get("api_key"):
            headers["Authorization"] = f"Bearer {self.server_args['api_key']}"
        while True:
            if self._proc.poll() is not None:
                tail = self.log_tail()
                self.shutdown()
                raise RuntimeError(f"radixlm serve exited with {self._proc.returncode}:\n{tail}")
            try:
                res = requests.get(self.url + "/health_generate", headers=headers, timeout=30)
                if res.status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.shutdown()
                raise TimeoutError(f"server not healthy after {timeout} s:\n{tail}")
            time.sleep(0.25)

    def log_tail(self, chars: int = 4000) -> str:
        """The last ``chars`` characters of the server's log."""
        with open(self._log.name, errors="replace") as f:
            return f.read()[-chars:]

    def shutdown(self, timeout: float = 20.0) -> None:
        """Stop the server's process group (SIGTERM, SIGKILL after ``timeout``). Idempotent."""
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        try:
            os.killpg(pid, signal.SIGTERM)
            self._proc.wait(timeout)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._proc.wait()
        try:  # NOTE: children that outlived the leader in its group.
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        atexit.unregister(self.shutdown)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001 - interpreter teardown
            pass

    # ---- SGLang's convenience methods ------------------------------------------------------------

    def cache_prefix(self, prefix: str) -> None:
        """Put ``prefix`` into the server's prefix cache (one prefill-only request)."""
        self.endpoint.cache_prefix(prefix)

    def get_tokenizer(self) -> Any:
        """The served model's tokenizer (transformers), loaded from its ``tokenizer_path``."""
        from transformers import AutoTokenizer

        info = self.endpoint.model_info
        return AutoTokenizer.from_pretrained(info.get("tokenizer_path") or info["model_path"])

    def generate(self, prompt: str | list[str], sampling_params: dict[str, Any] | None = None,
                 return_logprob: bool | list[bool] = False, logprob_start_len: int | None = None,
                 top_logprobs_num: int | None = None, lora_path: Any = None) -> str:
        """One native ``/generate`` call; returns the response as a JSON string (as SGLang).

        Raises:
            NotImplementedError: ``lora_path`` given. RuntimeError: the request failed.
        """
        if lora_path is not None:
            raise NotImplementedError("LoRA adapters are not supported by radixlm")
        body: dict[str, Any] = {"text": prompt, "sampling_params": sampling_params or {},
                                "return_logprob": return_logprob}
        if logprob_start_len is not None:
            body["logprob_start_len"] = logprob_start_len
        if top_logprobs_num is not None:
            body["top_logprobs_num"] = top_logprobs_num
        return json.dumps(self.endpoint.request(body))

    async def async_generate(self, prompt: str, sampling_params: dict[str, Any] | None = None):
        """Stream a completion: yields text pieces (run in a worker thread)."""
        import asyncio

        body = {"text": prompt, "sampling_params": sampling_params or {}}
        loop = asyncio.get_running_loop()
        it = iter(self.endpoint.request_stream(body))
        end = object()
        seen = 0
        while True:
            chunk = await loop.run_in_executor(None, next, it, end)
            if chunk is end:
                return
            text = chunk.get("text", "")
            if len(text) > seen:
                yield text[seen:]
                seen = len(text)

    add_request = async_generate  # NOTE: SGLang's alias

    def start_profile(self) -> None:
        """Not supported: raises NotImplementedError."""
        raise NotImplementedError("profiling through sgl.Runtime is not supported by radixlm")

    stop_profile = start_profile
