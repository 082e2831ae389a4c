"""GPU: the engine with Triton kernels + CUDA graphs gives the same greedy outputs as the torch
reference path (skipped without CUDA; run by benchmarks/gpu_check.sh on the H200)."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

PROMPTS = [
    "def fibonacci(n):",
    "import json\n\ndef load(path):\n    with open(path) as f:",
    "class LRUCache:\n    def __init__(self, capacity):\n        self.capacity = capacity",
    "# Licensed under the Python Software Foundation License",
    "for i in range(10):",
    "x",
]
GREEDY = {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}


def _outputs(path: str, force_torch: bool, **kw) -> list[list[int]]:
    from radixlm.runtime.engine import Engine

    old = os.environ.get("RADIXLM_FORCE_TORCH_OPS")
    os.environ["RADIXLM_FORCE_TORCH_OPS"] = "1" if force_torch else "0"
    try:
        with Engine(path, device="cuda", dtype="float32", max_total_tokens=8192, **kw) as e:
            batched = [o["output_ids"] for o in e.generate(PROMPTS, GREEDY)]
            alone = [e.generate(p, GREEDY)["output_ids"] for p in PROMPTS]
        assert batched == alone
        return batched
    finally:
        if old is None:
            os.environ.pop("RADIXLM_FORCE_TORCH_OPS", None)
        else:
            os.environ["RADIXLM_FORCE_TORCH_OPS"] = old


def test_kernels_and_cuda_graphs_match_torch_reference(tiny_llama):
    reference = _outputs(tiny_llama, force_torch=True, disable_cuda_graph=True, enable_overlap_schedule=False)
    fast = _outputs(tiny_llama, force_torch=False)  # NOTE: overlap scheduling is the CUDA default
    assert fast == reference


def test_cuda_graph_padding_and_eager_fallback(tiny_llama):
    reference = _outputs(tiny_llama, force_torch=False, disable_cuda_graph=True)
    # max bs 4: batches of 6 run eagerly, batches of 3 replay the padded size-4 graph.
    assert _outputs(tiny_llama, force_torch=False, cuda_graph_max_bs=4) == reference


def test_overlap_schedule_matches_on_gpu(tiny_llama):
    reference = _outputs(tiny_llama, force_torch=False, enable_overlap_schedule=False)
    assert _outputs(tiny_llama, force_torch=False) == reference  # the CUDA default: overlap on


def test_short_extend_slices_replay_decode_graphs(tiny_llama, monkeypatch):
    """Speculative verify rows (1 + k tokens per request) run as decode rows through the decode
    CUDA graphs (ModelRunner._forward_flat_decode); greedy outputs equal plain eager decoding."""
    from radixlm.runtime.model_runner import ModelRunner

    calls = []
    flat = ModelRunner._forward_flat_decode
    monkeypatch.setattr(ModelRunner, "_forward_flat_decode",
                        lambda self, b, ids=None: calls.append(b.num_tokens) or flat(self, b, ids))
    reference = _outputs(tiny_llama, force_torch=False, disable_cuda_graph=True, enable_overlap_schedule=False)
    assert not calls
    spec = _outputs(tiny_llama, force_torch=False, speculative_algorithm="ngram", speculative_num_draft_tokens=4)
    assert spec == reference
    assert calls and max(calls) > len(PROMPTS)  # verify batches with drafts went through the graphs


def test_short_prefills_replay_decode_graphs(tiny_llama, monkeypatch):
    """Prefills within cuda_graph_max_extend_tokens run as decode rows through the graphs
    (whole prompts, batched or alone); greedy outputs equal eager prefills."""
    from radixlm.runtime.model_runner import ModelRunner

    longest = []  # longest slice of every batch that went through the graphs
    flat = ModelRunner._forward_flat_decode
    monkeypatch.setattr(ModelRunner, "_forward_flat_decode",
                        lambda self, b, ids=None: longest.append(max(s.length for s in b.slices)) or flat(self, b, ids))
    big = dict(max_running_requests=128, cuda_graph_max_bs=128)  # graphs wide enough for the prompts
    reference = _outputs(tiny_llama, force_torch=False, cuda_graph_max_extend_tokens=0, **big)
    assert max(longest, default=0) <= 16  # 0: only short slices go through the graphs
    longest.clear()
    assert _outputs(tiny_llama, force_torch=False, **big) == reference
    assert max(longest) > 16  # whole prompts went through the graphs


def test_cascade_attention_keeps_greedy_outputs(tiny_llama):
    """40 requests under one cached ~300-token prefix decode with cascade plans (thresholds lowered
    for this small model), through the cascade CUDA graphs and eagerly past the graphs; greedy
    outputs equal those with cascade attention off."""
    from radixlm.runtime.cascade import CascadePlanner
    from radixlm.runtime.engine import Engine
    from radixlm.runtime.testing import spy_cascade_plans

    prefix = "You are a careful assistant who answers in one short sentence. " * 25
    prompts = [prefix + f"Question {i}: what is {i} plus {2 * i}?" for i in range(40)]

    def run(cascade: bool, **kw) -> tuple[list[list[int]], list[bool]]:
        used: list[bool] = []
        with Engine(tiny_llama, device="cuda", dtype="float32", max_total_tokens=32768, max_running_requests=64,
                    enable_cascade_attention=cascade, **kw) as e:
            if cascade:
                e.runner.cascade = CascadePlanner(1, min_shared=64, min_saved_bytes=0)
                used = spy_cascade_plans(e.runner.cascade)
            e.generate(prompts[0], GREEDY)  # NOTE: the prefix enters the cache
            return [o["output_ids"] for o in e.generate(prompts, GREEDY)], used

    reference, _ = run(False)
    graphs, used = run(True)
    assert graphs == reference and sum(used) >= 20
    eager, used = run(True, cuda_graph_max_bs=16)
    assert eager == reference and sum(used) >= 20


def test_fused_decode_graphs_match_plain_graphs(tiny_llama, monkeypatch):
    """True decode steps replay graphs whose attention applies rotary and stores the new key and
    value itself; flat decode rows (short prefills through the graphs) keep the plain graphs.
    Greedy outputs equal those with the fusion off (plain graphs only)."""
    from radixlm.runtime.attention import AttentionBackend
    from radixlm.runtime.cuda_graph import CudaGraphRunner

    fused_replays = []
    replay = CudaGraphRunner.replay

    def spy(self, *args, **kw):
        fused_replays.append(bool(kw.get("decode")) and bool(self.fused_sizes) and kw.get("cascade") is None)
        return replay(self, *args, **kw)

    monkeypatch.setattr(CudaGraphRunner, "replay", spy)
    fused = _outputs(tiny_llama, force_torch=False)
    assert any(fused_replays) and not all(fused_replays)  # decode steps fused, short prefills plain
    fused_replays.clear()
    monkeypatch.setattr(AttentionBackend, "decode_rotary_in_attention", False)
    assert _outputs(tiny_llama, force_torch=False) == fused
    assert fused_replays and not any(fused_replays)


def test_overlap_jump_steps_match_synchronous_path(tiny_llama):
    """Jump-forward with overlap scheduling: a request whose grammar forces text decodes it in the
    next overlapped step (a flat-decode graph replay fed partly by device-side sampled ids); the
    greedy outputs equal the synchronous path's, and jump steps did run."""
    from radixlm.runtime.engine import Engine

    params = [{**GREEDY, "ignore_eos": False, "max_new_tokens": 64, "regex": r"(Step [0-9]{1,2} is done\. ){2,6}"},
              {**GREEDY, "ignore_eos": False, "max_new_tokens": 64,
               "json_schema": '{"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, '
                              '"count": {"type": "integer"}}, "required": ["name", "count"]}'}]
    results = []
    for overlap in (False, True):
        with Engine(tiny_llama, device="cuda", dtype="float32", max_total_tokens=8192, enable_jump_forward=True,
                    enable_overlap_schedule=overlap) as e:
            batch = [params[i % 2] for i in range(len(PROMPTS))]
            e.generate(PROMPTS, batch)  # NOTE: compiles the grammars (requests wait for them: no overlap)
            outs = e.generate(PROMPTS, batch)
            results.append(([o["output_ids"] for o in outs], getattr(e.scheduler, "jump_steps", 0)))
    assert results[1][0] == results[0][0]
    assert results[1][1] > 0


def test_device_first_visit_masks_keep_constrained_outputs(tiny_llama, monkeypatch):
    """DFA grammars too large to precompute get first-visit masks from the DFA-over-vocabulary
    kernel (grammar/device_masks.py): greedy constrained outputs equal those of host-computed masks,
    and the device path did compute rows."""
    import radixlm.grammar.dfa_engine as dfa_engine
    from radixlm.grammar import device_masks
    from radixlm.runtime.engine import Engine

    monkeypatch.setattr(dfa_engine, "EAGER_STATES", 0)  # NOTE: every DFA state is a first visit
    params = [{**GREEDY, "ignore_eos": False, "max_new_tokens": 48, "regex": r"[A-Z][a-z]{1,8}( [a-z]{2,9}){2,7}\."},
              {**GREEDY, "ignore_eos": False, "max_new_tokens": 48,
               "json_schema": '{"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, '
                              '"tags": {"type": "array", "items": {"type": "string", "maxLength": 8}}}, '
                              '"required": ["name", "tags"]}'}]
    results = []
    for flag in ("0", "1"):
        monkeypatch.setenv("RADIXLM_DEVICE_MASKS", flag)
        before = device_masks.computed[0]
        with Engine(tiny_llama, device="cuda", dtype="float32", max_total_tokens=8192) as e:
            outs = e.generate(PROMPTS, [params[i % 2] for i in range(len(PROMPTS))])
        results.append(([o["output_ids"] for o in outs], device_masks.computed[0] - before))
    assert results[1][0] == results[0][0]
    assert results[0][1] == 0 and results[1][1] > 0


def test_burst_beside_decodes_replays_decode_graphs(tiny_llama, monkeypatch):
    """Short prompts arriving while requests decode, more rows than the decode graphs hold (but
    fewer than twice as many): the mixed step stops admitting at the graphs' capacity and replays
    them (prefill slices past FLAT_DECODE_MAX_SLICE, past cuda_graph_max_extend_tokens, within
    the KV-read budget); greedy outputs equal those of eager mixed steps."""
    import random

    from radixlm.runtime.model_runner import FLAT_DECODE_MAX_SLICE, ModelRunner
    from radixlm.runtime.request import Req
    from radixlm.runtime.sampling_params import SamplingParams
    from radixlm.runtime.scheduler import Scheduler
    from radixlm.runtime.server_args import ServerArgs
    from radixlm.runtime.tokenizer import load_tokenizer

    flat_prefills = []
    flat = ModelRunner._forward_flat_decode
    monkeypatch.setattr(ModelRunner, "_forward_flat_decode", lambda self, b, ids=None: flat_prefills.append(
        max(s.length for s in b.slices)) or flat(self, b, ids))
    rng = random.Random(0)
    first = [[rng.randrange(10, 1000) for _ in range(rng.randrange(5, 30))] for _ in range(8)]
    burst = [[rng.randrange(10, 1000) for _ in range(rng.randrange(18, 26))] for _ in range(4)]

    def run(**kw) -> list[list[int]]:
        args = ServerArgs(model_path=tiny_llama, device="cuda", dtype="float32", max_total_tokens=8192,
                          max_running_requests=64, cuda_graph_max_bs=64, **kw)
        tok, eos = load_tokenizer(tiny_llama, tiny_llama)
        runner = ModelRunner(args, tiny_llama, eos)
        sched = Scheduler.create(args, runner, tok)
        reqs = [Req(f"r{i}", ids, SamplingParams(max_new_tokens=24, temperature=0, ignore_eos=True))
                for i, ids in enumerate(first + burst)]
        try:
            for r in reqs[:8]:
                sched.add_request(r)
            for _ in range(3):
                sched.step()
            for r in reqs[8:]:  # NOTE: 4 x ~22 tokens beside 8 decodes: past 64 rows, within 128
                sched.add_request(r)
            while sched.has_work():
                sched.step()
        finally:
            runner.release()
        return [list(r.output_ids) for r in reqs]

    reference = run(cuda_graph_max_extend_tokens=0)
    assert max(flat_prefills, default=0) <= FLAT_DECODE_MAX_SLICE
    flat_prefills.clear()
    assert run(cuda_graph_max_extend_tokens=8) == reference
    assert max(flat_prefills) > FLAT_DECODE_MAX_SLICE  # burst prompts rode the graphs
    assert len({tuple(o) for o in reference}) > 6  # outputs vary across requests


def test_logit_bias_on_the_overlapped_graph_path(tiny_llama):
    """A request with ``logit_bias`` takes the host sampling path beside graph-replayed rows
    (overlap scheduling on): its biased tokens are forced and its batch-mates keep their outputs."""
    from radixlm.runtime.engine import Engine

    with Engine(tiny_llama, device="cuda", dtype="float32", max_total_tokens=8192) as e:
        alone = [e.generate(p, GREEDY)["output_ids"] for p in PROMPTS]
        biased = {**GREEDY, "logit_bias": {"7": 100.0}}
        mixed = e.generate(PROMPTS, [biased if i == 2 else GREEDY for i in range(len(PROMPTS))])
    assert mixed[2]["output_ids"] == [7] * GREEDY["max_new_tokens"]
    assert [o["output_ids"] for i, o in enumerate(mixed) if i != 2] == [a for i, a in enumerate(alone) if i != 2]
