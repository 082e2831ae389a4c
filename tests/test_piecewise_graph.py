"""Piecewise forward of EXTEND batches (``runtime/piecewise_graph.py``) on the CPU: the pieces run
eagerly (no graphs; padded to the buckets like the graphs), so this checks the decomposition:
mixed prefill + decode steps give the logits and KV of the plain forward, and padding rows write
only the padding slot 0. The CUDA graphs themselves: tests/test_gpu_piecewise.py."""

from __future__ import annotations

import random

import pytest
import torch

from radixlm.runtime.piecewise_graph import piecewise_token_sizes


def test_token_buckets():
    assert piecewise_token_sizes(8704) [:9] == [64, 128, 256, 320, 384, 448, 512, 640, 768]
    sizes = piecewise_token_sizes(8704)
    assert sizes[-1] == 8704 and 8192 in sizes and sizes == sorted(set(sizes))
    assert all(b / a <= 2 for a, b in zip(sizes, sizes[1:]))
    assert all(b / a <= 1.25 + 1e-9 for a, b in zip(sizes, sizes[1:]) if a >= 256)
    assert piecewise_token_sizes(100, 16) == [16, 32, 64, 100]
    assert piecewise_token_sizes(8) == []


def run_mixed_schedule(path: str, device: str, dtype: str, piecewise: str, overlap: bool = False,
                       cascade: bool = False, max_new_tokens: int = 12, **kw):
    """Drive a scheduler over a load with mixed steps (8 requests decode, then 6 longer prompts
    arrive, one sharing a cached prefix) and return ``(outputs, extend_logits, k_buffers,
    runner_used, cascade_plans)``: greedy output ids per request, the logits of every EXTEND
    forward (fp32, on the CPU), each layer's K pool, how many EXTEND batches went through the
    pieces, and how many cascade plans were made. ``piecewise``: ``"off"``, ``"eager"`` (the
    pieces without graphs, buckets from 16 tokens) or ``"graphs"`` (``enable_piecewise_cuda_graph``);
    ``overlap``: overlap scheduling; ``cascade``: the first 8 prompts share a 48-token prefix and
    their decode rows read it with cascade plans (thresholds lowered for the tiny model)."""
    from radixlm.runtime.forward_batch import ForwardMode
    from radixlm.runtime.model_runner import ModelRunner
    from radixlm.runtime.piecewise_graph import PiecewiseGraphRunner
    from radixlm.runtime.request import Req
    from radixlm.runtime.sampling_params import SamplingParams
    from radixlm.runtime.scheduler import Scheduler
    from radixlm.runtime.server_args import ServerArgs
    from radixlm.runtime.testing import spy_cascade_plans
    from radixlm.runtime.tokenizer import load_tokenizer

    args = ServerArgs(model_path=path, device=device, dtype=dtype, max_total_tokens=8192, max_running_requests=32,
                      enable_overlap_schedule=overlap, enable_piecewise_cuda_graph=piecewise == "graphs", **kw)
    tok, eos = load_tokenizer(path, path)
    runner = ModelRunner(args, path, eos)
    if piecewise == "eager":
        runner.piecewise = PiecewiseGraphRunner(runner, 512, min_tokens=16, capture=False)
    if piecewise != "off":
        assert runner.piecewise is not None
    plans = []
    if cascade:
        from radixlm.runtime.cascade import CascadePlanner

        runner.cascade = CascadePlanner(1, min_shared=16, min_saved_bytes=0)
        plans = spy_cascade_plans(runner.cascade)
    used, logits = [0], []
    forward = runner.forward_logits

    def spy(batch, input_ids=None):
        out, per_slice = forward(batch, input_ids)
        if batch.mode == ForwardMode.EXTEND:
            logits.append(out.float().cpu())
            used[0] += runner.piecewise is not None and runner.piecewise.can_run(batch.num_tokens)
        return out, per_slice

    runner.forward_logits = spy
    sched = Scheduler.create(args, runner, tok)
    rng = random.Random(0)
    ids = lambda n: [rng.randrange(10, 1000) for _ in range(n)]  # noqa: E731
    shared = ids(48) if cascade else []
    first = [shared + ids(rng.randrange(5, 40)) for _ in range(8)]
    later = [ids(rng.randrange(30, 90)) for _ in range(5)] + [first[0] + ids(20)]
    reqs = [Req(f"r{i}", p, SamplingParams(max_new_tokens=max_new_tokens, temperature=0, ignore_eos=True))
            for i, p in enumerate(first + later)]
    try:
        for r in reqs[:8]:
            sched.add_request(r)
        for _ in range(3):
            sched.step()
        for r in reqs[8:]:
            sched.add_request(r)
        while sched.has_work():
            sched.step()
        k_pool = [k.float().cpu() for k in runner.kv_pool.k_buffer]
    finally:
        runner.release()
    return [list(r.output_ids) for r in reqs], logits, k_pool, used[0], sum(plans)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_pieces_equal_plain_forward_on_cpu(tiny_models, arch):
    """Outputs, the logits of every extend step and the K pool (all but the padding slot 0)
    equal the plain forward's; fp32 on the CPU: only GEMM row counts differ (padding), so the
    tolerance is fp32 rounding. Qwen3: per-head q/k norms written back into the static QKV."""
    ref, ref_logits, ref_k, _, _ = run_mixed_schedule(tiny_models[arch], "cpu", "float32", "off", max_new_tokens=6)
    got, got_logits, got_k, used, _ = run_mixed_schedule(tiny_models[arch], "cpu", "float32", "eager", max_new_tokens=6)
    assert got == ref
    assert used >= 2 and len(got_logits) == len(ref_logits)
    for a, b in zip(got_logits, ref_logits):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    for a, b in zip(got_k, ref_k):
        torch.testing.assert_close(a[1:], b[1:], atol=1e-5, rtol=1e-5)  # NOTE: slot 0 takes the padding rows


def test_pieces_with_a_sliding_window_on_cpu(tmp_path):
    """A windowed layer (Qwen2 with use_sliding_window: layer 1) keeps its window in the eager
    attention between the pieces; Qwen2's qkv bias goes through ``addmm`` into the static QKV."""
    from radixlm.runtime.tiny_model import make_tiny_model

    path = make_tiny_model(str(tmp_path / "qwen2w"), "qwen2", sliding_window=16)
    ref, ref_logits, _, _, _ = run_mixed_schedule(path, "cpu", "float32", "off", max_new_tokens=6)
    got, got_logits, _, used, _ = run_mixed_schedule(path, "cpu", "float32", "eager", max_new_tokens=6)
    assert got == ref and used >= 2
    for a, b in zip(got_logits, ref_logits):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_pieces_with_cascade_decode_rows_on_cpu(tiny_llama):
    """A mixed step whose decode rows share a prefix: their attention between the pieces takes
    the backend's cascade path."""
    ref, ref_logits, _, _, _ = run_mixed_schedule(tiny_llama, "cpu", "float32", "off", cascade=True, max_new_tokens=6)
    got, got_logits, _, used, plans = run_mixed_schedule(tiny_llama, "cpu", "float32", "eager", cascade=True, max_new_tokens=6)
    assert got == ref and used >= 2 and plans >= 1
    for a, b in zip(got_logits, ref_logits):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
