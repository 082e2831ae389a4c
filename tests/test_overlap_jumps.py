"""Jump-forward under overlap scheduling on CPU (issue 12): when steps run synchronously (after
admission) while constrained requests have jump-forward extends pending, the overlap restarts with
a jump step of all running requests (``OverlapScheduler._jump_from_sync``); the greedy outputs
equal the synchronous scheduler's, and that path did run."""

from __future__ import annotations

from radixlm.runtime.request import Req
from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.testing import make_scheduler, run_to_completion

SCHEMA = ('{"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}, '
          '"kind": {"enum": ["alpha", "beta"]}, "size": {"type": "integer", "minimum": 0, "maximum": 99}}, '
          '"required": ["name", "kind", "size"]}')
REGEX = r"(Step [0-9] is done\. ){2,5}"


def _run(path: str, overlap: bool):
    sched = make_scheduler(path, enable_overlap_schedule=overlap, enable_jump_forward=True)
    tok = sched.output_processor.tokenizer
    restarts = []
    if overlap:
        inner = sched._jump_from_sync

        def counted():
            got = inner()
            restarts.append(got is not None)
            return got

        sched._jump_from_sync = counted
    reqs = []
    for i in range(10):
        grammar = {"json_schema": SCHEMA} if i % 3 else ({"regex": REGEX} if i % 2 else {})
        reqs.append(Req(f"r{i}", tok.encode(f"{i}: record number {i} as data"),
                        SamplingParams(max_new_tokens=40, temperature=0, **grammar)))
    for g in ({"json_schema": SCHEMA}, {"regex": REGEX}):  # NOTE: compiled before the run starts
        warm = Req("warm", tok.encode("x"), SamplingParams(max_new_tokens=1, **g))
        sched.grammar.submit(warm)
        warm.grammar_future.result(timeout=300)
    outs = run_to_completion(sched, reqs, arrivals=[0, 0, 0, 2, 2, 4, 6, 6, 9, 12])
    return outs, [r.jump_forward_tokens for r in reqs], sum(restarts), sched


def test_jump_steps_from_synchronous_steps_keep_outputs(tiny_llama) -> None:
    plain, plain_jumps, _, _ = _run(tiny_llama, overlap=False)
    over, over_jumps, restarts, sched = _run(tiny_llama, overlap=True)
    assert sum(plain_jumps) > 0  # the grammars forced text
    assert over == plain
    assert restarts > 0 and sched.jump_steps >= restarts
