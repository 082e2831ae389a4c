"""pydantic request models of the native (DESIGN.md §3.2) and OpenAI-compatible (§3.3) APIs.

Validation happens once, here, at the edge: types (strict ints and bools where a float or a
string would be a client bug), ranges and sizes of every field. The sampling fields are not
declared here: they are generated from the one definition, ``runtime/sampling_params.py``
(:class:`~radixlm.runtime.sampling_params.SamplingParams`: names, types, bounds, checks), and a
validated body yields that dataclass directly (:meth:`NativeSamplingParams.to_runtime`).
Unknown fields are ignored (clients send extras). A failure names the field; the server turns
it into HTTP 400. Checks that need the model (vocabulary size, context length) live in the
tokenizer manager.

Limits (module constants, documented in docs/server.md): ``MAX_N`` samples per prompt,
``MAX_TOP_LOGPROBS`` top entries per position, ``MAX_BATCH`` prompts per request, ``MAX_STOP``
stop strings of at most ``MAX_STOP_CHARS`` characters, grammars of at most ``MAX_GRAMMAR_CHARS``.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal, Optional, Union, get_type_hints

from pydantic import (
    BaseModel, ConfigDict, Field, PrivateAttr, StrictBool, StrictInt, create_model, field_validator, model_validator,
)

from radixlm.runtime.sampling_params import (  # noqa: F401 - re-exported (the edge's limits and checks)
    GRAMMAR_SYNTAX_CHECKS, MAX_GRAMMAR_CHARS, MAX_STOP, MAX_STOP_CHARS, Finite, SamplingParams, TokenId, TokenLen,
    check_ebnf, check_json_schema, check_regex,
)

MAX_N = 128
MAX_TOP_LOGPROBS = 20
MAX_BATCH = 1024
MAX_TOKEN_ID = 2**31 - 1
SAMPLING_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(SamplingParams))
EDGE_LIMITS = {"n": Field(le=MAX_N)}  # tighter than the runtime's bounds (the in-process Engine allows more)


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


def sampling_fields(exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """``create_model`` field specs of :class:`SamplingParams`' fields (less ``exclude``): the
    dataclass's annotated type (its validation) plus ``EDGE_LIMITS`` and the grammars' syntax
    checks (``GRAMMAR_SYNTAX_CHECKS``), optional, default ``None`` (= the runtime default)."""
    hints = get_type_hints(SamplingParams, include_extras=True)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(SamplingParams):
        if f.name not in exclude:
            t = hints[f.name]
            for extra in (EDGE_LIMITS.get(f.name), GRAMMAR_SYNTAX_CHECKS.get(f.name)):
                t = t if extra is None else Annotated[t, extra]
            out[f.name] = (Optional[t], None)
    return out


# NOTE: the OpenAI requests name these differently (max_tokens, min_tokens) or not at all
_NOT_OPENAI = ("max_new_tokens", "min_new_tokens", "n", "spaces_between_special_tokens")
_Constraints = create_model("_Constraints", __base__=_Lenient, __module__=__name__,
                            **sampling_fields(exclude=_NOT_OPENAI))
_Constraints.__doc__ = "The sampling fields the native and OpenAI APIs share (generated from SamplingParams)."


def to_sampling_params(values: dict[str, Any]) -> SamplingParams:
    """Build the runtime :class:`SamplingParams` from edge-validated ``values`` (``None`` = default):
    no second validation of the fields; the cross-field rules run (``ValueError``)."""
    return SamplingParams(**{k: v for k, v in values.items() if v is not None})


class NativeSamplingParams(create_model("_NativeFields", __base__=_Lenient, __module__=__name__,
                                        **sampling_fields())):
    """Typed view of the native ``sampling_params``: every :class:`SamplingParams` field, optional
    (``None`` = the engine default). :meth:`to_runtime` gives the validated dataclass."""

    _runtime: SamplingParams | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _cross_fields(self):
        self._runtime = to_sampling_params(self.model_dump())
        return self

    def to_runtime(self) -> SamplingParams:
        """The runtime's :class:`SamplingParams` (built once, at validation)."""
        return self._runtime


Rid = Annotated[str, Field(min_length=1, max_length=256)]
MAX_CHOICES = 256
MAX_CHOICE_CHARS = 4096
ChoicesMethod = Literal["token_length_normalized", "greedy_token_selection",
                        "unconditional_likelihood_normalized"]
MAX_LEASE_TTL_S = 24 * 3600.0


class CacheLeaseInput(_Lenient):
    """``cache_lease`` of ``/generate``: keep the request's cached sequence (prompt + output) ahead
    of unleased prefixes in eviction order for ``ttl_s`` seconds under the name ``id`` (a later
    request with the same ``id`` moves and renews the lease; ``POST /release_cache_lease`` ends it)."""

    id: Rid
    ttl_s: Annotated[Finite, Field(gt=0, le=MAX_LEASE_TTL_S)] = 60.0


class GenerateReqInput(_Lenient):
    """``POST /generate``: exactly one of ``text`` and ``input_ids``; a list makes a batch."""

    text: str | Annotated[list[str], Field(max_length=MAX_BATCH)] | None = None
    input_ids: list[TokenId] | Annotated[list[list[TokenId]], Field(max_length=MAX_BATCH)] | None = None
    sampling_params: NativeSamplingParams | Annotated[list[NativeSamplingParams], Field(max_length=MAX_BATCH)] | None = None
    return_logprob: StrictBool | list[StrictBool] = False
    logprob_start_len: Annotated[StrictInt, Field(ge=-1)] | list[Annotated[StrictInt, Field(ge=-1)]] = -1
    top_logprobs_num: (Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)]
                       | list[Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)]]) = 0
    return_text_in_logprobs: StrictBool = False
    stream: StrictBool = False
    rid: Rid | list[Rid] | None = None
    # radixlm extensions (docs/server.md): select in one round trip, program-aware cache leases
    choices: Annotated[list[Annotated[str, Field(max_length=MAX_CHOICE_CHARS)]],
                       Field(min_length=1, max_length=MAX_CHOICES)] | None = None
    choices_method: ChoicesMethod = "token_length_normalized"
    cache_lease: CacheLeaseInput | None = None
    # NOTE: SGLang fields this server does not implement; each would change the answer if ignored
    # (another input, another model), so a set value is refused (400), not dropped. ``None``,
    # empty and all-``None`` lists (what batching clients send for "no image") count as unset.
    image_data: Any = None
    audio_data: Any = None
    video_data: Any = None
    input_embeds: Any = None
    lora_path: Any = None
    custom_logit_processor: Any = None
    session_params: Any = None

    @model_validator(mode="after")
    def _unsupported(self):
        for name in _REFUSED_NATIVE:
            v = getattr(self, name)
            if v not in (None, "", [], {}) and not (isinstance(v, list) and all(x in (None, "", []) for x in v)):
                raise ValueError(f"{name}: not supported by this server (text-only model, no LoRA adapters, "
                                 "no custom logit processors, no sessions)")
        return self


_REFUSED_NATIVE = ("image_data", "audio_data", "video_data", "input_embeds", "lora_path", "custom_logit_processor",
                   "session_params")


class ReleaseCacheLeaseInput(_Lenient):
    """``POST /release_cache_lease``: end the named leases (unknown ids are ignored)."""

    ids: Annotated[list[Rid], Field(max_length=MAX_BATCH)]


class AbortReqInput(_Lenient):
    """``POST /abort_request``: abort exactly ``rid`` (with its ``n`` samples), or everything
    with ``abort_all: true``."""

    rid: Rid | None = None
    abort_all: StrictBool = False


class TokenizeReqInput(_Lenient):
    prompt: str | Annotated[list[str], Field(max_length=MAX_BATCH)]
    add_special_tokens: StrictBool = True


class DetokenizeReqInput(_Lenient):
    tokens: list[TokenId]


# ------------------------------------------------------------------ OpenAI
class StreamOptions(_Lenient):
    include_usage: StrictBool = False


class _SamplingExtras(_Constraints):
    """OpenAI sampling fields plus the SGLang extras (sent through ``extra_body``); the sampling
    ones are :class:`_Constraints`' (generated from SamplingParams) plus ``n`` and ``min_tokens``."""

    model: str | None = None
    n: Annotated[StrictInt, Field(ge=1, le=MAX_N)] = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    min_tokens: TokenLen | None = None
    rid: Rid | None = None


class JsonSchemaFormat(_Lenient):
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None

    @field_validator("schema_")
    @classmethod
    def _schema(cls, v):
        if v is not None:
            check_json_schema(v)
        return v


class ResponseFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class CompletionRequest(_SamplingExtras):
    prompt: (str | Annotated[list[str], Field(max_length=MAX_BATCH)] | list[TokenId]
             | Annotated[list[list[TokenId]], Field(max_length=MAX_BATCH)])
    max_tokens: TokenLen | None = 16
    logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    echo: StrictBool = False
    response_format: ResponseFormat | None = None
    # NOTE: declared to be refused, not ignored: both would change what is returned
    suffix: str | None = None
    best_of: Annotated[StrictInt, Field(ge=1, le=MAX_N)] | None = None

    @model_validator(mode="after")
    def _unsupported(self):
        if self.suffix:
            raise ValueError("suffix: insertion (text after the completion) is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError(f"best_of: only best_of == n is supported (got best_of={self.best_of}, n={self.n})")
        return self


class FunctionDef(_Lenient):
    name: Annotated[str, Field(min_length=1, max_length=256)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _params(cls, v):
        if v is not None:
            check_json_schema(v)
        return v


class Tool(_Lenient):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(_Lenient):
    name: str


class ToolChoiceFunction(_Lenient):
    type: Literal["function"] = "function"
    function: NamedFunction


class ContentPart(_Lenient):
    """One part of a message's content: text only (images, audio and files would be dropped
    silently otherwise: refused with a 400 naming the part's type)."""

    type: str
    text: str | None = None

    @field_validator("type")
    @classmethod
    def _text_only(cls, v: str) -> str:
        if v != "text":
            raise ValueError(f"content parts of type {v!r} are not supported (this model takes text parts only)")
        return v


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


Scalar = Union[StrictBool, StrictInt, Finite, Annotated[str, Field(max_length=1024)], None]


class ChatCompletionRequest(_SamplingExtras):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: TokenLen | None = None
    max_completion_tokens: TokenLen | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], ToolChoiceFunction, None] = None
    # NOTE: scalars only: a template may loop over what it is given (rendered length is also capped)
    chat_template_kwargs: Annotated[dict[str, Scalar], Field(max_length=32)] | None = None
