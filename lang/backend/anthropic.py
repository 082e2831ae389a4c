"""``sglang.lang.backend.anthropic``: ``Anthropic`` (not supported: raises NotImplementedError)."""

from radixlm.interpreter.api_backends import Anthropic

__all__ = ["Anthropic"]
