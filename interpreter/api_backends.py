"""SGLang's other hosted-API backends, by name only: radixlm does not support them.

``sgl.Anthropic``, ``sgl.Crusoe``, ``sgl.LiteLLM`` and ``sgl.VertexAI`` exist so programs that mention them import;
constructing one raises NotImplementedError naming the supported alternatives (``sgl.OpenAI`` for
any OpenAI-compatible endpoint, ``sgl.RuntimeEndpoint``, ``sgl.Runtime``, ``sgl.Engine``).
"""

from __future__ import annotations

from typing import Any


class _Unsupported:
    _what = "this API backend"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            f"sgl.{type(self).__name__} ({self._what}) is not supported by radixlm; use "
            "sgl.OpenAI(model, base_url=...) for an OpenAI-compatible endpoint, or "
            "sgl.RuntimeEndpoint / sgl.Runtime / sgl.Engine")


class Anthropic(_Unsupported):
    """Not supported: raises NotImplementedError on construction."""

    _what = "Anthropic's messages API"


class LiteLLM(_Unsupported):
    """Not supported: raises NotImplementedError on construction."""

    _what = "the LiteLLM proxy client"


class VertexAI(_Unsupported):
    """Not supported: raises NotImplementedError on construction."""

    _what = "Google Vertex AI"


class Crusoe(_Unsupported):
    """Not supported: raises NotImplementedError on construction."""

    _what = "Crusoe's inference API"
