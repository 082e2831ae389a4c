"""Tracing: run a program's Python body against a recording state to get its IR without a model.

Unknown arguments become :class:`~radixlm.lang.ir.Argument` placeholders and ``s["x"]`` becomes a
:class:`~radixlm.lang.ir.Variable` placeholder.  Tracing stops (cleanly, recorded in ``stopped``)
where the body needs a run-time value: a placeholder in an f-string, control flow on a generated
value, ``s.text()``.  The nodes recorded up to there are exact, which is all that the constant-prefix
analysis (SGLang's ``extract_prefix_by_tracing``) needs.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from radixlm.lang.chat_template import ChatTemplate, default_chat_template
from radixlm.lang.ir import (
    Argument, Constant, Expr, Fork, Join, RoleBegin, RoleEnd, Variable, VarScopeBegin, VarScopeEnd,
)
from radixlm.lang.state import StateBase

if TYPE_CHECKING:
    from radixlm.lang.function import Function


class StopTracing(Exception):
    """Raised inside a traced body where it needs a value only known at run time."""


_tracing = threading.local()


def is_tracing() -> bool:
    """Whether this thread is running a program body for :func:`trace_program`."""
    return getattr(_tracing, "depth", 0) > 0


class TracerState(StateBase):
    """Recording program state; ``nodes`` is the IR appended so far."""

    def __init__(self, name: str = "s") -> None:
        self.name = name
        self.nodes: list[Expr] = []

    def submit(self, nodes: list[Expr]) -> None:
        self.nodes.extend(nodes)

    def __getitem__(self, name: str) -> Variable:
        return Variable(name, self.name)

    def __setitem__(self, name: str, value: Any) -> None:
        pass  # NOTE: a host-side assignment adds no text; nothing to record.

    def get_var(self, name: str) -> Variable:
        return self[name]

    def fork(self, size: int = 1, position_ids_offset: Any = None) -> TracerForks:
        children = [TracerState(f"{self.name}.fork[{i}]") for i in range(size)]
        self.nodes.append(Fork(size, [c.nodes for c in children]))
        return TracerForks(children, self)

    def copy(self, position_ids_offset: Any = None) -> Any:
        """Tracing counterpart of ``ProgramState.copy``."""
        from contextlib import contextmanager

        @contextmanager
        def scope() -> Iterator[TracerState]:
            forks = self.fork(1)
            yield forks[0]
            forks.join()

        return scope()

    def _stop(self, what: str) -> Any:
        raise StopTracing(f"{what} needs run-time values")

    def text(self) -> str:
        return self._stop("s.text()")

    def messages(self) -> list[dict[str, str]]:
        return self._stop("s.messages()")

    def get_meta_info(self, name: str) -> dict[str, Any]:
        return self._stop("s.get_meta_info()")

    def sync(self) -> None:
        pass


class TracerForks:
    """Tracing counterpart of ``ForkedStates``."""

    def __init__(self, states: list[TracerState], parent: TracerState) -> None:
        self.states = states
        self.parent = parent

    def __getitem__(self, i: int) -> TracerState:
        return self.states[i]

    def __setitem__(self, i: int, value: TracerState) -> None:
        # NOTE: makes ``forks[i] += x`` work (``+=`` on the child returns the child itself).
        if value is not self.states[i]:
            raise TypeError("forked states cannot be replaced")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[TracerState]:
        return iter(self.states)

    def __iadd__(self, other: Any) -> TracerForks:
        for i, st in enumerate(self.states):
            if isinstance(other, (list, tuple)):
                st += other[i]
            else:
                st += other(i) if callable(other) else other
        return self

    def join(self, mode: str = "gather_variable") -> None:
        self.parent.nodes.append(Join(mode))



@dataclass
class TracedProgram:
    """IR of a program as recorded by :func:`trace_program`.

    Attributes:
        name: the function's name.
        arguments: argument name -> value or :class:`Argument` placeholder.
        nodes: root state's nodes in order (forks hold their children's nodes).
        stopped: why tracing stopped early, or ``None`` if the body ran to the end.
    """

    name: str
    arguments: dict[str, Any]
    nodes: list[Expr] = field(default_factory=list)
    stopped: str | None = None

    def constant_prefix(self, chat_template: ChatTemplate | None = None) -> str:
        """Text every run of the program starts with (constants and role markers before the
        first node that depends on arguments or on the model). Empty when there is none."""
        tmpl = chat_template or default_chat_template()
        out: list[str] = []
        for node in self.nodes:
            if isinstance(node, Constant):
                out.append(node.value)
            elif isinstance(node, RoleBegin):
                out.append(tmpl.begin(node.role))
            elif isinstance(node, RoleEnd):
                out.append(tmpl.end(node.role))
            elif not isinstance(node, (VarScopeBegin, VarScopeEnd)):
                break
        return "".join(out)

    def _lines(self, nodes: list[Expr], indent: str, counter: list[int]) -> list[str]:
        lines = []
        for node in nodes:
            lines.append(f"{indent}%{counter[0]} = " + str(node))
            counter[0] += 1
            if isinstance(node, Fork):
                for i, child in enumerate(node.children):
                    lines.append(f"{indent}  fork[{i}]:")
                    lines.extend(self._lines(child, indent + "    ", counter))
        return lines

    def __str__(self) -> str:
        args = ", ".join(["s", *(k + "=" + (str(v) if isinstance(v, Argument) else repr(v))
                                 for k, v in self.arguments.items())])
        lines = [f"program {self.name}({args}):", *self._lines(self.nodes, "  ", [0])]
        if self.stopped:
            lines.append(f"  ... (tracing stopped: {self.stopped})")
        return "\n".join(lines)


def trace_program(func: Function, kwargs: dict[str, Any]) -> TracedProgram:
    """Trace ``func`` (a :class:`~radixlm.lang.function.Function`) with the given arguments.

    Arguments not in ``kwargs`` (nor bound, nor defaulted) become placeholders.  Never raises for
    errors of the body: they end the trace and are described in ``TracedProgram.stopped``.
    """
    sig = inspect.signature(func.func)
    params = list(sig.parameters.values())[1:]
    arguments: dict[str, Any] = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name in kwargs:
            arguments[p.name] = kwargs[p.name]
        elif p.name in func.bind_arguments:
            arguments[p.name] = func.bind_arguments[p.name]
        elif p.default is not p.empty:
            arguments[p.name] = p.default
        else:
            arguments[p.name] = Argument(p.name)
    state = TracerState()
    program = TracedProgram(func.func.__name__, arguments, state.nodes)
    _tracing.depth = getattr(_tracing, "depth", 0) + 1
    try:
        func.func(state, **arguments)
    except StopTracing as exc:
        program.stopped = str(exc)
    except Exception as exc:  # noqa: BLE001 - placeholders make arbitrary host code fail
        program.stopped = f"{type(exc).__name__}: {exc}"
    finally:
        _tracing.depth -= 1
    return program
