"""``@function``: a Python function over a program state, runnable, batchable and traceable.

Mirrors SGLang's ``SglFunction``: ``f.run(...)`` executes one program, ``f.run_batch([...])`` many in
parallel after pre-caching their constant prefix, ``f.trace(...)`` returns the IR, ``f.bind(...)``
fixes arguments, and calling ``f(s, ...)`` from inside another program inlines it on that state.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from radixlm.lang.ir import SamplingParams
from radixlm.lang.state import StateBase
from radixlm.lang.tracer import StopTracing, TracedProgram, is_tracing, trace_program

if TYPE_CHECKING:
    from radixlm.interpreter.state import ProgramState

_SAMPLING_KEYS = {f.name for f in fields(SamplingParams)} - {"dtype", "regex", "json_schema", "ebnf"}


_DEFAULTED = ("max_new_tokens", "n", "temperature", "top_p", "top_k", "min_p", "frequency_penalty",
              "presence_penalty", "ignore_eos")


def run_defaults(overrides: dict[str, Any]) -> SamplingParams:
    """Run-level default sampling parameters: the runtime's defaults (SGLang's: 128 new tokens,
    temperature 1.0, ...) of the ``_DEFAULTED`` fields, then ``overrides``."""
    from radixlm.runtime.sampling_params import SamplingParams as RuntimeSamplingParams

    runtime = RuntimeSamplingParams()
    base = SamplingParams(**{k: getattr(runtime, k) for k in _DEFAULTED})
    for k, v in overrides.items():
        setattr(base, k, v)
    return base


_RUN_SAMPLING = ("max_new_tokens", "n", "stop", "stop_token_ids", "stop_regex", "temperature",
                 "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty", "ignore_eos",
                 "return_logprob", "logprob_start_len", "top_logprobs_num",
                 "return_text_in_logprobs")


def _explicit(local_vars: dict[str, Any]) -> dict[str, Any]:
    return {k: local_vars[k] for k in _RUN_SAMPLING}


def split_run_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``run(**kwargs)`` into (sampling defaults, program arguments)."""
    sampling = {k: v for k, v in kwargs.items() if k in _SAMPLING_KEYS}
    return sampling, {k: v for k, v in kwargs.items() if k not in _SAMPLING_KEYS}


# NOTE: gen()'s names of options that run()/run_batch() spell differently (as in SGLang).
_GEN_ONLY_NAMES = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"}


def option_hint(names: Any) -> str:
    """A hint for misspelled run options among ``names`` (``max_tokens`` -> ``max_new_tokens``),
    or ``""``."""
    hits = [f"{k!r} is gen()'s name; run() and run_batch() take {_GEN_ONLY_NAMES[k]!r}"
            for k in names if k in _GEN_ONLY_NAMES]
    return f" ({'; '.join(hits)})" if hits else ""


class Function:
    """A DSL program. Create with the :func:`function` decorator.

    Attributes:
        func: the wrapped Python function; its first parameter is the state ``s``.
        bind_arguments: arguments fixed by :meth:`bind`.
        num_api_spec_tokens: API speculative execution (SGLang semantics, used by ``sgl.OpenAI``):
            the gens of an assistant turn come from one call of up to N tokens.
    """

    def __init__(self, func: Callable[..., Any], num_api_spec_tokens: int | None = None,
                 bind_arguments: dict[str, Any] | None = None) -> None:
        params = list(inspect.signature(func).parameters)
        if not params:
            raise TypeError("a @function must take the program state as its first parameter")
        self.func = func
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bind_arguments = dict(bind_arguments or {})
        self.arg_names = params[1:]
        self.arg_defaults = [p.default for p in inspect.signature(func).parameters.values()
                             if p.default is not p.empty]
        self.pin_prefix_rid = None
        self.__name__ = getattr(func, "__name__", "program")
        self.__doc__ = func.__doc__

    def bind(self, **kwargs: Any) -> Function:
        """A copy with some arguments fixed. Raises TypeError for unknown argument names."""
        unknown = set(kwargs) - set(self.arg_names)
        if unknown:
            raise TypeError(f"{self.__name__}() has no arguments {sorted(unknown)}")
        return Function(self.func, self.num_api_spec_tokens, {**self.bind_arguments, **kwargs})

    def bind_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Map positional/keyword program arguments to names (bound ones fill the gaps).

        Raises:
            TypeError: arguments that do not fit the function's signature.
        """
        sig = inspect.signature(self.func)
        merged = {**self.bind_arguments, **kwargs}
        try:
            bound = sig.bind(None, *args, **merged)
        except TypeError as exc:
            raise TypeError(f"{self.__name__}(): {exc}{option_hint(merged)}") from None
        bound.apply_defaults()
        first = next(iter(sig.parameters))
        return {k: v for k, v in bound.arguments.items() if k != first}

    def run(
        self,
        *args: Any,
        max_new_tokens: int = 128,
        n: int = 1,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        stop_regex: str | list[str] | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        ignore_eos: bool = False,
        return_logprob: bool | None = None,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None,
        stream: bool = False,
        backend: Any = None,
        use_thread: bool = True,
        **kwargs: Any,
    ) -> ProgramState:
        """Execute the program once (SGLang's ``SglFunction.run``).

        Args:
            *args, **kwargs: program arguments; keyword arguments named like radixlm's other
                sampling parameters (``min_new_tokens``, ``repetition_penalty``, ``seed``) become
                defaults too.
            max_new_tokens .. return_text_in_logprobs: defaults for every ``gen`` of the program
                (a ``gen``'s own arguments win).
            stream: run the body on its own thread and stream generations (``s.text_iter()``).
            backend: a Backend, ``Engine``, ``Runtime``, or ``None`` for
                ``global_config.default_backend``.
            use_thread: False runs every appended node before ``s += ...`` returns.
        Returns:
            the :class:`~radixlm.interpreter.state.ProgramState`; results may still be in flight
            (``s["x"]`` and ``s.text()`` wait for them).
        Raises:
            TypeError: bad arguments; RuntimeError: no backend available.
        """
        from radixlm.interpreter.runner import run_program

        if is_tracing():  # NOTE: a traced body (e.g. run_batch's prefix scan) never runs programs
            raise StopTracing(f"{self.__name__}.run() runs a separate program")
        sampling, program_kwargs = split_run_kwargs(kwargs)
        explicit = self._claim_program_arguments(_explicit(locals()), args, program_kwargs)
        defaults = run_defaults({**explicit, **sampling})
        return run_program(self, backend, args, program_kwargs, defaults, stream,
                           use_thread=use_thread)

    def _claim_program_arguments(self, explicit: dict[str, Any], args: tuple[Any, ...],
                                 program_kwargs: dict[str, Any]) -> dict[str, Any]:
        """Give a required program parameter named like a run option (``def f(s, question, n)``
        run as ``f.run(question=q, n=5)``) its value: Python binds ``n`` to ``run``'s option,
        which leaves the program without its argument (a TypeError in SGLang).  Only parameters
        without a default that are not given otherwise are claimed, so programs that run under
        SGLang keep its meaning; the option then keeps its default.  Updates ``program_kwargs``;
        returns the remaining options."""
        given = set(self.arg_names[: len(args)]) | set(program_kwargs) | set(self.bind_arguments)
        params = inspect.signature(self.func).parameters
        out = dict(explicit)
        for name, value in explicit.items():
            if name in params and name not in given and name in self.arg_names \
                    and params[name].default is inspect.Parameter.empty:
                program_kwargs[name] = value
                out[name] = _RUN_DEFAULTS[name]
        return out

    def run_batch(
        self,
        batch_kwargs: list[Any],
        *,
        max_new_tokens: int = 128,
        n: int = 1,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        stop_regex: str | list[str] | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        ignore_eos: bool = False,
        return_logprob: bool | None = None,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None,
        backend: Any = None,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        generator_style: bool = False,
        **sampling: Any,
    ) -> list[ProgramState] | Iterator[ProgramState]:
        """Run the program once per element of ``batch_kwargs`` in parallel, results in order.

        Args:
            batch_kwargs: list of dicts of arguments (or of positional-argument tuples).
            max_new_tokens .. return_text_in_logprobs: as in :meth:`run`; ``**sampling`` takes
                radixlm's extra sampling defaults (``min_new_tokens``, ``seed``, ...).
            backend: as in :meth:`run`.
            num_threads: worker threads, or ``"auto"`` (``min(len(batch), 64)``).
            progress_bar: show a tqdm bar.
            generator_style: return a generator yielding the finished states in input order
                instead of a list.
        Returns:
            finished program states, ``len == len(batch_kwargs)``, in input order; a program that
            failed has ``error()`` set instead of raising.
        Raises:
            TypeError: unknown sampling keyword or badly shaped arguments.
        """
        from radixlm.interpreter.runner import run_program_batch

        if is_tracing():
            raise StopTracing(f"{self.__name__}.run_batch() runs separate programs")
        unknown = set(sampling) - _SAMPLING_KEYS
        if unknown:
            raise TypeError(f"unknown run_batch options {sorted(unknown)}{option_hint(unknown)}")
        defaults = run_defaults({**_explicit(locals()), **sampling})
        return run_program_batch(self, backend, list(batch_kwargs), defaults, num_threads,
                                 progress_bar, generator_style=generator_style)

    def trace(self, *, backend: Any = None, **kwargs: Any) -> TracedProgram:
        """The program's IR, with ``kwargs`` as known arguments (others are placeholders).

        ``backend`` is accepted for SGLang compatibility; use ``TracedProgram.constant_prefix
        (backend.chat_template)`` to render role markers.
        """
        return trace_program(self, kwargs)

    def compile(self, *, backend: Any = None) -> CompiledFunction:
        """SGLang's ``compile``: a :class:`CompiledFunction` with ``run`` / ``run_batch`` /
        ``print_graph``. radixlm runs compiled programs with the same interpreter (``run``'s
        results; the trace is kept for ``print_graph``)."""
        return CompiledFunction(self, backend)

    def cache(self, backend: Any = None) -> str:
        """Send the traced constant prefix to the backend's prefix cache; returns that prefix."""
        from radixlm.interpreter.runner import cache_program

        return cache_program(self, backend)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``f(s, ...)`` inside a program appends ``f``'s nodes to ``s``; otherwise ``f.run(...)``
        (while a body is being traced, that stops the trace instead)."""
        if args and isinstance(args[0], StateBase):
            merged = {**self.bind_arguments, **kwargs}
            return self.func(args[0], *args[1:], **merged)
        return self.run(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<radixlm.function {self.__name__}>"


class CompiledFunction:
    """What :meth:`Function.compile` returns (SGLang's ``sglang.lang.compiler.CompiledFunction``).

    Attributes:
        function: the compiled :class:`Function`; backend: the backend given to ``compile``.
    """

    def __init__(self, function: Function, backend: Any = None) -> None:
        self.function = function
        self.backend = backend
        self.traced = function.trace(backend=backend)

    def print_graph(self) -> None:
        """Print the program's IR (its trace with placeholder arguments)."""
        print(self.traced)

    def run(self, *, backend: Any = None, **kwargs: Any) -> ProgramState:
        """Run once; keyword arguments only (program arguments and sampling defaults, as
        :meth:`Function.run`)."""
        return self.function.run(backend=backend or self.backend, **kwargs)

    def run_batch(self, batch_kwargs: list[dict[str, Any]], *, backend: Any = None,
                  **kwargs: Any) -> list[ProgramState]:
        """Run once per dict of ``batch_kwargs`` (options as :meth:`Function.run_batch`)."""
        return self.function.run_batch(batch_kwargs, backend=backend or self.backend, **kwargs)


_RUN_DEFAULTS = {k: p.default for k, p in inspect.signature(Function.run).parameters.items()
                 if k in _RUN_SAMPLING}


def function(func: Callable[..., Any] | None = None,
             num_api_spec_tokens: int | None = None) -> Any:
    """Decorator turning ``def f(s, ...)`` into a :class:`Function`.

    Usable bare (``@function``) or with options (``@function(num_api_spec_tokens=64)``).
    """
    if func is None:
        return lambda f: Function(f, num_api_spec_tokens=num_api_spec_tokens)
    return Function(func, num_api_spec_tokens=num_api_spec_tokens)
