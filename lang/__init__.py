"""The DSL: primitives (``api``), IR nodes (``ir``), ``@function``, tracing, choice methods and
chat-template role markers. See docs/dsl.md."""
