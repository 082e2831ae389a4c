"""HTTP backend speaking the SGLang-native protocol of DESIGN.md §3.2 (radixlm's or SGLang's server).

Role markers come from the served model's tokenizer when ``/get_model_info`` names a
``tokenizer_path`` that exists on this machine (or from an explicit ``chat_template``), otherwise
from the template SGLang's matchers pick from the model path (``lang/chat_template_registry.py``),
otherwise the plain default template is used.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

import requests

from radixlm.interpreter.backend import Backend, Response
from radixlm.interpreter.lease import LeaseReleaser
from radixlm.lang.chat_template import (
    ChatTemplate, chat_template_from_tokenizer, default_chat_template, named_chat_template,
)
from radixlm.lang.chat_template_registry import match_model_path

logger = logging.getLogger(__name__)


def _error_message(res: requests.Response) -> str:
    try:
        body = res.json()
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            return str(body["error"].get("message", body))
        return json.dumps(body)
    except ValueError:
        return res.text


class RuntimeEndpoint(Backend):
    """Backend over a running server's native HTTP API.

    Args:
        base_url: e.g. ``"http://127.0.0.1:30000"``.
        api_key: sent as ``Authorization: Bearer <api_key>`` when given.
        verify: TLS verification for ``requests`` (a CA bundle path or bool; ``None``: default).
        chat_template_name: one of SGLang's template names (``"chatml"``, ``"qwen"``,
            ``"llama-3-instruct"``, ...: ``named_chat_template``); others are ignored with a
            warning (the template is then derived).
        chat_template: a ChatTemplate, or ``None`` to derive it (see module docstring).
        timeout: seconds per HTTP request (``None``: no limit).
    Raises:
        RuntimeError: the server is unreachable or ``/get_model_info`` fails.
    """

    fork_commits_prefix = False  # NOTE: see Backend; the server shares the prefix in-batch.

    def __init__(self, base_url: str, api_key: str | None = None, verify: Any = None,
                 chat_template_name: str | None = None, *,
                 chat_template: ChatTemplate | None = None, timeout: float | None = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.verify = verify
        self.timeout = timeout
        if chat_template is None and chat_template_name is not None:
            chat_template = named_chat_template(chat_template_name)
        self._local = threading.local()
        self._releaser = LeaseReleaser(lambda ids: self._post("/release_cache_lease", {"ids": ids}))
        self.model_info: dict[str, Any] = self._get("/get_model_info")
        self.chat_template = chat_template or self._derive_template()

    def _derive_template(self) -> ChatTemplate:
        path = self.model_info.get("tokenizer_path") or self.model_info.get("model_path")
        if isinstance(path, str) and os.path.isdir(path):
            try:
                from transformers import AutoTokenizer

                return chat_template_from_tokenizer(AutoTokenizer.from_pretrained(path))
            except Exception as exc:  # noqa: BLE001 - fall back to the plain template
                logger.warning("could not load tokenizer %s for the chat template: %s", path, exc)
        for name in (self.model_info.get("model_path"), path):
            if isinstance(name, str) and match_model_path(name):  # NOTE: SGLang's path matching
                return named_chat_template(match_model_path(name)) or default_chat_template()
        return default_chat_template()

    @property
    def _session(self) -> requests.Session:
        # NOTE: requests.Session is not documented thread-safe; executors run on many threads.
        sess = getattr(self._local, "session", None)
        if sess is None:
            sess = requests.Session()
            if self.verify is not None:
                sess.verify = self.verify
            if self.api_key:
                sess.headers["Authorization"] = f"Bearer {self.api_key}"
            self._local.session = sess
        return sess

    def _check(self, res: requests.Response) -> requests.Response:
        if res.status_code != 200:
            raise RuntimeError(f"{res.request.method} {res.url} -> HTTP {res.status_code}: "
                               f"{_error_message(res)}")
        return res

    def _get(self, path: str) -> Any:
        try:
            res = self._session.get(self.base_url + path, timeout=self.timeout)
        except requests.RequestException as exc:
            raise RuntimeError(f"cannot reach {self.base_url}: {exc}") from exc
        return self._check(res).json()

    def _post(self, path: str, body: dict[str, Any], stream: bool = False) -> requests.Response:
        try:
            res = self._session.post(self.base_url + path, json=body, stream=stream,
                                     timeout=self.timeout)
        except requests.RequestException as exc:
            raise RuntimeError(f"cannot reach {self.base_url}: {exc}") from exc
        return self._check(res)

    def request(self, payload: dict[str, Any]) -> Response | list[Response]:
        return self._post("/generate", payload).json()

    def request_stream(self, payload: dict[str, Any]) -> Iterator[Response]:
        res = self._post("/generate", {**payload, "stream": True}, stream=True)
        with res:
            for line in res.iter_lines(decode_unicode=False):
                if not line or not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                chunk = json.loads(data)
                if "error" in chunk:
                    err = chunk["error"]
                    raise RuntimeError(err.get("message", str(err)) if isinstance(err, dict)
                                       else str(err))
                yield chunk

    def flush_cache(self, empty_cache: bool = True) -> None:
        self._post("/flush_cache", {})

    def get_server_info(self) -> dict[str, Any]:
        return self._get("/get_server_info")

    def get_model_name(self) -> str:
        return str(self.model_info.get("model_path", "unknown"))

    @property
    def supports_cache_lease(self) -> bool:
        """True when ``/get_model_info`` lists ``cache_lease`` in ``radixlm_features``."""
        return "cache_lease" in (self.model_info.get("radixlm_features") or ())

    def release_cache_leases(self, ids: list[str]) -> None:
        """Queue ``ids`` for one batched ``POST /release_cache_lease`` from a background thread."""
        if ids and self.supports_cache_lease:
            self._releaser.release(ids)
