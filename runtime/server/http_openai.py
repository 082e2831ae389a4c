"""OpenAI-compatible routes (DESIGN.md §3.3): ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions`` over the TokenizerManager; the official ``openai`` client is the test."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from radixlm.runtime.deadline import DeadlineExceeded, submit_with_deadline
from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.server.http_native import SSE_HEADERS, error_body, parse_body, sse
from radixlm.runtime.server.openai_tools import parse_tool_calls, response_format_schema, tool_constraint
from radixlm.runtime.server.protocol import (
    SAMPLING_FIELD_NAMES, ChatCompletionRequest, CompletionRequest, _SamplingExtras, to_sampling_params,
)
from radixlm.runtime.server.tokenizer_manager import GenSpec, ReqState, RequestError, TokenizerManager


def _sampling(body: _SamplingExtras, max_new: int, json_schema: str | None, strict: bool = False) -> SamplingParams:
    """The request's :class:`SamplingParams`: every field of it the body carries (generated from
    it, so none is left behind), ``min_tokens`` as ``min_new_tokens``, and the resolved
    ``max_new_tokens`` and response-format / tool schema (``strict``: OpenAI's ``strict: true``,
    which sets ``disable_additional_properties``). Raises RequestError (400)."""
    values = {k: getattr(body, k) for k in SAMPLING_FIELD_NAMES if k in type(body).model_fields}
    values.update(min_new_tokens=body.min_tokens, max_new_tokens=max_new)
    if json_schema is not None:
        values["json_schema"] = json_schema
    if strict:
        values["disable_additional_properties"] = True
    try:
        return to_sampling_params(values)
    except ValueError as e:
        raise RequestError(str(e), param="sampling_params") from None


def _finish(st: ReqState, tool_calls: bool = False) -> str | None:
    reason = st.finish_reason
    if reason is None:
        return None
    if tool_calls:
        return "tool_calls"
    return {"stop": "stop", "length": "length"}.get(reason.get("type"), "abort")


def _usage(states: list[ReqState], n: int) -> dict[str, Any]:
    firsts = states[::n]
    prompt = sum(s.prompt_tokens for s in firsts)
    completion = sum(s.completion_tokens for s in states)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(s.cached_tokens for s in firsts)}}


def _check_errors(states: list[ReqState]) -> None:
    for s in states:
        if s.finish_reason and s.finish_reason.get("status_code"):
            raise RequestError(s.finish_reason.get("message", "bad request"), status=s.finish_reason["status_code"])


def _completion_logprobs(entries: list, tops: list, offset: int) -> dict[str, Any]:
    tokens, offsets, pos = [], [], offset
    for e in entries:
        tokens.append(e[2] or "")
        offsets.append(pos)
        pos += len(e[2] or "")
    # NOTE: as OpenAI: the sampled token is always among its position's top entries (so up to
    # logprobs + 1 of them; logprobs=0 gives just it); a position without a logprob (the first
    # echoed prompt token) has None
    top = [None if e[0] is None else {**{x[2] or "": x[0] for x in (t or [])}, e[2] or "": e[0]}
           for e, t in zip(entries, tops)]
    return {"tokens": tokens, "token_logprobs": [e[0] for e in entries], "top_logprobs": top,
            "text_offset": offsets}


def _chat_logprobs(entries: list, tops: list) -> dict[str, Any]:
    def item(e):
        tok = e[2] or ""
        return {"token": tok, "logprob": e[0], "bytes": list(tok.encode("utf-8"))}
    return {"content": [{**item(e), "top_logprobs": [item(x) for x in (t or [])]} for e, t in zip(entries, tops)]}


def add_openai_routes(app: FastAPI, tm: TokenizerManager) -> None:
    """Register the ``/v1`` routes on ``app``."""

    def card() -> dict:
        return {"id": tm.model_name, "object": "model", "created": int(time.time()), "owned_by": "radixlm",
                "root": tm.model_name, "max_model_len": tm.context_len}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model:path}")  # NOTE: a path: model ids are often paths or "org/name"
    async def model(model: str):
        if model != tm.model_name:
            raise RequestError(f"model {model!r} is not served here (this server serves {tm.model_name!r})",
                               status=404, param="model")
        return card()

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await parse_body(request, CompletionRequest)
        p = body.prompt
        if isinstance(p, str) or (isinstance(p, list) and p and isinstance(p[0], int)):
            p = [p]
        if not p:
            raise RequestError("prompt is empty", param="prompt")
        vocab = tm.info.get("vocab_size") or len(tm.tokenizer)
        if any(not isinstance(x, str) and any(t >= vocab for t in x) for x in p):  # NOTE: before decoding
            raise RequestError(f"prompt token ids must be in [0, {vocab})", param="prompt")
        encoded = iter(await tm.encode_many([x for x in p if isinstance(x, str)]))  # NOTE: one tokenizer call
        prompts = [next(encoded) if isinstance(x, str) else list(x) for x in p]
        texts = [x if isinstance(x, str) else await tm.run_off_loop(tm.tokenizer.decode, x) for x in p]
        sp = _sampling(body, 16 if body.max_tokens is None else body.max_tokens,
                       *response_format_schema(body.response_format))
        lp = body.logprobs is not None
        specs = [GenSpec(ids, sp, lp, 0 if (lp and body.echo) else -1, body.logprobs or 0, True,
                         f"{body.rid}-{i}" if body.rid and len(prompts) > 1 else body.rid)
                 for i, ids in enumerate(prompts)]
        states, queue = await tm.submit(specs)
        cid, created, n = f"cmpl-{uuid.uuid4().hex}", int(time.time()), body.n

        def logprobs_of(st: ReqState, start: int = 0, echo: bool = False):
            if not lp:
                return None
            entries, tops = st.output_lp[start:], st.output_top[start:]
            if echo:
                entries, tops = st.input_lp + entries, st.input_top + tops
            return _completion_logprobs(entries, tops, 0)

        if body.stream:
            async def events():
                sent = {s.index: 0 for s in states}
                sent_lp = {s.index: 0 for s in states}
                try:
                    if body.echo:
                        for s in states:
                            yield sse({"id": cid, "object": "text_completion", "created": created, "model": tm.model_name,
                                       "choices": [{"index": s.index, "text": texts[s.index // n], "logprobs": None,
                                                    "finish_reason": None}]})
                    async for st in tm.updates(states, queue, request):
                        if st.finish_reason and st.finish_reason.get("status_code"):
                            yield sse(error_body(st.finish_reason.get("message", "error"), st.finish_reason["status_code"]))
                            continue
                        delta = st.text[sent[st.index]:]
                        chunk_lp = logprobs_of(st, sent_lp[st.index])
                        sent[st.index], sent_lp[st.index] = len(st.text), len(st.output_lp)
                        if delta or st.finished or (chunk_lp and chunk_lp["tokens"]):
                            yield sse({"id": cid, "object": "text_completion", "created": created,
                                       "model": tm.model_name,
                                       "choices": [{"index": st.index, "text": delta, "logprobs": chunk_lp,
                                                    "finish_reason": _finish(st)}]})
                    if body.stream_options and body.stream_options.include_usage:
                        yield sse({"id": cid, "object": "text_completion", "created": created, "model": tm.model_name,
                                   "choices": [], "usage": _usage(states, n)})
                    yield "data: [DONE]\n\n"
                finally:
                    tm.abort_unfinished(states)
            return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)

        await tm.wait_all(states, queue, request)
        _check_errors(states)
        choices = [{"index": s.index, "text": (texts[s.index // n] if body.echo else "") + s.text,
                    "logprobs": logprobs_of(s, echo=body.echo), "finish_reason": _finish(s)} for s in states]
        return {"id": cid, "object": "text_completion", "created": created, "model": tm.model_name,
                "choices": choices, "usage": _usage(states, n)}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await parse_body(request, ChatCompletionRequest)
        ids = await _chat_prompt(tm, body)
        schema, forced, strict = tool_constraint(body.tools, body.tool_choice)
        constrained = schema is not None
        if schema is None:
            schema, strict = response_format_schema(body.response_format)
        max_new = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        if max_new is None:
            max_new = max(tm.context_len - len(ids) - 1, 1)
        top = body.top_logprobs or 0
        spec = GenSpec(ids, _sampling(body, max_new, schema, strict), body.logprobs, -1, top, True, body.rid)
        states, queue = await tm.submit([spec])
        cid, created, n = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), body.n
        tools = body.tools if body.tool_choice != "none" else None

        def chunk(index: int, delta: dict, finish: str | None, logprobs=None) -> str:
            return sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": tm.model_name,
                        "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]})

        if body.stream:
            async def events():
                sent = {s.index: 0 for s in states}
                sent_lp = {s.index: 0 for s in states}
                try:
                    for s in states:
                        yield chunk(s.index, {"role": "assistant", "content": ""}, None)
                    async for st in tm.updates(states, queue, request):
                        if st.finish_reason and st.finish_reason.get("status_code"):
                            yield sse(error_body(st.finish_reason.get("message", "error"), st.finish_reason["status_code"]))
                            continue
                        lps = None
                        if body.logprobs:
                            lps = _chat_logprobs(st.output_lp[sent_lp[st.index]:], st.output_top[sent_lp[st.index]:])
                            sent_lp[st.index] = len(st.output_lp)
                        if constrained:  # NOTE: a call is emitted whole once its JSON is complete
                            if st.finished:
                                calls = parse_tool_calls(st.text, tools, forced, True) or []
                                delta = {"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]}
                                yield chunk(st.index, delta, _finish(st, bool(calls)), lps)
                            continue
                        delta = st.text[sent[st.index]:]
                        sent[st.index] = len(st.text)
                        if delta or lps and lps["content"]:
                            yield chunk(st.index, {"content": delta}, None, lps)
                        if st.finished:
                            yield chunk(st.index, {}, _finish(st))
                    if body.stream_options and body.stream_options.include_usage:
                        yield sse({"id": cid, "object": "chat.completion.chunk", "created": created,
                                   "model": tm.model_name, "choices": [], "usage": _usage(states, n)})
                    yield "data: [DONE]\n\n"
                finally:
                    tm.abort_unfinished(states)
            return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)

        await tm.wait_all(states, queue, request)
        _check_errors(states)
        choices = []
        for s in states:
            calls = parse_tool_calls(s.text, tools, forced, constrained)
            message: dict[str, Any] = {"role": "assistant", "content": None if calls else s.text}
            if calls:
                message["tool_calls"] = calls
            choices.append({"index": s.index, "message": message, "finish_reason": _finish(s, bool(calls)),
                            "logprobs": _chat_logprobs(s.output_lp, s.output_top) if body.logprobs else None})
        return {"id": cid, "object": "chat.completion", "created": created, "model": tm.model_name,
                "choices": choices, "usage": _usage(states, n)}


async def _chat_prompt(tm: TokenizerManager, body: ChatCompletionRequest) -> list[int]:
    """Render the messages with the tokenizer's chat template and tokenize them, off the event
    loop; the rendering is stopped after ``template_timeout_s`` and refused past
    ``max_template_chars`` (400)."""
    messages = []
    for m in body.messages:
        content = m.content
        if isinstance(content, list):
            content = "".join(part.text or "" for part in content if part.type == "text")
        msg: dict[str, Any] = {"role": m.role, "content": content or ""}
        for key in ("name", "tool_calls", "tool_call_id"):
            if getattr(m, key) is not None:
                msg[key] = getattr(m, key)
        messages.append(msg)
    tools = [t.model_dump() for t in body.tools] if body.tools and body.tool_choice != "none" else None
    cfg = tm.config

    def render() -> str:
        return tm.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True,
                                                **(body.chat_template_kwargs or {}))

    try:
        text = await asyncio.wrap_future(submit_with_deadline(render, cfg.template_timeout_s, name="radixlm-template"))
    except DeadlineExceeded:
        raise RequestError(f"the chat template took longer than {cfg.template_timeout_s:g} s to render",
                           param="chat_template_kwargs") from None
    except Exception as e:  # NOTE: template errors (missing template, bad roles) are the client's
        raise RequestError(f"cannot apply the chat template: {e}", param="messages") from None
    if len(text) > cfg.max_template_chars:
        raise RequestError(f"the rendered chat template has {len(text)} characters; the limit is "
                           f"{cfg.max_template_chars}", param="chat_template_kwargs")
    return (await tm.encode_many([text], add_special_tokens=False, param="messages"))[0]
