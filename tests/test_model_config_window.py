"""Where the sliding window applies, read from config.json as transformers reads it."""

from __future__ import annotations

import pytest

from radixlm.runtime.model_config import ModelConfig

BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4)


def cfg(arch: str, **kw) -> ModelConfig:
    return ModelConfig.from_hf_dict({"architectures": [arch], **BASE, **kw})


@pytest.mark.parametrize(
    "arch,kw,windows",
    [
        ("MistralForCausalLM", {"sliding_window": 4096}, (4096,) * 4),
        ("MistralForCausalLM", {"sliding_window": None}, (0,) * 4),
        ("MistralForCausalLM", {}, (4096,) * 4),  # HF MistralConfig's default
        ("LlamaForCausalLM", {"sliding_window": 16}, (0,) * 4),
        ("Qwen2ForCausalLM", {"sliding_window": 16}, (0,) * 4),  # no use_sliding_window
        ("Qwen2ForCausalLM", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2}, (0, 0, 16, 16)),
        ("Qwen2ForCausalLM", {"use_sliding_window": True, "sliding_window": 16}, (0,) * 4),  # default 28 layers
        ("Qwen3ForCausalLM", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 0}, (16,) * 4),
        ("Qwen3ForCausalLM", {"use_sliding_window": True, "sliding_window": None}, (0,) * 4),
        (
            "Qwen3ForCausalLM",
            {"use_sliding_window": True, "sliding_window": 8,
             "layer_types": ["sliding_attention", "full_attention"] * 2, "max_window_layers": 3},
            (8, 0, 8, 0),
        ),
        ("Qwen2ForCausalLM", {"layer_types": ["full_attention"] * 4}, (0,) * 4),
    ],
)
def test_layer_windows(arch, kw, windows):
    assert cfg(arch, **kw).layer_windows == windows


@pytest.mark.parametrize(
    "arch,kw,match",
    [
        ("Qwen2ForCausalLM", {"layer_types": ["sliding_attention"] * 4}, "use_sliding_window"),
        ("Qwen2ForCausalLM", {"use_sliding_window": True, "sliding_window": 8, "layer_types": ["full_attention"]}, "entries"),
        ("Qwen2ForCausalLM", {"use_sliding_window": True, "sliding_window": 8, "layer_types": ["chunked_attention"] * 4}, "unsupported"),
        ("MistralForCausalLM", {"sliding_window": 0}, "positive"),
    ],
)
def test_unsupported_window_settings_raise(arch, kw, match):
    with pytest.raises(ValueError, match=match):
        cfg(arch, **kw)
