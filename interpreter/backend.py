"""The small interface the interpreter drives, and the process-wide default backend.

A backend only has to send native-protocol ``/generate`` bodies (DESIGN.md §3.2) and answer with
native responses: :meth:`Backend.request` and :meth:`Backend.request_stream`.  Everything the DSL
needs (generation, prefix commits, choice scoring) is built on those two in this base class, so the
in-process :class:`~radixlm.interpreter.engine_backend.EngineBackend` and the HTTP
:class:`~radixlm.interpreter.runtime_endpoint.RuntimeEndpoint` behave identically.
"""

from __future__ import annotations

import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.global_config import global_config
from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod
from radixlm.lang.ir import SamplingParams

Response = dict[str, Any]


class Backend(ABC):
    """A model the interpreter can run programs on.

    Attributes:
        chat_template: role markers used for ``system/user/assistant``.
        fork_commits_prefix: whether ``s.fork(n > 1)`` of a non-empty state first sends the text
            as a prefill-only request (True here and for the in-process Engine, where it costs no
            round trip).  ``RuntimeEndpoint`` sets it False: over HTTP the branches' own requests
            share the prefix through the server's in-batch prefix sharing, and SGLang's frontend
            sends ``fork(3)`` + 3 gens as 3 requests too.
        typed_sampling_params: whether ``sampling_params`` of a generation payload is the runtime's
            validated ``SamplingParams`` (in process: the Engine takes it as is) rather than the
            protocol dict (a JSON body).
    """

    chat_template: ChatTemplate
    fork_commits_prefix: bool = True
    typed_sampling_params: bool = False

    @abstractmethod
    def request(self, payload: dict[str, Any]) -> Response | list[Response]:
        """Send one native ``/generate`` body; a list input gives a list of responses.

        Raises:
            RuntimeError: the request failed (the message says why).
        """

    @abstractmethod
    def request_stream(self, payload: dict[str, Any]) -> Iterator[Response]:
        """Send a streaming ``/generate`` body; yields chunks whose ``text`` is cumulative."""

    @abstractmethod
    def flush_cache(self, empty_cache: bool = True) -> None:
        """Drop the backend's prefix cache (``empty_cache`` is accepted for SGLang compatibility)."""

    @abstractmethod
    def get_server_info(self) -> dict[str, Any]:
        """Backend configuration and statistics (as ``GET /get_server_info``)."""

    def shutdown(self) -> None:
        """Release resources; the default does nothing."""

    def get_model_name(self) -> str:
        """Model identifier (path) of the backend."""
        return "unknown"

    # ---- program-aware cache leases (interpreter/lease.py) ------------------------------------

    @property
    def supports_cache_lease(self) -> bool:
        """Whether requests may carry ``cache_lease`` (radixlm's runtime); False here."""
        return False

    def release_cache_leases(self, ids: list[str]) -> None:
        """Release program leases (never blocks on the network); the default does nothing."""

    def _lease_fields(self) -> dict[str, Any]:
        """``{"cache_lease": ...}`` for a request built now by a running program, else ``{}``."""
        if not self.supports_cache_lease:
            return {}
        from radixlm.interpreter.lease import current_lease

        lease = current_lease()
        return {"cache_lease": lease} if lease is not None else {}

    # ---- operations used by the interpreter ---------------------------------------------------

    def generate(self, prompt: str, params: SamplingParams) -> tuple[str, Response]:
        """Complete ``prompt``. Returns ``(text, meta_info)``; text excludes prompt and stop."""
        obj = self.request({**_payload(prompt, params, self.typed_sampling_params), **self._lease_fields()})
        assert isinstance(obj, dict)
        return obj["text"], raise_if_rejected(obj["meta_info"])

    def generate_n(self, prompt: str, params: SamplingParams,
                   n: int) -> tuple[list[str], list[Response]]:
        """``n`` completions of ``prompt`` in one batched request: ``(texts, meta_infos)``."""
        payload = {**_payload(prompt, params, self.typed_sampling_params), **self._lease_fields()}
        payload["text"] = [prompt] * n
        objs = self.request(payload)
        assert isinstance(objs, list) and len(objs) == n
        return [o["text"] for o in objs], [raise_if_rejected(o["meta_info"]) for o in objs]

    def generate_stream(self, prompt: str, params: SamplingParams) -> Iterator[tuple[str, Response]]:
        """Stream a completion: yields ``(delta_text, meta_info)``; deltas concatenate to the text."""
        payload = {**_payload(prompt, params, self.typed_sampling_params), **self._lease_fields()}
        payload["stream"] = True
        seen = 0
        for chunk in self.request_stream(payload):
            text = chunk.get("text", "")
            meta = raise_if_rejected(chunk.get("meta_info", {}))
            yield text[seen:], meta
            seen = len(text)

    def commit_prefix(self, prompt: str) -> Response:
        """Prefill-only request (``max_new_tokens: 0``): ``prompt`` enters the prefix cache.

        Returns the response's ``meta_info`` (``prompt_tokens``, ``cached_tokens``, ...).
        """
        obj = self.request({"text": prompt, "sampling_params": {"max_new_tokens": 0},
                            **self._lease_fields()})
        assert isinstance(obj, dict)
        return raise_if_rejected(obj["meta_info"])

    def cache_prefix(self, prefix: str) -> None:
        """SGLang's name for :meth:`commit_prefix` (returns nothing)."""
        self.commit_prefix(prefix)

    def select(self, prompt: str, choices: list[str],
               method: ChoicesSamplingMethod) -> ChoicesDecision:
        """Score ``choices`` as continuations of ``prompt`` (see ``interpreter/select.py``)."""
        from radixlm.interpreter.select import score_choices

        return score_choices(self, prompt, choices, method, self._lease_fields())


def raise_if_rejected(meta: Response) -> Response:
    """Return ``meta``, or raise ``RuntimeError`` when its ``finish_reason`` is an abort carrying
    an HTTP ``status_code`` (a rejected request: invalid grammar, bad parameter, no KV room).

    The in-process Engine reports such failures in the response, where the HTTP server answers
    4xx/5xx (which :class:`RuntimeEndpoint` raises), so both backends fail a program the same way,
    as SGLang's frontend does.  An abort without a status (``abort_request``) keeps its text.
    """
    reason = meta.get("finish_reason") if isinstance(meta, dict) else None
    if isinstance(reason, dict) and reason.get("type") == "abort" and reason.get("status_code"):
        raise RuntimeError(f"request rejected ({reason['status_code']}): "
                           f"{reason.get('message', 'aborted')}")
    return meta


def _payload(prompt: str, params: SamplingParams, typed: bool = False) -> dict[str, Any]:
    """The ``/generate`` body of one generation; ``typed``: ``sampling_params`` is the runtime's
    dataclass (validated here), else the protocol dict."""
    defaults = {"skip_special_tokens": global_config.skip_special_tokens_in_output,
                "spaces_between_special_tokens": global_config.spaces_between_special_tokens_in_out}
    sp = params.to_runtime(**defaults) if typed else {**defaults, **params.to_native()}
    return {"text": prompt, "sampling_params": sp, **params.request_options()}


_engine_backends: weakref.WeakKeyDictionary[Any, Backend] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def resolve_backend(backend: Any = None) -> Backend:
    """Turn ``backend`` (a Backend, an ``Engine``, or ``None`` = the default) into a Backend.

    An ``Engine`` is wrapped once in an ``EngineBackend`` (cached per engine).

    Raises:
        RuntimeError: ``None`` and no default backend was set.
        TypeError: an object that is neither a Backend nor Engine-like.
    """
    if backend is None:
        if global_config.default_backend is None:
            raise RuntimeError("no backend: pass backend=... or call radixlm.set_default_backend()")
        backend = global_config.default_backend
    if isinstance(backend, Backend):
        return backend
    if hasattr(backend, "endpoint") and isinstance(backend.endpoint, Backend):
        return backend.endpoint
    if callable(getattr(backend, "generate", None)) and hasattr(backend, "tokenizer"):
        from radixlm.interpreter.engine_backend import EngineBackend

        with _lock:
            try:
                wrapped = _engine_backends.get(backend)
            except TypeError:
                wrapped = None
            if wrapped is None:
                wrapped = EngineBackend(backend)
                try:
                    _engine_backends[backend] = wrapped
                except TypeError:
                    pass
        return wrapped
    raise TypeError(f"not a backend: {type(backend).__name__}")


def set_default_backend(backend: Any) -> None:
    """Use ``backend`` (a Backend, an ``Engine`` or a ``Runtime``) for programs run without
    ``backend=``; stored in ``global_config.default_backend``. Raises TypeError for non-backends."""
    global_config.default_backend = resolve_backend(backend)


def get_default_backend() -> Backend | None:
    """The default backend (``global_config.default_backend`` resolved), or ``None``."""
    if global_config.default_backend is None:
        return None
    return resolve_backend(global_config.default_backend)


def flush_cache(backend: Any = None, empty_cache: bool = True) -> bool:
    """Flush the prefix cache of ``backend`` (default: the default backend).

    Returns:
        False when there is no backend at all (as SGLang), else True.
    """
    if backend is None and global_config.default_backend is None:
        return False
    resolve_backend(backend).flush_cache(empty_cache=empty_cache)
    return True


def get_server_info(backend: Any = None) -> dict[str, Any] | None:
    """Server info of ``backend`` (default: the default backend); ``None`` without any backend."""
    if backend is None and global_config.default_backend is None:
        return None
    return resolve_backend(backend).get_server_info()
