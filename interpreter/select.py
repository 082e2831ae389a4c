"""Choice scoring for ``select``, with the request pattern of SGLang's frontend (DESIGN.md §3.2).

1. One prefill-only request for the prompt: it enters the prefix cache and its ``prompt_tokens`` P
   tells where the choices begin.
2. One batched request of ``prompt + choice`` for all choices with ``max_new_tokens: 0``,
   ``return_logprob``, ``return_text_in_logprobs`` and ``logprob_start_len = max(P - 2, 0)``: the
   prompt's KV is reused from the cache and only the last prompt tokens plus the choice are scored.
   Starting two tokens early covers "token healing", where the prompt's last token merges with the
   choice's first token when the two are tokenized together.
3. For ``unconditional_likelihood_normalized`` only: one batched ``input_ids`` request that scores
   each choice's tokens without the prompt.

The choice's tokens are the returned entries whose text reaches past the prompt's characters (so a
token straddling the boundary counts as the choice's first token); when the token texts do not
line up with the strings (e.g. partial UTF-8), positions ``>= P`` are used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod, LogprobEntry

if TYPE_CHECKING:
    from radixlm.interpreter.backend import Backend


def choice_token_entries(prompt: str, choice: str, entries: list[LogprobEntry], start: int,
                         prompt_tokens: int) -> list[LogprobEntry]:
    """Entries (``[logprob, token_id, text]``) of ``choice``'s own tokens.

    Args:
        prompt: the text before the choice.
        choice: the choice string.
        entries: input-token logprobs of ``prompt + choice`` covering positions ``[start, L)``.
        start: the request's ``logprob_start_len``.
        prompt_tokens: P, the token count of ``prompt`` alone.
    Returns:
        the entries belonging to the choice, without entries whose logprob is ``None``.
    """
    texts = [e[2] if len(e) > 2 else None for e in entries]
    picked: list[LogprobEntry] | None = None
    if texts and all(isinstance(t, str) for t in texts):
        full = prompt + choice
        covered = "".join(texts)  # type: ignore[arg-type]
        if full.endswith(covered):
            pos = len(full) - len(covered)
            picked = []
            for entry, text in zip(entries, texts):
                pos += len(text)  # type: ignore[arg-type]
                if pos > len(prompt):
                    picked.append(entry)
    if picked is None:
        picked = entries[max(prompt_tokens - start, 0):]
    return [e for e in picked if e[0] is not None]


def sglang_entries(prompt: str, entries: list[LogprobEntry]) -> list[LogprobEntry]:
    """SGLang's ``input_token_logprobs`` of one choice: every entry from ``logprob_start_len``,
    minus the first one when ``prompt`` ends with its text (no token healing happened)."""
    if entries and len(entries[0]) > 2 and isinstance(entries[0][2], str) \
            and prompt.endswith(entries[0][2]):
        return list(entries[1:])
    return list(entries)


def _mean_logprob(entries: list[LogprobEntry]) -> float:
    return sum(float(e[0]) for e in entries) / len(entries) if entries else 0.0


def score_choices(backend: Backend, prompt: str, choices: list[str],
                  method: ChoicesSamplingMethod) -> ChoicesDecision:
    """Pick one of ``choices`` as the continuation of ``prompt``.

    Returns:
        the decision; its ``meta_info`` holds ``normalized_prompt_logprobs`` ``[C]`` (mean over
        each choice's own tokens), ``input_token_logprobs`` ``[C][*]`` as SGLang returns them
        (the scored boundary tokens before the choice first, entry 0 ``[None, id, text]``),
        ``choice_token_logprobs`` ``[C][T_i]`` (each choice's own tokens), ``prompt_tokens`` and
        ``cached_tokens`` of the prompt's prefill-only request, ``logprob_start_len`` and
        method-specific scores.
    Raises:
        RuntimeError: a request failed; ValueError: no choices.
    """
    if not choices:
        raise ValueError("select needs at least one choice")
    commit = backend.commit_prefix(prompt)
    prompt_tokens = int(commit["prompt_tokens"])
    start = max(prompt_tokens - 2, 0)
    objs = backend.request({
        "text": [prompt + c for c in choices],
        "sampling_params": {"max_new_tokens": 0, "temperature": 0},
        "return_logprob": True,
        "return_text_in_logprobs": True,
        "logprob_start_len": start,
    })
    assert isinstance(objs, list) and len(objs) == len(choices)
    raw = [o["meta_info"]["input_token_logprobs"] for o in objs]
    input_lp = [choice_token_entries(prompt, c, entries, start, prompt_tokens)
                for c, entries in zip(choices, raw)]
    output_lp = [o["meta_info"].get("output_token_logprobs") or [] for o in objs]
    normalized = [_mean_logprob(e) for e in input_lp]
    unconditional: list[list[LogprobEntry]] | None = None
    if method.requires_unconditional_logprobs:
        unconditional = _unconditional(backend, input_lp)
    decision = method(choices=choices, normalized_prompt_logprobs=normalized,
                      input_token_logprobs=input_lp, output_token_logprobs=output_lp,
                      unconditional_token_logprobs=unconditional)
    # NOTE: SGLang's meta info keeps the scored boundary tokens before the choice ([None, id, text]
    # first); the decision above used only the choice's own tokens (``choice_token_logprobs``).
    decision.meta_info["choice_token_logprobs"] = input_lp
    decision.meta_info["input_token_logprobs"] = [sglang_entries(prompt, e) for e in raw]
    decision.meta_info.setdefault("prompt_tokens", prompt_tokens)
    decision.meta_info.setdefault("cached_tokens", int(commit.get("cached_tokens", 0)))
    decision.meta_info.setdefault("logprob_start_len", start)
    return decision


def _unconditional(backend: Backend, input_lp: list[list[LogprobEntry]]) -> list[list[Any]]:
    ids = [[int(e[1]) for e in entries] for entries in input_lp]
    out: list[list[Any]] = [[] for _ in ids]
    todo = [i for i, row in enumerate(ids) if row]
    if todo:
        objs = backend.request({
            "input_ids": [ids[i] for i in todo],
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True,
            "return_text_in_logprobs": True,
            "logprob_start_len": 0,
        })
        assert isinstance(objs, list)
        for i, obj in zip(todo, objs):
            out[i] = obj["meta_info"]["input_token_logprobs"]
    return out
