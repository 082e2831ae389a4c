"""Qwen2 / Qwen2.5 (``Qwen2ForCausalLM``): the Llama block with a bias on q/k/v projections."""

from radixlm.runtime.models.layers import CausalLM


class Qwen2ForCausalLM(CausalLM):
    pass


EntryClass = Qwen2ForCausalLM
