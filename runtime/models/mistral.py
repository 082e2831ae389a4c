"""Mistral 7B (``MistralForCausalLM``): the Llama block with GQA (Jiang et al. 2023).

Sliding-window attention (``sliding_window`` in config.json, on every layer) is applied by the
attention backend from ``ModelConfig.layer_windows``: a query sees its last ``sliding_window`` keys.
"""

from radixlm.runtime.models.layers import CausalLM


class MistralForCausalLM(CausalLM):
    pass


EntryClass = MistralForCausalLM
