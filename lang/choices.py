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
