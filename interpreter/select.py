"""Choice scoring for ``select``: one round trip against radixlm, SGLang's pattern elsewhere.

Against radixlm (the HTTP server or the in-process Engine) a ``select`` is ONE native request,
``{"text": prompt, "choices": [...], "choices_method": name, "sampling_params":
{"max_new_tokens": 0}}``: the runtime tokenizes ``prompt + choice`` for every choice, scores them
against the cached prompt in one prefill batch (and, for ``unconditional_likelihood_normalized``,
the choices' own tokens without the prompt in the same batch) and returns the scores in
``meta_info`` (docs/server.md, "select in one round trip").

A server without the ``choices`` field (SGLang's) ignores it and answers the same body as a
prefill-only request for the prompt: that response is step 1 of SGLang's frontend pattern
(DESIGN.md §3.2), so the fallback costs no extra request:

1. the prefill-only request for the prompt: it enters the prefix cache and its ``prompt_tokens`` P
   tells where the choices begin;
2. one batched request of ``prompt + choice`` for all choices with ``max_new_tokens: 0``,
   ``return_logprob``, ``return_text_in_logprobs`` and ``logprob_start_len = max(P - 2, 0)``: the
   prompt's KV is reused from the cache and only the last prompt tokens plus the choice are scored.
   Starting two tokens early covers "token healing", where the prompt's last token merges with the
   choice's first token when the two are tokenized together;
3. for ``unconditional_likelihood_normalized`` only: one batched ``input_ids`` request that scores
   each choice's tokens without the prompt.

Either way the decision is made here by the method object (so custom methods work) through
:func:`radixlm.lang.choices.decide_choices`, from the same logprob entries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from radixlm.lang.choices import (  # noqa: F401 - re-exported (older import path)
    ChoicesDecision, ChoicesSamplingMethod, LogprobEntry, apply_choices_method, choice_token_entries,
    choices_method_name, decide_choices, sglang_entries,
)

from radixlm.interpreter.backend import raise_if_rejected

if TYPE_CHECKING:
    from radixlm.interpreter.backend import Backend

#: meta_info key whose presence marks a native one-trip ``choices`` response.
NATIVE_KEY = "choice_token_logprobs"


def native_choices_payload(prompt: str, choices: list[str], method: ChoicesSamplingMethod,
                           extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The one-trip ``/generate`` body of a ``select`` (a prefill-only request to servers that
    ignore ``choices``). ``extra``: more top-level fields (e.g. ``cache_lease``)."""
    return {"text": prompt, "choices": list(choices), "choices_method": choices_method_name(method),
            "sampling_params": {"max_new_tokens": 0}, **(extra or {})}


def score_choices(backend: Backend, prompt: str, choices: list[str],
                  method: ChoicesSamplingMethod, extra: dict[str, Any] | None = None
                  ) -> ChoicesDecision:
    """Pick one of ``choices`` as the continuation of ``prompt`` (one request against radixlm).

    Returns:
        the decision; ``meta_info`` as :func:`radixlm.lang.choices.decide_choices` documents.
    Raises:
        RuntimeError: a request failed; ValueError: no choices.
    """
    if not choices:
        raise ValueError("select needs at least one choice")
    try:
        obj = backend.request(native_choices_payload(prompt, choices, method, extra))
    except RuntimeError as exc:
        if "choices" not in str(exc):  # NOTE: a server that refuses the field by name: fall back
            raise
        return score_choices_multi_request(backend, prompt, choices, method)
    assert isinstance(obj, dict)
    meta = raise_if_rejected(obj["meta_info"])
    if NATIVE_KEY not in meta:  # the server ignored `choices`: this was the prefill-only commit
        return score_choices_multi_request(backend, prompt, choices, method, commit=meta)
    return apply_choices_method(method, choices, meta[NATIVE_KEY], meta["input_token_logprobs"],
                                meta.get("unconditional_token_logprobs"),
                                prompt_tokens=int(meta["prompt_tokens"]),
                                logprob_start_len=int(meta["logprob_start_len"]),
                                cached_tokens=int(meta.get("cached_tokens", 0)))


def score_choices_multi_request(backend: Backend, prompt: str, choices: list[str],
                                method: ChoicesSamplingMethod,
                                commit: dict[str, Any] | None = None) -> ChoicesDecision:
    """SGLang's request pattern (module docstring, steps 1-3). ``commit``: the ``meta_info`` of
    step 1 when it was already sent."""
    if not choices:
        raise ValueError("select needs at least one choice")
    if commit is None:
        commit = backend.commit_prefix(prompt)
    prompt_tokens = int(commit["prompt_tokens"])
    start = max(prompt_tokens - 2, 0)
    objs = backend.request({
        "text": [prompt + c for c in choices],
        "sampling_params": {"max_new_tokens": 0, "temperature": 0},
        "return_logprob": True,
        "return_text_in_logprobs": True,
        "logprob_start_len": start,
        **backend._lease_fields(),
    })
    assert isinstance(objs, list) and len(objs) == len(choices)
    raw = [raise_if_rejected(o["meta_info"])["input_token_logprobs"] for o in objs]
    unconditional: list[list[LogprobEntry]] | None = None
    if method.requires_unconditional_logprobs:
        own = [choice_token_entries(prompt, c, e, start, prompt_tokens) for c, e in zip(choices, raw)]
        unconditional = _unconditional(backend, own)
    return decide_choices(method, prompt, choices, raw, unconditional, prompt_tokens=prompt_tokens,
                          logprob_start_len=start, cached_tokens=int(commit.get("cached_tokens", 0)))


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
            out[i] = raise_if_rejected(obj["meta_info"])["input_token_logprobs"]
    return out
