"""GPU: a sliding-window model (tiny Mistral, window 8) through the Triton kernels, the SDPA fresh
prefill and decode CUDA graphs gives HF's greedy ids past the window, fp32 (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

TEXT = "import json\nimport os\n\n\ndef load(path):\n    with open(path) as f:\n        return json.load(f)\n\n\ndef save(path, data):\n    with open(path, \"w\") as f:\n        json.dump(data, f, indent=2)\n"


@pytest.mark.parametrize("arch", ["mistral", "qwen2"])
def test_windowed_engine_on_gpu_equals_hf_generate(tmp_path, arch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from radixlm.runtime.engine import Engine
    from radixlm.runtime.tiny_model import make_tiny_model

    path = make_tiny_model(str(tmp_path / arch), arch, sliding_window=8)
    tok = AutoTokenizer.from_pretrained(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = tok.encode(TEXT)
    prompts = [ids[:24], ids[:24] + ids[30:36], ids[:5], ids[10:40]]
    params = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
    with Engine(path, device="cuda", dtype="float32", max_total_tokens=4096) as engine:
        first = engine.generate(input_ids=prompts[0], sampling_params=params)  # later prompt 1 hits the cache
        outs = [first] + engine.generate(input_ids=prompts[1:], sampling_params=params)
    assert outs[1]["meta_info"]["cached_tokens"] >= 24
    for p, out in zip(prompts, outs):
        with torch.no_grad():
            gen = hf.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, min_new_tokens=24, pad_token_id=0)
        assert out["output_ids"] == gen[0, len(p) :].tolist()
