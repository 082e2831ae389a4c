"""pydantic request models of the native (DESIGN.md §3.2) and OpenAI-compatible (§3.3) APIs.

Validation happens once, here, at the edge: types (strict ints and bools where a float or a
string would be a client bug), ranges and sizes of every field. Unknown fields are ignored
(clients send extras). A failure names the field; the server turns it into HTTP 400. Checks that
need the model (vocabulary size, context length) live in the tokenizer manager.

Limits (module constants, documented in docs/server.md): ``MAX_N`` samples per prompt,
``MAX_TOP_LOGPROBS`` top entries per position, ``MAX_BATCH`` prompts per request, ``MAX_STOP``
stop strings of at most ``MAX_STOP_CHARS`` characters, grammars of at most ``MAX_GRAMMAR_CHARS``.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator

MAX_N = 128
MAX_TOP_LOGPROBS = 20
MAX_BATCH = 1024
MAX_STOP = 32
MAX_STOP_CHARS = 1024
MAX_GRAMMAR_CHARS = 32 * 1024
MAX_TOKEN_ID = 2**31 - 1
MAX_SEED = 2**63 - 1 - MAX_N

Finite = Annotated[float, Field(allow_inf_nan=False)]
TokenId = Annotated[StrictInt, Field(ge=0, le=MAX_TOKEN_ID)]
StopStr = Annotated[str, Field(max_length=MAX_STOP_CHARS)]
GrammarStr = Annotated[str, Field(max_length=MAX_GRAMMAR_CHARS)]
StopList = Annotated[list[StopStr], Field(max_length=MAX_STOP)]
TokenLen = Annotated[StrictInt, Field(ge=0, le=MAX_TOKEN_ID)]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


def check_regex(pattern: str, field: str) -> str:
    """Cheap syntax check of a regex (Python ``re``); raises ``ValueError`` naming ``field``."""
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise ValueError(f"invalid {field}: {e}") from None
    return pattern


def check_json_schema(schema: str | dict | bool) -> str:
    """Parse (when a string) and meta-validate a JSON Schema; returns its JSON text.
    Raises ``ValueError`` for invalid JSON or a schema the meta-schema rejects (e.g. ``minItems: -5``)."""
    import jsonschema

    if isinstance(schema, str):
        try:
            obj = json.loads(schema)
        except (json.JSONDecodeError, RecursionError) as e:
            raise ValueError(f"json_schema is not valid JSON: {e}") from None
    else:
        obj = schema
    if not isinstance(obj, (dict, bool)):
        raise ValueError("json_schema must be a JSON object")
    try:
        jsonschema.validators.validator_for(obj, default=jsonschema.Draft202012Validator).check_schema(obj)
    except jsonschema.SchemaError as e:
        raise ValueError(f"invalid json_schema: {e.message}") from None
    except RecursionError:
        raise ValueError("invalid json_schema: nested too deeply") from None
    text = schema if isinstance(schema, str) else json.dumps(schema)
    if len(text) > MAX_GRAMMAR_CHARS:
        raise ValueError(f"json_schema is longer than {MAX_GRAMMAR_CHARS} characters")
    return text


def check_ebnf(grammar: str) -> str:
    """Cheap check of an EBNF (lark) grammar: non-empty and defines ``root``. The real compile
    runs once, in the scheduler, with a time limit."""
    if not re.search(r"(?m)^\s*\??root\s*(\.\d+)?\s*(:|::=)", grammar):
        raise ValueError("invalid ebnf: no rule named root")
    return grammar


class _Constraints(_Lenient):
    """Fields shared by native and OpenAI sampling: stops and grammars, syntax-checked cheaply."""

    stop: StopStr | StopList | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=1024)] | None = None
    stop_regex: GrammarStr | Annotated[list[GrammarStr], Field(max_length=MAX_STOP)] | None = None
    regex: GrammarStr | None = None
    json_schema: GrammarStr | dict | None = None
    ebnf: GrammarStr | None = None
    top_k: Annotated[StrictInt, Field(le=MAX_TOKEN_ID)] | None = None
    min_p: Annotated[Finite, Field(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[Finite, Field(ge=0.01, le=2)] | None = None
    frequency_penalty: Annotated[Finite, Field(ge=-2, le=2)] | None = None
    presence_penalty: Annotated[Finite, Field(ge=-2, le=2)] | None = None
    temperature: Annotated[Finite, Field(ge=0)] | None = None
    top_p: Annotated[Finite, Field(gt=0, le=1)] | None = None
    seed: Annotated[StrictInt, Field(ge=0, le=MAX_SEED)] | None = None
    ignore_eos: StrictBool | None = None
    skip_special_tokens: StrictBool | None = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v):
        if v is not None and v != -1 and v < 1:
            raise ValueError("top_k must be -1 (off) or >= 1")
        return v

    @field_validator("stop_regex")
    @classmethod
    def _stop_regex(cls, v):
        for p in [v] if isinstance(v, str) else (v or []):
            check_regex(p, "stop_regex")
        return v

    @field_validator("regex")
    @classmethod
    def _regex(cls, v):
        return v if v is None else check_regex(v, "regex")

    @field_validator("json_schema")
    @classmethod
    def _json_schema(cls, v):
        return v if v is None else check_json_schema(v)

    @field_validator("ebnf")
    @classmethod
    def _ebnf(cls, v):
        return v if v is None else check_ebnf(v)


class NativeSamplingParams(_Constraints):
    """Typed view of the native ``sampling_params`` (``None`` = the engine default)."""

    max_new_tokens: TokenLen | None = None
    min_new_tokens: TokenLen | None = None
    n: Annotated[StrictInt, Field(ge=1, le=MAX_N)] | None = None
    spaces_between_special_tokens: StrictBool | None = None


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
    """OpenAI sampling fields plus the SGLang extras (sent through ``extra_body``)."""

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
    type: str
    text: str | None = None


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
