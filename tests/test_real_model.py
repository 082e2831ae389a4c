"""The default real model (SmolLM2-135M-Instruct, fp32 on CPU) against HF transformers, and greedy
outputs unchanged by batching, staggered arrivals, chunked prefill, retraction, the prefix cache,
page size, overlap scheduling and the Triton kernels (interpreted).

Expected values come from HF ``generate`` on the same weights. Every compared set of outputs must
hold >= 10 distinct tokens, so a degenerate model (or a broken loader) cannot pass by repeating
one token.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from radixlm.runtime.request import Req
from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.scheduler import Scheduler
from radixlm.runtime.testing import CHAT_QUESTIONS, make_scheduler, run_to_completion

pytestmark = pytest.mark.timeout(900)

QUESTIONS = CHAT_QUESTIONS
NEW_TOKENS = 32


def distinct_tokens(outputs: list[list[int]]) -> int:
    return len({t for out in outputs for t in out})


@pytest.fixture(scope="module")
def model_path() -> str:
    from radixlm.runtime.default_model import default_model_path

    return default_model_path()


@pytest.fixture(scope="module")
def prompts(model_path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    msgs = [[{"role": "user", "content": q}] for q in QUESTIONS]
    return [tok.apply_chat_template(m, tokenize=True, add_generation_prompt=True, return_dict=False) for m in msgs]


@pytest.fixture(scope="module")
def hf_outputs(model_path, prompts) -> list[list[int]]:
    """HF greedy continuations (one left-padded batch), EOS not stopping (like ``ignore_eos``)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    width = max(map(len, prompts))
    pad = model.config.pad_token_id or 0
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        gen = model.generate(input_ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                             eos_token_id=None, pad_token_id=pad)
    outs = gen[:, width:].tolist()
    assert all(len(o) == NEW_TOKENS for o in outs)
    assert distinct_tokens(outs) >= 10
    return outs


def run(sched: Scheduler, prompts: list[list[int]], arrivals: list[int] | None = None,
        max_new: int = NEW_TOKENS) -> list[list[int]]:
    """Greedy, ``ignore_eos``; each request is added at its arrival step."""
    reqs = [Req(f"r{i}", list(p), SamplingParams(max_new_tokens=max_new, temperature=0, ignore_eos=True))
            for i, p in enumerate(prompts)]
    return run_to_completion(sched, reqs, arrivals)


def test_engine_greedy_text_equals_hf_generate(model_path, prompts, hf_outputs):
    from radixlm.runtime.engine import Engine

    with Engine(model_path, device="cpu", max_total_tokens=4096) as engine:
        texts = [engine.tokenizer.decode(p) for p in prompts]
        assert [engine.tokenizer.encode(t) for t in texts] == prompts  # text in, same ids
        outs = engine.generate(texts, {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True})
        assert [o["output_ids"] for o in outs] == hf_outputs
        assert [o["text"] for o in outs] == [engine.tokenizer.decode(o, skip_special_tokens=True) for o in hf_outputs]
    assert "Paris" in engine.tokenizer.decode(hf_outputs[0])  # a real instruct model answers


VARIANTS = {
    "staggered_chunk8": (dict(chunked_prefill_size=8), [(i * 7) % 23 for i in range(8)]),
    "staggered_cache_off": (dict(disable_radix_cache=True), [(i * 5) % 19 for i in range(8)]),
    "retraction_cached": (dict(max_total_tokens=180), [(i * 3) % 11 for i in range(8)]),
    "page_size_4": (dict(page_size=4, chunked_prefill_size=16), [(i * 2) % 7 for i in range(8)]),
    "overlap_retraction": (dict(enable_overlap_schedule=True, max_total_tokens=180), [(i * 3) % 11 for i in range(8)]),
    "staggered_no_mixed": (dict(enable_mixed_chunk=False, chunked_prefill_size=16), [(i * 3) % 13 for i in range(8)]),
    "staggered_mixed_chunk16": (dict(chunked_prefill_size=16), [(i * 3) % 13 for i in range(8)]),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_batching_variants_keep_greedy_outputs(model_path, prompts, hf_outputs, name):
    kw, arrivals = VARIANTS[name]
    sched = make_scheduler(model_path, **kw)
    outs = run(sched, prompts, arrivals)
    assert distinct_tokens(outs) >= 10
    assert outs == hf_outputs
    if "retraction" in name:
        assert sched.stats.num_retracted > 0
    if "chunk8" in name:
        assert sched.stats.num_prefill_batches > len(prompts)
    # mixed batches (on by default) ran where arrivals met running requests, and only then
    assert (sched.stats.num_mixed_batches > 0) == sched.args.enable_mixed_chunk
    if not kw.get("disable_radix_cache"):
        assert sched.flush_cache()
    assert sched.allocator.available_size() == sched.allocator.size


def test_prefix_cache_hits_keep_greedy_outputs(model_path, prompts, hf_outputs):
    """The same prompts again: their prefixes (and the shared system prompt) come from the cache."""
    sched = make_scheduler(model_path)
    assert run(sched, prompts) == hf_outputs
    # Second pass, in reverse order: all but the last prompt token come from the radix cache.
    cached_before = sched.stats.cached_tokens
    assert run(sched, prompts[::-1]) == hf_outputs[::-1]
    assert sched.stats.cached_tokens - cached_before == sum(len(p) - 1 for p in prompts)


_TRITON_SCRIPT = r"""
import json, sys
from radixlm.runtime.engine import Engine
prompts = json.loads(sys.argv[2])
with Engine(sys.argv[1], device="cpu", max_total_tokens=1024, chunked_prefill_size=32) as e:
    outs = e.generate(input_ids=prompts, sampling_params={"max_new_tokens": int(sys.argv[3]),
                      "temperature": 0, "ignore_eos": True})
print(json.dumps([o["output_ids"] for o in outs]))
"""


def test_triton_kernels_interpreted_keep_greedy_outputs(model_path, prompts, hf_outputs):
    """The whole model through the Triton kernels (interpreter, fresh process so that
    ``TRITON_INTERPRET`` is set before triton's import), chunked prefill over a cached prefix."""
    pytest.importorskip("triton")
    import json

    n_new = 12  # NOTE: interpreted kernels are slow; one prompt, the one with the most varied output
    best = max(range(len(prompts)), key=lambda i: len(set(hf_outputs[i][:n_new])))
    env = {**os.environ, "TRITON_INTERPRET": "1", "RADIXLM_FORCE_TRITON_OPS": "1"}
    proc = subprocess.run([sys.executable, "-c", _TRITON_SCRIPT, model_path, json.dumps([prompts[best]]),
                           str(n_new)], env=env, capture_output=True, text=True, timeout=800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert distinct_tokens(outs) >= 10
    assert outs == [hf_outputs[best][:n_new]]
