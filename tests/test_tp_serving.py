"""Tensor parallelism end to end on CPU (gloo, 2 ranks): greedy and seeded outputs through the
Engine (constrained decoding too) and the server equal TP=1; killing a TP rank ends the server within 5 s."""

from __future__ import annotations

import os
import shutil
import signal
import time

import pytest
import requests
import torch
from safetensors.torch import save_file

from radixlm.runtime.server.testing import ServerProcess, child_pids

PROMPTS = ["def f(x):", "import json\nclass A:", "hello world, this is"]
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
SEEDED = {"temperature": 0.8, "max_new_tokens": 8, "seed": 7, "ignore_eos": True}


@pytest.fixture(scope="module")
def varied_model(tmp_path_factory) -> str:
    """The tiny llama's config and tokenizer with larger random weights (std 0.2), so greedy
    outputs vary from token to token (the tiny model's repeat one token)."""
    from radixlm.runtime.model_config import ModelConfig
    from radixlm.runtime.model_loader import hf_weight_shapes
    from radixlm.runtime.tiny_model import tiny_model_path

    src = tiny_model_path("llama")
    dst = str(tmp_path_factory.mktemp("tp-serving") / "model")
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors*"))
    gen = torch.Generator().manual_seed(0)
    tensors = {n: (1.0 if "norm" in n else 0.0) + 0.2 * torch.randn(s, generator=gen)
               for n, s in hf_weight_shapes(ModelConfig.from_pretrained(dst))}
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    return dst


def _engine_outputs(path: str, tp_size: int) -> list[list[int]]:
    from radixlm.runtime.engine import Engine

    with Engine(path, device="cpu", max_total_tokens=1024, tp_size=tp_size) as engine:
        greedy = engine.generate(PROMPTS, GREEDY)
        seeded = engine.generate(PROMPTS[:2], SEEDED)
        constrained = engine.generate(PROMPTS[1:], {**GREEDY, "regex": "[a-z]+ = [0-9]+"})  # grammar gate
        leased = engine.generate(PROMPTS[2], GREEDY, cache_lease={"id": "prog", "ttl_s": 600})
        assert engine.release_cache_lease("prog") == 1  # replicated on every rank
        engine.flush_cache()  # replicated on every rank; the next request still matches
        again = engine.generate(PROMPTS[0], GREEDY)
    return [o["output_ids"] for o in greedy + seeded + constrained + [leased, again]]


@pytest.fixture(scope="module")
def tp1_outputs(varied_model) -> list[list[int]]:
    return _engine_outputs(varied_model, 1)


def test_engine_tp2_outputs_equal_tp1(varied_model, tp1_outputs):
    assert len(set(tp1_outputs[0])) > 3  # outputs that vary, so equality means something
    assert _engine_outputs(varied_model, 2) == tp1_outputs


def _procs_named(pid: int) -> dict[str, int]:
    out = {}
    for child in child_pids(pid):
        with open(f"/proc/{child}/comm") as f:
            out[f.read().strip()] = child
    return out


def test_server_tp2_equals_tp1_and_dies_with_a_rank(varied_model, tp1_outputs):
    ref = tp1_outputs[: len(PROMPTS)]  # the TP=1 Engine's greedy outputs of PROMPTS
    srv = ServerProcess(["--model-path", varied_model, "--tp-size", "2", "--max-total-tokens", "1024"])
    try:
        got = requests.post(srv.url + "/generate", json={"text": PROMPTS, "sampling_params": GREEDY}).json()
        assert [o["output_ids"] for o in got] == ref
        names = _procs_named(srv.proc.pid)
        assert {"radixlm-schedul", "radixlm-tp1", "radixlm-detoken"} <= set(names), names
        t0 = time.monotonic()
        os.kill(names["radixlm-tp1"], signal.SIGKILL)
        srv.proc.wait(timeout=10)
        elapsed = time.monotonic() - t0
        assert srv.proc.returncode == 1
        assert elapsed < 5.0, elapsed
        assert "scheduler-tp1 process" in srv.log_tail() and "SIGKILL" in srv.log_tail()
    finally:
        srv.stop()


def test_engine_start_fails_with_the_divisibility_rule(tmp_path):
    """3 query heads cannot be split over 2 ranks: every rank fails at start-up, the Engine
    raises the rule and leaves no rank or process group behind."""
    import json

    from radixlm.runtime import distributed
    from radixlm.runtime.engine import Engine

    cfg = {"architectures": ["Qwen2ForCausalLM"], "vocab_size": 64, "hidden_size": 48, "intermediate_size": 64,
           "num_hidden_layers": 1, "num_attention_heads": 3, "num_key_value_heads": 1, "max_position_embeddings": 64}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"num_attention_heads \(3\) divisible by tp_size \(2\)"):
        Engine(str(tmp_path), device="cpu", load_format="dummy", skip_tokenizer_init=True, max_total_tokens=64,
               tp_size=2)
    assert distributed.get_tensor_model_parallel_world_size() == 1
