"""In-process backend: programs call ``radixlm.runtime.engine.Engine.generate`` directly (no HTTP).

The Engine runs its scheduler on its own thread and accepts concurrent ``generate`` calls, so each
program executor thread simply blocks in it while the scheduler batches the calls together.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from radixlm.interpreter.backend import Backend, Response
from radixlm.lang.chat_template import ChatTemplate, chat_template_from_tokenizer

_ENGINE_KEYS = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")


class EngineBackend(Backend):
    """Backend over an in-process ``Engine``.

    Args:
        engine: a ``radixlm.Engine`` (anything with ``generate(prompt=..., sampling_params=...,
            input_ids=..., return_logprob=..., logprob_start_len=..., top_logprobs_num=...,
            stream=...)`` returning native responses, and ``tokenizer``).
        chat_template: role markers; default: derived from ``engine.tokenizer``'s chat template.

    Generation payloads carry the runtime's ``SamplingParams`` (validated once, by the DSL),
    which ``Engine.generate`` uses as is: no dict in between.
    """

    typed_sampling_params = True

    def __init__(self, engine: Any, chat_template: ChatTemplate | None = None) -> None:
        self.engine = engine
        self.chat_template = chat_template or chat_template_from_tokenizer(
            getattr(engine, "tokenizer", None))

    def _call(self, payload: dict[str, Any], stream: bool) -> Any:
        kwargs = {k: payload[k] for k in _ENGINE_KEYS if payload.get(k) is not None}
        if payload.get("cache_lease") is not None and self.supports_cache_lease:
            kwargs["cache_lease"] = payload["cache_lease"]
        return self.engine.generate(prompt=payload.get("text"), input_ids=payload.get("input_ids"),
                                    sampling_params=payload.get("sampling_params") or {},
                                    stream=stream, **kwargs)

    @property
    def supports_cache_lease(self) -> bool:
        """Whether the engine keeps program leases (``Engine.release_cache_lease``)."""
        return callable(getattr(self.engine, "release_cache_lease", None))

    def request(self, payload: dict[str, Any]) -> Response | list[Response]:
        choices = payload.get("choices")
        score = getattr(self.engine, "score_choices", None)
        if choices is not None and callable(score) and isinstance(payload.get("text"), str):
            lease = payload.get("cache_lease") if self.supports_cache_lease else None
            return score(payload["text"], list(choices),
                         payload.get("choices_method", "token_length_normalized"), cache_lease=lease)
        if choices is not None:  # NOTE: an engine without one-trip select: the body is a commit
            payload = {k: v for k, v in payload.items() if k not in ("choices", "choices_method")}
        return self._call(payload, stream=False)

    def release_cache_leases(self, ids: list[str]) -> None:
        if ids and self.supports_cache_lease:
            self.engine.release_cache_lease(ids, wait=False)

    def request_stream(self, payload: dict[str, Any]) -> Iterator[Response]:
        yield from self._call(payload, stream=True)

    def flush_cache(self, empty_cache: bool = True) -> None:
        self.engine.flush_cache()

    def get_server_info(self) -> dict[str, Any]:
        return self.engine.get_server_info()

    def get_model_name(self) -> str:
        return str(getattr(self.engine, "model_path", None) or "radixlm-engine")

    def shutdown(self) -> None:
        self.engine.shutdown()
