"""``select`` in one round trip: the runtime side of ``/generate`` with ``choices``.

A :class:`ChoicesPlan` turns ``(prompt, choices, choices_method)`` into the scoring requests that
SGLang's frontend would send in two or three round trips (``interpreter/select.py``), so that the
HTTP server (``runtime/server/http_native.py``) and the in-process ``Engine`` submit them together:

* one prefill-only request per choice over ``prompt + choice`` with ``return_logprob`` and
  ``logprob_start_len = max(P - 2, 0)`` (P = tokens of the prompt alone; starting two tokens early
  covers token healing at the boundary). Submitted together, they are admitted in the same prefill
  round; the scheduler's in-batch prefix sharing lets one of them compute the prompt and the others
  reuse it from the radix cache;
* for ``unconditional_likelihood_normalized`` also one request per choice over the choice's own
  tokens alone (``logprob_start_len = 0``). The choice's tokens are known before scoring: they are
  the tokens whose decoded text reaches past the prompt (:func:`radixlm.lang.choices.choice_span_start`,
  the same rule the frontend applies to the returned token texts).

:meth:`ChoicesPlan.response` applies the method (:func:`radixlm.lang.choices.decide_choices`) and
shapes the native response documented in docs/server.md ("select in one round trip").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from radixlm.lang.choices import CHOICES_METHODS, choice_span_start, decide_choices

#: sampling params of every scoring request (prefill only).
SCORING_PARAMS: dict[str, Any] = {"max_new_tokens": 0, "temperature": 0.0}


@dataclass
class ChoicesPlan:
    """The scoring requests of one ``select`` and how to read their results.

    Attributes:
        prompt, choices, method: the request (``method`` is a name of ``CHOICES_METHODS``).
        prompt_tokens: P, token count of the prompt alone.
        logprob_start_len: ``max(P - 2, 0)``, the scoring requests' first scored position.
        input_ids: ``[C]`` token ids of ``prompt + choice_i``.
        unconditional_ids: ``[C]`` ids of each choice's own tokens (empty lists when the method
            does not need them, or the choice has no scored token).
    """

    prompt: str
    choices: list[str]
    method: str
    prompt_tokens: int
    logprob_start_len: int
    input_ids: list[list[int]]
    unconditional_ids: list[list[int]] = field(default_factory=list)

    @classmethod
    def build(cls, encode: Callable[[str], list[int]], decode_token: Callable[[int], str],
              prompt: str, choices: list[str], method: str = "token_length_normalized"
              ) -> "ChoicesPlan":
        """Tokenize the prompt and every ``prompt + choice``.

        Args:
            encode: text -> token ids (the runtime's tokenizer, as for ``text`` prompts).
            decode_token: one token id -> its text (``tokenizer.decode([id])``, the text the
                runtime puts in logprob entries).
        Raises:
            ValueError: no choices, an unknown method, or an empty prompt.
        """
        if not choices:
            raise ValueError("choices must hold at least one string")
        if method not in CHOICES_METHODS:
            raise ValueError(f"unknown choices_method {method!r}; choose from {sorted(CHOICES_METHODS)}")
        p = len(encode(prompt))
        if p == 0:
            raise ValueError("the prompt is empty")
        start = max(p - 2, 0)
        ids = [encode(prompt + c) for c in choices]
        uncond: list[list[int]] = [[] for _ in choices]
        if CHOICES_METHODS[method].requires_unconditional_logprobs:
            for i, (choice, row) in enumerate(zip(choices, ids)):
                texts = [decode_token(t) for t in row[start:]]
                k = choice_span_start(prompt, choice, texts, start, p)
                # NOTE: entry 0 of a scoring request has no logprob; the choice never owns it.
                uncond[i] = row[start + max(k, 1):]
        return cls(prompt, list(choices), method, p, start, ids, uncond)

    def requests(self) -> list[tuple[list[int], int]]:
        """``(input_ids, logprob_start_len)`` of every scoring request: the ``C`` conditional
        ones, then one per non-empty ``unconditional_ids`` row."""
        out = [(row, self.logprob_start_len) for row in self.input_ids]
        out += [(row, 0) for row in self.unconditional_ids if row]
        return out

    def response(self, entries: list[list[list]], cached_tokens: int = 0, rid: str = "",
                 t0: float | None = None, finish_reason: dict | None = None) -> dict[str, Any]:
        """The native response from the scoring requests' ``input_token_logprobs`` (in
        :meth:`requests` order, entries ``[logprob, id, text]``).

        Returns:
            ``{"text": decision, "output_ids": [], "meta_info": {...}}`` (docs/server.md).
        """
        c = len(self.choices)
        scored, rest = entries[:c], iter(entries[c:])
        uncond = None
        if CHOICES_METHODS[self.method].requires_unconditional_logprobs:
            uncond = [next(rest) if row else [] for row in self.unconditional_ids]
        decision = decide_choices(CHOICES_METHODS[self.method], self.prompt, self.choices, scored, uncond,
                                  prompt_tokens=self.prompt_tokens,
                                  logprob_start_len=self.logprob_start_len, cached_tokens=cached_tokens)
        meta = {
            "id": rid, "finish_reason": finish_reason or {"type": "length", "length": 0},
            "completion_tokens": 0, "e2e_latency": time.perf_counter() - t0 if t0 else 0.0,
            "choices_method": self.method, "decision": decision.decision,
            "decision_index": self.choices.index(decision.decision),
            **_finite(decision.meta_info),
        }
        return {"text": decision.decision, "output_ids": [], "meta_info": meta}


def _finite(obj: Any) -> Any:
    """``obj`` with NaN / infinite floats as ``None`` (strict JSON; e.g. the greedy matrix of an
    empty choice)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
