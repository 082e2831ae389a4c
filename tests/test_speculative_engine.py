"""N-gram speculative decoding on the default real model (SmolLM2-135M-Instruct, CPU fp32): greedy
outputs identical with and without speculation (copy-heavy prompts, stop strings, max tokens, a
JSON-schema and a regex constraint, logprobs, streaming, retraction under a small KV pool), drafts
really accepted, and no KV slot leaked by rejected drafts."""

from __future__ import annotations

import json

import pytest

from radixlm import Engine

pytestmark = pytest.mark.timeout(600)

PASSAGE = ("On March 3, 2021, Maria Alvarez signed a contract in Lisbon to deliver 420 tons of wheat to "
           "the cooperative run by Jonas Becker. The first shipment left on April 9, 2021 with 35 bicycles.")
PROMPTS = [
    f"Repeat this passage word for word: {PASSAGE}",
    f"List every name, date and quantity in the passage, copying them exactly.\n\n{PASSAGE}",
    "Write the numbers from 1 to 30 separated by commas.",
    "What is the capital of France?",
    "Copy this line three times: the quick brown fox jumps over the lazy dog.",
    "Give me three tips for staying healthy.",
]
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Give me three tips for staying healthy.",
             "Explain what a binary search does.", "What is 12 times 7?", "Name a famous painting by Leonardo da Vinci.",
             "How do plants make their food?", "Translate 'good morning' into Spanish."]
SCHEMA = {"type": "object", "properties": {"people": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                                           "city": {"type": "string"}}, "required": ["people", "city"]}
SPEC = dict(speculative_algorithm="ngram", speculative_num_draft_tokens=4)
NEW = 40


def chat(tok, text: str) -> str:
    return tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)


def requests(tok) -> tuple[list[str], list[dict]]:
    texts = [chat(tok, p) for p in PROMPTS]
    params = [{"max_new_tokens": NEW, "temperature": 0} for _ in texts]
    params[0]["stop"] = ["wheat"]  # a stop string inside a copied span
    params[2]["max_new_tokens"] = 17  # max tokens reached mid-draft
    texts.append(chat(tok, f"Extract the people and the city as JSON.\n\n{PASSAGE}"))
    params.append({"max_new_tokens": 60, "temperature": 0, "json_schema": json.dumps(SCHEMA)})
    texts.append(chat(tok, "Write a date like 2021-03-03."))
    params.append({"max_new_tokens": 20, "temperature": 0, "regex": r"20[0-9]{2}-[0-1][0-9]-[0-3][0-9]"})
    return texts, params


def run(engine: Engine, texts, params) -> list[dict]:
    return engine.generate(texts, params)


def assert_no_leak(engine: Engine) -> None:
    def check():
        s = engine.scheduler
        return s.allocator.available_size() + s.tree_cache.evictable_size(), s.allocator.size

    have, size = engine._call(check)
    assert have == size, f"{size - have} KV slots leaked"
    assert engine.flush_cache()
    assert engine._call(lambda: engine.scheduler.allocator.available_size()) == size


@pytest.fixture(scope="module")
def plain():
    with Engine(dtype="float32", device="cpu") as e:
        texts, params = requests(e.tokenizer)
        yield e, texts, params, run(e, texts, params)


@pytest.fixture(scope="module")
def spec():
    with Engine(dtype="float32", device="cpu", **SPEC) as e:
        yield e


def test_greedy_outputs_identical_and_drafts_accepted(plain, spec):
    _, texts, params, expected = plain
    # NOTE: compile the two grammars first: a request admitted only when its compile ends (in a
    # duty-cycled thread) decodes after the others, and the pass count below would depend on timing
    spec.generate(texts[6:], [{**p, "max_new_tokens": 1} for p in params[6:]])
    stats = spec.scheduler.stats
    passes0 = stats.num_prefill_batches + stats.num_decode_batches
    got = run(spec, texts, params)
    for want, have in zip(expected, got):
        assert have["output_ids"] == want["output_ids"]
        assert have["text"] == want["text"]
        assert have["meta_info"]["finish_reason"] == want["meta_info"]["finish_reason"]
    assert len({t for o in expected for t in o["output_ids"]}) >= 40  # outputs that really vary
    assert expected[0]["meta_info"]["finish_reason"]["matched"] == "wheat"
    json.loads(expected[6]["text"])
    info = spec.get_server_info()
    assert info["spec_verify_ct"] > 0 and info["spec_accepted_tokens"] > 0
    copy = got[0]["meta_info"]
    assert copy["spec_verify_ct"] > 0 and copy["spec_accept_rate"] > 0.3  # the verbatim copy
    passes = stats.num_prefill_batches + stats.num_decode_batches - passes0
    assert passes < max(len(o["output_ids"]) for o in got)  # fewer steps than the longest output
    assert_no_leak(spec)


def test_logprobs_and_streaming_match(plain, spec):
    e, texts, _, _ = plain
    p = {"max_new_tokens": 24, "temperature": 0}
    want = e.generate(texts[0], p, return_logprob=True, top_logprobs_num=2)
    have = spec.generate(texts[0], p, return_logprob=True, top_logprobs_num=2)
    assert have["output_ids"] == want["output_ids"]
    a, b = want["meta_info"]["output_token_logprobs"], have["meta_info"]["output_token_logprobs"]
    assert len(a) == len(b) == len(want["output_ids"])
    for (lp1, t1, _), (lp2, t2, _) in zip(a, b):
        assert t1 == t2 and abs(lp1 - lp2) < 1e-3
    assert [t for _, t, _ in have["meta_info"]["output_top_logprobs"][3]] == \
        [t for _, t, _ in want["meta_info"]["output_top_logprobs"][3]]
    # jump-forward is off for logprob requests: the grammar's forced strings come as drafts
    pj = {"max_new_tokens": 60, "temperature": 0, "json_schema": json.dumps(SCHEMA)}
    want_j = e.generate(texts[6], pj, return_logprob=True)
    have_j = spec.generate(texts[6], pj, return_logprob=True)
    assert have_j["output_ids"] == want_j["output_ids"] and have_j["text"] == want_j["text"]
    json.loads(have_j["text"])
    assert have_j["meta_info"]["spec_accepted_tokens"] >= 4  # '{"people": ["' etc. are forced
    chunks = list(spec.generate(texts[0], p, stream=True))
    assert chunks[-1]["text"] == want["text"] and chunks[-1]["output_ids"] == want["output_ids"]
    assert len(chunks) < len(want["output_ids"])  # several tokens per chunk
    assert_no_leak(spec)


def test_seeded_sampling_reproducible(spec):
    tok = spec.tokenizer
    p = {"max_new_tokens": 24, "temperature": 0.8, "top_p": 0.9, "seed": 7}
    text = chat(tok, PROMPTS[0])
    a, b = spec.generate(text, p), spec.generate(text, p)
    assert a["output_ids"] == b["output_ids"] and len(a["output_ids"]) > 0
    assert_no_leak(spec)


def test_retraction_under_small_pool_keeps_outputs(plain):
    """A pool too small for all requests: retracted requests drop their drafts, re-run and still
    give the plain engine's greedy outputs; every slot comes back."""
    from radixlm.runtime.default_model import default_model_path
    from radixlm.runtime.request import Req
    from radixlm.runtime.sampling_params import SamplingParams
    from radixlm.runtime.testing import make_scheduler, run_to_completion

    e = plain[0]
    ids = [e.tokenizer.encode(chat(e.tokenizer, q)) for q in QUESTIONS]
    p = {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}
    want = [o["output_ids"] for o in e.generate(input_ids=ids, sampling_params=p)]
    sched = make_scheduler(default_model_path(), dtype="float32", max_total_tokens=180, **SPEC)
    reqs = [Req(f"r{i}", list(x), SamplingParams.from_dict(dict(p))) for i, x in enumerate(ids)]
    assert run_to_completion(sched, reqs, [(i * 3) % 11 for i in range(len(ids))]) == want
    assert sched.stats.num_retracted > 0 and sched.spec_drafter.stats.spec_accepted_tokens > 0
    assert sched.flush_cache() and sched.allocator.available_size() == sched.allocator.size


def test_speculation_keeps_one_row_products_on_cublas(tiny_llama):
    """Verify rows (M > 1) use F.linear, so with speculation on the one-row decode products must
    too (the Triton GEMV rounds differently); without it the process default comes back."""
    import radixlm.kernels as K

    with Engine(tiny_llama, device="cpu", **SPEC):
        assert K._SKINNY_GEMM is False
    with Engine(tiny_llama, device="cpu"):
        assert K._SKINNY_GEMM == K.SKINNY_GEMM_DEFAULT


def test_drafts_from_other_requests_keep_greedy_outputs(plain, spec):
    """Requests of one task, one after another: later ones draft from the earlier ones' tokens
    (the global n-gram store, on by default); outputs stay the plain engine's, slots come back."""
    e = plain[0]
    passages = [PASSAGE, PASSAGE.replace("Maria Alvarez", "Aiko Tanaka").replace("Lisbon", "Osaka"),
                PASSAGE.replace("Jonas Becker", "Kwame Mensah").replace("420 tons of wheat", "60 laptops")]
    texts = [chat(e.tokenizer, "Extract every person, date and quantity as JSON: {\"people\": [...], \"dates\": "
                  f"[...], \"quantities\": [...]}}.\n\n{p}") for p in passages]
    p = {"max_new_tokens": 32, "temperature": 0}
    want = [e.generate(t, p)["output_ids"] for t in texts]
    drafter = spec.scheduler.spec_drafter
    spec._call(drafter.clear_store)
    before = (drafter.store_draft_ct, drafter.store_draft_tokens, drafter.store_accepted_tokens)
    assert [spec.generate(t, p)["output_ids"] for t in texts] == want
    steps, tokens, accepted = (a - b for a, b in zip((drafter.store_draft_ct, drafter.store_draft_tokens,
                                                      drafter.store_accepted_tokens), before))
    assert steps > 0 and tokens >= steps and accepted > 0  # the store really drafted, and usefully
    assert drafter.store_capacity == spec.scheduler.args.speculative_ngram_capacity == 1_000_000
    assert_no_leak(spec)
