"""``sglang.lang.backend.crusoe``: ``Crusoe`` (not supported: raises NotImplementedError)."""

from radixlm.interpreter.api_backends import Crusoe

__all__ = ["Crusoe"]
