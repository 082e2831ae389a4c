"""Llama 2 / 3 / 3.1 / 3.2 (``LlamaForCausalLM``): RMSNorm, SwiGLU, GQA, RoPE with optional
``llama3`` or ``linear`` scaling, optionally tied embeddings (Llama 3.2 1B/3B)."""

from radixlm.runtime.models.layers import CausalLM


class LlamaForCausalLM(CausalLM):
    """Touvron et al. 2023; Llama 3 herd paper (Dubey et al. 2024) for the rope scaling."""


EntryClass = LlamaForCausalLM
