"""The DSL end to end on the in-process Engine with the default tiny random-weight model (CPU).

Expected values are computed from the engine's own ``generate`` results (plain requests without
the interpreter), never from the code under test.
"""

from __future__ import annotations

import json
import re

import pytest

import radixlm as sgl

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def engine():
    from radixlm.runtime.engine import Engine

    eng = Engine()
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def backend(engine):
    return sgl.EngineBackend(engine)


def _ids(engine, text: str) -> list[int]:
    return engine.tokenizer.encode(text)


def test_engine_backend_is_resolved_from_engine(engine, backend):
    assert sgl.interpreter.backend.resolve_backend(engine) is sgl.interpreter.backend.resolve_backend(engine)
    # the tiny model's tokenizer has a ChatML template: markers come from it
    assert backend.chat_template.name == "tokenizer"
    assert backend.chat_template.begin("user") == "<|im_start|>user\n"


def test_gen_matches_plain_engine_request(engine, backend):
    @sgl.function
    def prog(s, q):
        s += sgl.system("You are terse.")
        s += sgl.user(q)
        s += sgl.assistant(sgl.gen("a", max_tokens=6))

    st = prog.run(q="What is a trie?", temperature=0, backend=backend)
    prompt = ("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is a trie?"
              "<|im_end|>\n<|im_start|>assistant\n")
    ref = engine.generate(prompt, {"max_new_tokens": 6, "temperature": 0})
    assert st["a"] == ref["text"]
    assert [m["role"] for m in st.messages()] == ["system", "user", "assistant"]
    # the rendered conversation is exactly what the tokenizer's own template produces
    assert st.text() == engine.tokenizer.apply_chat_template(st.messages(), tokenize=False)


def test_fork_branches_hit_the_committed_prefix(engine, backend):
    engine.flush_cache()
    prefix = "import json\nimport logging\n\ndef load_config(path):\n    \"\"\"Read the file.\"\"\"\n"

    @sgl.function
    def prog(s):
        s += prefix
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f"    # step {i}\n" + sgl.gen("code", max_tokens=4, temperature=0)
        forks.join()
        return [f.get_meta_info("code") for f in forks]

    st = prog.run(backend=backend)
    p = _ids(engine, prefix)
    for i, meta in enumerate(st.ret_value):
        child = _ids(engine, prefix + f"    # step {i}\n")
        shared = next((k for k, (a, b) in enumerate(zip(p, child)) if a != b), len(p))
        assert meta["cached_tokens"] >= shared, (meta, shared)
    assert len(st["code"]) == 3


def _reference_scores(engine, prompt: str, choices: list[str]):
    """Per-choice conditional and unconditional logprobs straight from engine.generate."""
    p = _ids(engine, prompt)
    cond, uncond = [], []
    for c in choices:
        full = _ids(engine, prompt + c)
        assert full[: len(p)] == p, "test prompts must not merge with the choice"
        r = engine.generate(input_ids=full, sampling_params={"max_new_tokens": 0},
                            return_logprob=True, logprob_start_len=0)
        cond.append([e[0] for e in r["meta_info"]["input_token_logprobs"][len(p):]])
        u = engine.generate(input_ids=full[len(p):], sampling_params={"max_new_tokens": 0},
                            return_logprob=True, logprob_start_len=0)
        uncond.append([e[0] or 0.0 for e in u["meta_info"]["input_token_logprobs"]])
    return cond, uncond


def _greedy_ref(rows: list[list[float]]) -> int:
    width = max(len(r) for r in rows)
    padded = [r + [sum(r) / len(r)] * (width - len(r)) for r in rows]
    alive = list(range(len(rows)))
    for col in range(width):
        top = max(padded[i][col] for i in alive)
        alive = [i for i in alive if padded[i][col] >= top - 1e-6]
        if len(alive) == 1:
            break
    return alive[0]


@pytest.mark.parametrize("prompt,choices", [
    ("The capital of France is", [" Paris", " London", " a city in Europe"]),
    ("def main():\n    return", [" None", " 0", " self.value", " json.dumps(data)"]),
])
def test_select_matches_independent_scoring(engine, backend, prompt, choices):
    cond, uncond = _reference_scores(engine, prompt, choices)
    means = [sum(r) / len(r) for r in cond]
    pmi = [sum(a - b for a, b in zip(c, u)) / len(c) for c, u in zip(cond, uncond)]
    want = {
        "token_length_normalized": choices[max(range(len(choices)), key=means.__getitem__)],
        "greedy_token_selection": choices[_greedy_ref(cond)],
        "unconditional_likelihood_normalized": choices[max(range(len(choices)), key=pmi.__getitem__)],
    }

    @sgl.function
    def prog(s, method):
        s += prompt + sgl.select("c", choices, choices_method=method)

    for name, expected in want.items():
        st = prog.run(method=getattr(sgl, name), backend=backend)
        assert st["c"] == expected, name
        meta = st.get_meta_info("c")
        assert meta["normalized_prompt_logprobs"] == pytest.approx(means, abs=2e-3)
        if name == "unconditional_likelihood_normalized":
            assert meta["normalized_unconditional_prompt_logprobs"] == pytest.approx(pmi, abs=2e-3)


def test_run_batch_order_and_precache(engine, backend):
    engine.flush_cache()
    shots = "".join(f"Q: what is {a}+{b}?\nA: {a + b}\n" for a, b in [(1, 2), (3, 4), (5, 6)])

    @sgl.function
    def few_shot(s, question):
        s += shots + "Q: " + question + "\nA:"
        s += sgl.gen("answer", max_tokens=3, stop="\n")

    qs = [f"what is {i}+{i}?" for i in range(5)]
    states = few_shot.run_batch([{"question": q} for q in qs], temperature=0, backend=backend)
    for q, st in zip(qs, states):
        ref = engine.generate(shots + "Q: " + q + "\nA:",
                              {"max_new_tokens": 3, "stop": "\n", "temperature": 0})
        assert st["answer"] == ref["text"]
    prefix_ids = _ids(engine, shots + "Q: ")
    for st in states:  # every program, including the first ones, found the precached prefix
        assert st.get_meta_info("answer")["cached_tokens"] >= len(prefix_ids) - 1


def test_streaming_increments_concatenate(engine, backend):
    @sgl.function
    def prog(s):
        s += "def f" + sgl.gen("body", max_tokens=10, temperature=0, ignore_eos=True)

    st = prog.run(stream=True, backend=backend)
    pieces = list(st.text_iter("body"))
    assert len(pieces) >= 2 and "".join(pieces) == st["body"]
    ref = engine.generate("def f", {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True})
    assert st["body"] == ref["text"]


def test_request_error_in_fork_propagates_without_hang(backend):
    @sgl.function
    def prog(s):
        s += "x = 1\n"
        forks = s.fork(2)
        forks[0] += sgl.gen("a", max_tokens=2)
        forks[1] += sgl.gen("a", max_tokens=2, top_p=5.0)  # invalid: rejected by the engine
        forks.join()

    st = prog.run(backend=backend)
    assert st.error() is not None
    with pytest.raises(sgl.ProgramError):
        st["a"]


def _has_grammar() -> bool:
    import radixlm.grammar as g

    return hasattr(g, "GrammarCompiler")


@pytest.mark.skipif(not _has_grammar(), reason="grammar engine (issue 4) not integrated yet")
def test_constrained_gens_parse(engine, backend):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}

    @sgl.function
    def prog(s):
        s += "n = " + sgl.gen_int("n", max_tokens=12) + "\n"
        s += "f = " + sgl.gen("f", dtype=float, max_tokens=20) + "\n"
        s += "b = " + sgl.gen("b", dtype=bool, max_tokens=4) + "\n"
        s += "r = " + sgl.gen("r", regex=r"[ab]{3}-[0-9]", max_tokens=8) + "\n"
        s += "j = " + sgl.gen("j", json_schema=schema, max_tokens=24)

    st = prog.run(temperature=0, backend=backend)
    assert st.error() is None, st.error()
    int(st["n"])
    float(st["f"])
    assert st["b"] in ("True", "False")
    assert re.fullmatch(r"[ab]{3}-[0-9]", st["r"])
    assert isinstance(json.loads(st["j"])["ok"], bool)


def test_gen_n_samples_on_the_real_model(engine, backend):
    @sgl.function
    def prog(s):
        s += sgl.user("Name a fruit.")
        s += sgl.assistant(sgl.gen("f", max_tokens=4, n=3, temperature=1.0))

    st = prog.run(backend=backend)
    assert st.error() is None, st.error()
    assert isinstance(st["f"], list) and len(st["f"]) == 3 and all(isinstance(x, str) for x in st["f"])
    assert st.messages()[-1] == {"role": "assistant", "content": st["f"][0].lstrip()}
