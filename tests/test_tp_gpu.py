"""Tensor parallelism on 2 GPUs (NCCL): greedy outputs of TP=2 equal TP=1 with CUDA graphs
(all-reduce and all-gather inside the captured graph), eagerly, and with overlap scheduling.
Skipped without 2 CUDA devices."""

from __future__ import annotations

import json
import os

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")]

CONFIG = {"architectures": ["Qwen2ForCausalLM"], "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
          "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 2048}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """Random weights with std 0.2, so greedy outputs vary from token to token."""
    from safetensors.torch import save_file

    from radixlm.runtime.model_config import ModelConfig
    from radixlm.runtime.model_loader import hf_weight_shapes

    path = tmp_path_factory.mktemp("tp-gpu")
    (path / "config.json").write_text(json.dumps(CONFIG))
    gen = torch.Generator().manual_seed(0)
    tensors = {n: (1.0 if "norm" in n else 0.0) + 0.2 * torch.randn(s, generator=gen)
               for n, s in hf_weight_shapes(ModelConfig.from_hf_dict(CONFIG))}
    save_file(tensors, os.path.join(path, "model.safetensors"))
    return str(path)


def _outputs(path: str, **kw) -> list[list[int]]:
    from radixlm.runtime.engine import Engine

    prompts = [[(37 * i + 11 * j) % 900 + 50 for j in range(20 + 7 * i)] for i in range(6)]
    sp = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    with Engine(path, device="cuda", dtype="float32", skip_tokenizer_init=True, mem_fraction_static=0.3, **kw) as e:
        return [o["output_ids"] for o in e.generate(input_ids=prompts, sampling_params=sp)]


@pytest.mark.parametrize("kw", [{}, {"disable_cuda_graph": True}, {"enable_overlap_schedule": False}],
                         ids=["graphs+overlap", "eager", "graphs"])
def test_tp2_greedy_equals_tp1_on_gpus(model_dir, kw):
    ref = _outputs(model_dir, tp_size=1)
    assert len(set(ref[0])) > 5
    assert _outputs(model_dir, tp_size=2, **kw) == ref
