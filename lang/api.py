"""DSL primitives: ``gen``, ``gen_int``, ``gen_string``, ``select``, roles and ``var_scope``.

Names, argument order and semantics follow SGLang's frontend (``sglang.gen`` etc., DESIGN.md §3.1),
so ``import radixlm as sgl`` runs SGLang programs.  Each call only builds IR nodes; nothing talks to
a model until a program state executes them.
"""

from __future__ import annotations

import warnings
from typing import Any

from radixlm.lang.choices import ChoicesSamplingMethod, token_length_normalized
from radixlm.lang.constraints import check_regex, dtype_to_regex, json_schema_to_str
from radixlm.lang.ir import (
    Expr, ExprList, Gen, RoleBegin, RoleEnd, SamplingParams, Select, SeparateReasoning,
    VarScopeBegin, VarScopeEnd, as_exprs,
)


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: Any = None,
    choices: list[str] | None = None,
    choices_method: ChoicesSamplingMethod | None = None,
    regex: str | None = None,
    json_schema: Any = None,
    *,
    repetition_penalty: float | None = None,
    seed: int | None = None,
    ebnf: str | None = None,
    logit_bias: dict[int, float] | None = None,
) -> Expr:
    """Generate text from the model at this point of the program.

    Args:
        name: variable that receives the completion (``s[name]``), or ``None``.
        max_tokens / min_tokens: bounds on generated tokens (``None``: the run's default, 128 / 0).
        n: number of samples (SGLang semantics): with ``n > 1`` the variable is the list of the
            ``n`` completions and the state's text continues with the first one.
        stop, stop_token_ids, stop_regex: stop conditions; the matched stop is not in the text.
        temperature, top_p, top_k, min_p, frequency_penalty, presence_penalty, repetition_penalty,
            seed, ignore_eos, logit_bias: sampling controls with the native protocol's meaning
            (§3.2; ``logit_bias`` maps token ids to a bias in [-100, 100] added to their logits).
        return_logprob, logprob_start_len, top_logprobs_num, return_text_in_logprobs: logprob
            options; the entries appear in ``s.get_meta_info(name)``.
        dtype: ``int``/``float``/``bool``/``str`` (or names): constrains the output with a regex
            (``radixlm.lang.constraints``); the value stays a string.
        choices: if non-empty, this is a :func:`select` with ``choices_method`` instead of a generation.
        regex / json_schema / ebnf: constrained decoding; ``json_schema`` may be a JSON string, a
            dict or a pydantic model class; its objects that declare properties take no undeclared
            keys unless the schema allows them (the runtime's ``disable_additional_properties``,
            on by default as xgrammar's ``strict_mode`` in SGLang).
    Returns:
        a :class:`~radixlm.lang.ir.Gen` (or :class:`~radixlm.lang.ir.Select`) node.
    Raises:
        ValueError: ``n`` < 1, an unsupported ``dtype``, an invalid ``regex`` (checked here, as
            SGLang's ``gen`` does), or more than one of ``regex``/``json_schema``/``ebnf`` (a
            ``dtype`` given with a ``regex`` wins with a warning, as in SGLang).
        TypeError: a ``json_schema`` of an unsupported type.
    """
    if choices:  # NOTE: as SGLang, an empty list means a plain generation
        return select(name, choices, temperature=temperature or 0.0,
                      choices_method=choices_method or token_length_normalized)
    if n is not None and int(n) < 1:
        raise ValueError(f"gen(n={n}): n must be >= 1")
    if dtype is not None:
        dtype_to_regex(dtype)  # validate early
    if regex is not None:
        check_regex(regex)
    if dtype is not None and regex is not None:
        # NOTE: SGLang's backends warn and use the dtype; keep that rather than fail the program.
        warnings.warn(f"Both dtype and regex are set. Only dtype will be used. dtype: {dtype}, "
                      f"regex: {regex}", stacklevel=2)
        regex = None
    constraints = [c for c in (dtype, regex, json_schema, ebnf) if c is not None]
    if len(constraints) > 1:
        raise ValueError("give at most one of dtype, regex, json_schema, ebnf")
    params = SamplingParams(
        max_new_tokens=max_tokens, min_new_tokens=min_tokens, n=n, stop=stop,
        stop_token_ids=stop_token_ids, stop_regex=stop_regex, temperature=temperature, top_p=top_p,
        top_k=top_k, min_p=min_p, frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty, repetition_penalty=repetition_penalty,
        ignore_eos=ignore_eos, seed=seed, logit_bias=logit_bias, return_logprob=return_logprob,
        logprob_start_len=logprob_start_len, top_logprobs_num=top_logprobs_num,
        return_text_in_logprobs=return_text_in_logprobs, dtype=dtype, regex=regex,
        json_schema=None if json_schema is None else json_schema_to_str(json_schema), ebnf=ebnf,
    )
    return Gen(name, params)


def _typed_gen(dtype: Any, name: str | None, max_tokens: int | None, n: int | None,
               kwargs: dict[str, Any]) -> Expr:
    return gen(name, max_tokens, n=n, dtype=dtype, **kwargs)


def gen_int(
    name: str | None = None,
    max_tokens: int | None = None,
    n: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
) -> Expr:
    """``gen`` constrained to an integer (``REGEX_INT``, stops at a space or newline); the value
    is a string. Arguments as in :func:`gen`."""
    kw = dict(locals())
    return _typed_gen(int, kw.pop("name"), kw.pop("max_tokens"), kw.pop("n"), kw)


def gen_string(
    name: str | None = None,
    max_tokens: int | None = None,
    n: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
) -> Expr:
    """``gen`` constrained to a double-quoted string of word characters and spaces
    (``REGEX_STR``, quotes included in the value). Arguments as in :func:`gen`."""
    kw = dict(locals())
    return _typed_gen(str, kw.pop("name"), kw.pop("max_tokens"), kw.pop("n"), kw)


def select(
    name: str | None = None,
    choices: list[str] | None = None,
    temperature: float = 0.0,
    choices_method: ChoicesSamplingMethod = token_length_normalized,
) -> Expr:
    """Append the most likely of ``choices`` (scored by the model) and store it in ``s[name]``.

    Args:
        name: variable receiving the chosen string; its scores go to ``s.get_meta_info(name)``.
        choices: non-empty list of distinct, non-empty strings.
        temperature: must be 0 (selection is greedy, as in SGLang).
        choices_method: one of ``token_length_normalized`` (default), ``greedy_token_selection``,
            ``unconditional_likelihood_normalized`` (``radixlm.lang.choices``).
    Raises:
        ValueError: empty choices, an empty choice string, or temperature > 0.
    """
    if not choices:
        raise ValueError("select needs a non-empty list of choices")
    if any(not isinstance(c, str) or c == "" for c in choices):
        raise ValueError("select choices must be non-empty strings")
    if temperature > 1e-5:
        raise ValueError("select only supports temperature=0")
    return Select(name, list(choices), float(temperature), choices_method)


def _role(role: str, expr: Any) -> ExprList:
    inner = [] if expr is None else as_exprs(expr)
    return ExprList([RoleBegin(role), *inner, RoleEnd(role)])


def system(expr: Any = None) -> ExprList:
    """A system message wrapping ``expr`` (text or nodes) in the chat template's markers."""
    return _role("system", expr)


def user(expr: Any = None) -> ExprList:
    """A user message wrapping ``expr`` (text or nodes) in the chat template's markers."""
    return _role("user", expr)


def assistant(expr: Any = None) -> ExprList:
    """An assistant message wrapping ``expr``, typically ``gen(...)``."""
    return _role("assistant", expr)


def system_begin() -> RoleBegin:
    """Open a system message (close it with :func:`system_end`)."""
    return RoleBegin("system")


def system_end() -> RoleEnd:
    """Close a system message."""
    return RoleEnd("system")


def user_begin() -> RoleBegin:
    """Open a user message (close it with :func:`user_end`)."""
    return RoleBegin("user")


def user_end() -> RoleEnd:
    """Close a user message."""
    return RoleEnd("user")


def assistant_begin() -> RoleBegin:
    """Open an assistant message (close it with :func:`assistant_end`)."""
    return RoleBegin("assistant")


def assistant_end() -> RoleEnd:
    """Close an assistant message."""
    return RoleEnd("assistant")


def var_scope(name: str, expr: Any) -> ExprList:
    """Capture all text that ``expr`` appends into variable ``name`` (see also ``s.var_scope``)."""
    return ExprList([VarScopeBegin(name), *as_exprs(expr), VarScopeEnd(name)])


def image(expr: Any) -> Expr:
    """SGLang's image input. Raises NotImplementedError: radixlm serves text-only models."""
    raise NotImplementedError("sgl.image is not supported: radixlm serves text-only models")


def video(path: str, num_frames: int) -> Expr:
    """SGLang's video input. Raises NotImplementedError: radixlm serves text-only models."""
    raise NotImplementedError("sgl.video is not supported: radixlm serves text-only models")


def separate_reasoning(expr: Any = None, model_type: str | None = None) -> ExprList:
    """Run ``expr`` (e.g. ``gen("answer")``), then split each named gen/select in it into the
    answer (``s["answer"]`` and the text) and the ``<think>`` reasoning
    (``s["answer_reasoning_content"]``). ``model_type="deepseek-r1"``: output without a closing
    ``</think>`` is all reasoning. Not applied when streaming (as in SGLang)."""
    inner = [] if expr is None else as_exprs(expr)
    return ExprList([*inner, SeparateReasoning(model_type, expr)])
