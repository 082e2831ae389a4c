"""Typed messages of the server's three ZeroMQ channels and their one codec (pickle).

Channels (all PUSH -> PULL over ``ipc://`` paths unique per server instance, see :class:`IpcPaths`):

* tokenizer manager -> scheduler: :class:`TokenizedGenerateReq`, :class:`AbortReq`,
  :class:`ControlReq`.
* scheduler -> detokenizer: :class:`BatchTokenIDOut` (one per scheduler step).
* detokenizer -> tokenizer manager: :class:`BatchStrOut` (one per scheduler step), and
  scheduler -> tokenizer manager: :class:`ControlReply` (answers to :class:`ControlReq`).
"""

from __future__ import annotations

import os
import pickle
import tempfile
import uuid
from dataclasses import dataclass, field
from typing import Any

# (logprob | None, token_id, [(logprob, token_id), ...] | None) as the scheduler records them.
RawLogprob = tuple


@dataclass(frozen=True)
class IpcPaths:
    """The ``ipc://`` endpoints of one server instance (unique names under the temp dir)."""

    scheduler_in: str
    detokenizer_in: str
    tokenizer_in: str

    @classmethod
    def new(cls) -> "IpcPaths":
        base = os.path.join(tempfile.gettempdir(), f"radixlm-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        return cls(f"ipc://{base}-sched", f"ipc://{base}-detok", f"ipc://{base}-tok")

    def files(self) -> list[str]:
        return [p[len("ipc://"):] for p in (self.scheduler_in, self.detokenizer_in, self.tokenizer_in)]


# ---------------------------------------------------------------- tokenizer -> scheduler
@dataclass
class DetokInit:
    """What the detokenizer needs to start a request's text (sent once, with its first output)."""

    prompt_tail: list[int]
    stop: list[str]
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    text_in_logprobs: bool = False


@dataclass
class TokenizedGenerateReq:
    """One sample of one prompt (``n > 1`` is expanded by the tokenizer manager)."""

    rid: str
    input_ids: list[int]
    sampling_params: dict[str, Any]
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    seed: int | None = None
    detok: DetokInit | None = None


@dataclass
class AbortReq:
    """Abort ``rid`` (or every request when ``abort_all``)."""

    rid: str | None = None
    abort_all: bool = False
    message: str = "aborted"


@dataclass
class ControlReq:
    """A request answered by a :class:`ControlReply` with the same ``req_id``.

    ``kind``: ``flush_cache`` (payload: bool), ``server_info`` (payload: dict).
    """

    req_id: str
    kind: str


@dataclass
class ControlReply:
    req_id: str
    payload: Any


# ---------------------------------------------------------------- scheduler -> detokenizer
@dataclass
class SchedulerSnapshot:
    """Scheduler gauges after a step (for metrics and admission control)."""

    num_running: int
    num_waiting: int
    kv_used_tokens: int  # held by requests (not counting evictable cached prefixes)
    kv_total_tokens: int
    cache_hit_rate: float
    num_retracted: int


@dataclass
class TokenIDOut:
    """What one request produced in one step (deltas since its previous output)."""

    rid: str
    new_output_ids: list[int]
    finish_reason: dict | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    new_input_logprobs: list[RawLogprob] = field(default_factory=list)
    new_output_logprobs: list[RawLogprob] = field(default_factory=list)
    detok: DetokInit | None = None  # set on the request's first output


@dataclass
class BatchTokenIDOut:
    outputs: list[TokenIDOut]
    snapshot: SchedulerSnapshot


# ---------------------------------------------------------------- detokenizer -> tokenizer
@dataclass
class StrOut:
    """One request's step output with text; logprob entries are ``[logprob, id, text|None]``."""

    rid: str
    text: str  # cumulative, stop string trimmed
    new_output_ids: list[int]
    finish_reason: dict | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    new_input_logprobs: list[list] = field(default_factory=list)
    new_input_top: list[list | None] = field(default_factory=list)
    new_output_logprobs: list[list] = field(default_factory=list)
    new_output_top: list[list | None] = field(default_factory=list)


@dataclass
class BatchStrOut:
    outputs: list[StrOut]
    snapshot: SchedulerSnapshot


def encode(msg: object) -> bytes:
    """The one codec of every channel."""
    return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> object:
    return pickle.loads(data)
