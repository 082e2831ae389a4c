"""Continuous batching: outputs do not depend on batching, arrival order, chunked prefill,
retraction or the prefix cache (DESIGN.md §4, batching invariance)."""

from __future__ import annotations

import pytest

from radixlm.runtime.request import Req
from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.scheduler import Scheduler
from radixlm.runtime.testing import make_scheduler, run_to_completion

SNIPPETS = [
    "import os\nimport sys\n",
    "def add(a, b):\n    return a + b\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n",
    "for i in range(10):\n    print(i)",
    "# Licensed under the Python Software Foundation License",
    "try:\n    import json\nexcept ImportError:\n    json = None",
    "x = {'a': 1, 'b': [1, 2, 3]}",
    "while True:\n    line = f.readline()\n    if not line:\n        break",
    "async def fetch(session, url):\n    async with session.get(url) as r:",
    "return",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "raise ValueError('bad value: %r' % (value,))",
    "@property\ndef name(self):\n    return self._name",
    "with open(path, encoding='utf-8') as f:\n    data = f.read()",
    "if __name__ == '__main__':\n    main()",
    "lambda x: x * 2",
]


def make_req(sched: Scheduler, i: int, prompt: str, max_new: int = 20) -> Req:
    ids = sched.output_processor.tokenizer.encode(prompt)
    sp = SamplingParams(max_new_tokens=max_new, temperature=0, ignore_eos=True)
    return Req(f"r{i}", ids, sp)


def run(sched: Scheduler, reqs: list[Req], arrivals: list[int] | None = None) -> list[list[int]]:
    return run_to_completion(sched, reqs, arrivals)


@pytest.fixture(scope="module")
def alone(tiny_llama) -> list[list[int]]:
    sched = make_scheduler(tiny_llama, disable_radix_cache=True)
    return [run(sched, [make_req(sched, i, p)])[0] for i, p in enumerate(SNIPPETS)]


@pytest.mark.parametrize("disable_radix_cache", [True, False])
def test_staggered_arrivals_with_small_chunks_match_alone(tiny_llama, alone, disable_radix_cache):
    sched = make_scheduler(tiny_llama, chunked_prefill_size=8, disable_radix_cache=disable_radix_cache)
    reqs = [make_req(sched, i, p) for i, p in enumerate(SNIPPETS)]
    arrivals = [(i * 3) % 17 for i in range(len(reqs))]
    assert run(sched, reqs, arrivals) == alone
    assert sched.stats.num_prefill_batches > len(SNIPPETS)  # chunking really happened


@pytest.mark.parametrize("max_total_tokens", [4096, 200])
def test_overlap_schedule_keeps_outputs(tiny_llama, alone, max_total_tokens):
    sched = make_scheduler(tiny_llama, enable_overlap_schedule=True, max_total_tokens=max_total_tokens)
    reqs = [make_req(sched, i, p, max_new=20 - (i % 5)) for i, p in enumerate(SNIPPETS)]
    arrivals = [(i * 5) % 23 for i in range(len(reqs))]
    outs = run(sched, reqs, arrivals)
    assert outs == [a[: 20 - (i % 5)] for i, a in enumerate(alone)]
    assert sched.stats.num_decode_batches > 0
    assert sched.flush_cache()
    assert sched.allocator.available_size() == sched.allocator.size


def test_retraction_keeps_outputs(tiny_llama, alone):
    # 16 requests need ~16 * (20 + 20) = 640 slots at once; the pool has 200.
    sched = make_scheduler(tiny_llama, max_total_tokens=200, disable_radix_cache=True)
    reqs = [make_req(sched, i, p) for i, p in enumerate(SNIPPETS)]
    assert run(sched, reqs) == alone
    assert sched.stats.num_retracted > 0
    assert sched.allocator.available_size() == sched.allocator.size


def test_retraction_with_radix_cache(tiny_llama, alone):
    sched = make_scheduler(tiny_llama, max_total_tokens=200)
    reqs = [make_req(sched, i, p) for i, p in enumerate(SNIPPETS)]
    assert run(sched, reqs) == alone
    assert sched.stats.num_retracted > 0
    assert sched.flush_cache()
    assert sched.allocator.available_size() == sched.allocator.size


def test_max_running_requests_is_respected(tiny_llama, alone):
    sched = make_scheduler(tiny_llama, max_running_requests=3)
    reqs = [make_req(sched, i, p) for i, p in enumerate(SNIPPETS)]
    for r in reqs:
        sched.add_request(r)
    peak = 0
    while sched.has_work():
        sched.step()
        peak = max(peak, len(sched.running))
    assert peak == 3
    assert [r.output_ids for r in reqs] == alone


@pytest.mark.parametrize("pool, expected", [(1024, 16), (16384, 64), (10**6, 1024)])
def test_max_running_requests_derived_from_kv_pool(tiny_llama, pool, expected):
    """Unset, the concurrency cap follows the KV pool (one request per 256 tokens, in [16, 1024])
    and the req_to_token table has a row for each (plus headroom and the padding row)."""
    sched = make_scheduler(tiny_llama, max_total_tokens=pool)
    assert sched.runner.max_running_requests == expected == sched.server_info()["max_running_requests"]
    assert sched.req_to_token_pool.size > expected


def test_mixed_batch_decodes_running_requests_during_a_prefill(tiny_llama, alone):
    """A late arrival's prefill carries one decode token of every running request, so the
    running requests advance in the same step (and outputs stay those of running alone)."""
    sched = make_scheduler(tiny_llama)
    reqs = [make_req(sched, i, p) for i, p in enumerate(SNIPPETS)]
    sched.add_request(reqs[0])
    sched.step()  # prefill of request 0
    before = len(reqs[0].output_ids)
    sched.add_request(reqs[1])
    sched.step()  # prefill of request 1 mixed with a decode of request 0
    assert len(reqs[0].output_ids) == before + 1 and len(reqs[1].output_ids) == 1
    assert sched.stats.num_mixed_batches == 1 and sched.stats.num_decode_batches == 0
    assert run(sched, reqs[2:]) == alone[2:]
    while sched.has_work():
        sched.step()
    assert [r.output_ids for r in reqs[:2]] == alone[:2]


def test_oversized_prompt_is_rejected(tiny_llama):
    sched = make_scheduler(tiny_llama, max_total_tokens=16)
    with pytest.raises(ValueError, match="KV"):
        sched.add_request(make_req(sched, 0, SNIPPETS[10]))
    with pytest.raises(ValueError, match="empty"):
        sched.add_request(Req("e", [], SamplingParams()))


def test_overlap_schedule_defaults_to_the_device():
    from radixlm.runtime.server_args import ServerArgs

    assert ServerArgs(device="cpu").enable_overlap_schedule is False
    assert ServerArgs(device="cuda").enable_overlap_schedule is True
    assert ServerArgs(device="cuda", enable_overlap_schedule=False).enable_overlap_schedule is False
    assert ServerArgs(device="cpu", enable_overlap_schedule=True).enable_overlap_schedule is True


def test_admission_is_skipped_while_every_waiting_grammar_compiles(tiny_llama, monkeypatch):
    """While all waiting requests wait for grammar compiles, steps do no admission work (no
    priority pass that would compete with the compile thread for the GIL) and running requests
    keep decoding; a compile that fails then aborts its request at the next step."""
    from concurrent.futures import Future

    sched = make_scheduler(tiny_llama)
    running = make_req(sched, 0, SNIPPETS[0])
    sched.add_request(running)
    sched.step()
    blocked = make_req(sched, 1, SNIPPETS[1])
    sched.add_request(blocked)
    blocked.grammar_future = compiling = Future()  # as if its grammar were being compiled
    calls = []
    priority = sched.policy.calc_priority
    monkeypatch.setattr(sched.policy, "calc_priority", lambda waiting: (calls.append(len(waiting)), priority(waiting))[1])
    before = len(running.output_ids)
    for _ in range(3):
        sched.step()
    assert calls == [] and len(running.output_ids) == before + 3 and blocked in sched.waiting
    compiling.set_exception(ValueError("unsupported keyword"))
    sched.step()
    assert calls and blocked.finished and "invalid grammar" in blocked.finish_reason["message"]


def test_a_burst_waiting_on_one_compile_polls_it_once_per_step(tiny_llama, monkeypatch):
    """Requests that share one grammar compile (a burst with one schema) cost one poll per step
    while it runs, not one per request (the scan runs with the GIL the compile thread needs);
    a compile that fails then ends every request waiting on it at the next step."""
    from concurrent.futures import Future

    sched = make_scheduler(tiny_llama)
    shared, other = Future(), Future()
    burst = [make_req(sched, i, SNIPPETS[i % 4]) for i in range(12)]
    for i, req in enumerate(burst):
        sched.add_request(req)
        req.grammar_future = other if i == 5 else shared
    polled = []
    poll = sched.grammar.poll
    monkeypatch.setattr(sched.grammar, "poll", lambda req: (polled.append(req.rid), poll(req))[1])
    for _ in range(2):
        polled.clear()
        sched.step()
        assert sorted(polled) == ["r0", "r5"] and all(r in sched.waiting for r in burst)
    shared.set_exception(ValueError("unsupported keyword"))
    sched.step()
    assert [r.finished for r in burst] == [i != 5 for i in range(12)]


def test_mixed_batches_cap_the_prefill_chunk_while_requests_decode(tiny_llama, alone):
    """While requests decode, a prompt is prefilled in mixed_chunk_size pieces (each running
    request's next token waits for that forward); alone, it takes chunked_prefill_size pieces.
    Outputs stay those of running alone."""
    sched = make_scheduler(tiny_llama, mixed_chunk_size=4, chunked_prefill_size=64)
    longest = max(range(len(SNIPPETS)), key=lambda i: len(SNIPPETS[i]))
    first, late = make_req(sched, 0, SNIPPETS[0]), make_req(sched, longest, SNIPPETS[longest])
    assert len(late.origin_input_ids) > 8
    sched.add_request(first)
    sched.step()  # request 0 alone: its whole prompt in one chunk
    assert first.kv_len == len(first.origin_input_ids)
    sched.add_request(late)
    sched.step()  # mixed: 4 prompt tokens of the late request + request 0's decode token
    assert late.kv_len == 4 and sched.stats.num_mixed_batches == 1
    while sched.has_work():
        sched.step()
    assert [first.output_ids, late.output_ids] == [alone[0], alone[longest]]


@pytest.mark.parametrize("params, expected", [(None, 8192), (4e9, 4096), (8e9, 2048), (70e9, 2048)])
def test_mixed_chunk_size_scales_inversely_with_model_size(tiny_llama, monkeypatch, params, expected):
    """Default mixed-batch prefill: 2,048 tokens per 8B parameters, scaled inversely, within
    [2048, chunked_prefill_size] (a tiny model gets the whole chunked prefill size)."""

    class Count:
        def numel(self) -> int:
            return int(params)

    sched = make_scheduler(tiny_llama, chunked_prefill_size=8192)
    if params is not None:
        monkeypatch.setattr(sched.runner.model, "parameters", lambda: iter([Count()]))
    assert sched.mixed_chunk_size == expected
    assert make_scheduler(tiny_llama, mixed_chunk_size=300).mixed_chunk_size == 300


def test_mixed_chunk_budget_follows_the_decode_batch_cost():
    """The chunk costs ``ratio`` decode steps: more KV read per decode step, longer chunks, within
    [floor, cap]; Llama-3.1-8B-like figures: a heavy unshared batch keeps the full 2,048, a batch
    of short or shared contexts gets about 1,000."""
    from radixlm.runtime.mixed_chunk import mixed_chunk_budget

    l8b = dict(params=8_000_000_000, weight_bytes=16_000_000_000, kv_bytes_per_token=131_072, cap=2048,
               balance=175.0)
    light, heavy = mixed_chunk_budget(decode_kv_tokens=200_000, **l8b), mixed_chunk_budget(decode_kv_tokens=600_000, **l8b)
    assert 800 < light < 1200 and heavy == 2048
    assert mixed_chunk_budget(decode_kv_tokens=0, **l8b) == 512  # the floor
    assert mixed_chunk_budget(decode_kv_tokens=0, **{**l8b, "cap": 300}) == 300  # the cap wins
    more = [mixed_chunk_budget(decode_kv_tokens=n, **{**l8b, "cap": 10**6}) for n in (1e5, 2e5, 4e5)]
    assert more == sorted(more) and more[0] < more[-1]


def test_mixed_chunk_budget_counts_a_decode_steps_fixed_time():
    """A small model's decode step is mostly per-layer fixed time, not bytes: with that time
    counted (``step_fixed_bytes``), SmolLM2-135M-like figures at a few hundred rows keep the full
    8,192-token chunk that bytes alone cut to about half; the 8B's light batch moves little."""
    from radixlm.runtime.mixed_chunk import mixed_chunk_budget, step_fixed_bytes

    small = dict(params=135_000_000, weight_bytes=270_000_000, kv_bytes_per_token=23_040, cap=8192,
                 balance=175.0, decode_kv_tokens=100_000)
    assert mixed_chunk_budget(**small) < 6000
    assert mixed_chunk_budget(**small, fixed_bytes=step_fixed_bytes(30, "cuda")) == 8192
    assert step_fixed_bytes(30, "no-such-device") == 0.0
    l8b = dict(params=8_000_000_000, weight_bytes=16_000_000_000, kv_bytes_per_token=131_072, cap=2048,
               balance=175.0, decode_kv_tokens=200_000)
    plain, fixed = mixed_chunk_budget(**l8b), mixed_chunk_budget(**l8b, fixed_bytes=step_fixed_bytes(32, "cuda"))
    assert plain < fixed < 1.15 * plain


def test_mixed_budget_shrinks_for_a_light_decode_batch(tiny_llama, monkeypatch):
    """``mixed_chunk_policy="cost"`` with a cost model for the device: the mixed chunk follows the
    KV of the decode batch the queue heads to, within ``mixed_chunk_size``; with the default
    ``fixed`` policy it is the fixed size; a device without a model is a clear error."""
    from radixlm.runtime import mixed_chunk

    with pytest.raises(ValueError, match="no cost model for device 'cpu'"):
        make_scheduler(tiny_llama, mixed_chunk_policy="cost")
    monkeypatch.setitem(mixed_chunk.MACHINE_BALANCE, "cpu", 175.0)
    sched = make_scheduler(tiny_llama, chunked_prefill_size=8192, mixed_chunk_policy="cost")
    fixed = sched.mixed_chunk_size
    assert sched._mixed_budget() == fixed  # nothing admitted yet: no mean prompt to go by
    req = make_req(sched, 0, SNIPPETS[0])
    sched.add_request(req)
    sched.step()
    light = sched._mixed_budget()
    assert light < fixed
    for i in range(1, 64):  # a long queue: the batch it heads to reads more KV
        sched.add_request(make_req(sched, i, SNIPPETS[i % len(SNIPPETS)] * 4))
    assert sched._mixed_budget() > light
    capped = make_scheduler(tiny_llama, chunked_prefill_size=8192, mixed_chunk_size=300, mixed_chunk_policy="cost")
    for i in range(64):
        capped.add_request(make_req(capped, i, SNIPPETS[i % len(SNIPPETS)] * 4))
    capped.step()
    assert capped._mixed_budget() <= 300  # the explicit size caps the model's chunk
    assert sched.args.mixed_chunk_policy == "cost"
    assert make_scheduler(tiny_llama).args.mixed_chunk_policy == "cost"  # auto: the device has a model
    monkeypatch.delitem(mixed_chunk.MACHINE_BALANCE, "cpu")
    default = make_scheduler(tiny_llama, chunked_prefill_size=8192)
    default.add_request(make_req(default, 0, SNIPPETS[0]))
    default.step()
    assert default.args.mixed_chunk_policy == "fixed" and default._mixed_budget() == default.mixed_chunk_size  # auto on CPU
    with pytest.raises(ValueError, match="mixed_chunk_policy"):
        make_scheduler(tiny_llama, mixed_chunk_policy="adaptive")


def test_engine_rejection_carries_a_400_status(tiny_llama):
    """A request the scheduler refuses at admission (prompt bigger than the KV pool) finishes as
    an abort with ``status_code`` 400 in-process too, as the server answers it (clients such as
    the DSL interpreter fail the program on it instead of reading an empty output)."""
    from radixlm.runtime.engine import Engine

    with Engine(tiny_llama, device="cpu", max_total_tokens=64) as e:
        out = e.generate(input_ids=list(range(5, 105)), sampling_params={"max_new_tokens": 2})
        reason = out["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and reason["status_code"] == 400 and "KV" in reason["message"], reason
        ok = e.generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 2, "temperature": 0})
        assert ok["meta_info"]["finish_reason"]["type"] == "length"  # the engine keeps serving
