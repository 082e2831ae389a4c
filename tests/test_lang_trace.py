"""Tracing, constant prefixes, choice methods and chat-template derivation (no model needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import radixlm as sgl
from radixlm.lang.chat_template import ChatTemplate, chat_template_from_tokenizer
from radixlm.lang.ir import Argument, Fork, Gen, Join, Select, Variable

SHARED = Path(os.environ.get("RADIXLM_SHARED_DATA",
                             Path(__file__).resolve().parents[1] / ".." / "shared" / "data"))


@sgl.function
def helper(s, topic):
    s += "Topic: " + topic + "\n"


@sgl.function
def planner(s, question, n=2):
    s += sgl.system("You plan.")
    helper(s, "planning")
    with s.user():
        s += "Question: " + question
    s += sgl.assistant(sgl.gen("plan", max_tokens=16, stop="\n"))
    forks = s.fork(n)
    for i, f in enumerate(forks):
        f += f"Option {i}: " + sgl.select("verdict", ["good", "bad"])
    forks.join()
    s += "Chosen: " + s["plan"]
    if s["plan"].startswith("A"):
        s += "!"


def test_trace_records_roles_fork_and_select():
    prog = planner.trace()
    nodes = prog.nodes
    assert isinstance(prog.arguments["question"], Argument) and prog.arguments["n"] == 2
    forks = [n for n in nodes if isinstance(n, Fork)]
    assert len(forks) == 1 and forks[0].n == 2
    for i, child in enumerate(forks[0].children):
        assert child[0].value == f"Option {i}: " and isinstance(child[1], Select)
    assert any(isinstance(n, Join) for n in nodes)
    assert isinstance(nodes[-1], Variable) and nodes[-1].name == "plan"
    assert "AttributeError" in prog.stopped  # s["plan"].startswith on a placeholder
    text = str(prog)
    lines = text.splitlines()
    assert lines[0] == "program planner(s, question=Argument('question'), n=2):"
    order = ["RoleBegin(system)", "Constant('Topic: planning\\n')", "RoleBegin(user)",
             "Argument('question')", "Gen('plan', max_new_tokens=16, stop='\\n')", "Fork(2)",
             "fork[0]:", "Select('verdict'", "fork[1]:", "Join('gather_variable')",
             "Variable(s['plan'])", "tracing stopped"]
    positions = [next(i for i, line in enumerate(lines[1:]) if key in line) for key in order]
    assert positions == sorted(positions)


def test_constant_prefix_stops_at_the_first_dynamic_node():
    tmpl = ChatTemplate("t", {"system": ("<S>", "</S>"), "user": ("<U>", "</U>"),
                              "assistant": ("<A>", "</A>")})
    prog = planner.trace()
    assert prog.constant_prefix(tmpl) == "<S>You plan.</S>Topic: planning\n<U>Question: "
    known = planner.trace(question="Why?")
    assert known.constant_prefix(tmpl) == ("<S>You plan.</S>Topic: planning\n<U>Question: Why?"
                                           "</U><A>")
    assert prog.constant_prefix().startswith("System: You plan.")


def test_trace_stops_on_variables_in_format_strings():
    @sgl.function
    def prog(s):
        s += "a" + sgl.gen("x")
        s += f"echo {s['x']}"

    traced = prog.trace()
    assert isinstance(traced.nodes[-1], Gen) and "format string" in traced.stopped
    assert traced.constant_prefix() == "a"
    assert sgl.trace(prog).stopped == traced.stopped


# ---- choice methods ------------------------------------------------------------------------


def _entries(values):
    return [[v, i, f"t{i}"] for i, v in enumerate(values)]


def test_token_length_normalized_takes_first_max():
    d = sgl.token_length_normalized(choices=["a", "b", "c"],
                                    normalized_prompt_logprobs=[-2.0, -1.0, -1.0],
                                    input_token_logprobs=[[], [], []],
                                    output_token_logprobs=[[], [], []])
    assert d.decision == "b" and d.meta_info["normalized_prompt_logprobs"] == [-2.0, -1.0, -1.0]


def test_greedy_token_selection_pads_short_choices_with_their_mean():
    rows = [[-1.0, -5.0], [-1.0, -2.0, -0.1], [-3.0]]
    d = sgl.greedy_token_selection(choices=["a", "b", "c"], normalized_prompt_logprobs=[0, 0, 0],
                                   input_token_logprobs=[_entries(r) for r in rows],
                                   output_token_logprobs=[[], [], []])
    assert d.decision == "b"
    assert d.meta_info["greedy_logprob_matrix"][0] == [-1.0, -5.0, -3.0]
    assert d.meta_info["greedy_logprob_matrix"][2] == [-3.0, -3.0, -3.0]
    # a short choice whose mean beats the long one's next token wins
    rows = [[-1.0], [-1.0, -4.0]]
    d = sgl.greedy_token_selection(choices=["x", "y"], normalized_prompt_logprobs=[0, 0],
                                   input_token_logprobs=[_entries(r) for r in rows],
                                   output_token_logprobs=[[], []])
    assert d.decision == "x"


def test_unconditional_likelihood_normalized():
    cond = [[-1.0, -1.0], [-3.0, -0.5]]
    uncond = [[None, -0.5], [None, -4.0]]
    d = sgl.unconditional_likelihood_normalized(
        choices=["p", "q"], normalized_prompt_logprobs=[-1.0, -1.75],
        input_token_logprobs=[_entries(r) for r in cond],
        output_token_logprobs=[[], []], unconditional_token_logprobs=[_entries(r) for r in uncond])
    want = [((-1.0 - 0.0) + (-1.0 + 0.5)) / 2, ((-3.0 - 0.0) + (-0.5 + 4.0)) / 2]
    assert d.meta_info["normalized_unconditional_prompt_logprobs"] == pytest.approx(want)
    assert d.decision == "q"
    with pytest.raises(ValueError):
        sgl.unconditional_likelihood_normalized(
            choices=["p"], normalized_prompt_logprobs=[0.0], input_token_logprobs=[[]],
            output_token_logprobs=[[]])
    with pytest.raises(ValueError):
        sgl.unconditional_likelihood_normalized(
            choices=["p"], normalized_prompt_logprobs=[0.0],
            input_token_logprobs=[_entries([-1.0])], output_token_logprobs=[[]],
            unconditional_token_logprobs=[_entries([None, -1.0])])


def test_choice_token_entries_handles_token_healing():
    from radixlm.interpreter.select import choice_token_entries

    # prompt "ab c" = [a][b][ c] (P=3), choice "at": "ab c"+"at" -> [a][b][ cat] merges
    merged = [[None, 1, "b"], [-0.5, 2, " cat"]]
    assert choice_token_entries("ab c", "at", merged, 1, 3) == [[-0.5, 2, " cat"]]
    # no merge: [a][b][ c][at]
    plain = [[None, 1, "b"], [-0.7, 2, " c"], [-0.2, 3, "at"]]
    assert choice_token_entries("ab c", "at", plain, 1, 3) == [[-0.2, 3, "at"]]
    # texts missing: positions >= P
    blind = [[None, 1, None], [-0.7, 2, None], [-0.2, 3, None], [-0.1, 4, None]]
    assert choice_token_entries("ab c", "at", blind, 1, 3) == [[-0.2, 3, None], [-0.1, 4, None]]


# ---- chat templates ------------------------------------------------------------------------

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}")
NO_SYSTEM = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
             "{{ raise_exception('no system role') }}{% endif %}"
             "{{ '[' + m['role'] + '] ' + m['content'] + '\\n' }}{% endfor %}")


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    path = SHARED / "tokenizers" / "gpt-2"
    if not path.exists():
        pytest.skip(f"shared test data missing at {path} (set RADIXLM_SHARED_DATA)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def test_chat_template_from_chatml_reproduces_the_tokenizer(gpt2_tokenizer):
    tok = gpt2_tokenizer
    tok.chat_template = None
    assert chat_template_from_tokenizer(tok).name == "default"  # gpt-2 has no template
    tok.chat_template = CHATML
    tmpl = chat_template_from_tokenizer(tok)
    assert tmpl.role_markers["user"] == ("<|im_start|>user\n", "<|im_end|>\n")
    conv = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi there"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}]
    assert tmpl.render(conv) == tok.apply_chat_template(conv, tokenize=False)


def test_bos_marker_that_encoding_does_not_add_is_kept(gpt2_tokenizer):
    # SmolLM2's BOS is "<|im_start|>" and encoding does not prepend it: the system marker must
    # keep it, or the first message loses its "<|im_start|>".
    tok = gpt2_tokenizer
    old = tok.bos_token
    tok.chat_template = CHATML
    try:
        tok.bos_token = "<|im_start|>"
        assert tok("x")["input_ids"][0] != tok.bos_token_id
        tmpl = chat_template_from_tokenizer(tok)
        assert tmpl.begin("system") == "<|im_start|>system\n"
        conv = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
        assert tmpl.render(conv) == tok.apply_chat_template(conv, tokenize=False)
    finally:
        tok.bos_token = old


def test_chat_template_without_system_role_reuses_user_markers(gpt2_tokenizer):
    tok = gpt2_tokenizer
    tok.chat_template = NO_SYSTEM
    tmpl = chat_template_from_tokenizer(tok)
    assert tmpl.role_markers["user"] == ("[user] ", "\n")
    assert tmpl.role_markers["system"] == tmpl.role_markers["user"]
    assert not tmpl.begin("user").startswith(tok.bos_token)  # BOS is not repeated per turn


def test_phi3_template_from_shared_data():
    path = SHARED / "tokenizers" / "phi-3"
    if not path.exists():
        pytest.skip(f"shared test data missing at {path}")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    tmpl = chat_template_from_tokenizer(tok)
    conv = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    rendered = tok.apply_chat_template(conv, tokenize=False)
    assert rendered == tok.bos_token + tmpl.render(conv)
    # a gen after user(...) + assistant_begin() sees exactly the template's generation prompt
    # (phi-3 closes every user turn with "<|assistant|>\n", so its assistant begin is empty)
    prompt = tok.apply_chat_template(conv[:1], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|assistant|>\n")
    assert prompt == tok.bos_token + tmpl.render(conv[:1]) + tmpl.begin("assistant")


# ---- SGLang's named chat templates ------------------------------------------------------------


@pytest.mark.parametrize("path, name", [
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3-instruct"), ("Qwen/Qwen2.5-7B-Instruct", "qwen"),
    ("google/gemma-2-9b-it", "gemma-it"), ("HuggingFaceTB/SmolLM2-135M-Instruct", "chatml"),
    ("deepseek-ai/DeepSeek-V3", "deepseek-v3"), ("gpt2", "default"),
])
def test_chat_template_by_model_path_matches_sglang(path, name):
    from radixlm.lang.chat_template import get_chat_template_by_model_path

    assert get_chat_template_by_model_path(path).name == name


def test_named_chat_templates_have_sglang_markers():
    from radixlm.lang.chat_template import get_chat_template

    llama3 = get_chat_template("llama-3-instruct")
    assert llama3.render([{"role": "user", "content": "Hi"}]) == \
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
    assert get_chat_template("gemma-it").begin("assistant") == "<start_of_turn>model\n"
    assert get_chat_template("qwen").default_system_prompt == "You are a helpful assistant."
    assert get_chat_template("chatml").default_system_prompt is None
