"""Module paths of ``sglang.lang.backend.*`` (``runtime_endpoint``, ``openai``, ``base_backend``,
``anthropic``, ``litellm``, ``vertexai``); the implementations live in ``radixlm.interpreter``."""
