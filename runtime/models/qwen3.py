"""Qwen3 (``Qwen3ForCausalLM``): no qkv bias, per-head RMSNorm on q and k before RoPE.

With ``use_sliding_window``, layers ``>= max_window_layers`` (or those ``layer_types`` names
``sliding_attention``) get the sliding window, as in transformers (``ModelConfig.layer_windows``)."""

from radixlm.runtime.models.layers import CausalLM


class Qwen3ForCausalLM(CausalLM):
    pass


EntryClass = Qwen3ForCausalLM
