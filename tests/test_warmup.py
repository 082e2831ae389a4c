"""Server warm-up (runtime/warmup.py) on CPU with ``force``: it runs its requests through the
scheduler, then leaves no trace: the prefix cache is empty, the counters start from zero, and a
later workload's greedy outputs equal those of a scheduler that never warmed up."""

from __future__ import annotations

from radixlm.runtime.model_runner import ModelRunner
from radixlm.runtime.request import Req
from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.scheduler import Scheduler
from radixlm.runtime.server_args import ServerArgs
from radixlm.runtime.tokenizer import load_tokenizer
from radixlm.runtime.warmup import warm_up


def _scheduler(path: str) -> Scheduler:
    args = ServerArgs(model_path=path, device="cpu", max_total_tokens=8192, chunked_prefill_size=256)
    tok, eos = load_tokenizer(path, path)
    return Scheduler.create(args, ModelRunner(args, path, eos), tok)


def _run(sched: Scheduler, tok_ids: list[list[int]]) -> list[list[int]]:
    reqs = [Req(f"r{i}", ids, SamplingParams(max_new_tokens=12, temperature=0)) for i, ids in enumerate(tok_ids)]
    for r in reqs:
        sched.add_request(r)
    while sched.has_work():
        sched.step()
    return [list(r.output_ids) for r in reqs]


def test_warm_up_leaves_no_trace(tiny_llama):
    prompts = [[17 + 3 * i + j for j in range(20 + 5 * i)] for i in range(6)]
    cold = _scheduler(tiny_llama)
    assert warm_up(cold) == 0.0  # CPU: skipped unless forced
    reference = _run(cold, prompts)
    warm = _scheduler(tiny_llama)
    assert warm_up(warm, force=True) > 0.0
    assert warm.tree_cache.evictable_size() == 0 and warm.allocator.available_size() == warm.runner.max_total_tokens
    assert warm.stats.prompt_tokens == 0 and warm.stats.generated_tokens == 0 and warm._admitted_requests == 0
    assert _run(warm, prompts) == reference
    assert len({tuple(o) for o in reference}) > 3  # outputs vary across prompts
