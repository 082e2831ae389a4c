"""Operations shared by every program state: the interpreter's and the tracer's.

A state only needs ``submit(nodes)``; ``s += x``, role helpers and ``var_scope`` are built on it, so
programs behave the same whether they are executed or traced.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from radixlm.lang.ir import Expr, RoleBegin, RoleEnd, VarScopeBegin, VarScopeEnd, as_exprs


class StateBase(ABC):
    """Base of program states (``s`` in ``@function def f(s, ...)``)."""

    @abstractmethod
    def submit(self, nodes: list[Expr]) -> None:
        """Append ``nodes`` to this state's program, in order."""

    def __iadd__(self, other: Any) -> StateBase:
        if other is None:
            raise ValueError("Tried to append None to state.")  # NOTE: SGLang's error
        self.submit(as_exprs(other))
        return self

    def _role(self, role: str, expr: Any) -> Any:
        if expr is not None:
            self.submit([RoleBegin(role), *as_exprs(expr), RoleEnd(role)])
            return None
        return self._role_scope(role)

    @contextmanager
    def _role_scope(self, role: str) -> Iterator[None]:
        self.submit([RoleBegin(role)])
        yield
        self.submit([RoleEnd(role)])

    def system(self, expr: Any = None) -> Any:
        """Append a system message, or with no argument return a ``with`` scope for one."""
        return self._role("system", expr)

    def user(self, expr: Any = None) -> Any:
        """Append a user message, or with no argument return a ``with`` scope for one."""
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> Any:
        """Append an assistant message, or with no argument return a ``with`` scope for one."""
        return self._role("assistant", expr)

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """``with s.var_scope("x"):`` stores all text appended inside the block in ``s["x"]``."""
        self.submit([VarScopeBegin(name)])
        yield
        self.submit([VarScopeEnd(name)])
