"""The FastAPI app: shared plumbing (JSON parsing, errors, API key, /metrics) and the
SGLang-native endpoints of DESIGN.md §3.2. The OpenAI routes live in :mod:`.http_openai`."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.server.protocol import (
    AbortReqInput, DetokenizeReqInput, GenerateReqInput, ReleaseCacheLeaseInput, TokenizeReqInput,
)
from radixlm.runtime.server.tokenizer_manager import GenSpec, RequestError, TokenizerManager

logger = logging.getLogger("radixlm.http")
M = TypeVar("M", bound=BaseModel)
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
#: radixlm extensions of the native API (reported by /get_model_info and /get_server_info).
FEATURES = ("choices", "cache_lease")


def error_body(message: str, status: int, param: str | None = None) -> dict:
    """OpenAI-style error object (also the native API's ``{"error": {"message": ...}}``)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


async def read_body(request: Request, limit: int) -> bytes:
    """The request body; RequestError(413) past ``limit`` bytes. An oversized body is drained
    (not kept) so the connection stays usable, up to 4x the limit; beyond that it is closed."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > 4 * limit:
        raise RequestError(f"the request body has {declared} bytes; the limit is {limit} (--max-request-bytes)",
                           status=413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        elif size > 4 * limit:
            break
    if size > limit:
        raise RequestError(f"the request body has more than {limit} bytes (--max-request-bytes)", status=413)
    return b"".join(chunks)


_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "bytes", "tuple"}


def _is_tag(x) -> bool:
    """Union-member tags pydantic puts in error paths (class names, ``list[...]``, ``str``)."""
    return isinstance(x, str) and (x[:1].isupper() or "[" in x or x in _TAGS or x.startswith(("constrained-", "function-")))


def _field_error(e: ValidationError) -> RequestError:
    errors = e.errors()
    first = errors[0]
    if first["type"] == "json_invalid":
        return RequestError(f"malformed JSON body: {first['msg']}")
    if first["type"] == "model_type" and not first["loc"]:
        return RequestError("the JSON body must be an object")
    # NOTE: of a union's alternatives, report a value error over a type mismatch
    first = next((x for x in errors if not x["type"].endswith("_type")), first)
    loc = ".".join(str(x) for x in first["loc"] if not _is_tag(x))
    msg = first["msg"].replace("Value error, ", "")
    return RequestError(f"{loc}: {msg} (got {first.get('input')!r:.80})".replace("\n", " "),
                        param=loc.split(".")[0] or None)


OFF_LOOP_BYTES = 64 * 1024  # bodies above this are parsed in a worker thread


async def parse_body(request: Request, model: type[M]) -> M:
    """Read and validate the JSON body into ``model`` (pydantic's JSON parser: it rejects invalid
    UTF-8, lone surrogates and nesting deeper than 200); raises RequestError 400 naming the bad
    field, 413 for a body over ``--max-request-bytes``."""
    tm: TokenizerManager = request.app.state.tm
    raw = await read_body(request, tm.config.max_request_bytes)
    if not raw.strip():
        raw = b"{}"
    try:
        if len(raw) > OFF_LOOP_BYTES:
            return await tm.run_off_loop(model.model_validate_json, raw)
        return model.model_validate_json(raw)
    except ValidationError as e:
        raise _field_error(e) from None
    except RecursionError:
        raise RequestError("the JSON body is nested too deeply") from None


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _as_list(value, count: int, name: str) -> list:
    if isinstance(value, list):
        if len(value) != count:
            raise RequestError(f"{name} has {len(value)} entries for {count} prompts", param=name)
        return value
    return [value] * count


async def native_specs(body: GenerateReqInput, tm: TokenizerManager) -> tuple[list[GenSpec], bool]:
    """Normalize a ``/generate`` body into per-prompt specs; returns ``(specs, single)``."""
    if (body.text is None) == (body.input_ids is None):
        raise RequestError("pass exactly one of text and input_ids", param="text")
    if body.text is not None:
        single = isinstance(body.text, str)
        prompts = await tm.encode_many([body.text] if single else body.text)  # NOTE: one tokenizer call
    else:
        ids = body.input_ids
        single = not (ids and isinstance(ids[0], list))
        prompts = [list(ids)] if single else [list(x) for x in ids]
    n = len(prompts)
    if n == 0:
        raise RequestError("the batch is empty", param="text")
    sps = _as_list(body.sampling_params, n, "sampling_params")
    lps = _as_list(body.return_logprob, n, "return_logprob")
    starts = _as_list(body.logprob_start_len, n, "logprob_start_len")
    tops = _as_list(body.top_logprobs_num, n, "top_logprobs_num")
    if isinstance(body.rid, list):
        rids = _as_list(body.rid, n, "rid")
    else:
        rids = [body.rid if n == 1 or body.rid is None else f"{body.rid}-{i}" for i in range(n)]
    lease = body.cache_lease.model_dump() if body.cache_lease else None
    return [
        GenSpec(prompts[i], sps[i].to_runtime() if sps[i] is not None else SamplingParams(), bool(lps[i]),
                starts[i], tops[i], body.return_text_in_logprobs, rids[i], cache_lease=lease,
                clamp_max_new=sps[i] is None or sps[i].max_new_tokens is None)
        for i in range(n)
    ], single


async def generate_choices(body: GenerateReqInput, tm: TokenizerManager, request: Request) -> dict:
    """``/generate`` with ``choices``: every choice scored in one submission (runtime/choices.py);
    returns the native response of docs/server.md ("select in one round trip")."""
    from radixlm.runtime.choices import SCORING_PARAMS, ChoicesPlan

    if not isinstance(body.text, str):
        raise RequestError("choices needs one text prompt (text: str)", param="choices")
    if body.stream:
        raise RequestError("choices cannot be streamed", param="stream")
    if isinstance(body.rid, list):
        raise RequestError("choices takes one rid", param="rid")
    try:
        plan = await tm.run_off_loop(ChoicesPlan.build, tm.tokenizer.encode,
                                     lambda t: tm.tokenizer.decode([t]), body.text, body.choices,
                                     body.choices_method)
    except ValueError as e:
        raise RequestError(str(e), param="choices") from None
    base = body.rid or uuid.uuid4().hex
    lease = body.cache_lease.model_dump() if body.cache_lease else None
    # NOTE: only the prompt + choice requests carry the lease (they hold the program's prefix)
    specs = [GenSpec(ids, SamplingParams(**SCORING_PARAMS), True, start, 0, True, f"{base}-choice-{i}",
                     cache_lease=lease if i < len(plan.choices) else None)
             for i, (ids, start) in enumerate(plan.requests())]
    t0 = time.perf_counter()
    states, queue = await tm.submit(specs)
    await tm.wait_all(states, queue, request)
    bad = next((s.finish_reason for s in states if s.finish_reason.get("type") == "abort"), None)
    if bad is not None:
        raise RequestError(f"choice scoring aborted: {bad.get('message')}", status=500)
    cached = sum(s.cached_tokens for s in states[: len(plan.choices)])
    return plan.response([s.input_lp for s in states], cached, base, t0, states[0].finish_reason)


class ContainErrors:
    """ASGI middleware: an unexpected exception becomes a logged 500 for that request only; it
    never reaches the server (which would close the keep-alive connection)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:  # noqa: BLE001 - a bug; contained to this request
            logger.exception("error serving %s", scope.get("path"))
            if not started:
                body = error_body(f"internal error: {type(exc).__name__}: {exc}", 500)
                await JSONResponse(body, status_code=500)(scope, receive, send)


def _api_key_middleware(app: FastAPI, api_key: str) -> None:
    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if request.url.path != "/health" and request.headers.get("authorization", "") != f"Bearer {api_key}":
            return JSONResponse(error_body("invalid or missing API key", 401), status_code=401)
        return await call_next(request)


def create_app(tm: TokenizerManager) -> FastAPI:
    """The HTTP app over ``tm``: native routes, OpenAI routes and ``/metrics``."""
    from radixlm.runtime.server.http_openai import add_openai_routes

    app = FastAPI(title="radixlm", openapi_url=None, docs_url=None, redoc_url=None)
    app.state.tm = tm

    @app.exception_handler(RequestError)
    async def on_request_error(request: Request, exc: RequestError):
        return JSONResponse(error_body(exc.message, exc.status, exc.param), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError):
        return JSONResponse(error_body(str(exc)[:500], 400), status_code=400)

    app.add_middleware(ContainErrors)

    if tm.config.api_key:
        _api_key_middleware(app, tm.config.api_key)

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request):
        body = await parse_body(request, GenerateReqInput)
        if body.choices is not None:
            return await generate_choices(body, tm, request)
        specs, single = await native_specs(body, tm)
        states, queue = await tm.submit(specs)
        if body.stream:
            async def events():
                try:
                    async for st in tm.updates(states, queue, request):
                        reason = st.finish_reason or {}
                        if reason.get("status_code"):
                            yield sse(error_body(reason.get("message", "bad request"), reason["status_code"]))
                        else:  # NOTE: sse(result()) built incrementally (O(new output) per event)
                            yield st.sse_chunk(st.index if len(states) > 1 else None)
                    yield "data: [DONE]\n\n"
                finally:
                    tm.abort_unfinished(states)
            return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)
        await tm.wait_all(states, queue, request)
        outs = [s.result() for s in states]
        return outs[0] if single and len(outs) == 1 else outs

    @app.get("/health")
    async def health():
        """200 while the scheduler loop answers a ping within --health-timeout-s; else 503."""
        if await tm.scheduler_alive(tm.config.health_timeout_s):
            return Response(status_code=200)
        return JSONResponse(error_body("the scheduler is not responding", 503), status_code=503)

    @app.get("/health_generate")
    async def health_generate(request: Request):
        spec = GenSpec((await tm.encode_async("ok"))[:1] or [0], SamplingParams(max_new_tokens=1, temperature=0.0))
        states, queue = await tm.submit([spec])
        try:
            await asyncio.wait_for(tm.wait_all(states, queue, request), timeout=30)
        except asyncio.TimeoutError:
            return JSONResponse(error_body("generation timed out", 503), status_code=503)
        return Response(status_code=200)

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info():
        cfg = tm.config
        return {"model_path": cfg.model_path, "tokenizer_path": cfg.tokenizer_path or cfg.model_path,
                "is_generation": True, "served_model_name": tm.model_name,
                "context_length": tm.context_len, "max_total_tokens": tm.max_total_tokens,
                "radixlm_features": list(FEATURES)}

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def server_info():
        info = await tm.control("server_info")
        return {**{k: v for k, v in vars(tm.config).items() if k != "api_key"}, **info,
                "served_model_name": tm.model_name, "version": _version(), "radixlm_features": list(FEATURES)}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        for _ in range(20):  # NOTE: refused while requests are in flight; give them a moment
            if await tm.control("flush_cache"):
                return PlainTextResponse("Cache flushed.\n")
            await asyncio.sleep(0.1)
        return JSONResponse(error_body("cache not flushed: requests are in flight", 400), status_code=400)

    @app.post("/abort_request")
    async def abort_request(request: Request):
        body = await parse_body(request, AbortReqInput)
        if body.abort_all:  # NOTE: only an explicit abort_all aborts more than one request
            tm.abort_all()
        elif body.rid:
            tm.abort(body.rid)
        else:
            raise RequestError("pass rid or abort_all", param="rid")
        return Response(status_code=200)

    @app.post("/release_cache_lease")
    async def release_cache_lease(request: Request):
        """End the named program leases (docs/server.md); answers ``{"released": n}``."""
        body = await parse_body(request, ReleaseCacheLeaseInput)
        return {"released": await tm.control("release_cache_lease", args={"ids": list(body.ids)})}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await parse_body(request, TokenizeReqInput)

        async def enc(text: str) -> list[int]:
            return await tm.run_off_loop(lambda: tm.tokenizer.encode(text, add_special_tokens=body.add_special_tokens))

        if isinstance(body.prompt, str):
            ids = await enc(body.prompt)
            return {"tokens": ids, "count": len(ids), "max_model_len": tm.context_len}
        ids = [await enc(p) for p in body.prompt]
        return {"tokens": ids, "count": [len(x) for x in ids], "max_model_len": tm.context_len}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await parse_body(request, DetokenizeReqInput)
        vocab = tm.info.get("vocab_size") or len(tm.tokenizer)
        if any(t < 0 or t >= vocab for t in body.tokens):
            raise RequestError(f"tokens must be ids in [0, {vocab})", param="tokens")
        return {"text": await tm.run_off_loop(tm.tokenizer.decode, body.tokens)}

    @app.get("/metrics")
    async def metrics():
        return Response(tm.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    add_openai_routes(app, tm)
    return app


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("radixlm")
    except Exception:
        return "0.1.0"
