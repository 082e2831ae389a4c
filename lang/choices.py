"""How ``select`` turns per-token logprobs of each choice into a decision.

Three methods with SGLang's names and semantics (sglang ``lang/choices.py``; the unconditional
normalization is the PMI-style calibration of Holtzman et al., "Surface Form Competition", 2021):

* ``token_length_normalized`` (default): argmax of the mean conditional logprob of the choice tokens.
* ``greedy_token_selection``: compare choices token by token, keeping the ones with the highest
  logprob at each position; a shorter choice is padded with its own mean logprob.
* ``unconditional_likelihood_normalized``: argmax of mean(log p(tok | prompt) - log p(tok | choice
  prefix only)); needs a second request that scores the choice tokens without the prompt.

Logprob entries are ``[logprob, token_id, token_text]`` as in the native protocol (DESIGN.md §3.2);
``input_token_logprobs[i]`` holds the entries of choice ``i``'s own tokens.  Ties go to the first
choice.  Custom methods subclass :class:`ChoicesSamplingMethod`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

LogprobEntry = list[Any]  # [logprob: float | None, token_id: int, token_text: str | None]


@dataclass
class ChoicesDecision:
    """Result of a choice method: the chosen string and the scores behind it (``get_meta_info``)."""

    decision: str
    meta_info: dict[str, Any] = field(default_factory=dict)


def _first_argmax(values: list[float]) -> int:
    if not values:
        raise ValueError("select needs at least one choice")
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _values(entries: list[LogprobEntry]) -> list[float]:
    return [float(e[0]) for e in entries if e[0] is not None]


class ChoicesSamplingMethod(ABC):
    """A rule that picks one choice from its token logprobs."""

    requires_unconditional_logprobs: bool = False

    @abstractmethod
    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[LogprobEntry]],
        output_token_logprobs: list[list[LogprobEntry]],
        unconditional_token_logprobs: list[list[LogprobEntry]] | None = None,
    ) -> ChoicesDecision:
        """Pick a choice.

        Args:
            choices: the candidate strings, ``len == C``.
            normalized_prompt_logprobs: ``[C]`` mean logprob of each choice's tokens.
            input_token_logprobs: ``[C][T_i]`` entries of each choice's tokens.
            output_token_logprobs: ``[C][0]`` (scoring requests generate nothing).
            unconditional_token_logprobs: ``[C][T_i]`` entries of the choice tokens scored without
                the prompt (entry 0 has logprob ``None``), when ``requires_unconditional_logprobs``.
        Raises:
            ValueError: no choices, or missing/mismatched unconditional logprobs.
        """

    def __repr__(self) -> str:
        return type(self).__name__


class TokenLengthNormalized(ChoicesSamplingMethod):
    """Highest mean conditional logprob per token."""

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs,
                 output_token_logprobs, unconditional_token_logprobs=None) -> ChoicesDecision:
        best = _first_argmax(list(normalized_prompt_logprobs))
        return ChoicesDecision(choices[best], {
            "normalized_prompt_logprobs": list(normalized_prompt_logprobs),
            "input_token_logprobs": input_token_logprobs,
            "output_token_logprobs": output_token_logprobs,
        })


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Token-by-token elimination; shorter choices are extended with their mean logprob."""

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs,
                 output_token_logprobs, unconditional_token_logprobs=None) -> ChoicesDecision:
        if not choices:
            raise ValueError("select needs at least one choice")
        rows = [_values(entries) for entries in input_token_logprobs]
        width = max((len(r) for r in rows), default=0)
        matrix = [r + [_mean(r) if r else float("nan")] * (width - len(r)) for r in rows]
        alive = list(range(len(choices)))
        for col in range(width):
            top = max(matrix[i][col] for i in alive)
            alive = [i for i in alive if matrix[i][col] == top] or alive
            if len(alive) == 1:
                break
        return ChoicesDecision(choices[alive[0]], {
            "normalized_prompt_logprobs": list(normalized_prompt_logprobs),
            "input_token_logprobs": input_token_logprobs,
            "output_token_logprobs": output_token_logprobs,
            "greedy_logprob_matrix": matrix,
        })


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """Highest mean of (conditional - unconditional) logprob per choice token."""

    requires_unconditional_logprobs = True

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs,
                 output_token_logprobs, unconditional_token_logprobs=None) -> ChoicesDecision:
        if unconditional_token_logprobs is None:
            raise ValueError("unconditional_likelihood_normalized needs unconditional logprobs")
        scores = []
        for cond, uncond in zip(input_token_logprobs, unconditional_token_logprobs, strict=True):
            if len(cond) != len(uncond):
                raise ValueError("conditional and unconditional logprobs differ in length")
            # NOTE: the first unconditional token has no context, so its logprob is None -> 0.
            diffs = [float(c[0]) - float(u[0] or 0.0) for c, u in zip(cond, uncond)]
            scores.append(_mean(diffs))
        best = _first_argmax(scores)
        return ChoicesDecision(choices[best], {
            "normalized_prompt_logprobs": list(normalized_prompt_logprobs),
            "input_token_logprobs": input_token_logprobs,
            "output_token_logprobs": output_token_logprobs,
            "unconditional_token_logprobs": unconditional_token_logprobs,
            "normalized_unconditional_prompt_logprobs": scores,
        })


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()


CHOICES_METHODS: dict[str, ChoicesSamplingMethod] = {
    "token_length_normalized": token_length_normalized,
    "greedy_token_selection": greedy_token_selection,
    "unconditional_likelihood_normalized": unconditional_likelihood_normalized,
}


def choices_method_name(method: ChoicesSamplingMethod) -> str:
    """The wire name (``choices_method`` of ``/generate``) that gives ``method`` its inputs.

    A custom method is named after the built-in method that needs the same logprobs (the caller
    then applies the custom method to the returned logprobs itself).
    """
    for name, known in CHOICES_METHODS.items():
        if type(method) is type(known):
            return name
    if method.requires_unconditional_logprobs:
        return "unconditional_likelihood_normalized"
    return "token_length_normalized"


def choice_span_start(prompt: str, choice: str, texts: list[str | None], start: int,
                      prompt_tokens: int) -> int:
    """Index of the first of ``choice``'s own tokens among the scored entries of ``prompt + choice``.

    Args:
        prompt: the text before the choice.
        choice: the choice string.
        texts: the token text of every scored entry (positions ``[start, L)`` of the tokenized
            ``prompt + choice``; ``None`` where unknown).
        start: the scoring request's ``logprob_start_len``.
        prompt_tokens: P, the token count of ``prompt`` alone.
    Returns:
        ``k``: entries ``[k:]`` are the choice's tokens. A token whose text reaches past the
        prompt's characters belongs to the choice, so a token that merges the prompt's end with the
        choice's start ("token healing") is the choice's first token. When the token texts do not
        line up with the strings (unknown texts, partial UTF-8), ``k = max(P - start, 0)``.
    """
    if texts and all(isinstance(t, str) for t in texts):
        full = prompt + choice
        covered = "".join(texts)  # type: ignore[arg-type]
        if full.endswith(covered):
            pos = len(full) - len(covered)
            for k, text in enumerate(texts):
                pos += len(text)  # type: ignore[arg-type]
                if pos > len(prompt):
                    return k
            return len(texts)
    return max(prompt_tokens - start, 0)


def choice_token_entries(prompt: str, choice: str, entries: list[LogprobEntry], start: int,
                         prompt_tokens: int) -> list[LogprobEntry]:
    """Entries (``[logprob, token_id, text]``) of ``choice``'s own tokens (:func:`choice_span_start`),
    without entries whose logprob is ``None``."""
    texts = [e[2] if len(e) > 2 else None for e in entries]
    k = choice_span_start(prompt, choice, texts, start, prompt_tokens)
    return [e for e in entries[k:] if e[0] is not None]


def sglang_entries(prompt: str, entries: list[LogprobEntry]) -> list[LogprobEntry]:
    """SGLang's ``input_token_logprobs`` of one choice: every entry from ``logprob_start_len``,
    minus the first one when ``prompt`` ends with its text (no token healing happened)."""
    if entries and len(entries[0]) > 2 and isinstance(entries[0][2], str) \
            and prompt.endswith(entries[0][2]):
        return list(entries[1:])
    return list(entries)


def decide_choices(method: ChoicesSamplingMethod, prompt: str, choices: list[str],
                   scored: list[list[LogprobEntry]],
                   unconditional: list[list[LogprobEntry]] | None, *, prompt_tokens: int,
                   logprob_start_len: int, cached_tokens: int = 0) -> ChoicesDecision:
    """Apply ``method`` to the scored entries of every ``prompt + choice`` (one place for the
    frontend's multi-request path, the server's one-trip ``choices`` request and the Engine).

    Args:
        method: the choice method.
        prompt, choices: as given to ``select``.
        scored: ``[C][*]`` input-token entries of ``prompt + choice_i`` from ``logprob_start_len``
            (entry 0 has logprob ``None``).
        unconditional: ``[C][T_i]`` entries of each choice's own tokens scored without the prompt
            (entry 0 ``None``), or ``None`` when the method does not need them.
        prompt_tokens: P, tokens of ``prompt`` alone; logprob_start_len: ``max(P - 2, 0)``.
        cached_tokens: prompt tokens served from the prefix cache (reported only).
    Returns:
        the decision; ``meta_info`` holds the method's scores plus ``choice_token_logprobs``
        ``[C][T_i]`` (each choice's own tokens), ``input_token_logprobs`` ``[C][*]`` as SGLang
        returns them (boundary tokens first, entry 0 ``[None, id, text]``),
        ``normalized_prompt_logprobs`` ``[C]`` (mean over the choice's tokens),
        ``unnormalized_prompt_logprobs`` ``[C]`` (their sum), ``prompt_tokens``, ``cached_tokens``
        and ``logprob_start_len``.
    Raises:
        ValueError: no choices, or ``len(scored) != len(choices)``.
    """
    if not choices or len(scored) != len(choices):
        raise ValueError("select needs at least one choice and one scored entry list per choice")
    own = [choice_token_entries(prompt, c, e, logprob_start_len, prompt_tokens)
           for c, e in zip(choices, scored)]
    # NOTE: SGLang's meta info keeps the scored boundary tokens before the choice ([None, id,
    # text] first); the decision uses only the choice's own tokens.
    boundary = [sglang_entries(prompt, e) for e in scored]
    return apply_choices_method(method, choices, own, boundary, unconditional,
                                prompt_tokens=prompt_tokens, logprob_start_len=logprob_start_len,
                                cached_tokens=cached_tokens)


def apply_choices_method(method: ChoicesSamplingMethod, choices: list[str],
                         own: list[list[LogprobEntry]], boundary: list[list[LogprobEntry]],
                         unconditional: list[list[LogprobEntry]] | None, *, prompt_tokens: int,
                         logprob_start_len: int, cached_tokens: int = 0) -> ChoicesDecision:
    """The second half of :func:`decide_choices`: ``own`` ``[C][T_i]`` are each choice's own
    entries (no ``None`` logprobs), ``boundary`` ``[C][*]`` the SGLang-style entries."""
    sums = [sum(float(e[0]) for e in row) for row in own]
    normalized = [s / len(row) if row else 0.0 for s, row in zip(sums, own)]
    decision = method(choices=choices, normalized_prompt_logprobs=normalized,
                      input_token_logprobs=own, output_token_logprobs=[[] for _ in choices],
                      unconditional_token_logprobs=unconditional)
    meta = decision.meta_info
    meta["choice_token_logprobs"] = own
    meta["input_token_logprobs"] = boundary
    meta["unnormalized_prompt_logprobs"] = sums
    meta.update(prompt_tokens=prompt_tokens, cached_tokens=cached_tokens,
                logprob_start_len=logprob_start_len)
    return decision
