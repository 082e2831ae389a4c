"""Typed messages of the server's three ZeroMQ channels and their one codec (msgpack).

Channels (all PUSH -> PULL over ``ipc://`` paths unique per server instance, see :class:`IpcPaths`):

* tokenizer manager -> scheduler: :class:`TokenizedGenerateReq`, :class:`AbortReq`,
  :class:`ControlReq`.
* scheduler -> detokenizer: :class:`BatchTokenIDOut` (one per scheduler step).
* detokenizer -> tokenizer manager: :class:`BatchStrOut` (one per scheduler step; plain outputs
  as columns too, with their text as increments), and
  scheduler -> tokenizer manager: :class:`ControlReply` (answers to :class:`ControlReq`).

The codec is msgpack (data only, never code): a message is a map tagged with its class name, and
:func:`decode` rebuilds only the dataclasses of this module; anything else raises
:class:`MalformedMessage`, which the receivers log and drop. The sockets live in a private
directory (mode 0700) removed at shutdown; :func:`remove_stale_dirs` removes those whose server
died without cleaning up.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

import msgpack

from radixlm.runtime.sampling_params import SamplingParams  # NOTE: a message field (registered below)

DIR_PREFIX = "radixlm-"

# (logprob | None, token_id, [(logprob, token_id), ...] | None) as the scheduler records them.
RawLogprob = tuple


@dataclass(frozen=True)
class IpcPaths:
    """The ``ipc://`` endpoints of one server instance, in a private directory ``dir`` (0700,
    named ``radixlm-<server pid>-<random>`` under the temp dir)."""

    dir: str
    scheduler_in: str
    detokenizer_in: str
    tokenizer_in: str

    @classmethod
    def new(cls) -> "IpcPaths":
        """Create the directory (``mkdtemp``: mode 0700) after removing stale ones."""
        remove_stale_dirs()
        base = tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-")
        return cls(base, f"ipc://{base}/sched", f"ipc://{base}/detok", f"ipc://{base}/tok")

    def files(self) -> list[str]:
        return [p[len("ipc://"):] for p in (self.scheduler_in, self.detokenizer_in, self.tokenizer_in)]

    def remove(self) -> None:
        """Delete the socket directory (idempotent)."""
        shutil.rmtree(self.dir, ignore_errors=True)


def remove_stale_dirs(root: str | None = None) -> list[str]:
    """Remove socket directories of this user whose server process no longer exists."""
    root = root or tempfile.gettempdir()
    removed = []
    for name in os.listdir(root):
        if not name.startswith(DIR_PREFIX):
            continue
        path = os.path.join(root, name)
        try:
            pid = int(name[len(DIR_PREFIX):].split("-", 1)[0])
            if os.stat(path).st_uid != os.getuid() or not os.path.isdir(path):
                continue
        except (ValueError, OSError):
            continue
        try:
            os.kill(pid, 0)
            continue  # alive (or not ours to judge)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        except OSError:
            continue
    return removed


# ---------------------------------------------------------------- tokenizer -> scheduler
@dataclass
class DetokInit:
    """What the detokenizer needs to start a request's text (sent once, with its first output)."""

    prompt_tail: list[int]
    stop: list[str]
    stop_regex: list[str] = field(default_factory=list)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    text_in_logprobs: bool = False


@dataclass
class TokenizedGenerateReq:
    """One sample of one prompt (``n > 1`` is expanded by the tokenizer manager)."""

    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams  # validated by the tokenizer manager's edge, sent typed
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    sample: int = 0  # index k among the prompt's n samples (a seeded sample uses seed + k)
    detok: DetokInit | None = None
    cache_lease: dict | None = None  # {"id": str, "ttl_s": float}: lease the cached sequence


@dataclass
class AbortReq:
    """Abort ``rid`` (or every request when ``abort_all``)."""

    rid: str | None = None
    abort_all: bool = False
    message: str = "aborted"


@dataclass
class ControlReq:
    """A request answered by a :class:`ControlReply` with the same ``req_id``.

    ``kind``: ``flush_cache`` (payload: bool), ``server_info`` (payload: dict), ``ping``
    (payload: True; the health check's proof that the scheduler loop runs),
    ``release_cache_lease`` (``args = {"ids": [...]}``; payload: number of leases released).
    """

    req_id: str
    kind: str
    args: dict | None = None


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
    spec_verify_ct: int = 0  # speculative decoding: verify steps with a draft (cumulative)
    spec_draft_tokens: int = 0  # draft tokens proposed (cumulative)
    spec_accepted_tokens: int = 0  # draft tokens accepted (cumulative)


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
    spec_info: dict | None = None  # speculative decoding figures for meta_info (cumulative)


@dataclass
class BatchTokenIDOut:
    """One step's outputs. Requests whose output is only new token ids (not their first output,
    not finished, no logprobs, no speculation figures: nearly every request of a decode step)
    travel as parallel ``plain_*`` lists, which msgpack packs natively; the others as
    :class:`TokenIDOut` objects in ``outputs``."""

    outputs: list[TokenIDOut]
    snapshot: SchedulerSnapshot
    plain_rids: list[str] = field(default_factory=list)
    plain_new_ids: list[list[int]] = field(default_factory=list)
    plain_prompt_tokens: list[int] = field(default_factory=list)
    plain_cached_tokens: list[int] = field(default_factory=list)
    plain_completion_tokens: list[int] = field(default_factory=list)

    def plain(self) -> list[TokenIDOut]:
        """The ``plain_*`` columns as :class:`TokenIDOut` objects (for readers that want objects)."""
        return [TokenIDOut(r, ids, None, p, c, n) for r, ids, p, c, n in zip(
            self.plain_rids, self.plain_new_ids, self.plain_prompt_tokens, self.plain_cached_tokens,
            self.plain_completion_tokens)]


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
    spec_info: dict | None = None  # speculative decoding figures for meta_info (cumulative)


@dataclass
class BatchStrOut:
    """One step's outputs with text. Requests whose output is plain (not finished, no logprob
    entries, no speculation figures, text not cut back by a stop string: nearly every request of
    a decode step) travel as parallel ``plain_*`` lists carrying only the text *appended* since the
    request's previous output (``plain_text``); the others as :class:`StrOut` objects in
    ``outputs``, whose ``text`` is cumulative. Within one message a request appears once."""

    outputs: list[StrOut]
    snapshot: SchedulerSnapshot
    plain_rids: list[str] = field(default_factory=list)
    plain_text: list[str] = field(default_factory=list)  # appended text (not cumulative)
    plain_new_ids: list[list[int]] = field(default_factory=list)
    plain_prompt_tokens: list[int] = field(default_factory=list)
    plain_cached_tokens: list[int] = field(default_factory=list)
    plain_completion_tokens: list[int] = field(default_factory=list)

    def add_plain(self, rid: str, text: str, new_ids: list[int], prompt_tokens: int, cached_tokens: int,
                  completion_tokens: int) -> None:
        """Append one plain output to the columns (``text``: appended since the previous output)."""
        self.plain_rids.append(rid)
        self.plain_text.append(text)
        self.plain_new_ids.append(new_ids)
        self.plain_prompt_tokens.append(prompt_tokens)
        self.plain_cached_tokens.append(cached_tokens)
        self.plain_completion_tokens.append(completion_tokens)


class MalformedMessage(ValueError):
    """A frame that is not an encoded message of this module."""


_TAG = "__msg__"
_TYPES: dict[str, type] = {}


_FIELDS: dict[type, tuple[str, ...]] = {}  # message class -> its field names (encode hot path)


def _register() -> None:
    for obj in list(globals().values()):
        if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj is not IpcPaths:
            _TYPES[obj.__name__] = obj
            _FIELDS[obj] = tuple(f.name for f in dataclasses.fields(obj))


def _default(obj: Any) -> Any:
    names = _FIELDS.get(type(obj))
    if names is not None:
        out = {name: getattr(obj, name) for name in names}
        out[_TAG] = type(obj).__name__
        return out
    if isinstance(obj, (set, frozenset)):
        return list(obj)
    return str(obj)  # NOTE: e.g. a dtype in server_info; data, never code


def _hook(d: dict) -> Any:
    name = d.pop(_TAG, None)
    if name is None:
        return d
    cls = _TYPES.get(name)
    if cls is None:
        raise MalformedMessage(f"unknown message type {name!r}")
    return cls(**d)


def encode(msg: object) -> bytes:
    """The one codec of every channel (msgpack of the tagged dataclass)."""
    return msgpack.packb(msg, default=_default, use_bin_type=True)


def decode(data: bytes) -> object:
    """Inverse of :func:`encode`. Raises :class:`MalformedMessage` for anything else."""
    try:
        msg = msgpack.unpackb(data, object_hook=_hook, raw=False, strict_map_key=False)
    except MalformedMessage:
        raise
    except Exception as e:  # msgpack's errors, or a tagged map with wrong fields (TypeError)
        raise MalformedMessage(f"{type(e).__name__}: {e}") from None
    if type(msg).__name__ not in _TYPES:
        raise MalformedMessage(f"not a message: {type(msg).__name__}")
    return msg


_register()
