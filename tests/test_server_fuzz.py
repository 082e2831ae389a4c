"""Hostile clients (issue 13): hypothesis throws malformed JSON, wrong types, extreme numbers, deep
nesting, invalid Unicode, bad grammars and bad tools at the generation endpoints of a live server.

Every answer must be 2xx or 4xx (never 5xx, never a hang past ``HANG_S``, never a reset); after
the storm a normal greedy request gives the same output as before and the KV pool and request
rows are back to their baseline."""

from __future__ import annotations

import json
import math

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixlm.runtime.server.testing import ServerProcess

HANG_S = 60
NORMAL = {"text": "def main():", "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
ENDPOINTS = ["/generate", "/v1/completions", "/v1/chat/completions"]
SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.fixture(scope="module")
def server():
    from radixlm.runtime.tiny_model import tiny_model_path

    srv = ServerProcess(["--model-path", tiny_model_path(), "--max-request-bytes", "65536",
                         "--grammar-compile-timeout-s", "5", "--max-running-requests", "16"])
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def http():
    with requests.Session() as s:  # NOTE: one keep-alive connection: a reset would show here
        yield s


@pytest.fixture(scope="module")
def baseline(server, http):
    out = http.post(server.url + "/generate", json=NORMAL, timeout=HANG_S).json()
    return out["output_ids"]


def post(server, http, path: str, data: bytes | str) -> requests.Response:
    res = http.post(server.url + path, data=data, timeout=HANG_S, headers={"Content-Type": "application/json"})
    assert res.status_code < 500, (path, data[:300], res.status_code, res.text[:500])
    if res.status_code >= 400:
        assert "message" in res.json()["error"], res.text
    elif res.headers.get("content-type", "").startswith("text/event-stream"):
        assert res.text.rstrip().endswith("data: [DONE]"), res.text[-300:]
    return res


# ------------------------------------------------------------------ strategies
BIG_INTS = st.sampled_from([-1, -2, 0, 1, 2, 7, 2**31, 2**31 - 1, 2**63, 2**64, -(2**63), 10**12, 10**30])
FLOATS = st.one_of(st.sampled_from([math.inf, -math.inf, math.nan, 1e-300, 1e300, -0.0, 5e-324]),
                   st.floats(allow_nan=True, allow_infinity=True, width=64))
WEIRD_TEXT = st.one_of(st.text(max_size=30), st.sampled_from(["\ud800", "a\udfffb", "\x00", "\u202e", "🙂" * 5]))
SCALARS = st.one_of(st.none(), st.booleans(), BIG_INTS, FLOATS, WEIRD_TEXT)
JSONISH = st.recursive(SCALARS, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                        st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                       max_leaves=12)
SAMPLING_FIELDS = ["max_new_tokens", "min_new_tokens", "n", "stop", "stop_token_ids", "stop_regex", "temperature",
                   "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty",
                   "ignore_eos", "skip_special_tokens", "regex", "json_schema", "ebnf", "seed"]
TOP_FIELDS = ["text", "input_ids", "return_logprob", "logprob_start_len", "top_logprobs_num", "stream", "rid",
              "return_text_in_logprobs"]
BAD_REGEX = st.sampled_from(["a**", "(", "[z-a]", "(?P<x>a)(?P<x>b)", "a{5,2}", "\\", "(a|b", "x{99999}", "[^\\x00-\\U0010ffff]"])
BAD_SCHEMA = st.one_of(st.sampled_from([{"type": "array", "minItems": -5}, {"type": "nope"}, {"$ref": "#/nowhere"},
                                        {"properties": 5}, "not json", "[1,2]", {"enum": []}]), JSONISH)
BAD_EBNF = st.one_of(st.sampled_from(["", "root ::= ", "root: (", "x: \"a\"", 'root: "a" | ', "root: missing_rule"]),
                     st.text(max_size=40))


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _dumps(obj) -> str:
    return json.dumps(obj, allow_nan=True)  # NOTE: emits Infinity/NaN and \ud800 escapes on purpose


# ------------------------------------------------------------------ tests
@settings(max_examples=60, **SETTINGS)
@given(path=st.sampled_from(ENDPOINTS), raw=st.one_of(
    st.binary(max_size=120),
    st.sampled_from([b"{", b"[]", b"null", b'"x"', b"{\"text\": }", b"\xff\xfe{}", b"{\"text\": \"\\ud800\"}",
                     b"{\"text\": \"a\", \"text\": 5}", deep(1000).encode(), ("{\"a\":" * 900 + "1" + "}" * 900).encode()])))
def test_malformed_bodies(server, http, path, raw):
    post(server, http, path, raw)


@settings(max_examples=120, **SETTINGS)
@given(field=st.sampled_from(SAMPLING_FIELDS), value=JSONISH, top=st.sampled_from(TOP_FIELDS), top_value=JSONISH,
       stream=st.booleans())
def test_native_fields(server, http, field, value, top, top_value, stream):
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 4, field: value}, top: top_value}
    if top != "stream":
        body["stream"] = stream
    if top == "input_ids":
        body.pop("text")
    if field == "max_new_tokens" and isinstance(value, int) and 8 < value < 2**31:
        body["sampling_params"][field] = 8  # NOTE: keep valid lengths short on the CPU
    post(server, http, "/generate", _dumps(body))


@settings(max_examples=60, **SETTINGS)
@given(kind=st.sampled_from(["regex", "json_schema", "ebnf", "stop_regex"]), data=st.data())
def test_bad_grammars(server, http, kind, data):
    value = data.draw({"regex": BAD_REGEX, "stop_regex": BAD_REGEX, "json_schema": BAD_SCHEMA, "ebnf": BAD_EBNF}[kind])
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 4, kind: value}}
    post(server, http, "/generate", _dumps(body))


@settings(max_examples=60, **SETTINGS)
@given(path=st.sampled_from(ENDPOINTS[1:]), field=st.sampled_from(
    ["n", "max_tokens", "temperature", "top_p", "logprobs", "top_logprobs", "stop", "seed", "prompt", "messages",
     "tools", "tool_choice", "response_format", "chat_template_kwargs", "stream", "echo", "stop_token_ids"]),
    value=JSONISH, stream=st.booleans())
def test_openai_fields(server, http, path, field, value, stream):
    body = {"model": "m", "max_tokens": 4, "stream": stream}
    if path == "/v1/completions":
        body["prompt"] = "hi"
    else:
        body["messages"] = [{"role": "user", "content": "hi"}]
    body[field] = value
    if field == "max_tokens" and isinstance(value, int) and 8 < value < 2**31:
        body[field] = 8
    post(server, http, path, _dumps(body))


@settings(max_examples=30, **SETTINGS)
@given(params=JSONISH, name=WEIRD_TEXT, choice=st.one_of(st.sampled_from(["auto", "required", "none", "bogus"]), JSONISH))
def test_bad_tools(server, http, params, name, choice):
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": name, "parameters": params}}], "tool_choice": choice}
    post(server, http, "/v1/chat/completions", _dumps(body))


def test_limits(server, http):
    """The reported findings, one by one: each gets a 4xx naming the field."""
    big = http.post(server.url + "/generate", data=b'{"text": "' + b"a" * 200_000 + b'"}', timeout=HANG_S)
    assert big.status_code == 413
    cases = [
        ({"text": "hi", "sampling_params": {"top_k": 2**64}}, "top_k"),
        ({"text": "hi", "sampling_params": {"repetition_penalty": 1e-300}}, "repetition_penalty"),
        ({"text": "hi", "sampling_params": {"n": 10**9}}, "n"),
        ({"text": "hi", "sampling_params": {"max_new_tokens": 10**12}}, "max_new_tokens"),
        ({"text": "hi", "sampling_params": {"max_new_tokens": 2**31 - 1}}, "context length"),
        ({"text": "hi", "top_logprobs_num": 10**6, "return_logprob": True}, "top_logprobs_num"),
        ({"text": "hi", "logprob_start_len": -5, "return_logprob": True}, "logprob_start_len"),
        ({"text": "hi", "sampling_params": {"stop_token_ids": [10**6]}}, "stop_token_ids"),
        ({"text": "hi", "sampling_params": {"stop_regex": "("}}, "stop_regex"),
        ({"text": "hi", "sampling_params": {"json_schema": {"type": "array", "minItems": -5}}}, "json_schema"),
        ({"text": "hi", "sampling_params": {"regex": "a**"}}, "regex"),
        ({"input_ids": [True, False]}, "input_ids"),
    ]
    for body, needle in cases:
        res = http.post(server.url + "/generate", data=_dumps(body), timeout=HANG_S)
        assert res.status_code == 400 and needle in res.json()["error"]["message"], (body, res.text)
    temp_inf = http.post(server.url + "/generate", data=_dumps({"text": "hi", "sampling_params": {
        "temperature": math.inf, "regex": "[a-z]+"}}), timeout=HANG_S)
    assert temp_inf.status_code == 400 and "temperature" in temp_inf.text
    for prompt in ([-1], [2**63]):
        res = http.post(server.url + "/v1/completions", json={"model": "m", "prompt": prompt}, timeout=HANG_S)
        assert res.status_code == 400 and res.json()["error"]["param"] == "prompt", res.text


def test_after_the_storm(server, http, baseline):
    """Runs last: outputs unchanged, nothing leaked, still healthy."""
    out = http.post(server.url + "/generate", json=NORMAL, timeout=HANG_S).json()
    assert out["output_ids"] == baseline
    assert http.get(server.url + "/health", timeout=HANG_S).status_code == 200
    assert http.post(server.url + "/flush_cache", timeout=HANG_S).status_code == 200
    info = http.get(server.url + "/get_server_info", timeout=HANG_S).json()
    assert info["kv_available_tokens"] == info["max_total_num_tokens"]
    assert info["req_rows_available"] == info["req_rows_total"]
    assert info["num_running"] == 0 and info["num_waiting"] == 0
