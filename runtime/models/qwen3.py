"""Qwen3 (``Qwen3ForCausalLM``): no qkv bias, per-head RMSNorm on q and k before RoPE."""

from radixlm.runtime.models.layers import CausalLM


class Qwen3ForCausalLM(CausalLM):
    pass


EntryClass = Qwen3ForCausalLM
