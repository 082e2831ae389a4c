"""Program execution: ProgramState, per-state executors, run/run_batch, and the backends
(``EngineBackend`` in-process, ``RuntimeEndpoint`` over HTTP). See docs/dsl.md."""
