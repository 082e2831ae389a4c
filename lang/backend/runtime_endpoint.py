"""``sglang.lang.backend.runtime_endpoint``: ``RuntimeEndpoint`` and ``Runtime``."""

from radixlm.interpreter.runtime import Runtime
from radixlm.interpreter.runtime_endpoint import RuntimeEndpoint

__all__ = ["Runtime", "RuntimeEndpoint"]
