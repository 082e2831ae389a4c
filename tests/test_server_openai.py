"""The OpenAI-compatible API (DESIGN.md §3.3) driven by the official ``openai`` client against a
live server subprocess (tiny default model, ``--api-key``). The last test kills the scheduler
process and checks that the server exits non-zero promptly."""

from __future__ import annotations

import json
import os
import signal
import time

import openai
import pytest
import requests

from radixlm.runtime.server.testing import ServerProcess, child_pids

KEY = "sk-test-key"


@pytest.fixture(scope="module")
def server():
    from radixlm.runtime.tiny_model import tiny_model_path

    srv = ServerProcess(["--model-path", tiny_model_path(), "--api-key", KEY])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def native(server, **body) -> dict:
    res = requests.post(server.url + "/generate", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert res.status_code == 200, res.text
    return res.json()


def test_models_and_api_key(server, client):
    models = client.models.list()
    assert len(models.data) == 1 and models.data[0].id
    assert client.models.retrieve(models.data[0].id).id == models.data[0].id  # ids are paths: "/" inside
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("not-this-model")
    assert requests.get(server.url + "/v1/models").status_code == 401
    assert requests.get(server.url + "/health").status_code == 200
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_completion_matches_native_and_usage(server, client):
    res = client.completions.create(model="m", prompt="def main():", max_tokens=8, temperature=0)
    ref = native(server, text="def main():", sampling_params={"max_new_tokens": 8, "temperature": 0})
    choice = res.choices[0]
    assert choice.text == ref["text"]
    assert choice.finish_reason in ("length", "stop")
    assert res.usage.prompt_tokens == ref["meta_info"]["prompt_tokens"]
    assert res.usage.completion_tokens == ref["meta_info"]["completion_tokens"]
    assert res.usage.total_tokens == res.usage.prompt_tokens + res.usage.completion_tokens
    again = client.completions.create(model="m", prompt="def main():", max_tokens=8, temperature=0)
    assert again.choices[0].text == choice.text
    # NOTE: the repeated prompt is cached except its last token, which is always recomputed
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1


def test_completion_n_stop_logprobs_stream(server, client):
    base = client.completions.create(model="m", prompt="x = {", max_tokens=10, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = base[4:6]
    res = client.completions.create(model="m", prompt="x = {", max_tokens=10, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True})
    assert res.choices[0].text == base[: base.index(stop)] and res.choices[0].finish_reason == "stop"
    multi = client.completions.create(model="m", prompt=["a", "b"], max_tokens=3, n=2, seed=7)
    assert sorted(c.index for c in multi.choices) == [0, 1, 2, 3]
    lp = client.completions.create(model="m", prompt="y =", max_tokens=4, temperature=0, logprobs=2)
    lps = lp.choices[0].logprobs
    assert "".join(lps.tokens) == lp.choices[0].text and len(lps.token_logprobs) == 4
    assert all(len(t) <= 2 for t in lps.top_logprobs) and all(v <= 0 for v in lps.token_logprobs)
    # OpenAI: the sampled token is always among its top entries (logprobs=0: only it); an echoed
    # first prompt token has no logprob
    for k in (0, 2):
        got = client.completions.create(model="m", prompt="y =", max_tokens=3, temperature=1.0, seed=4,
                                        logprobs=k, echo=True).choices[0].logprobs
        assert got.token_logprobs[0] is None and got.top_logprobs[0] is None
        for tok, lp_, top in zip(got.tokens[1:], got.token_logprobs[1:], got.top_logprobs[1:]):
            assert top[tok] == lp_ and len(top) <= k + 1
    parts = [c.choices[0].text for c in client.completions.create(model="m", prompt="x = {", max_tokens=10,
                                                                   temperature=0, stream=True,
                                                                   extra_body={"ignore_eos": True}) if c.choices]
    assert "".join(parts) == base


def test_chat_completion_and_stream(server, client):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}]
    res = client.chat.completions.create(model="m", messages=msgs, max_tokens=6, temperature=0,
                                         logprobs=True, top_logprobs=2)
    msg = res.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str)
    content = res.choices[0].logprobs.content
    assert "".join(t.token for t in content) == msg.content
    assert all(len(t.top_logprobs) == 2 for t in content)
    tok = requests.post(server.url + "/tokenize", json={"prompt": "x"}, headers={"Authorization": f"Bearer {KEY}"})
    assert tok.status_code == 200
    stream = client.chat.completions.create(model="m", messages=msgs, max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == msg.content
    assert chunks[-1].usage.completion_tokens == res.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0  # same prompt twice
    n = client.chat.completions.create(model="m", messages=msgs, max_tokens=4, n=3, temperature=0)
    assert [c.message.content for c in n.choices] == [n.choices[0].message.content] * 3


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


def _matches(obj, schema) -> None:
    import jsonschema

    jsonschema.validate(obj, schema)


def test_response_format_json_schema(client):
    res = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "A person."}], max_tokens=60, temperature=0.7, seed=1,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}})
    _matches(json.loads(res.choices[0].message.content), SCHEMA)
    obj = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "JSON"}], max_tokens=40,
                                         response_format={"type": "json_object"}, seed=2)
    assert obj.choices[0].finish_reason == "length" or isinstance(json.loads(obj.choices[0].message.content), dict)


def test_response_format_strict_closes_objects(server, client):
    """Undeclared keys are refused by default and with ``strict: true`` (the schema declares ``a``
    and is silent on others). Tokens starting with ``}`` are banned, so an open object can only go
    on with undeclared pairs: opened (``disable_additional_properties: false``, JSON Schema's
    semantics) the output has them; closed, the ban loses to the grammar after ``"a"``."""
    from transformers import AutoTokenizer

    from radixlm.runtime.tiny_model import tiny_model_path

    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    closing = [i for s, i in tok.get_vocab().items() if tok.convert_tokens_to_string([s]).startswith("}")]
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}
    modes = {"strict": ({"strict": True}, {}), "default": ({}, {}),
             "open": ({"strict": False}, {"disable_additional_properties": False})}
    outs = {}
    for mode, (fmt, extra) in modes.items():
        res = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "An object."}], max_tokens=40, temperature=1.0,
            seed=5, n=4, logit_bias={str(i): -100 for i in closing}, extra_body=extra,
            response_format={"type": "json_schema", "json_schema": {"name": "o", "schema": schema, **fmt}})
        outs[mode] = [c.message.content for c in res.choices]
    assert all(set(json.loads(text)) == {"a"} for text in outs["strict"] + outs["default"]), outs
    assert all(not text.startswith(('{"a": true}', '{"a": false}')) for text in outs["open"]), outs["open"]


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string", "maxLength": 10},
                                                                         "days": {"type": "integer", "minimum": 1,
                                                                                  "maximum": 7}},
                                                          "required": ["city", "days"],
                                                          "additionalProperties": False}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
             "required": ["zone"], "additionalProperties": False}}}]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_tools_produce_valid_calls(client, choice):
    res = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather?"}],
                                         tools=TOOLS, tool_choice=choice, max_tokens=80, temperature=0.8, seed=3)
    c = res.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    call = c.message.tool_calls[0]
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    assert call.function.name in by_name
    if isinstance(choice, dict):
        assert call.function.name == "get_time"
    _matches(json.loads(call.function.arguments), by_name[call.function.name])


@pytest.mark.parametrize("with_other_tool", [False, True])
def test_pydantic_tools_with_defs(client, with_other_tool):
    """``openai.pydantic_function_tool`` parameters refer to ``#/$defs/...``: embedded in the call
    object (and in an ``anyOf`` of calls), the references must still resolve (they were a 400)."""
    import jsonschema
    import pydantic

    class Addr(pydantic.BaseModel):
        city: str = pydantic.Field(max_length=8)

    class Person(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=8)
        age: int = pydantic.Field(ge=0, le=120)
        addr: Addr

    tools = [openai.pydantic_function_tool(Person, name="save_person")]
    if with_other_tool:
        tools.append(openai.pydantic_function_tool(Addr, name="save_addr"))
    res = client.chat.completions.parse(model="m", messages=[{"role": "user", "content": "p"}], tools=tools,
                                        tool_choice="required", max_tokens=120, temperature=0.8, seed=2)
    call = res.choices[0].message.tool_calls[0]
    assert res.choices[0].finish_reason == "tool_calls"
    params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), params)
    assert isinstance(call.function.parsed_arguments, (Person, Addr))


def test_tools_auto_without_call_gives_content(client):
    res = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], tools=TOOLS,
                                         tool_choice="auto", max_tokens=5, temperature=0)
    assert res.choices[0].message.tool_calls is None and isinstance(res.choices[0].message.content, str)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(messages=[]), "messages"),
    (dict(messages=[{"role": "wizard", "content": "x"}]), "role"),
    (dict(messages=[{"role": "user", "content": "x"}], temperature=-3), "temperature"),
    (dict(messages=[{"role": "user", "content": "x"}], top_logprobs=99, logprobs=True), "top_logprobs"),
    (dict(messages=[{"role": "user", "content": "x"}], tools=TOOLS,
          tool_choice={"type": "function", "function": {"name": "nope"}}), "nope"),
    (dict(messages=[{"role": "user", "content": "x"}], extra_body={"regex": "(unclosed"}), "regex"),
    (dict(messages=[{"role": "user", "content": "x"}], logit_bias={"999999999": 5}), "logit_bias"),
    (dict(messages=[{"role": "user", "content": "x"}], logit_bias={"5": 250}), "logit_bias"),
    (dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]),
     "image_url"),
])
def test_bad_requests_are_400(client, kwargs, needle):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", max_tokens=2, **kwargs)
    assert needle in str(err.value)
    ok = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert ok.usage.completion_tokens <= 2


def test_logit_bias_reaches_the_sampler(server, client):
    """A +100 bias all but forces its token; the OpenAI and native paths agree (string keys)."""
    res = client.completions.create(model="m", prompt="Hello", max_tokens=4, temperature=0, logit_bias={"50": 100})
    ref = native(server, text="Hello", sampling_params={"max_new_tokens": 4, "temperature": 0,
                                                         "logit_bias": {"50": 100}})
    assert ref["output_ids"] == [50] * 4
    assert res.choices[0].text == ref["text"]


@pytest.mark.parametrize("kwargs,needle", [(dict(suffix="end"), "suffix"), (dict(best_of=3), "best_of")])
def test_completion_options_that_change_output_are_refused(client, kwargs, needle):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="m", prompt="x", max_tokens=2, **kwargs)
    assert needle in str(err.value)
    assert client.completions.create(model="m", prompt="x", max_tokens=2, best_of=1).usage.completion_tokens <= 2


def test_killing_scheduler_exits_nonzero(server):
    """Last in this module: the server must notice a dead child and exit non-zero, not hang."""
    names = {pid: open(f"/proc/{pid}/comm").read().strip() for pid in child_pids(server.proc.pid)}
    target = [pid for pid, name in names.items() if name.startswith("radixlm-sched")]
    assert len(target) == 1, names
    os.kill(target[0], signal.SIGKILL)
    t0 = time.monotonic()
    code = server.proc.wait(timeout=20)
    assert code != 0 and time.monotonic() - t0 < 20
    assert "scheduler process" in server.log_tail() and "SIGKILL" in server.log_tail()
    time.sleep(0.5)
    assert not [pid for pid in names if os.path.exists(f"/proc/{pid}") and
                open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]
