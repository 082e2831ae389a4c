"""``sglang.lang.backend.base_backend``: ``BaseBackend`` is radixlm's :class:`Backend`."""

from radixlm.interpreter.backend import Backend as BaseBackend

__all__ = ["BaseBackend"]
