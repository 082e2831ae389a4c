"""radixlm: structured generation for LLMs — a Python DSL over a radix-tree KV-cache runtime.

The public API matches SGLang's frontend (DESIGN.md §3.1), so ``import radixlm as sgl`` runs SGLang
programs::

    import radixlm as sgl

    @sgl.function
    def qa(s, question):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=64))

    sgl.set_default_backend(sgl.Engine())  # or sgl.RuntimeEndpoint(url), sgl.Runtime(), sgl.OpenAI()
    print(qa.run(question="What is a radix tree?")["answer"])

``Engine``, ``ServerArgs`` (the server's ``ServerConfig``), ``Runtime`` and the API backends
(``OpenAI``; ``Anthropic``, ``Crusoe``, ``LiteLLM``, ``VertexAI`` raise a "not supported" error) are
imported lazily so ``import radixlm`` stays light.
"""

from __future__ import annotations

from typing import Any

from radixlm.interpreter.backend import (
    Backend, flush_cache, get_default_backend, get_server_info, set_default_backend,
)
from radixlm.interpreter.engine_backend import EngineBackend
from radixlm.interpreter.executor import ProgramError
from radixlm.interpreter.runtime_endpoint import RuntimeEndpoint
from radixlm.interpreter.state import ForkedStates, ProgramState
from radixlm.lang.api import (
    assistant, assistant_begin, assistant_end, gen, gen_int, gen_string, image, select,
    separate_reasoning, system, system_begin, system_end, user, user_begin, user_end, var_scope,
    video,
)
from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.choices import (
    ChoicesDecision, ChoicesSamplingMethod, greedy_token_selection, token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixlm.lang.function import Function, function
from radixlm.global_config import global_config
from radixlm.lang.tracer import TracedProgram

__version__ = "0.1.0"


def trace(program: Function, *, backend: Any = None, **kwargs: Any) -> TracedProgram:
    """The IR of ``program`` with ``kwargs`` as known arguments (same as ``program.trace``)."""
    return program.trace(backend=backend, **kwargs)


# NOTE: heavy or optional pieces load on first use so ``import radixlm`` stays light.
_LAZY = {
    "Engine": ("radixlm.runtime.engine", "Engine"),
    "Runtime": ("radixlm.interpreter.runtime", "Runtime"),
    "OpenAI": ("radixlm.interpreter.openai_backend", "OpenAI"),
    "Anthropic": ("radixlm.interpreter.api_backends", "Anthropic"),
    "LiteLLM": ("radixlm.interpreter.api_backends", "LiteLLM"),
    "VertexAI": ("radixlm.interpreter.api_backends", "VertexAI"),
    "Crusoe": ("radixlm.interpreter.api_backends", "Crusoe"),
    "ServerArgs": ("radixlm.runtime.server.config", "ServerConfig"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'radixlm' has no attribute {name!r}")


__all__ = [
    "Anthropic", "Crusoe", "LiteLLM", "OpenAI", "Runtime", "ServerArgs", "VertexAI", "global_config", "image",
    "separate_reasoning", "video", "__version__",
    "Backend", "ChatTemplate", "ChoicesDecision", "ChoicesSamplingMethod", "Engine",
    "EngineBackend", "ForkedStates", "Function", "ProgramError", "ProgramState", "RuntimeEndpoint",
    "TracedProgram", "assistant", "assistant_begin", "assistant_end", "flush_cache", "function",
    "gen", "gen_int", "gen_string", "get_default_backend", "get_server_info",
    "greedy_token_selection", "select", "set_default_backend", "system", "system_begin",
    "system_end", "token_length_normalized", "trace", "unconditional_likelihood_normalized",
    "user", "user_begin", "user_end", "var_scope",
]
