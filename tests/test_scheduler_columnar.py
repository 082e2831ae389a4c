"""The columnar decode path (``OutputProcessor.process_decode``, ``Scheduler._process_decode``)
leaves the same request states as the per-request path (``OutputProcessor.process``), on a mixed
batch and end to end."""

from __future__ import annotations

import pytest

from radixlm.runtime.batch import ReqSlice, ScheduleBatch, StepOutput
from radixlm.runtime.forward_batch import ForwardMode
from radixlm.runtime.output_processor import OutputProcessor
from radixlm.runtime.request import Req
from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.sampler import BAD_TOKEN
from radixlm.runtime.testing import make_scheduler, run_to_completion

PROMPT = "def add(a, b):\n    return a + b\n"


def _state(req: Req) -> tuple:
    text = req.detok.text if req.detok is not None else None
    return (req.rid, list(req.output_ids), req.finish_reason, req.status, req.kv_len, req.input_logprobs_done,
            list(req.output_logprobs), list(req.input_logprobs), text)


def _mixed(sched, per_request: bool) -> tuple[list[Req], list[StepOutput]]:
    """One request per kind of row, each with two outputs so far, and the token it samples."""
    op = sched.output_processor
    ids = op.tokenizer.encode(PROMPT)
    eos = min(op.eos)
    word = op.tokenizer.encode(" return")[-1]
    kinds = [  # (sampling params, return_logprob, sampled token, logprob)
        (SamplingParams(max_new_tokens=10), False, word),  # plain, goes on
        (SamplingParams(max_new_tokens=3), False, word),  # plain, max_new_tokens reached
        (SamplingParams(max_new_tokens=10, stop_token_ids=[word]), False, word),  # plain, stop id
        (SamplingParams(max_new_tokens=10), False, eos),  # plain, EOS
        (SamplingParams(max_new_tokens=10, ignore_eos=True), False, eos),  # plain, EOS ignored
        (SamplingParams(max_new_tokens=10, stop=[" return"]), False, word),  # stop string: per request
        (SamplingParams(max_new_tokens=10, stop=["zzz"]), False, word),  # stop string, no match
        (SamplingParams(max_new_tokens=10), True, word),  # logprobs: per request
        (SamplingParams(max_new_tokens=3), True, word),  # logprobs, max_new_tokens reached
        (SamplingParams(max_new_tokens=10), False, BAD_TOKEN),  # sampling failed: abort
        (SamplingParams(max_new_tokens=10 ** 6), False, word),  # context length reached
    ]
    reqs, outs = [], []
    for k, (sp, lp, tok) in enumerate(kinds):
        prompt = ids if k < len(kinds) - 1 else ids + [word] * (op.context_len - len(ids) - 3)
        req = Req(f"r{k}", list(prompt), sp, return_logprob=lp)
        op.init_req(req)
        if per_request:
            req.plain_check = None  # NOTE: every row through OutputProcessor.process
        for t in (word, word):
            req.output_ids.append(t)
            if req.detok is not None:
                req.detok.append(t)
        req.kv_len = req.num_tokens - 1
        req.input_logprobs_done = True
        reqs.append(req)
        outs.append(StepOutput(next_token_id=tok, next_logprob=-0.5 if lp else None, next_top=None))
    return reqs, outs


def test_columnar_and_per_request_paths_leave_the_same_states(tiny_llama):
    states, running, generated = [], [], []
    for per_request in (False, True):
        sched = make_scheduler(tiny_llama)
        reqs, outs = _mixed(sched, per_request)
        assert sum(r.plain_check is not None for r in reqs) == (0 if per_request else 7)
        sched.running = list(reqs)
        batch = ScheduleBatch(ForwardMode.DECODE, [ReqSlice(r, r.kv_len, r.kv_len + 1, True) for r in reqs])
        touched = sched._process(batch, outs)
        assert touched == reqs
        states.append([_state(r) for r in reqs])
        running.append([r.rid for r in sched.running])
        generated.append(sched.stats.generated_tokens)
    assert states[0] == states[1]
    assert running[0] == running[1]
    assert generated[0] == generated[1]
    reasons = {s[0]: s[2] for s in states[0]}
    assert reasons["r0"] is None and reasons["r4"] is None and reasons["r6"] is None and reasons["r7"] is None
    assert reasons["r1"]["type"] == "length" and reasons["r8"]["type"] == "length"
    assert reasons["r2"]["type"] == "stop" and reasons["r3"]["type"] == "stop" and reasons["r5"]["type"] == "stop"
    assert reasons["r9"]["type"] == "abort" and reasons["r10"]["type"] == "length"
    assert running[0] == ["r0", "r4", "r6", "r7"]


@pytest.mark.parametrize("overlap", [False, True])
def test_columnar_path_keeps_outputs_end_to_end(tiny_llama, monkeypatch, overlap):
    """Greedy and seeded requests with stop ids, stop strings, logprobs and EOS, run with and
    without the columnar path: the same tokens, finish reasons, texts and logprobs."""
    results, stop_ids = [], {}
    for columnar in (None, True, False):  # None: a first run picks the stop ids
        if columnar is False:
            init = OutputProcessor.init_req

            def per_request(self, req):
                init(self, req)
                req.plain_check = None  # NOTE: every row through OutputProcessor.process

            monkeypatch.setattr(OutputProcessor, "init_req", per_request)
        sched = make_scheduler(tiny_llama, enable_overlap_schedule=overlap and columnar is not None)
        tok = sched.output_processor.tokenizer
        reqs = []
        for i in range(12):
            kw = {"max_new_tokens": 6 + i % 5, "temperature": 0 if i % 3 else 0.8, "seed": i,
                  "ignore_eos": i % 2 == 0}
            if i % 4 == 1 and columnar is not None:
                kw["stop_token_ids"] = [stop_ids[i]]  # NOTE: sampled at (about) the 4th token
            if i % 4 == 2:
                kw["stop"] = ["e", "\n"]
            reqs.append(Req(f"r{i}", tok.encode(f"{i} def f(x):\n    return x * {i}"), SamplingParams(**kw),
                            return_logprob=i % 5 == 3))
        run_to_completion(sched, reqs, [i % 4 for i in range(len(reqs))])
        if columnar is None:
            stop_ids = {i: r.output_ids[min(3, len(r.output_ids) - 1)] for i, r in enumerate(reqs) if r.output_ids}
            continue
        results.append([(r.output_ids, r.finish_reason, r.detok.text, r.output_logprobs) for r in reqs])
    assert results[0] == results[1]
    assert any(r[1] == {"type": "stop", "matched": stop_ids[i]} for i, r in enumerate(results[0]) if i % 4 == 1)


def _long_run(tiny_llama, overlap: bool, abort_at: int | None = None):
    """16 requests, greedy and sampled (seeded), 24 tokens each (sampled rows see the same batch
    sizes in both schedulers, so the same logits bits): long overlapped chains (follow-up slices
    reused, req_to_token entries carried); with ``abort_at``, request r5 is aborted at that step
    (while a step is in flight)."""
    sched = make_scheduler(tiny_llama, enable_overlap_schedule=overlap)
    tok = sched.output_processor.tokenizer
    reqs = [Req(f"r{i}", tok.encode(f"{i}: the story of {i} apples"),
                SamplingParams(max_new_tokens=24, temperature=0.7 if i % 2 else 0, seed=i,
                               ignore_eos=True)) for i in range(16)]
    for r in reqs:
        sched.add_request(r)
    step = 0
    while sched.has_work():
        if step == abort_at:
            assert sched.abort("r5") is reqs[5]
        sched.step()
        step += 1
    texts = [r.detok.text for r in reqs]
    return [(r.output_ids, r.finish_reason) for r in reqs], texts, sched


@pytest.mark.parametrize("abort_at", [None, 9])
def test_overlapped_decode_chains_keep_outputs(tiny_llama, abort_at):
    """The overlap scheduler's reused follow-up state (DecodeFacts: slices, req_to_token
    entries, sampling columns) gives the outputs of the synchronous scheduler, also when a
    request is aborted mid-chain; the lazy detokenizers that read output_ids give the text of
    the ids; the KV accounting ends clean."""
    plain, plain_texts, _ = _long_run(tiny_llama, False, abort_at)
    over, over_texts, sched = _long_run(tiny_llama, True, abort_at)
    assert sched.jump_steps == 0 and sched.stats.num_decode_batches > 20
    if abort_at is None:
        assert over == plain and over_texts == plain_texts
    else:  # NOTE: batch sizes then differ (the abort lands a step later in the overlapped run), so
        # do sampled rows' logits bits and draws (the tiny model's distributions are flat): greedy rows
        assert [o for i, o in enumerate(over) if i % 2 == 0] == [o for i, o in enumerate(plain) if i % 2 == 0]
        assert over[5][1]["type"] == "abort" and plain[5][1]["type"] == "abort"
    tok = sched.output_processor.tokenizer
    for (ids, _), text in zip(over, over_texts):
        assert text == tok.decode(ids, skip_special_tokens=True)
    assert sched.allocator.available_size() + sched.tree_cache.evictable_size() == sched.allocator.size


def test_sampling_columns_give_the_same_draws():
    """``sample`` with prebuilt SamplingColumns (kept by the overlap scheduler per request set)
    draws what it draws building them itself."""
    import torch

    from radixlm.runtime.sampler import SamplingColumns, sample

    reqs = [Req(f"r{i}", [1, 2], SamplingParams(temperature=[0, 0.8, 1.3][i % 3], top_k=[0, 5][i % 2],
                                                 top_p=[1.0, 0.9][i % 2], seed=i if i % 4 == 0 else None))
            for i in range(12)]
    for i, r in enumerate(reqs):
        if r.sampling_params.seed is not None:
            r.generator = torch.Generator().manual_seed(i)
    logits = torch.randn(12, 50, generator=torch.Generator().manual_seed(0))
    logits[3] = float("nan")
    got = []
    for cols in (None, SamplingColumns.of(reqs, 50, logits.device)):
        for i, r in enumerate(reqs):
            if r.generator is not None:
                r.generator.manual_seed(i)
        got.append(sample(logits.clone(), reqs, torch.Generator().manual_seed(7), columns=cols).tolist())
    assert got[0] == got[1] and got[0][3] == BAD_TOKEN
    greedy = [Req("g", [1], SamplingParams(temperature=0))] * 12
    assert sample(logits.clone(), greedy, all_greedy=True).tolist() == sample(logits.clone(), greedy).tolist()


def test_all_plain_batches_finish_by_stop_id_and_length_alike(tiny_llama):
    """All-plain greedy batches (the overlap scheduler's one-pass path, whose finish checks run
    only when a token is some request's stop id or some request nears its length limit): stop
    ids, EOS and staggered length limits end the requests as in the synchronous scheduler."""
    results, stop_ids = [], {}
    for overlap in (False, False, True):
        sched = make_scheduler(tiny_llama, enable_overlap_schedule=overlap)
        tok = sched.output_processor.tokenizer
        reqs = []
        for i in range(12):
            kw = {"max_new_tokens": 10 + i, "temperature": 0, "ignore_eos": i % 3 != 0}
            if stop_ids and i % 4 == 1:
                kw["stop_token_ids"] = [stop_ids[i]]
            reqs.append(Req(f"r{i}", tok.encode(f"{i} def g(y):\n    return y + {i}"), SamplingParams(**kw)))
        run_to_completion(sched, reqs)
        if not stop_ids:
            stop_ids = {i: r.output_ids[4] for i, r in enumerate(reqs)}
            continue
        results.append([(r.output_ids, r.finish_reason) for r in reqs])
    assert results[0] == results[1]
    assert any(r[1] == {"type": "stop", "matched": stop_ids[i]} for i, r in enumerate(results[0]) if i % 4 == 1)
    assert any(r[1]["type"] == "length" for r in results[0])
