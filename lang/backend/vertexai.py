"""``sglang.lang.backend.vertexai``: ``VertexAI`` (not supported: raises NotImplementedError)."""

from radixlm.interpreter.api_backends import VertexAI

__all__ = ["VertexAI"]
