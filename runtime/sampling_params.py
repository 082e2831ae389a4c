"""Per-request sampling parameters: the one definition of their names, defaults and validation.

:class:`SamplingParams` is used by the runtime (``Req.sampling_params``), generated into the HTTP
edge's pydantic models (``runtime/server/protocol.py``: same names, types, bounds and checks) and
produced by the DSL (``lang/ir.py``). Each field's type carries its validation (pydantic
``Annotated`` constraints and validators); cross-field rules live in ``__post_init__``. A request
is validated once: by the HTTP model at the server's edge, or by :meth:`SamplingParams.from_dict`
in process (``Engine.generate`` with a dict).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Annotated, Any, NamedTuple

from pydantic import AfterValidator, BeforeValidator, Field, StrictBool, StrictInt, TypeAdapter, ValidationError

GREEDY_EPS = 1e-6  # temperature below this means greedy (argmax)
MAX_INT = 2**31 - 1  # bound of integer fields (token counts, top_k, token ids)
MAX_N = 1024  # samples per prompt (the HTTP edge allows 128: protocol.MAX_N)
MAX_SEED = 2**63 - 1  # seed + n must stay below this
MAX_STOP = 32  # stop strings / stop patterns per request
MAX_STOP_CHARS = 1024  # characters of one stop string
MAX_STOP_IDS = 1024  # stop token ids per request
MAX_GRAMMAR_CHARS = 32 * 1024  # characters of a regex, JSON schema or EBNF grammar
MAX_LOGIT_BIAS = 1024  # token entries of one logit_bias map
LOGIT_BIAS_RANGE = 100.0  # a bias lies in [-100, 100] (OpenAI's range)


def check_regex(pattern: str, name: str = "regex") -> str:
    """Cheap syntax check of a regex (Python ``re``); raises ``ValueError`` naming ``name``."""
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise ValueError(f"invalid {name}: {e}") from None
    return pattern


def check_json_schema(schema: str | dict | bool) -> str:
    """Parse (when a string) and meta-validate a JSON Schema; returns its JSON text.
    Raises ``ValueError`` for invalid JSON or a schema the meta-schema rejects (e.g. ``minItems: -5``).

    The verdict is cached per schema text (:func:`_schema_problem`): meta-validation costs a few
    milliseconds on the server's event loop, and concurrent requests usually share one schema."""
    if isinstance(schema, str):
        text = schema
    elif isinstance(schema, (dict, bool)):
        try:
            text = json.dumps(schema)
        except (TypeError, ValueError, RecursionError) as e:
            raise ValueError(f"json_schema is not JSON-serializable: {e}") from None
    else:
        raise ValueError("json_schema must be a JSON object")
    if len(text) > MAX_GRAMMAR_CHARS:
        raise ValueError(f"json_schema is longer than {MAX_GRAMMAR_CHARS} characters")
    problem = _schema_problem(text)
    if problem is not None:
        raise ValueError(problem)
    return text


@lru_cache(maxsize=512)
def _schema_problem(text: str) -> str | None:
    """Why the JSON text ``text`` is not a valid JSON Schema (its meta-schema's verdict, through
    jsonschema), or None when it is one."""
    import jsonschema

    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        return f"json_schema is not valid JSON: {e}"
    if not isinstance(obj, (dict, bool)):
        return "json_schema must be a JSON object"
    try:
        jsonschema.validators.validator_for(obj, default=jsonschema.Draft202012Validator).check_schema(obj)
    except jsonschema.SchemaError as e:
        return f"invalid json_schema: {e.message}"
    except RecursionError:
        return "invalid json_schema: nested too deeply"
    return None


def check_ebnf(grammar: str) -> str:
    """Cheap check of an EBNF (lark) grammar: defines ``root``. The real compile runs once, in the
    scheduler, with a time limit. Raises ``ValueError``."""
    if not re.search(r"(?m)^\s*\??root\s*(\.\d+)?\s*(:|::=)", grammar):
        raise ValueError("invalid ebnf: no rule named root")
    return grammar


def _str_list(v: Any) -> Any:
    return [v] if isinstance(v, str) else v


def _optional(check):
    return lambda v: v if v is None else check(v)


def _check_stop_regex(v: list[str] | None) -> list[str] | None:
    import regex  # NOTE: the detokenizer searches with the `regex` module (time-bounded searches)

    for p in v or []:
        check_regex(p, "stop_regex")
        try:
            regex.compile(p)
        except (regex.error, RecursionError, OverflowError) as e:
            raise ValueError(f"invalid stop_regex: {e}") from None
    return [p for p in v or [] if p] or None


def _schema_text(v: Any) -> Any:
    return json.dumps(v) if isinstance(v, dict) else v


def _top_k(v: int) -> int:
    if v != -1 and v < 1:
        raise ValueError("top_k must be -1 (off) or >= 1")
    return v


# ---- field types: each carries its own validation (pydantic runs it; see protocol.py)
Finite = Annotated[float, Field(allow_inf_nan=False)]
TokenId = Annotated[StrictInt, Field(ge=0, le=MAX_INT)]
TokenLen = Annotated[StrictInt, Field(ge=0, le=MAX_INT)]
GrammarStr = Annotated[str, Field(max_length=MAX_GRAMMAR_CHARS)]
StopStr = Annotated[str, Field(max_length=MAX_STOP_CHARS)]
Stops = Annotated[list[StopStr], BeforeValidator(_str_list), Field(max_length=MAX_STOP),
                  AfterValidator(lambda v: [s for s in v if s])]
StopIds = Annotated[list[TokenId], Field(max_length=MAX_STOP_IDS)]
StopRegex = Annotated[Annotated[list[GrammarStr], Field(max_length=MAX_STOP)] | None, BeforeValidator(_str_list),
                      AfterValidator(_check_stop_regex)]
Regex = GrammarStr | None
JsonSchema = Annotated[GrammarStr | None, BeforeValidator(_schema_text)]
Ebnf = GrammarStr | None
# NOTE: cheap syntax checks of the constraint grammars, added at the HTTP edge (protocol.py) so
# that a bad grammar gets its 400 before it is queued. In process the grammar backend's compile
# (time-limited, in a thread pool) rejects it, aborting only that request of a batch.
GRAMMAR_SYNTAX_CHECKS = {"regex": AfterValidator(_optional(check_regex)),
                         "json_schema": AfterValidator(_optional(check_json_schema)),
                         "ebnf": AfterValidator(_optional(check_ebnf))}
Penalty = Annotated[Finite, Field(ge=-2, le=2)]
# NOTE: token ids as keys, not strict: JSON object keys are strings ("42" -> 42); {} means none
LogitBias = Annotated[
    Annotated[dict[Annotated[int, Field(ge=0, le=MAX_INT)],
                   Annotated[Finite, Field(ge=-LOGIT_BIAS_RANGE, le=LOGIT_BIAS_RANGE)]],
              Field(max_length=MAX_LOGIT_BIAS)] | None,
    AfterValidator(lambda v: v or None)]


@dataclass
class SamplingParams:
    """Sampling and stopping controls of one request (DESIGN.md §3.2), SGLang's names and defaults.

    ``temperature`` < 1e-6 is greedy. ``top_k`` = -1 disables top-k; ``top_p`` = 1 and
    ``min_p`` = 0 disable theirs. ``max_new_tokens`` = 0 is a prefill-only request. ``stop`` is a
    string or list of strings trimmed from the output; ``stop_token_ids`` end generation like EOS;
    ``stop_regex`` (pattern or list) ends it when a pattern matches the decoded output, which is
    cut where the match starts (finish reason ``{"type": "stop", "matched": pattern}``).
    ``seed`` makes sampling reproducible per request (sample ``k`` of ``n`` uses ``seed + k``).
    ``logit_bias`` maps token ids to a bias in [-100, 100] added to their logits before sampling
    (OpenAI's ``logit_bias``; -100 in effect bans a token, +100 all but forces it); token ids must
    be below the vocabulary size (checked where the model is known: the tokenizer manager).
    ``regex``/``json_schema``/``ebnf`` constrain decoding (at most one; a ``json_schema`` dict is
    stored as its JSON text). ``disable_additional_properties`` (vLLM's name; default on, as
    xgrammar's ``strict_mode`` in SGLang and vLLM; OpenAI's ``strict: true`` also sets it): objects
    of the ``json_schema`` that declare properties take no undeclared keys unless the schema allows
    them (``additionalProperties`` / ``unevaluatedProperties`` given); ``False`` gives JSON
    Schema's semantics, undeclared keys allowed where the schema is silent (a real model then
    tends to invent keys until ``max_new_tokens``).

    Constructing directly checks only the cross-field rules (``__post_init__``); untrusted input
    goes through :meth:`from_dict` or the HTTP models, which also check every field's type and
    range and raise ``ValueError`` / ``ValidationError`` naming the field (the HTTP models also
    syntax-check the grammars: ``GRAMMAR_SYNTAX_CHECKS``).
    """

    max_new_tokens: TokenLen = 128
    min_new_tokens: TokenLen = 0
    n: Annotated[StrictInt, Field(ge=1, le=MAX_N)] = 1
    stop: Stops = field(default_factory=list)
    stop_token_ids: StopIds = field(default_factory=list)
    stop_regex: StopRegex = None
    temperature: Annotated[Finite, Field(ge=0)] = 1.0
    top_p: Annotated[Finite, Field(gt=0, le=1)] = 1.0
    top_k: Annotated[StrictInt, Field(ge=-MAX_INT, le=MAX_INT), AfterValidator(_top_k)] = -1
    min_p: Annotated[Finite, Field(ge=0, le=1)] = 0.0
    frequency_penalty: Penalty = 0.0
    presence_penalty: Penalty = 0.0
    repetition_penalty: Annotated[Finite, Field(ge=0.01, le=2)] = 1.0
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    regex: Regex = None
    json_schema: JsonSchema = None
    ebnf: Ebnf = None
    disable_additional_properties: StrictBool = True
    seed: Annotated[StrictInt, Field(ge=0, le=MAX_SEED)] | None = None
    logit_bias: LogitBias = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop] if self.stop else []
        if isinstance(self.stop_regex, str):
            self.stop_regex = [self.stop_regex]
        if self.max_new_tokens < self.min_new_tokens:
            raise ValueError("sampling_params.min_new_tokens must not exceed max_new_tokens")
        if sum(x is not None for x in (self.regex, self.json_schema, self.ebnf)) > 1:
            raise ValueError("sampling_params: only one of regex, json_schema and ebnf may be set")
        if self.seed is not None and self.seed + self.n > MAX_SEED:
            raise ValueError(f"sampling_params.seed={self.seed!r} must be below 2**63 - n")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | SamplingParams | None) -> SamplingParams:
        """Validate a protocol dict into a ``SamplingParams`` (unknown keys ignored, ``None``
        values mean default; a ``SamplingParams`` is returned as is).

        Raises:
            ValueError: naming the first bad field (``sampling_params.<name>: <why>``).
        """
        if isinstance(d, SamplingParams):
            return d
        if d is not None and not isinstance(d, dict):
            raise ValueError(f"sampling_params must be a dict, got {type(d).__name__}")
        return cls.validated(**(d or {}))

    @classmethod
    def validated(cls, **values: Any) -> SamplingParams:
        """Construct with every field checked (types, ranges, grammar syntax, cross-field rules);
        unknown names are ignored and ``None`` means default. Raises ``ValueError`` as
        :meth:`from_dict`."""
        known = _field_names()
        try:
            return _adapter().validate_python({k: v for k, v in values.items() if k in known and v is not None})
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            msg = first["msg"].replace("Value error, ", "")
            raise ValueError(f"sampling_params.{where}: {msg}" if where else msg) from None

    def to_dict(self) -> dict[str, Any]:
        """The protocol dict of the fields that differ from their defaults (for JSON bodies)."""
        default = _default()
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @property
    def grammar(self) -> GrammarSpec | None:
        """The constraint (its compile cache key), or ``None``."""
        for kind in ("regex", "json_schema", "ebnf"):
            if getattr(self, kind) is not None:
                closed = kind == "json_schema" and self.disable_additional_properties
                return GrammarSpec(kind, getattr(self, kind), closed)
        return None


class GrammarSpec(NamedTuple):
    """What to compile: ``kind`` (``"regex"`` / ``"json_schema"`` / ``"ebnf"``), its ``source``
    text, and for json_schema ``disable_additional_properties`` (see :class:`SamplingParams`)."""

    kind: str
    source: str
    disable_additional_properties: bool = False


_cache: dict[str, Any] = {}


def _adapter() -> TypeAdapter:
    if "adapter" not in _cache:
        _cache["adapter"] = TypeAdapter(SamplingParams)
    return _cache["adapter"]


def _field_names() -> frozenset[str]:
    if "names" not in _cache:
        _cache["names"] = frozenset(f.name for f in fields(SamplingParams))
    return _cache["names"]


def _default() -> SamplingParams:
    if "default" not in _cache:
        _cache["default"] = SamplingParams()
    return _cache["default"]
