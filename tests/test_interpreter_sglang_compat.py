"""SGLang frontend behaviours found by benchmarks/dsl_compat_probe.py (program shapes taken from
SGLang's test programs, examples and benchmarks). Expected values follow SGLang's frontend
(``sglang/lang/interpreter.py``, ``sglang/lang/api.py``) and, on the real default model, are
computed from plain Engine requests, never from the code under test."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import radixlm as sgl
from radixlm.lang.chat_template import ChatTemplate

pytestmark = pytest.mark.timeout(300)


class LogBackend(sgl.Backend):
    """Answers every generation with ``reply`` (or ``meta`` overrides); logs each payload."""

    def __init__(self, reply: str = "ok", meta: dict[str, Any] | None = None) -> None:
        self.chat_template = ChatTemplate("t", {r: (f"<{r}>", f"</{r}>")
                                                for r in ("system", "user", "assistant")})
        self.reply, self.meta, self.log = reply, meta or {}, []

    def _one(self, prompt: str, sp: Any) -> dict[str, Any]:
        return {"text": self.reply, "meta_info": {"prompt_tokens": len(prompt), **self.meta}}

    def request(self, payload: dict[str, Any]) -> Any:
        self.log.append(payload)
        if isinstance(payload["text"], list):
            return [self._one(t, payload["sampling_params"]) for t in payload["text"]]
        return self._one(payload["text"], payload["sampling_params"])

    def request_stream(self, payload: dict[str, Any]):
        yield self.request(payload)

    def flush_cache(self, empty_cache: bool = True) -> None:
        pass

    def get_server_info(self) -> dict[str, Any]:
        return {}


@pytest.fixture(scope="module")
def engine():
    eng = sgl.Engine(device="cpu", max_total_tokens=8192)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def backend(engine):
    return sgl.EngineBackend(engine)


def test_nested_roles_fail_the_program():
    @sgl.function
    def prog(s):
        with s.user():
            s += "q"
            s += sgl.assistant("a")

    st = prog.run(backend=LogBackend())
    assert isinstance(st.error(), ValueError) and "Nested roles" in str(st.error())


def test_message_contents_are_left_stripped():
    @sgl.function
    def prog(s):
        s += sgl.user("  padded")
        s += sgl.assistant(sgl.gen("a"))

    st = prog.run(backend=LogBackend(reply="\n  answer "))
    assert st.messages() == [{"role": "user", "content": "padded"},
                             {"role": "assistant", "content": "answer "}]
    assert st["a"] == "\n  answer " and st.text().endswith("\n  answer </assistant>")


def test_run_option_named_like_a_program_parameter_goes_to_the_program():
    # SGLang's examples/frontend_language/usage/parallel_sample.py: def f(s, question, n) + run(n=5)
    @sgl.function
    def prog(s, question, n):
        s += question
        forks = s.fork(n)
        forks += sgl.gen("g", max_tokens=2)
        forks.join()

    be = LogBackend()
    st = prog.run(question="q", n=3, backend=be)
    assert st.error() is None and st["g"] == ["ok"] * 3
    gens = [p for p in be.log if p["sampling_params"].get("max_new_tokens") != 0]
    assert len(gens) == 3 and all(isinstance(p["text"], str) for p in gens)  # not n=3 each

    @sgl.function
    def with_default(s, n=2):
        s += "x" * n + sgl.gen("g", max_tokens=1)

    assert with_default.run(backend=LogBackend()).text() == "xxok"
    st = with_default.run(n=3, backend=LogBackend())  # as SGLang: the option, default argument
    assert st.text() == "xxok" and st["g"] == ["ok"] * 3

    @sgl.function
    def no_param(s):
        s += "x" + sgl.gen("g", max_tokens=1)

    assert no_param.run(n=2, backend=LogBackend())["g"] == ["ok", "ok"]  # still the option


def test_invalid_regex_is_rejected_when_the_program_is_built():
    with pytest.raises(ValueError, match="regex"):
        sgl.gen("x", regex="(unclosed")
    with pytest.raises(ValueError, match="regex"):
        sgl.gen("x", regex="a{3,1}")
    sgl.gen("x", regex=r"\p{L}+")  # not Python re, but radixlm's grammar accepts it
    sgl.gen("x", regex=r"[0-9]+")


@pytest.mark.parametrize("status, rejected", [(400, True), (503, True), (None, False)])
def test_aborted_responses_with_a_status_fail_the_program(status, rejected):
    reason = {"type": "abort", "message": "invalid grammar: x"}
    if status is not None:
        reason["status_code"] = status

    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("a", max_tokens=2)

    st = prog.run(backend=LogBackend(reply="", meta={"finish_reason": reason}))
    if rejected:
        assert isinstance(st.error(), RuntimeError) and "invalid grammar" in str(st.error())
        with pytest.raises(sgl.ProgramError):
            st["a"]
    else:
        assert st.error() is None and st["a"] == ""


def test_grammar_rejected_by_the_engine_is_an_error(backend):
    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("a", max_tokens=3, json_schema={"type": "object", "properties": {
            "a": {"type": "nonsense"}}})

    st = prog.run(backend=backend)
    assert isinstance(st.error(), RuntimeError) and "nonsense" in str(st.error())


def test_zero_token_gen_reports_the_next_token_distribution(engine, backend):
    # SGLang's examples/frontend_language/usage/cot_decoding.py
    @sgl.function
    def prog(s):
        s += "The capital of France is"
        s += sgl.gen("top", max_tokens=0, return_logprob=True, top_logprobs_num=4,
                     return_text_in_logprobs=True)

    st = prog.run(backend=backend, temperature=0)
    ref = engine.generate("The capital of France is",
                          {"max_new_tokens": 1, "temperature": 0}, return_logprob=True,
                          top_logprobs_num=4, return_text_in_logprobs=True)
    tops = st.get_meta_info("top")["output_top_logprobs"][0]
    assert [t[1] for t in tops] == [t[1] for t in ref["meta_info"]["output_top_logprobs"][0]]
    assert len(tops) == 4 and all(isinstance(t[2], str) for t in tops)
    assert st["top"] == "" and st.text() == "The capital of France is"


def test_streamed_meta_info_follows_the_stream(backend):
    @sgl.function
    def prog(s):
        s += "Once upon a time" + sgl.gen("a", max_tokens=6, ignore_eos=True)

    async def collect():
        st = prog.run(stream=True, backend=backend, temperature=0)
        return st, [x async for x in st.text_async_iter("a", return_meta_data=True)]

    st, pairs = asyncio.run(collect())
    assert "".join(p for p, _ in pairs) == st["a"] and len(pairs) >= 2
    assert all(m.get("prompt_tokens") for _, m in pairs)
    assert st.get_meta_info("a")["completion_tokens"] == 6


def test_argument_errors_name_the_program_and_the_option():
    @sgl.function
    def qa(s, question):
        s += question + sgl.gen("a", max_tokens=2)

    with pytest.raises(TypeError, match=r"qa\(\).*'max_tokens'.*'max_new_tokens'"):
        qa.run(question="x", max_tokens=3, backend=LogBackend())
    with pytest.raises(TypeError, match=r"run_batch item 1: qa\(\).*'question'"):
        qa.run_batch([{"question": "a"}, {"q": "b"}], backend=LogBackend())
    with pytest.raises(TypeError, match="'max_new_tokens'"):
        qa.run_batch([{"question": "a"}], max_tokens=2, backend=LogBackend())


def test_dtype_with_regex_warns_and_uses_the_dtype_and_empty_choices_generate():
    from radixlm.lang.ir import REGEX_INT, Gen

    with pytest.warns(UserWarning, match="Only dtype will be used"):
        node = sgl.gen("x", dtype=int, regex="[a-z]+")
    assert node.params.regex is None and node.params.to_native()["regex"] == REGEX_INT
    assert isinstance(sgl.gen("x", choices=[]), Gen)  # SGLang: `if choices:`


def test_compile_runs_the_program(capsys):
    # SGLang's test/lang/test_tracing.py: f.compile() then compiled.run / run_batch / print_graph
    @sgl.function
    def prog(s, topic):
        s += "Tips for " + topic + ":" + sgl.gen("t", max_tokens=2)

    be = LogBackend()
    compiled = prog.compile(backend=be)
    st = compiled.run(topic="sleep", temperature=0)
    assert st["t"] == "ok" and st.text() == "Tips for sleep:ok"
    assert [x.text() for x in compiled.run_batch([{"topic": "a"}, {"topic": "b"}])] == \
        ["Tips for a:ok", "Tips for b:ok"]
    compiled.print_graph()
    assert "Gen('t'" in capsys.readouterr().out


def test_tracing_a_body_never_runs_other_programs():
    @sgl.function
    def expand(s, tip):
        s += "Expand: " + tip + sgl.gen("d", max_tokens=2)

    @sgl.function
    def outer(s, topic):
        s += "A long constant instruction that is well over sixty-four characters. " + topic
        branch = expand(tip="fixed")  # SGLang: a separate program on the default backend
        s += "\n" + branch["d"]

    be = LogBackend()
    old = sgl.global_config.default_backend
    sgl.set_default_backend(be)
    try:
        traced = outer.trace()
        assert be.log == [] and "expand" in traced.stopped
        sts = outer.run_batch([{"topic": "a"}, {"topic": "b"}])
        assert [st.text() for st in sts] == [
            "A long constant instruction that is well over sixty-four characters. a\nok",
            "A long constant instruction that is well over sixty-four characters. b\nok"]
        expands = [p for p in be.log if p["text"] == "Expand: fixed"]
        assert len(expands) == 2  # one per program, none from the prefix scan
    finally:
        sgl.global_config.default_backend = old


def test_template_default_system_prompt_is_inserted_first():
    from radixlm.lang.chat_template import get_chat_template

    be = LogBackend(reply="hi")
    be.chat_template = get_chat_template("qwen")

    @sgl.function
    def chat(s, system=None):
        if system:
            s += sgl.system(system)
        s += sgl.user("Hello")
        s += sgl.assistant(sgl.gen("a", max_tokens=2))

    st = chat.run(backend=be)
    assert st.messages()[0] == {"role": "system", "content": "You are a helpful assistant."}
    assert st.text() == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                         "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nhi<|im_end|>\n")
    own = chat.run(system="Be brief.", backend=be)
    assert [m["content"] for m in own.messages()] == ["Be brief.", "Hello", "hi"]


def test_endpoint_without_a_local_tokenizer_matches_the_model_path(monkeypatch):
    from radixlm.interpreter.runtime_endpoint import RuntimeEndpoint

    info = {"model_path": "meta-llama/Llama-3.1-8B-Instruct", "tokenizer_path": "/nonexistent"}
    monkeypatch.setattr(RuntimeEndpoint, "_get", lambda self, path: dict(info))
    assert RuntimeEndpoint("http://unused").chat_template.name == "llama-3-instruct"
    assert RuntimeEndpoint("http://unused", chat_template_name="gemma-it").chat_template.begin(
        "user") == "<start_of_turn>user\n"
    info["model_path"] = "some/unknown-model"
    assert RuntimeEndpoint("http://unused").chat_template.name == "default"


def test_runtime_add_request_streams_text_deltas():
    from radixlm.interpreter.runtime import Runtime

    class Stream(LogBackend):
        def request_stream(self, payload):
            self.log.append(payload)
            yield from ({"text": t} for t in ("He", "Hello", "Hello!"))

    rt = Runtime.__new__(Runtime)  # NOTE: no server: only the endpoint is used
    rt.endpoint = Stream()

    async def collect():
        return [x async for x in rt.add_request("Hi", {"max_new_tokens": 3})]

    assert asyncio.run(collect()) == ["He", "llo", "!"]
    assert rt.endpoint.log[0]["sampling_params"] == {"max_new_tokens": 3}


def test_sglang_attribute_names_of_states():
    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("a", max_tokens=1)
        forks = s.fork(2)
        assert forks.src_state is s
        forks.join()

    st = prog.run(backend=LogBackend())
    assert st.error() is None
    assert st.stream_executor.text_ == "xok" and st.stream_executor.variables["a"] == "ok"


def test_text_iter_of_a_variable_without_streaming_yields_its_value():
    @sgl.function
    def prog(s):
        with s.var_scope("block"):
            s += "a" + sgl.gen("g", max_tokens=1)
        forks = s.fork(2)
        forks += sgl.gen("f", max_tokens=1)
        forks.join()

    st = prog.run(backend=LogBackend())
    assert list(st.text_iter("block")) == ["aok"] and list(st.text_iter("g")) == ["ok"]
    assert list(st.text_iter("f")) == [["ok", "ok"]]
    assert "".join(st.text_iter()) == st.text()


def test_numpy_scalars_are_accepted_as_sampling_values(engine, backend):
    np = pytest.importorskip("numpy")

    @sgl.function
    def prog(s):
        s += "Once upon a time" + sgl.gen("a", max_tokens=np.int64(3), temperature=np.float32(0),
                                          stop_token_ids=[np.int64(0)], ignore_eos=True)

    st = prog.run(backend=backend, max_new_tokens=np.int64(4))
    assert st.error() is None and st.get_meta_info("a")["completion_tokens"] == 3
    ref = engine.generate("Once upon a time", {"max_new_tokens": 3, "temperature": 0,
                                               "ignore_eos": True})
    assert st["a"] == ref["text"]
