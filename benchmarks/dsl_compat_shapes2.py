"""More program shapes for ``dsl_compat_probe.py``: streaming, state API, errors, backend helpers."""

from __future__ import annotations

import asyncio

from dsl_compat_shapes import SHAPES, check, shape  # noqa: F401 - registry


def _qa(sgl):
    @sgl.function
    def qa(s, question):
        s += sgl.system("You are a helpful assistant.")
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=12))
    return qa


@shape
def _shape_stream_text_iter(sgl, be):
    qa = _qa(sgl)
    st = qa(question="Name a fruit.", stream=True, backend=be, temperature=0)
    out = "".join(st.text_iter())
    check(out == st.text(), "text_iter == text")
    st = qa(question="Name a fruit.", stream=True, backend=be, temperature=0)
    out = "".join(st.text_iter("answer"))
    check(out == st["answer"] and out, "text_iter(var)")


@shape
def _shape_stream_async(sgl, be):
    qa = _qa(sgl)

    async def go():
        st = qa.run(question="Name a fruit.", stream=True, backend=be, temperature=0)
        parts = [p async for p in st.text_async_iter(var_name="answer")]
        metas = []
        st2 = qa.run(question="Name a fruit.", stream=True, backend=be, temperature=0)
        async for p, meta in st2.text_async_iter("answer", return_meta_data=True):
            metas.append(meta)
        return st, parts, metas
    st, parts, metas = asyncio.run(go())
    check("".join(parts) == st["answer"], "async parts")
    check(metas and all(isinstance(m, dict) and m for m in metas), f"meta {metas[:1]}")


@shape
def _shape_stream_select_fork(sgl, be):
    @sgl.function
    def prog(s):
        s += "Pick:" + sgl.select("c", ["yes", "no"]) + "\n"
        forks = s.fork(2)
        forks += sgl.gen("g", max_tokens=4)
        forks.join()
    st = prog.run(stream=True, backend=be, temperature=0)
    out = "".join(st.text_iter())
    check(out == st.text() and st["c"] in ("yes", "no") and len(st["g"]) == 2, "stream+fork")


@shape
def _shape_text_iter_non_stream(sgl, be):
    qa = _qa(sgl)
    st = qa.run(question="Hi", backend=be, temperature=0)
    check("".join(st.text_iter()) == st.text(), "non-stream text_iter")
    check("".join(st.text_iter("answer")) == st["answer"], "non-stream var")


@shape
def _shape_default_backend_helpers(sgl, be):
    sgl.set_default_backend(be)
    try:
        st = _qa(sgl).run(question="Hi", temperature=0)
        check(isinstance(st["answer"], str), "default backend")
        check(sgl.flush_cache() in (True, None), "flush_cache")
        check(isinstance(sgl.get_server_info(), dict), "server info")
    finally:
        sgl.global_config.default_backend = None


@shape
def _shape_trace_cache_bind(sgl, be):
    @sgl.function
    def prog(s, ctx, q):
        s += "Long instruction. " * 8 + ctx + "\nQ: " + q + "\nA:" + sgl.gen("a", max_tokens=4)
    traced = prog.trace()
    check(traced is not None and str(traced), "trace")
    prog.cache(backend=be)
    bound = prog.bind(ctx="Sky is blue.")
    st = bound.run(q="Color of sky?", backend=be, temperature=0)
    check("Sky is blue." in st.text(), "bind")
    sgl.trace(prog, q="x")


@shape
def _shape_subfunction_and_copy(sgl, be):
    @sgl.function
    def helper(s, topic):
        s += "Topic: " + topic + "\n" + sgl.gen("h", max_tokens=4)

    @sgl.function
    def prog(s):
        helper(s, "cats")
        with s.copy() as c:
            c += "Aside:" + sgl.gen("aside", max_tokens=4)
        s["manual"] = "set by host"
    st = prog.run(backend=be, temperature=0)
    check("Topic: cats" in st.text() and st["manual"] == "set by host", "inline/set_var")
    check(st["aside"] and "Aside:" not in st.text(), "copy")


@shape
def _shape_use_thread_false_and_generator(sgl, be):
    @sgl.function
    def prog(s, q):
        s += "Q: " + q + "\nA:" + sgl.gen("a", max_tokens=4)
    st = prog.run(q="a?", backend=be, use_thread=False, temperature=0)
    check(isinstance(st["a"], str), "use_thread")
    gen = prog.run_batch([{"q": "a?"}, {"q": "b?"}], generator_style=True, backend=be)
    sts = list(gen)
    check(len(sts) == 2 and "b?" in sts[1].text(), "generator_style")
    check(prog.run_batch([], backend=be) == [], "empty batch")


@shape
def _shape_state_api(sgl, be):
    qa = _qa(sgl)
    st = qa.run(question="Hi", backend=be, temperature=0)
    check("answer" in st and "nope" not in st, "__contains__")
    check(st.get_meta_info("nope") is None, "missing meta")
    check(repr(st) == f"ProgramState({st.text()})", "repr")
    check(st.get_var("answer") == st["answer"] and st.error() is None, "get_var")
    try:
        st["nope"]
        raise AssertionError("no KeyError")
    except KeyError:
        pass


@shape
def _shape_body_error(sgl, be):
    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("a", max_tokens=2)
        raise RuntimeError("boom")
    st = prog.run(backend=be)
    check(isinstance(st.error(), RuntimeError), "error()")


@shape
def _shape_role_begin_end(sgl, be):
    @sgl.function
    def prog(s):
        s += sgl.system_begin() + "Be brief." + sgl.system_end()
        s += sgl.user_begin() + "Hello" + sgl.user_end()
        s += sgl.assistant_begin()
        s += sgl.gen("a", max_tokens=4)
        s += sgl.assistant_end()
    st = prog.run(backend=be, temperature=0)
    check([m["role"] for m in st.messages()] == ["system", "user", "assistant"], "roles")


@shape
def _shape_sampling_kwargs(sgl, be):
    @sgl.function
    def prog(s):
        s += "Once upon a time" + sgl.gen("a", max_tokens=6, top_p=0.9, top_k=20, min_p=0.05,
                                          frequency_penalty=0.5, presence_penalty=0.5,
                                          stop=["\n", "."], stop_token_ids=[0],
                                          temperature=0.8)
        s += sgl.gen("b", max_tokens=6, ignore_eos=True)
    st = prog.run(backend=be)
    check(st.get_meta_info("b")["completion_tokens"] == 6, "ignore_eos")


@shape
def _shape_separate_reasoning(sgl, be):
    @sgl.function
    def prog(s):
        s += sgl.user("Hi")
        s += sgl.assistant(sgl.separate_reasoning(sgl.gen("a", max_tokens=6), model_type="qwen3"))
    st = prog.run(backend=be, temperature=0)
    check("a_reasoning_content" in st, "reasoning var")


@shape
def _shape_errors_are_clear(sgl, be):
    for build, exc in ((lambda: sgl.gen("x", regex="(unclosed"), Exception),
                       (lambda: sgl.select("x", []), Exception)):
        try:
            build()
        except exc:
            continue
        raise AssertionError("accepted a bad argument at build time")

    @sgl.function
    def nested(s):
        with s.user():
            s += sgl.assistant("x")
    st = nested.run(backend=be)
    check(st.error() is not None, "nested roles accepted silently")


@shape
def _shape_message_content_strip(sgl, be):
    @sgl.function
    def prog(s):
        s += sgl.user("  padded question")
        s += sgl.assistant(" " + sgl.gen("a", max_tokens=4))
    st = prog.run(backend=be, temperature=0)
    m = st.messages()
    check(m[0]["content"] == "padded question", f"SGLang lstrips contents: {m[0]['content']!r}")


@shape
def _shape_run_batch_select_args(sgl, be):
    @sgl.function
    def prog(s, question, choices):
        s += "Context: a man walks a dog. " + question
        s += sgl.select("answer", choices=choices)
    args = [{"question": "He then", "choices": [" runs.", " sits.", " flies."]},
            {"question": "The dog", "choices": [" barks.", " sings."]}]
    sts = prog.run_batch(args, temperature=0, num_threads=64, progress_bar=True, backend=be)
    check([a["choices"].index(st["answer"]) >= 0 for a, st in zip(args, sts)] == [True, True], "")


@shape
def _shape_run_option_hint(sgl, be):
    @sgl.function
    def prog(s, question):
        s += question + sgl.gen("a", max_tokens=2)
    try:
        prog.run(question="x", max_tokens=4, backend=be)
    except TypeError as exc:
        check("max_new_tokens" in str(exc) and "prog" in str(exc), f"unclear: {exc}")
        return
    raise AssertionError("max_tokens accepted by run()")


@shape
def _shape_dtype_with_regex_and_empty_choices(sgl, be):
    import warnings

    @sgl.function
    def prog(s):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s += "Year: " + sgl.gen("y", dtype=int, regex="[0-9]{4}", max_tokens=6) + "\n"
        s += "Note:" + sgl.gen("n", choices=[], max_tokens=4)
    st = prog.run(backend=be, temperature=0)
    int(st["y"])
    check(isinstance(st["n"], str), "empty choices")


@shape
def _shape_rejected_request_is_an_error(sgl, be):
    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("a", max_tokens=3, json_schema={"type": "nonsense"})
    st = prog.run(backend=be)
    check(st.error() is not None, "a rejected grammar produced text silently")


@shape
def _shape_fork_concat_inside_open_role(sgl, be):
    docs = ["Doc A: the sky is blue.\n", "Doc B: grass is green.\n"]

    @sgl.function
    def prog(s, docs, question):
        s += sgl.user_begin()
        s += "Question:" + question + " Documents begin.\n"
        forks = s.fork(len(docs))
        forks += lambda i: docs[i]
        forks.join("concate_and_append")
        s += "\nDocuments end."
        s += sgl.user_end()
        s += sgl.assistant(sgl.gen("answer", max_tokens=6))
    st = prog.run(docs=docs, question="Sky colour?", temperature=0, backend=be)
    user = st.messages()[0]["content"]
    check(st.error() is None and user.index("Doc A") < user.index("Doc B"), "docs in user msg")


@shape
def _shape_compile_and_nested_program_call(sgl, be):
    @sgl.function
    def expand(s, tip):
        s += "Expand this tip: " + tip + "\n" + sgl.gen("detailed_tip", max_tokens=6)

    @sgl.function
    def tips(s, topic):
        s += "Here are 2 tips for " + topic + ".\n"
        s += "1." + sgl.gen("tip_1", stop=["\n", ":", "."], max_tokens=6) + "\n"
        branch = expand(tip=s["tip_1"])  # a separate program on the default backend
        s += "Tip 1: " + branch["detailed_tip"] + "\n"
    sgl.set_default_backend(be)
    try:
        compiled = tips.compile()
        st = compiled.run(topic="sleep", temperature=0)
        sts = compiled.run_batch([{"topic": "a"}, {"topic": "b"}], temperature=0)
        check(st.error() is None and all(x.error() is None for x in sts), "compiled run")
    finally:
        sgl.global_config.default_backend = None


@shape
def _shape_named_chat_template(sgl, be):
    from radixlm.lang.chat_template import get_chat_template

    if hasattr(be, "engine"):
        qwen = sgl.EngineBackend(be.engine, chat_template=get_chat_template("qwen"))
    else:
        qwen = sgl.RuntimeEndpoint(be.base_url, chat_template_name="qwen")

    @sgl.function
    def chat(s):
        s += sgl.user("Hello")
        s += sgl.assistant(sgl.gen("a", max_tokens=4))
    st = chat.run(backend=qwen, temperature=0)
    check(st.messages()[0]["role"] == "system", "qwen's default system prompt")
    check(get_chat_template("llama-3-instruct").begin("user").startswith("<|start_header_id|>"),
          "llama-3 markers")


@shape
def _shape_numpy_params_and_text_iter_var(sgl, be):
    import numpy as np

    @sgl.function
    def prog(s):
        with s.var_scope("block"):
            s += "Count: " + sgl.gen("c", max_tokens=np.int64(3), temperature=np.float64(0))
    st = prog.run(backend=be, max_new_tokens=np.int64(8))
    check(st.error() is None, f"numpy values: {st.error()!r}")
    check(list(st.text_iter("block")) == [st["block"]], "text_iter(var_scope) non-stream")
