"""Mistral 7B (``MistralForCausalLM``): the Llama block with GQA (Jiang et al. 2023).

Sliding-window attention is not applied: contexts are capped at the window by the engine."""

from radixlm.runtime.models.layers import CausalLM


class MistralForCausalLM(CausalLM):
    pass


EntryClass = MistralForCausalLM
