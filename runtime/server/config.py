"""Server-only configuration: :class:`ServerConfig` extends the engine's frozen ``ServerArgs``."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import dataclass, fields

from radixlm.runtime.server_args import ServerArgs


@dataclass(frozen=True)
class ServerConfig(ServerArgs):
    """``ServerArgs`` plus the HTTP front end's settings.

    Attributes:
        host: interface to bind (default ``127.0.0.1``).
        port: TCP port (default 30000).
        api_key: when set, every route but ``/health`` needs ``Authorization: Bearer <api_key>``.
        max_queued_requests: requests waiting for their first output beyond this get HTTP 503
            (``None``: unbounded).
        served_model_name: the model name of the OpenAI API (default: ``model_path``).
        ready_timeout_s: seconds to wait for the child processes to report ready.
        max_request_bytes: larger request bodies get HTTP 413 (default 8 MiB).
        health_timeout_s: ``/health`` answers 503 when the scheduler loop does not answer a
            ping within this many seconds (stopped, hung, or in one step longer than this).
        max_template_chars: a chat template rendering longer than this is refused (400), as is
            one that takes longer than ``template_timeout_s`` seconds.
        log_level: overrides the engine default so the per-prefill-batch log line shows.
    Raises ``ValueError`` for an out-of-range port or queue bound, or ``skip_tokenizer_init``.
    """

    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    max_queued_requests: int | None = None
    served_model_name: str | None = None
    ready_timeout_s: float = 600.0
    max_request_bytes: int = 8 * 1024 * 1024
    health_timeout_s: float = 20.0
    max_template_chars: int = 1_000_000
    template_timeout_s: float = 5.0
    log_level: str = "info"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if getattr(self, "skip_tokenizer_init", False):
            raise ValueError("skip_tokenizer_init is not supported by the server (it detokenizes and takes text)")
        if self.max_queued_requests is not None and self.max_queued_requests < 0:
            raise ValueError("max_queued_requests must be >= 0")
        if self.max_request_bytes < 1024:
            raise ValueError("max_request_bytes must be >= 1024")
        for name in ("health_timeout_s", "template_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")

    def engine_args(self) -> ServerArgs:
        """The plain ``ServerArgs`` part (what the scheduler process needs)."""
        names = {f.name for f in fields(ServerArgs)}
        return ServerArgs(**{k: v for k, v in vars(self).items() if k in names})


def _base_type(tp) -> type:
    """``int | None`` -> int; ``str`` -> str (dataclass annotations are strings here)."""
    if isinstance(tp, str):
        tp = eval(tp, {"int": int, "str": str, "float": float, "bool": bool, "None": type(None)})
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0]
    return tp


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """One ``--flag-name`` per :class:`ServerConfig` field; defaults read from the dataclass."""
    for f in dataclasses.fields(ServerConfig):
        flag = "--" + f.name.replace("_", "-")
        tp = _base_type(f.type)
        if tp is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=f"(default {f.default})")
        else:
            parser.add_argument(flag, type=tp, default=f.default, help=f"(default {f.default})")


def config_from_namespace(ns: argparse.Namespace) -> ServerConfig:
    """Build a :class:`ServerConfig` from parsed CLI args (unknown attributes ignored)."""
    names = {f.name for f in dataclasses.fields(ServerConfig)}
    return ServerConfig(**{k: v for k, v in vars(ns).items() if k in names})
