"""``sgl.Runtime`` and ``sgl.OpenAI`` against a real ``radixlm serve`` child process (tiny model).

One Runtime serves the module: its launch, ``.url``/``.endpoint`` and shutdown are tested, and the
OpenAI backend talks to its ``/v1``.  Expected texts come from the same server's native
``/generate`` (greedy), never from the code under test.  API speculative execution is tested with
a stub client whose completions are fixed strings.
"""

from __future__ import annotations

import json
import re
import socket
from types import SimpleNamespace
from typing import Any

import pytest
import requests

import radixlm as sgl

pytestmark = pytest.mark.timeout(240)

CHATML = "<|im_start|>{role}\n{content}<|im_end|>\n"


@pytest.fixture(scope="module")
def runtime():
    from radixlm.runtime.tiny_model import tiny_model_path

    rt = sgl.Runtime(model_path=tiny_model_path(), device="cpu", max_total_tokens=4096,
                     tp_size=1)  # tp_size: an SGLang-only argument, ignored with a warning
    try:
        yield rt
    finally:
        rt.shutdown()


def native(rt, prompt: str, **sp: Any) -> str:
    return rt.endpoint.request({"text": prompt, "sampling_params": {"temperature": 0, **sp}})["text"]


@pytest.fixture(scope="module")
def chat(runtime):
    return sgl.OpenAI(runtime.endpoint.get_model_name(), base_url=runtime.url + "/v1",
                      api_key="none", chat_template="chatml")


@pytest.fixture(scope="module")
def completion(runtime):
    return sgl.OpenAI(runtime.endpoint.get_model_name(), is_chat_model=False,
                      base_url=runtime.url + "/v1", api_key="none")


def test_runtime_is_a_backend(runtime):
    assert runtime.url.startswith("http://127.0.0.1:") and runtime.generate_url.endswith("/generate")
    assert requests.get(runtime.url + "/health", timeout=10).status_code == 200

    @sgl.function
    def prog(s):
        s += "Hello" + sgl.gen("x", max_tokens=4, temperature=0)

    st = prog.run(backend=runtime)  # a Runtime is accepted wherever a backend is
    assert st["x"] == native(runtime, "Hello", max_new_tokens=4)
    out = json.loads(runtime.generate("Hello", {"max_new_tokens": 4, "temperature": 0}))
    assert out["text"] == st["x"]


def test_openai_chat_gen_matches_the_native_greedy_output(runtime, chat):
    @sgl.function
    def prog(s, q):
        s += sgl.system("You are terse.")
        s += sgl.user(q)
        s += sgl.assistant(sgl.gen("a", max_tokens=6, temperature=0))

    st = prog.run(q="Name a colour.", backend=chat)
    prompt = (CHATML.format(role="system", content="You are terse.")
              + CHATML.format(role="user", content="Name a colour.") + "<|im_start|>assistant\n")
    assert st.error() is None and st["a"] == native(runtime, prompt, max_new_tokens=6)
    assert st.messages()[-1] == {"role": "assistant", "content": st["a"].lstrip()}  # SGLang lstrips contents
    assert st.get_meta_info("a")["completion_tokens"] <= 6
    assert chat.token_usage.completion_tokens > 0

    @sgl.function
    def misplaced(s):
        s += sgl.user("hi") + sgl.gen("x", max_tokens=2)

    assert "right after sgl.assistant" in str(misplaced.run(backend=chat).error())


def test_openai_completion_gen_stop_regex_json(runtime, completion):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}

    @sgl.function
    def prog(s):
        s += "Count: 1 2 3" + sgl.gen("a", max_tokens=8, temperature=0, stop=["7", "\n"])
        s += "\nn=" + sgl.gen("n", max_tokens=6, regex=r"[0-9]{2,4}", temperature=0)
        s += "\nj=" + sgl.gen("j", max_tokens=24, json_schema=schema, temperature=0)

    st = prog.run(backend=completion)
    assert st.error() is None, st.error()
    ref = native(runtime, "Count: 1 2 3", max_new_tokens=8, stop=["7", "\n"])
    assert st["a"] == ref
    assert re.fullmatch(r"[0-9]{2,4}", st["n"])
    assert isinstance(json.loads(st["j"])["ok"], bool)


def test_openai_select_scores_choices_like_the_native_endpoint(runtime, completion, chat):
    choices = ["red", "green", "blue", "a much longer choice"]

    @sgl.function
    def prog(s):
        s += "My favourite colour is " + sgl.select("c", choices)

    via_api = prog.run(backend=completion)
    via_native = prog.run(backend=runtime)
    assert via_api.error() is None and via_api["c"] == via_native["c"]
    got = via_api.get_meta_info("c")["normalized_prompt_logprobs"]
    want = via_native.get_meta_info("c")["normalized_prompt_logprobs"]
    assert got == pytest.approx(want, abs=1e-3)
    assert isinstance(prog.run(backend=chat).error(), NotImplementedError)


def test_runtime_server_arguments_become_cli_flags():
    from radixlm.interpreter.runtime import _cli_args

    flags = _cli_args({"model_path": "m", "disable_radix_cache": True, "api_key": None,
                       "enable_jump_forward": False, "max_total_tokens": 64, "dp_size": 2})
    assert flags == ["--model-path", "m", "--disable-radix-cache", "--max-total-tokens", "64"]
    with pytest.raises(TypeError):
        sgl.Runtime("error", 300.0, "positional")


def test_runtime_context_manager_and_port_release(runtime):
    port = int(runtime.url.rsplit(":", 1)[1])
    pid = runtime.pid
    with runtime as rt:  # NOTE: must stay the last test using the module's runtime
        assert rt is runtime
    runtime.shutdown()  # idempotent
    assert runtime.pid is None
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    with pytest.raises(ProcessLookupError):
        import os

        os.kill(pid, 0)


# ---- API speculative execution with a stub client ----------------------------------------------


class StubCompletions:
    def __init__(self, outputs: list[str], chat: bool) -> None:
        self.outputs, self.chat, self.calls = list(outputs), chat, []

    def create(self, **kw: Any) -> Any:
        self.calls.append(kw)
        text = self.outputs.pop(0)
        choice = (SimpleNamespace(message=SimpleNamespace(content=text), finish_reason="length",
                                  index=0, logprobs=None) if self.chat else
                  SimpleNamespace(text=text, finish_reason="length", index=0, logprobs=None))
        return SimpleNamespace(id="x", choices=[choice],
                               usage=SimpleNamespace(prompt_tokens=1, completion_tokens=1))


def stub_backend(outputs: list[str], chat: bool) -> Any:
    be = sgl.OpenAI("stub", is_chat_model=chat, api_key="none", base_url="http://127.0.0.1:9")
    stub = StubCompletions(outputs, chat)
    be.client = SimpleNamespace(chat=SimpleNamespace(completions=stub), completions=stub,
                                base_url="stub")
    return be, stub


def test_spec_execution_chat_one_call_per_assistant_turn():
    be, stub = stub_backend(["junk", "Name: Ada\nAge: 36\nmore"], chat=True)

    @sgl.function(num_api_spec_tokens=32)
    def prog(s):
        s += sgl.user("Describe a person.")
        s += sgl.assistant("Name: " + sgl.gen("name", stop="\n") + "\nAge: " + sgl.gen("age", stop="\n"))

    st = prog.run(backend=be, temperature=0)
    assert (st["name"], st["age"]) == ("Ada", "36")
    assert len(stub.calls) == 2  # the first completion did not match the format: retried once
    assert stub.calls[0]["max_tokens"] == 32 and "stop" not in stub.calls[0]
    assert stub.calls[0]["messages"] == [{"role": "user", "content": "Describe a person."}]
    assert st.messages()[-1]["content"] == "Name: Ada\nAge: 36"
    streamed = prog.run(backend=be, stream=True)  # as SGLang: no streaming with speculation
    assert "stream is not supported" in str(streamed.error())

    @sgl.function(num_api_spec_tokens=32)
    def constant_turn(s):
        s += sgl.user("Format:")
        s += sgl.assistant("Name: X")  # a turn without gens makes no call

    calls = len(stub.calls)
    assert constant_turn.run(backend=be).messages()[-1]["content"] == "Name: X"
    assert len(stub.calls) == calls


def test_spec_execution_completion_reuses_the_speculated_text():
    be, stub = stub_backend([" Ada\nAge: 36\nCity: Paris\n"], chat=False)

    @sgl.function(num_api_spec_tokens=64)
    def prog(s):
        s += "Name:" + sgl.gen("name", stop="\n", max_tokens=16)
        s += "\nAge: " + sgl.gen("age", stop="\n", max_tokens=16)

    st = prog.run(backend=be)
    assert (st["name"], st["age"]) == (" Ada", "36")
    assert len(stub.calls) == 1 and stub.calls[0]["max_tokens"] == 64


def test_select_without_prompt_logprobs_is_a_clear_error():
    be, stub = stub_backend(["ignored"], chat=False)  # the stub returns no logprobs

    @sgl.function
    def prog(s):
        s += "Pick: " + sgl.select("c", ["a", "b"])

    err = prog.run(backend=be).error()
    assert isinstance(err, RuntimeError) and "logprobs" in str(err)
    assert stub.calls[0]["echo"] is True and stub.calls[0]["prompt"] == ["Pick: a", "Pick: b"]
