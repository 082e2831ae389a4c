"""Per-request sampling parameters with the SGLang native protocol's names and defaults."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from typing import Any

GREEDY_EPS = 1e-6  # temperature below this means greedy (argmax)
MAX_INT = 2**31 - 1  # bound of integer fields (token counts, top_k, token ids)
MAX_N = 1024  # samples per prompt (the HTTP edge allows 128)


@dataclass
class SamplingParams:
    """Sampling and stopping controls of one request (DESIGN.md §3.2).

    ``temperature`` < 1e-6 is greedy. ``top_k`` = -1 disables top-k; ``top_p`` = 1 and
    ``min_p`` = 0 disable theirs. ``max_new_tokens`` = 0 is a prefill-only request. ``stop`` is a
    string or list of strings trimmed from the output; ``stop_token_ids`` end generation like EOS;
    ``stop_regex`` (pattern or list) ends it when a pattern matches the decoded output, which is
    cut where the match starts (finish reason ``{"type": "stop", "matched": pattern}``).
    ``seed`` makes sampling reproducible per request. ``regex``/``json_schema``/``ebnf`` constrain
    decoding (at most one). Unknown keys passed to :meth:`from_dict` are ignored.
    :meth:`validate` raises ``ValueError`` naming the offending field.
    """

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    n: int = 1
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    stop_regex: list[str] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    seed: int | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "SamplingParams":
        """Build from a protocol dict (unknown keys ignored, ``None`` values mean default)."""
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        sp = cls(**{k: v for k, v in d.items() if k in known and v is not None})
        if isinstance(sp.stop, str):
            sp.stop = [sp.stop]
        sp.stop = [s for s in (sp.stop or []) if s]
        sp.stop_token_ids = list(sp.stop_token_ids or [])
        if isinstance(sp.stop_regex, str):
            sp.stop_regex = [sp.stop_regex]
        sp.stop_regex = [p for p in (sp.stop_regex or []) if p] or None
        if isinstance(sp.json_schema, dict):
            import json

            sp.json_schema = json.dumps(sp.json_schema)
        sp.validate()
        return sp

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field of a wrong type or out of range (floats
        must be finite; ints are bounded so that tensors built from them cannot overflow)."""
        for name in ("max_new_tokens", "min_new_tokens", "n", "top_k"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or abs(v) > MAX_INT:
                raise ValueError(f"sampling_params.{name}={v!r} must be an integer in range")
        for name in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"sampling_params.{name}={v!r} must be a finite number")
        if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t <= MAX_INT for t in self.stop_token_ids):
            raise ValueError("sampling_params.stop_token_ids must be non-negative token ids")
        if self.seed is not None and (not isinstance(self.seed, int) or not 0 <= self.seed < 2**63 - self.n):
            raise ValueError(f"sampling_params.seed={self.seed!r} must be an integer in [0, 2**63 - n)")
        for p in self.stop_regex or []:
            try:
                re.compile(p)
            except (re.error, TypeError, RecursionError, OverflowError) as e:
                raise ValueError(f"sampling_params.stop_regex {p!r:.60} is invalid: {e}") from None
        checks = [
            ("max_new_tokens", self.max_new_tokens >= 0),
            ("min_new_tokens", 0 <= self.min_new_tokens),
            ("n", 1 <= self.n <= MAX_N),
            ("temperature", self.temperature >= 0),
            ("top_p", 0 < self.top_p <= 1),
            ("top_k", self.top_k == -1 or self.top_k >= 1),
            ("min_p", 0 <= self.min_p <= 1),
            ("frequency_penalty", -2 <= self.frequency_penalty <= 2),
            ("presence_penalty", -2 <= self.presence_penalty <= 2),
            ("repetition_penalty", 0.01 <= self.repetition_penalty <= 2),
        ]
        for name, ok in checks:
            if not ok:
                raise ValueError(f"sampling_params.{name}={getattr(self, name)!r} is out of range")
        if self.max_new_tokens < self.min_new_tokens:
            raise ValueError("sampling_params.min_new_tokens must not exceed max_new_tokens")
        if sum(x is not None for x in (self.regex, self.json_schema, self.ebnf)) > 1:
            raise ValueError("sampling_params: only one of regex, json_schema and ebnf may be set")

    @property
    def grammar(self) -> tuple[str, str] | None:
        """``(kind, source)`` of the constraint, or ``None``."""
        for kind in ("regex", "json_schema", "ebnf"):
            if getattr(self, kind) is not None:
                return kind, getattr(self, kind)
        return None
