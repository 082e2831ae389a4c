"""``kv_cache_dtype`` fp8_e4m3 / fp8_e5m2: an 8-bit KV pool (half of bf16's bytes per token, a
quarter of fp32's), validated at the edge, and on the real default model greedy outputs that stay
readable, start as the full-precision pool's do, and do not depend on batching or the prefix cache.
"""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.model_loader import resolve_kv_dtype
from radixlm.runtime.request import Req
from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.server_args import ServerArgs
from radixlm.runtime.testing import CHAT_QUESTIONS, make_scheduler, run_to_completion

pytestmark = pytest.mark.timeout(900)


def test_kv_cache_dtype_names():
    assert resolve_kv_dtype("auto", torch.bfloat16) is torch.bfloat16
    assert resolve_kv_dtype("fp8_e4m3", torch.bfloat16) is torch.float8_e4m3fn
    assert resolve_kv_dtype("fp8_e5m2", torch.float32) is torch.float8_e5m2
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        ServerArgs(kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        resolve_kv_dtype("fp16", torch.float32)


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_pool_holds_a_quarter_of_the_fp32_bytes(tiny_llama, kv):
    full, fp8 = make_scheduler(tiny_llama), make_scheduler(tiny_llama, kv_cache_dtype=kv)
    assert fp8.runner.kv_pool.k_buffer[0].dtype == resolve_kv_dtype(kv, torch.float32)
    assert fp8.runner.dtype == full.runner.dtype == torch.float32  # the model itself stays fp32
    assert 4 * fp8.runner.kv_bytes_per_token == full.runner.kv_bytes_per_token


@pytest.fixture(scope="module")
def chat():
    from transformers import AutoTokenizer

    from radixlm.runtime.default_model import default_model_path

    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=True, add_generation_prompt=True,
                                       return_dict=False) for q in CHAT_QUESTIONS[:3]]
    return path, prompts


def greedy(path: str, prompts: list[list[int]], alone: bool = False, **args) -> list[list[int]]:
    sched = make_scheduler(path, **args)
    reqs = [Req(f"r{i}", p, SamplingParams(max_new_tokens=16, temperature=0, ignore_eos=True))
            for i, p in enumerate(prompts)]
    return [run_to_completion(sched, [r])[0] for r in reqs] if alone else run_to_completion(sched, reqs)


def test_fp8_kv_on_the_real_model(chat):
    """e4m3 keys and values (3 mantissa bits): each answer starts as with the fp32 pool (the
    first tokens; later ones may drift), the outputs are not degenerate, and batching and cache
    hits (each request alone after the others, sharing the chat template's prefix) change nothing."""
    path, prompts = chat
    full = greedy(path, prompts)
    batched = greedy(path, prompts, kv_cache_dtype="fp8_e4m3")
    alone = greedy(path, prompts, alone=True, kv_cache_dtype="fp8_e4m3")
    assert batched == alone
    assert len({t for out in batched for t in out}) >= 10
    assert all(a[:3] == b[:3] for a, b in zip(batched, full)), (batched, full)
