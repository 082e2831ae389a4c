"""``sglang.lang.backend.openai``: the ``OpenAI`` backend."""

from radixlm.interpreter.openai_backend import OpenAI, TokenUsage

__all__ = ["OpenAI", "TokenUsage"]
