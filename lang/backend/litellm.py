"""``sglang.lang.backend.litellm``: ``LiteLLM`` (not supported: raises NotImplementedError)."""

from radixlm.interpreter.api_backends import LiteLLM

__all__ = ["LiteLLM"]
