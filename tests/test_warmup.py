"""Server warm-up (runtime/warmup.py) on CPU with ``force``, on the real default model: it runs
its requests through the scheduler, then leaves no trace: the prefix cache is empty, the counters
start from zero, and later chat requests' greedy outputs equal those of a scheduler that never
warmed up."""

from __future__ import annotations

from radixlm.runtime.request import Req
from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.testing import make_scheduler, run_to_completion
from radixlm.runtime.warmup import warm_up

QUESTIONS = ["Name a fruit that is red.", "What is the capital of France?", "Write a haiku about rain.",
             "How many legs does a spider have?", "Give me a synonym for happy.", "What color is the sky at night?"]


def _run(sched) -> list[list[int]]:
    tok = sched.output_processor.tokenizer
    reqs = []
    for i, q in enumerate(QUESTIONS):
        ids = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=True, add_generation_prompt=True,
                                      return_dict=False)
        reqs.append(Req(f"r{i}", ids, SamplingParams(max_new_tokens=16, temperature=0)))
    return run_to_completion(sched, reqs, arrivals=[0, 0, 1, 3, 3, 5])


def test_warm_up_leaves_no_trace() -> None:
    from radixlm.runtime.default_model import default_model_path

    path = default_model_path()
    cold = make_scheduler(path, chunked_prefill_size=256)
    assert warm_up(cold) == 0.0  # CPU: skipped unless forced
    reference = _run(cold)
    warm = make_scheduler(path, chunked_prefill_size=256)
    assert warm_up(warm, force=True) > 0.0
    assert warm.tree_cache.evictable_size() == 0 and warm.allocator.available_size() == warm.runner.max_total_tokens
    assert warm.stats.prompt_tokens == 0 and warm.stats.generated_tokens == 0 and warm._admitted_requests == 0
    assert _run(warm) == reference
    assert len({tuple(o) for o in reference}) == len(QUESTIONS)  # every answer differs
