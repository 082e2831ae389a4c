"""SGLang-frontend behaviours of the interpreter, on a small in-process fake backend that logs every
request: fork callables and the fork commit rule, gen(n), ProgramState.copy, repr, run(use_thread),
run_batch(generator_style), separate_reasoning, global_config. Expected values follow SGLang's
frontend (python/sglang/lang/interpreter.py) and are computed from the fake's rule, not the code."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import radixlm as sgl
from radixlm.lang.chat_template import ChatTemplate

pytestmark = pytest.mark.timeout(60)


def completion(prompt: str, index: int) -> str:
    """The fake model: a completion that names the prompt length and the sample index."""
    return f"<{len(prompt)}:{index}>"


class FakeBackend(sgl.Backend):
    """Native-protocol backend answering with :func:`completion`; ``log`` holds every payload."""

    def __init__(self, fixed: str | None = None) -> None:
        self.chat_template = ChatTemplate("test", {r: (f"[{r}]", f"[/{r}]") for r in
                                                   ("system", "user", "assistant")})
        self.fixed = fixed
        self.log: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def _one(self, prompt: str, sp: dict[str, Any], index: int) -> dict[str, Any]:
        text = "" if sp.get("max_new_tokens") == 0 else self.fixed or completion(prompt, index)
        return {"text": text, "meta_info": {"prompt_tokens": len(prompt), "cached_tokens": 0,
                                            "completion_tokens": len(text)}}

    def request(self, payload: dict[str, Any]) -> Any:
        with self.lock:
            self.log.append(payload)
        sp = payload.get("sampling_params") or {}
        if isinstance(payload["text"], list):
            return [self._one(t, sp, i) for i, t in enumerate(payload["text"])]
        return self._one(payload["text"], sp, 0)

    def request_stream(self, payload: dict[str, Any]):
        yield self.request(payload)

    def flush_cache(self, empty_cache: bool = True) -> None:
        pass

    def get_server_info(self) -> dict[str, Any]:
        return {"fake": True}


def gens(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in log if r["sampling_params"].get("max_new_tokens") != 0]


def test_fork_callable_list_and_expr():
    be = FakeBackend()

    @sgl.function
    def prog(s):
        s += "Q|"
        forks = s.fork(3)
        forks += lambda i: f"branch {i}:" + sgl.gen("g", max_tokens=3)
        forks += [" a", " b", " c"]
        forks += "."
        forks.join()

    st = prog.run(backend=be)
    assert st["g"] == [completion(f"Q|branch {i}:", 0) for i in range(3)]
    assert st.text() == "Q|"  # children's text stays in the children (gather_variable)

    @sgl.function
    def wrong_size(s):
        forks = s.fork(2)
        forks += ["only one"]

    assert isinstance(wrong_size.run(backend=be).error(), ValueError)


def test_fork_request_counts_follow_sglang():
    be = FakeBackend()

    @sgl.function
    def three(s, prefix):
        s += prefix
        forks = s.fork(3)
        for f in forks:
            f += sgl.gen("g", max_tokens=2)
        forks.join()

    three.run(prefix="", backend=be).sync()
    assert len(be.log) == 3  # empty text: no prefix commit, one request per gen
    be.log.clear()
    three.run(prefix="shared prefix ", backend=be).sync()
    assert len(be.log) == 4 and be.log[0]["sampling_params"] == {"max_new_tokens": 0}
    be.log.clear()
    be.fork_commits_prefix = False  # RuntimeEndpoint's setting: no commit over HTTP
    three.run(prefix="shared prefix ", backend=be).sync()
    assert len(be.log) == 3
    be.log.clear()

    @sgl.function
    def one(s):
        s += "text "
        f = s.fork(1)[0]
        f += sgl.gen("g", max_tokens=2)
        return f

    one.run(backend=be).ret_value.sync()
    assert len(be.log) == 1  # fork(1) commits nothing


def test_gen_n_returns_a_list_and_appends_the_first():
    be = FakeBackend()

    @sgl.function
    def prog(s):
        s += "P:"
        s += sgl.gen("xs", n=3, max_tokens=4) + "|"
        s += sgl.gen("y", max_tokens=4)

    st = prog.run(backend=be)
    assert st["xs"] == [completion("P:", i) for i in range(3)]
    assert st.text() == "P:" + completion("P:", 0) + "|" + completion("P:" + completion("P:", 0)
                                                                       + "|", 0)
    assert gens(be.log)[0]["text"] == ["P:"] * 3
    assert isinstance(st.get_meta_info("xs"), list) and len(st.get_meta_info("xs")) == 3
    st2 = prog.run(backend=be, n=2)  # run-level default applies to every gen
    assert len(st2["xs"]) == 3 and len(st2["y"]) == 2


def test_copy_forks_one_child_and_joins_its_variables():
    be = FakeBackend()

    @sgl.function
    def prog(s):
        s += "base "
        with s.copy() as c:
            c += "side " + sgl.gen("side", max_tokens=2)
        s += sgl.gen("main", max_tokens=2)

    st = prog.run(backend=be)
    assert st["side"] == [completion("base side ", 0)]
    assert st["main"] == completion("base ", 0)  # the copy's text did not reach the parent
    assert len(be.log) == 2  # fork(1): no commit


def test_repr_prints_the_text_raw():
    be = FakeBackend()
    st = sgl.function(lambda s: s.__iadd__("it's\nraw")).run(backend=be)
    assert repr(st) == "ProgramState(it's\nraw)"


def test_use_thread_false_runs_each_node_before_returning():
    be = FakeBackend()
    seen = []

    @sgl.function
    def prog(s):
        s += "a" + sgl.gen("x", max_tokens=1)
        seen.append(len(be.log))  # the request was already made
        s += "b"

    prog.run(backend=be, use_thread=False).sync()
    assert seen == [1]


def test_run_batch_generator_style_yields_states_in_order():
    be = FakeBackend()

    @sgl.function
    def prog(s, q):
        s += q + sgl.gen("a", max_tokens=2)

    qs = [f"question number {i}" * (i + 1) for i in range(7)]
    out = prog.run_batch([{"q": q} for q in qs], backend=be, generator_style=True, num_threads=2)
    assert not isinstance(out, list)
    assert [st["a"] for st in out] == [completion(q, 0) for q in qs]
    assert list(prog.run_batch([], backend=be, generator_style=True)) == []


def test_separate_reasoning_splits_think_block():
    be = FakeBackend("<think>step 1</think>\n\nThe answer.")

    @sgl.function
    def prog(s):
        s += sgl.user("q|")
        s += sgl.assistant(sgl.separate_reasoning(sgl.gen("a", max_tokens=9), model_type="qwen3"))

    st = prog.run(backend=be)
    assert st["a"] == "The answer." and st["a_reasoning_content"] == "step 1"
    assert st.text().endswith("[assistant]The answer.[/assistant]")
    from radixlm.interpreter.executor import split_reasoning

    assert split_reasoning("partial thought", "deepseek-r1") == ("partial thought", "")
    assert split_reasoning("plain answer", None) == ("", "plain answer")


def test_global_config_drives_the_interpreter(capsys):
    from radixlm.global_config import global_config

    assert sgl.global_config is global_config
    be = FakeBackend()
    old = (global_config.default_backend, global_config.verbosity,
           global_config.enable_precache_with_tracing)
    try:
        global_config.default_backend = be  # SGLang programs assign it directly
        global_config.verbosity = 2
        st = sgl.function(lambda s: s.__iadd__("hello" + sgl.gen("x", max_tokens=1))).run()
        assert st["x"] == completion("hello", 0)
        assert "hello" + completion("hello", 0) in capsys.readouterr().out
        global_config.verbosity = 0
        long_prefix = "A constant preamble that is comfortably longer than sixty-four chars. "

        @sgl.function
        def prog(s, q):
            s += long_prefix + q + sgl.gen("a", max_tokens=1)

        be.log.clear()
        prog.run_batch([{"q": "1"}, {"q": "2"}])
        assert be.log[0]["text"] == long_prefix  # precached by tracing
        be.log.clear()
        global_config.enable_precache_with_tracing = False
        prog.run_batch([{"q": "1"}, {"q": "2"}])
        assert len(be.log) == 2
        assert sgl.get_server_info() == {"fake": True} and sgl.flush_cache() is True
    finally:
        (global_config.default_backend, global_config.verbosity,
         global_config.enable_precache_with_tracing) = old
    global_config.default_backend = None
    try:
        assert sgl.flush_cache() is False and sgl.get_server_info() is None
    finally:
        global_config.default_backend = old[0]


def test_dtype_int_adds_sglang_stops():
    be = FakeBackend()
    sgl.function(lambda s: s.__iadd__("n=" + sgl.gen_int("n", stop="!"))).run(backend=be).sync()
    sp = be.log[0]["sampling_params"]
    assert sp["regex"] == sgl.lang.ir.REGEX_INT and sp["stop"] == ["!", " ", "\n"]
    assert sp["skip_special_tokens"] is True and sp["spaces_between_special_tokens"] is True


def test_none_append_and_missing_meta_info_follow_sglang():
    be = FakeBackend()

    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("a", max_tokens=1)
        s += None

    st = prog.run(backend=be)
    assert isinstance(st.error(), ValueError)
    ok = sgl.function(lambda s: s.__iadd__("y" + sgl.gen("a", max_tokens=1))).run(backend=be)
    assert ok.get_meta_info("nope") is None and ok.get_meta_info("a")["prompt_tokens"] == 1
