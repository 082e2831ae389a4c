"""Qwen2 / Qwen2.5 (``Qwen2ForCausalLM``): the Llama block with a bias on q/k/v projections.

With ``use_sliding_window``, layers ``>= max_window_layers`` (or those ``layer_types`` names
``sliding_attention``) get the sliding window, as in transformers (``ModelConfig.layer_windows``)."""

from radixlm.runtime.models.layers import CausalLM


class Qwen2ForCausalLM(CausalLM):
    pass


EntryClass = Qwen2ForCausalLM
