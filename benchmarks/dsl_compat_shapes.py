"""Program shapes for ``dsl_compat_probe.py``: small ``@function`` programs in the styles SGLang
frontend users write (few-shot, chat, select, fork/join, streaming, batch, constraints, logprobs).

Each shape is ``def _shape_x(sgl, be) -> None``: it runs its program on backend ``be`` through
the module ``sgl`` (radixlm imported as sgl) and raises ``Wrong`` when the program ran but gave a
result that SGLang's frontend would not give (checked structurally, never on model quality).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, Callable


class Wrong(Exception):
    """The program ran, but a result differs from SGLang's semantics."""


def check(cond: Any, what: str) -> None:
    """Raise :class:`Wrong` with ``what`` when ``cond`` is false."""
    if not cond:
        raise Wrong(what)


SHAPES: dict[str, Callable[[Any, Any], Any]] = {}


def shape(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """Register ``fn`` under its name without the ``_shape_`` prefix."""
    SHAPES[fn.__name__.removeprefix("_shape_")] = fn
    return fn


FEW = "Q: What is 2+2?\nA: 4\nQ: What is 3+3?\nA: 6\n"


@shape
def _shape_few_shot_stop(sgl, be):
    @sgl.function
    def prog(s, q):
        s += FEW + "Q: " + q + "\nA:" + sgl.gen("a", stop="\n", max_tokens=16, temperature=0)
    st = prog.run(q="What is 5+5?", backend=be)
    check("\n" not in st["a"] and st.text().endswith(st["a"]), "stop/text")


@shape
def _shape_run_batch_progress(sgl, be):
    @sgl.function
    def prog(s, q):
        s += FEW + "Q: " + q + "\nA:" + sgl.gen("a", stop="\n", max_tokens=8)
    qs = ["What is 1+1?", "What is 7+1?", "What is 9+9?"]
    sts = prog.run_batch([{"q": q} for q in qs], temperature=0.1, backend=be, num_threads=2,
                         progress_bar=True)
    check(len(sts) == 3 and all(q in st.text() for q, st in zip(qs, sts)), "order")


@shape
def _shape_run_batch_tuples(sgl, be):
    @sgl.function
    def prog(s, q, suffix="\nA:"):
        s += "Q: " + q + suffix + sgl.gen("a", max_tokens=4)
    sts = prog.run_batch([("x?",), ("y?", " =>")], backend=be, temperature=0)
    check("x?\nA:" in sts[0].text() and "y? =>" in sts[1].text(), "tuple args")


@shape
def _shape_chat_multi_turn(sgl, be):
    @sgl.function
    def prog(s, q1, q2):
        s += sgl.system("You are a helpful assistant.")
        s += sgl.user(q1)
        s += sgl.assistant(sgl.gen("a1", max_tokens=12))
        with s.user():
            s += q2
        with s.assistant():
            s += sgl.gen("a2", max_tokens=12)
    st = prog.run(q1="Hi!", q2="Name a color.", temperature=0.7, max_new_tokens=12, backend=be)
    m = st.messages()
    check([x["role"] for x in m] == ["system", "user", "assistant", "user", "assistant"], str(m))
    check(m[4]["content"] == st["a2"].lstrip() and m[3]["content"] == "Name a color.", "content")


@shape
def _shape_select_true_false(sgl, be):
    @sgl.function
    def prog(s, statement):
        s += "Statement: The sky is green.\nAnswer: False\nStatement: " + statement + "\n"
        s += "Answer:" + sgl.select("answer", ["True", "False", "Unknown"])
    st = prog.run(statement="Water is wet.", backend=be)
    meta = st.get_meta_info("answer")
    check(st["answer"] in ("True", "False", "Unknown"), "choice")
    check(len(meta["normalized_prompt_logprobs"]) == 3 and len(meta["input_token_logprobs"]) == 3,
          "meta")


@shape
def _shape_gen_choices_methods(sgl, be):
    @sgl.function
    def prog(s):
        s += "I need to use a "
        s += sgl.gen("t1", choices=["calculator", "search engine"])
        s += ". Again: " + sgl.gen("t2", choices=["calculator", "search engine"],
                                   choices_method=sgl.greedy_token_selection)
        s += ". Once more: " + sgl.select("t3", choices=["calculator", "search engine"],
                                          choices_method=sgl.unconditional_likelihood_normalized)
    st = prog.run(backend=be)
    for k in ("t1", "t2", "t3"):
        check(st[k] in ("calculator", "search engine"), k)
    check("unconditional_token_logprobs" in st.get_meta_info("t3"), "uncond meta")


@shape
def _shape_decode_int(sgl, be):
    @sgl.function
    def prog(s):
        s += "The number of hours in a day is " + sgl.gen_int("hours") + "\n"
        s += "The number of days in a year is " + sgl.gen_int("days") + "\n"
    st = prog.run(temperature=0.1, backend=be)
    int(st["hours"]), int(st["days"])


@shape
def _shape_json_regex_var_scope(sgl, be):
    from radixlm.lang.ir import REGEX_FLOAT, REGEX_INT, REGEX_STR

    @sgl.function
    def prog(s):
        s += "A JSON object describing Paris:\n"
        with s.var_scope("json_output"):
            s += "{\n"
            s += '  "name": ' + sgl.gen(regex=REGEX_STR) + ",\n"
            s += '  "population": ' + sgl.gen(regex=REGEX_INT, stop=[" ", "\n"]) + ",\n"
            s += '  "latitude": ' + sgl.gen(regex=REGEX_FLOAT, stop=[" ", "\n"]) + "\n"
            s += "}"
    st = prog.run(temperature=0.0, max_new_tokens=16, backend=be)
    obj = json.loads(st["json_output"])
    check(isinstance(obj["population"], int), "int")


@shape
def _shape_json_dtype_gen(sgl, be):
    @sgl.function
    def prog(s):
        with s.var_scope("js"):
            s += '{\n  "name": ' + sgl.gen_string(max_tokens=16) + ",\n"
            s += '  "population": ' + sgl.gen_int(max_tokens=8) + ",\n"
            s += '  "area": ' + sgl.gen(dtype=int, max_tokens=8) + ",\n"
            s += '  "tz": ' + sgl.gen(dtype=str, max_tokens=16) + "\n}"
    st = prog.run(max_new_tokens=64, backend=be)
    obj = json.loads(st["js"])
    check(isinstance(obj["name"], str) and isinstance(obj["population"], int), "types")


@shape
def _shape_dtype_all(sgl, be):
    @sgl.function
    def prog(s):
        s += "Q: Year?\nA: " + sgl.gen("i", dtype=int) + "\n"
        s += "Q: Pi?\nA: " + sgl.gen("f", dtype=float) + "\n"
        s += "Q: Sky blue?\nA: " + sgl.gen("b", dtype=bool) + "\n"
        s += "Q: Name?\nA: " + sgl.gen("s", dtype=str, stop="\n") + "\n"
    st = prog.run(backend=be, max_new_tokens=12)
    int(st["i"]), float(st["f"])
    check(st["b"] in ("True", "False") and st["s"].startswith('"'), "bool/str")


@shape
def _shape_var_in_expression(sgl, be):
    @sgl.function
    def prog(s, question):
        s += "Question: " + question + "\n"
        s += "A good person to answer this is" + sgl.gen("expert", stop=[".", "\n"], max_tokens=8)
        s += ".\nFor example," + s["expert"] + " would say " + sgl.gen("answer", stop=".",
                                                                     max_tokens=8)
    st = prog.run(question="What is the capital of France?", temperature=0.1, backend=be)
    check(st.text().count(st["expert"]) >= 2, "expert twice")


@shape
def _shape_tool_use_call(sgl, be):
    @sgl.function
    def prog(s, lhs, rhs):
        s += "calculate(1*2)=2\nQuestion: product of " + str(lhs) + " and " + str(rhs) + "\n"
        s += "calculate(" + sgl.gen("expression", regex=r"[0-9]+\*[0-9]+") + ") = "
        with s.var_scope("answer"):
            s += str(eval(s["expression"]))  # noqa: S307 - regex-constrained arithmetic
    st = prog(lhs=257, rhs=983, temperature=0, backend=be)  # __call__ == run
    check(st["answer"] == str(eval(st["expression"])), "var_scope value")  # noqa: S307


@shape
def _shape_react_loop(sgl, be):
    @sgl.function
    def prog(s, question):
        s += "Question: " + question + "\n"
        for i in range(1, 3):
            s += f"Thought {i}:" + sgl.gen(stop=[".", "\n"], max_tokens=8) + ".\n"
            s += f"Action {i}: " + sgl.select(f"action_{i}", ["Search", "Finish"])
            if s[f"action_{i}"] == "Search":
                s += " [" + sgl.gen(stop="]", max_tokens=8) + "].\n"
            else:
                s += " [" + sgl.gen("answer", stop="]", max_tokens=8) + "].\n"
                break
    st = prog.run(question="Where does Linus live?", temperature=0.1, backend=be)
    check(st["action_1"] in ("Search", "Finish"), "select")


@shape
def _shape_fork_join_gather(sgl, be):
    @sgl.function
    def prog(s, topic):
        s += "Tips for " + topic + ":\n"
        for i in range(1, 3):
            s += f"{i}." + sgl.gen(max_tokens=8, stop=[".", "\n"]) + ".\n"
        forks = s.fork(3)
        for i in range(3):
            forks[i] += f"Expand tip {i + 1}:\n"
            forks[i] += sgl.gen("detailed_tip", 8, stop=["\n\n"])
        forks.join()
        for i in range(3):
            s += f"Tip {i + 1}:" + forks[i]["detailed_tip"] + "\n"
        s += "\nIn summary," + sgl.gen("summary", max_tokens=8)
    st = prog.run(topic="sleep", temperature=0.3, backend=be)
    check(isinstance(st["summary"], str) and len(st["detailed_tip"]) == 3, "gather")


@shape
def _shape_fork_no_join(sgl, be):
    @sgl.function
    def prog(s):
        s += "Two tips: 1. Diet. 2. Exercise.\n"
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f += f"Expand tip {i + 1}:\n" + sgl.gen("detailed_tip", max_tokens=8, stop="\n\n")
        s += "Tip 1:" + forks[0]["detailed_tip"] + "\nTip 2:" + forks[1]["detailed_tip"] + "\n"
        s += "In summary" + sgl.gen("summary", max_tokens=6)
    st = prog.run(backend=be)
    check("detailed_tip" not in st and isinstance(st["summary"], str), "no-join vars")


@shape
def _shape_fork_lambda_concat(sgl, be):
    ctx = ["Ethan is the father of Liam.", "Noah is the father of Julian.", "Oliver is Carl's."]

    @sgl.function
    def prog(s, question):
        s += "Memorize these statements.\n"
        forks = s.fork(len(ctx))
        forks += lambda i: f"Statement {i}: " + ctx[i] + "\n"
        forks.join(mode="concate_and_append")
        s += "Question: " + question + "\nAnswer:" + sgl.gen("answer", max_tokens=8)
    st = prog.run(question="Who is Julian's father?", temperature=0, backend=be)
    t = st.text()
    check(all(c in t for c in ctx) and t.index(ctx[0]) < t.index(ctx[2]), "concat order")


@shape
def _shape_forks_iadd_expr_select(sgl, be):
    @sgl.function
    def prog(s, question, n):
        s += "Question: " + question + "\n"
        forks = s.fork(n)
        forks += "Reasoning:" + sgl.gen("reasoning", stop="\n", max_tokens=8) + "\n"
        forks += "Tool:" + sgl.gen("tool", choices=["calculator", "browser"]) + "\n"
        forks.join()
    st = prog.run(question="Compute 5 + 2 + 4.", n=3, temperature=1.0, backend=be)
    check(len(st["reasoning"]) == 3 and all(t in ("calculator", "browser") for t in st["tool"]),
          "parallel sample")


@shape
def _shape_tree_of_thought(sgl, be):
    def step(s, prompt, var, n):
        s += sgl.user(prompt)
        forks = s.fork(n)
        forks += sgl.assistant(sgl.gen(var, max_tokens=6, temperature=0.001))
        return forks

    @sgl.function
    def prog(s, question, num_branches):
        plans = step(s, "Plan: " + question, "plan", num_branches)
        sols = [f for p in plans for f in step(p, "Solve.", "answer", num_branches)]
        return [[x.text() for x in step(sol, "Final?", "final", num_branches)] for sol in sols]
    st = prog.run(question="2+2?", num_branches=2, temperature=0, backend=be)
    texts = [t for xs in st.ret_value for t in xs]
    check(len(texts) == 8 and all(t.count(be.chat_template.begin("assistant")) == 3
                                   for t in texts), "tree texts")


@shape
def _shape_cot_decoding_top_logprobs(sgl, be):
    @sgl.function
    def prog(s, question, k):
        s += sgl.user("Question: " + question + "\nAnswer:")
        s += sgl.assistant_begin()
        step_0 = s.fork(1)[0]
        forks = s.fork(k)
        step_0 += sgl.gen("get_top_k", max_tokens=0, return_logprob=True, top_logprobs_num=k,
                          return_text_in_logprobs=True)
        tops = step_0.get_meta_info("get_top_k")["output_top_logprobs"][0]
        for f, (logprob, token_id, text) in zip(forks, tops):
            f += text + sgl.gen("answer", temperature=0, max_tokens=4, return_logprob=True,
                                top_logprobs_num=2, return_text_in_logprobs=True)
            xs = f.get_meta_info("answer")["output_top_logprobs"]
            check(all(len(x) == 2 and isinstance(x[0][2], str) for x in xs), "top2")
        return tops
    st = prog.run(question="1+1?", k=3, backend=be)
    check(st.error() is None and len(st.ret_value) == 3, f"tops {st.error()!r}")


@shape
def _shape_logprobs_meta(sgl, be):
    @sgl.function
    def prog(s):
        s += "Hello" + sgl.gen("x", max_tokens=5, ignore_eos=True, return_logprob=True,
                               top_logprobs_num=2, logprob_start_len=0,
                               return_text_in_logprobs=True)
    st = prog.run(temperature=0, backend=be)
    m = st.get_meta_info("x")
    check(m["completion_tokens"] == 5 and len(m["output_token_logprobs"]) == 5, "outputs")
    check(len(m["input_token_logprobs"]) == m["prompt_tokens"], "inputs from 0")


@shape
def _shape_min_tokens(sgl, be):
    @sgl.function
    def prog(s):
        s += sgl.user("Say hi.")
        s += sgl.assistant(sgl.gen("answer", min_tokens=16, max_tokens=24))
    st = prog.run(backend=be)
    check(st.get_meta_info("answer")["completion_tokens"] >= 16, "min tokens")


@shape
def _shape_gen_n(sgl, be):
    @sgl.function
    def prog(s):
        s += "A random fruit:" + sgl.gen("f", n=3, max_tokens=4, temperature=1.0)
    st = prog.run(backend=be)
    check(isinstance(st["f"], list) and len(st["f"]) == 3 and st.text().endswith(st["f"][0]), "n")


@shape
def _shape_regex_ip(sgl, be):
    rx = r"((25[0-5]|2[0-4]\d|[01]?\d\d?).){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"

    @sgl.function
    def prog(s):
        s += "Q: What is the IP address of the Google DNS servers?\nA: "
        s += sgl.gen("answer", temperature=0, regex=rx)
    st = prog.run(backend=be)
    check(re.fullmatch(rx, st["answer"]), st["answer"])


@shape
def _shape_json_schema_pydantic(sgl, be):
    from pydantic import BaseModel

    class Wizard(BaseModel):
        name: str
        age: int

    @sgl.function
    def prog(s):
        s += "A wizard in JSON:\n" + sgl.gen("w", max_tokens=64, json_schema=Wizard)
        s += "\nAgain:\n" + sgl.gen("w2", max_tokens=64, json_schema=Wizard.model_json_schema())
    st = prog.run(backend=be, temperature=0)
    Wizard.model_validate_json(st["w"]), Wizard.model_validate_json(st["w2"])
