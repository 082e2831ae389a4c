"""Model architectures, one file each, looked up by the HF ``architectures`` name."""

from __future__ import annotations

import importlib

from radixlm.runtime.models.layers import CausalLM

_REGISTRY = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


def get_model_class(architecture: str) -> type[CausalLM]:
    """Model class for an HF architecture name. Raises ``ValueError`` when unsupported."""
    if architecture not in _REGISTRY:
        raise ValueError(f"unsupported architecture {architecture!r}; supported: {sorted(_REGISTRY)}")
    return importlib.import_module(f"radixlm.runtime.models.{_REGISTRY[architecture]}").EntryClass
