"""Engine API: sampling, stopping, logprob semantics (DESIGN.md §3.2) and detokenization."""

from __future__ import annotations

import asyncio

import pytest
import torch

from radixlm.runtime.detokenizer import IncrementalDetokenizer
from radixlm.runtime.engine import Engine

PROMPT = "def parse(self, text):\n    "
GREEDY = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tiny_llama):
    with Engine(tiny_llama, device="cpu", max_total_tokens=4096) as e:
        yield e


@pytest.fixture(scope="module")
def hf(tiny_llama):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()


def _hf_logprobs(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_seeded_sampling_is_reproducible(engine):
    sp = {"max_new_tokens": 16, "temperature": 1.0, "top_p": 0.9, "top_k": 50, "seed": 1234, "ignore_eos": True}
    a = engine.generate(PROMPT, sp)["output_ids"]
    # Reproducible even when batched with other (unseeded) requests.
    batch = engine.generate([PROMPT, "import os", PROMPT], [sp, {"max_new_tokens": 8}, sp])
    assert batch[0]["output_ids"] == a and batch[2]["output_ids"] == a
    other = engine.generate(PROMPT, {**sp, "seed": 99})["output_ids"]
    assert other != a


def test_top_k_one_is_greedy(engine):
    greedy = engine.generate(PROMPT, GREEDY)["output_ids"]
    topk1 = engine.generate(PROMPT, {**GREEDY, "temperature": 1.0, "top_k": 1})["output_ids"]
    assert greedy == topk1


def test_max_new_tokens_and_prefill_only(engine):
    out = engine.generate(PROMPT, {**GREEDY, "max_new_tokens": 5})
    assert len(out["output_ids"]) == 5
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    pre = engine.generate(PROMPT, {"max_new_tokens": 0})
    assert pre["text"] == "" and pre["output_ids"] == []
    assert pre["meta_info"]["finish_reason"]["type"] == "length"


def test_stop_string_is_trimmed(engine):
    seeded = {"max_new_tokens": 24, "temperature": 1.0, "seed": 5, "ignore_eos": True}
    text = engine.generate(PROMPT, seeded)["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), f"unusable stop string from {text!r}"
    out = engine.generate(PROMPT, {**seeded, "stop": [stop, "\x00never"]})
    assert out["text"] == text[: text.index(stop)]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_stop_token_ids_and_min_new_tokens(engine):
    ids = engine.generate(PROMPT, GREEDY)["output_ids"]
    stop_id = ids[4]
    out = engine.generate(PROMPT, {**GREEDY, "stop_token_ids": [stop_id]})
    first = ids.index(stop_id)
    assert out["output_ids"] == ids[: first + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    # min_new_tokens forbids the stop id until enough tokens exist.
    first_id = ids[0]
    out = engine.generate(PROMPT, {**GREEDY, "stop_token_ids": [first_id], "min_new_tokens": 3})
    assert len(out["output_ids"]) >= 3 and first_id not in out["output_ids"][:3]


def test_eos_stops_unless_ignored(engine):
    ids = engine.generate(PROMPT, GREEDY)["output_ids"]
    # Make the 3rd greedy token an EOS for this engine, then check both behaviours.
    eos = ids[2]
    proc = engine.scheduler.output_processor
    saved = set(proc.eos)
    proc.eos = saved | {eos}
    try:
        out = engine.generate(PROMPT, {**GREEDY, "ignore_eos": False})
        assert out["output_ids"] == ids[: ids.index(eos) + 1]
        assert engine.generate(PROMPT, GREEDY)["output_ids"] == ids
    finally:
        proc.eos = saved


def test_penalties_change_greedy_output(engine):
    base = engine.generate(PROMPT, GREEDY)["output_ids"]
    pen = engine.generate(PROMPT, {**GREEDY, "frequency_penalty": 2.0})["output_ids"]
    assert pen != base
    # A repeated token under a strong repetition penalty appears less often.
    rep = engine.generate(PROMPT, {**GREEDY, "repetition_penalty": 2.0})["output_ids"]
    assert max(rep.count(t) for t in set(rep)) <= max(base.count(t) for t in set(base))


def test_n_samples_share_prompt(engine):
    outs = engine.generate(PROMPT, {"max_new_tokens": 8, "n": 3, "seed": 7, "ignore_eos": True})
    assert isinstance(outs, list) and len(outs) == 3
    assert len({tuple(o["output_ids"]) for o in outs}) > 1


def test_output_logprobs_match_hf(engine, hf):
    out = engine.generate(PROMPT, GREEDY, return_logprob=True, top_logprobs_num=3)
    prompt = engine.tokenizer.encode(PROMPT)
    ref = _hf_logprobs(hf, prompt + out["output_ids"])
    entries = out["meta_info"]["output_token_logprobs"]
    assert [e[1] for e in entries] == out["output_ids"]
    for k, (lp, tid, _) in enumerate(entries):
        assert abs(lp - ref[len(prompt) - 1 + k, tid].item()) <= 1e-4
    top = out["meta_info"]["output_top_logprobs"]
    assert all(len(t) == 3 and t[0][1] == e[1] for t, e in zip(top, entries))  # greedy = top-1


@pytest.mark.parametrize("start", [0, 3, -1])
def test_input_logprobs_follow_protocol(engine, hf, start):
    prompt = engine.tokenizer.encode(PROMPT)
    out = engine.generate(PROMPT, {**GREEDY, "max_new_tokens": 2}, return_logprob=True, logprob_start_len=start)
    entries = out["meta_info"]["input_token_logprobs"]
    begin = len(prompt) - 1 if start == -1 else start
    assert [e[1] for e in entries] == prompt[begin:]
    assert entries[0][0] is None
    ref = _hf_logprobs(hf, prompt)
    for k in range(1, len(entries)):
        assert abs(entries[k][0] - ref[begin + k - 1, prompt[begin + k]].item()) <= 1e-4
    # Prefill-only with the default start returns no input logprobs.
    pre = engine.generate(PROMPT, {"max_new_tokens": 0}, return_logprob=True)
    assert pre["meta_info"]["input_token_logprobs"] == []


def test_input_logprobs_bypass_cached_prefix(engine, hf):
    """A cached prompt must still yield every requested input logprob (no reuse past start)."""
    engine.generate(PROMPT, {"max_new_tokens": 0})  # cache the prompt
    prompt = engine.tokenizer.encode(PROMPT)
    out = engine.generate(PROMPT, {"max_new_tokens": 1}, return_logprob=True, logprob_start_len=1)
    entries = out["meta_info"]["input_token_logprobs"]
    assert len(entries) == len(prompt) - 1 and all(e[0] is not None for e in entries[1:])
    assert out["meta_info"]["cached_tokens"] <= 1


def test_stream_yields_cumulative_text(engine):
    full = engine.generate(PROMPT, GREEDY)
    chunks = list(engine.generate(PROMPT, GREEDY, stream=True))
    assert chunks[-1]["text"] == full["text"] and chunks[-1]["output_ids"] == full["output_ids"]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))


def test_async_generate(engine):
    async def go():
        outs = await asyncio.gather(*(engine.async_generate(PROMPT, GREEDY) for _ in range(3)))
        chunks = [c async for c in await engine.async_generate(PROMPT, GREEDY, stream=True)]
        return outs, chunks

    outs, chunks = asyncio.run(go())
    expected = engine.generate(PROMPT, GREEDY)["output_ids"]
    assert all(o["output_ids"] == expected for o in outs)
    assert chunks[-1]["output_ids"] == expected


def test_invalid_sampling_params_raise(engine):
    with pytest.raises(ValueError, match="top_p"):
        engine.generate(PROMPT, {"top_p": 0})
    with pytest.raises(ValueError, match="temperature"):
        engine.generate(PROMPT, {"temperature": -1})
    assert engine.generate(PROMPT, {"max_new_tokens": 1, "unknown_key": 1})["output_ids"]


def test_flush_cache_returns_pool(engine):
    engine.generate([PROMPT, PROMPT + "x = 1"], GREEDY)
    assert engine.flush_cache()
    info = engine.get_server_info()
    assert info["kv_available_tokens"] == info["max_total_num_tokens"]


def test_detokenizer_never_splits_utf8(tiny_llama):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    text = "héllo wörld ✓ 日本語 — done"
    ids = tok.encode(text)
    assert len(ids) > len(text.split())  # multi-byte characters span several tokens
    detok = IncrementalDetokenizer(tok, [])
    pieces = [detok.append(t) for t in ids] + [detok.flush()]
    assert "".join(pieces) == text == detok.text
    assert all("\ufffd" not in p for p in pieces)


def test_lazy_detokenizer_gives_the_eager_text(tiny_llama):
    """Lazy (the server's scheduler, no stop strings): nothing is decoded until ``text`` is read,
    and then the text equals the eager one, held-back bytes included after ``flush``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    ids = tok.encode("héllo wörld ✓ 日本語 — done")
    prompt = tok.encode("Say:")
    eager, lazy = IncrementalDetokenizer(tok, prompt), IncrementalDetokenizer(tok, prompt, lazy=True)
    for k, t in enumerate(ids):
        eager.append(t)
        assert lazy.append(t) == ""
        if k == len(ids) // 2:
            assert lazy.text == eager.text  # read mid-way, then keeps going
    assert lazy.flush() == "" and lazy.text == eager.text + eager.flush() == eager.text
    with_stop = IncrementalDetokenizer(tok, prompt, stop=["wörld"], lazy=True)  # stop strings: eager
    assert any([with_stop.append(t) for t in ids])  # decoded as it goes
    assert with_stop.text == "héllo " and with_stop.matched_stop == "wörld"


def test_default_model_is_created_on_first_use():
    """No model path: SmolLM2-135M-Instruct, converted from the wheel's GGUF into the cache."""
    import json
    import os

    from radixlm.runtime.default_model import cache_dir, default_model_path

    path = default_model_path()
    assert path.startswith(cache_dir()) and os.path.exists(os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (30, 576, 49152)
    with Engine(device="cpu", max_total_tokens=256) as e:
        assert e.server_args.model_path == path
        assert e.generate("The capital of France is", {"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2


def _pool_is_back(e: Engine) -> None:
    assert e.flush_cache()
    info = e.get_server_info()
    assert info["kv_available_tokens"] == info["max_total_num_tokens"]
    assert info["req_rows_available"] == info["req_rows_total"]


BATCH = [PROMPT, "import os", "class A:"]


def test_failed_step_is_retried_per_request(tiny_llama, engine):
    """A transient exception inside a batch's forward pass: every request is retried alone and
    finishes with the output it has alone; nothing leaks."""
    alone = [engine.generate(p, GREEDY)["output_ids"] for p in BATCH]
    with Engine(tiny_llama, device="cpu", max_total_tokens=1024) as e:
        real_run, calls = e.runner.run, {"n": 0}

        def flaky(batch):
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("injected failure")
            return real_run(batch)

        e.runner.run = flaky
        out = e.generate(BATCH, GREEDY)
        assert [o["output_ids"] for o in out] == alone
        assert all(o["meta_info"]["finish_reason"]["type"] == "length" for o in out)
        _pool_is_back(e)


def test_poisoned_request_fails_alone(tiny_llama, engine):
    """A request that always breaks the step (here: the runner raises whenever it is in the
    batch) ends with an error status; the others finish as if alone; nothing leaks."""
    alone = [engine.generate(p, GREEDY)["output_ids"] for p in BATCH]
    with Engine(tiny_llama, device="cpu", max_total_tokens=1024) as e:
        real_run = e.runner.run

        def poisoned(batch):
            if any(r.rid == "bad" for r in batch.reqs) and any(len(r.output_ids) >= 2 for r in batch.reqs):
                raise OverflowError("injected poison")
            return real_run(batch)

        e.runner.run = poisoned
        out = e.generate(BATCH + ["bad prompt"], GREEDY, rid=["a", "b", "c", "bad"])
        assert [o["output_ids"] for o in out[:3]] == alone
        reason = out[3]["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and reason["status_code"] == 500 and "injected poison" in reason["message"]
        assert e.generate(PROMPT, GREEDY)["output_ids"] == alone[0]
        _pool_is_back(e)


@pytest.mark.parametrize("field, value", [("repetition_penalty", 1e-300), ("top_k", 2**64),
                                          ("temperature", float("inf")), ("top_p", float("nan"))])
def test_poisoned_sampling_value_fails_alone(tiny_llama, engine, field, value):
    """A sampling value that slipped past validation breaks only its own row of the sampler."""
    alone = [engine.generate(p, GREEDY)["output_ids"] for p in BATCH]
    with Engine(tiny_llama, device="cpu", max_total_tokens=1024) as e:
        sampled = {"max_new_tokens": 24, "temperature": 1.0, "ignore_eos": True}
        reqs = e._make_reqs(BATCH + ["poison"], [GREEDY] * 3 + [sampled], None, False, None, None, None)[1]
        object.__setattr__(reqs[3][0].sampling_params, field, value)  # NOTE: bypasses validation
        import queue

        done: queue.Queue = queue.Queue()
        for (r,) in reqs:
            r.sink = lambda req: done.put(req) if req.finished else None
            e._inbox.put(("add", r))
        got = {r.rid: r for r in (done.get(timeout=60) for _ in reqs)}
        assert [got[r.rid].output_ids for (r,) in reqs[:3]] == alone
        bad = got[reqs[3][0].rid].finish_reason
        if field in ("temperature", "top_k"):  # absorbed: uniform sampling / no top-k limit
            assert bad["type"] == "length"
        else:
            assert bad["type"] == "abort" and bad["status_code"] in (400, 500), bad
        _pool_is_back(e)


def test_overlap_schedule_matches_plain_engine(tiny_llama, engine):
    """Stop strings, stop ids, seeds and lengths give the same outputs with overlap scheduling."""
    seeded = {"max_new_tokens": 24, "temperature": 1.0, "seed": 5, "ignore_eos": True}
    text = engine.generate(PROMPT, seeded)["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cases = [
        (PROMPT, GREEDY),
        (PROMPT, seeded),
        (PROMPT, {**seeded, "stop": [stop]}),
        ("import os", {**GREEDY, "max_new_tokens": 3}),
        ("class A:", {**GREEDY, "frequency_penalty": 1.0}),
    ]
    prompts, sps = [c[0] for c in cases], [c[1] for c in cases]
    plain = engine.generate(prompts, sps)
    with Engine(tiny_llama, device="cpu", max_total_tokens=4096, enable_overlap_schedule=True) as e:
        overlapped = e.generate(prompts, sps)
        alone = [e.generate(p, sp) for p, sp in cases]
        assert e.flush_cache()
    for a, b, c in zip(plain, overlapped, alone):
        assert a["output_ids"] == b["output_ids"] == c["output_ids"]
        assert a["text"] == b["text"] and a["meta_info"]["finish_reason"] == b["meta_info"]["finish_reason"]


def test_stop_regex_trims_and_reports_pattern(engine):
    free = engine.generate(PROMPT, GREEDY)["text"]
    piece = free[len(free) // 2 : len(free) // 2 + 2]
    pattern = "".join("\\" + c if not c.isalnum() else c for c in piece) + "|zzzzqqq"
    out = engine.generate(PROMPT, {**GREEDY, "stop_regex": [pattern]})
    assert out["text"] == free[: free.find(piece)]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    with pytest.raises(ValueError, match="stop_regex"):
        engine.generate(PROMPT, {**GREEDY, "stop_regex": "("})


def _hf_greedy_with_bias(hf, ids: list[int], bias: dict[int, float], steps: int) -> list[int]:
    out = []
    for _ in range(steps):
        logits = _hf_logprobs(hf, ids + out)[-1]
        for t, b in bias.items():
            logits[t] += b
        out.append(int(torch.argmax(logits)))
    return out


def test_logit_bias_matches_hf_and_stays_in_its_row(engine, hf):
    """OpenAI ``logit_bias``: greedy decoding with a bias equals HF greedy over logits + bias
    (a -100 ban on the unbiased first token, +4 on two runners-up), and an unbiased request in
    the same batch keeps its own output."""
    ids = engine.tokenizer.encode(PROMPT)
    first = _hf_logprobs(hf, ids)[-1]
    ranked = torch.argsort(first, descending=True).tolist()
    bias = {ranked[0]: -100.0, ranked[3]: 4.0, ranked[7]: 4.0}
    want = _hf_greedy_with_bias(hf, ids, bias, 12)
    plain = engine.generate(PROMPT, {**GREEDY, "max_new_tokens": 12})["output_ids"]
    assert want != plain  # the bias changes this model's greedy output
    # JSON-style string keys, as an OpenAI body carries them
    biased = {**GREEDY, "max_new_tokens": 12, "logit_bias": {str(t): b for t, b in bias.items()}}
    both = engine.generate([PROMPT, PROMPT], [biased, {**GREEDY, "max_new_tokens": 12}])
    assert both[0]["output_ids"] == want
    assert both[1]["output_ids"] == plain
    forced = engine.generate(PROMPT, {**GREEDY, "max_new_tokens": 5, "logit_bias": {ranked[50]: 100}})
    assert forced["output_ids"] == [ranked[50]] * 5


@pytest.mark.parametrize("bias,needle", [
    ({"7": 101}, "logit_bias"), ({"seven": 1.0}, "logit_bias"), ({"-3": 1.0}, "logit_bias"),
    ({"7": float("nan")}, "logit_bias"),
])
def test_logit_bias_validation_names_the_field(bias, needle):
    from radixlm.runtime.sampling_params import SamplingParams

    with pytest.raises(ValueError, match=needle):
        SamplingParams.from_dict({"logit_bias": bias})
    assert SamplingParams.from_dict({"logit_bias": {"7": -100, 9: 0.5}}).logit_bias == {7: -100.0, 9: 0.5}
    assert SamplingParams.from_dict({"logit_bias": {}}).logit_bias is None
