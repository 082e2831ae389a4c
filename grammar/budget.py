"""A compile-time budget: long grammar-compilation loops call :func:`check_budget`, which raises a
clean :class:`GrammarError` once the deadline of the enclosing :func:`compile_budget` has passed.

Without an enclosing budget the checks are no-ops, so the automaton code stays usable on its own.
"""

from __future__ import annotations

import contextvars
import os
import time
from contextlib import contextmanager
from typing import Iterator

from radixlm.grammar.errors import GrammarError

# NOTE: below the 5 s that counts as a failed compile; RADIXLM_GRAMMAR_BUDGET_S overrides it.
DEFAULT_SECONDS = float(os.environ.get("RADIXLM_GRAMMAR_BUDGET_S", "3.0"))
_deadline: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar("grammar_deadline", default=None)


@contextmanager
def compile_budget(seconds: float | None = None) -> Iterator[None]:
    """Bound the compilation inside the ``with`` block to ``seconds`` (default
    ``DEFAULT_SECONDS``). Nested budgets keep the earliest deadline."""
    limit = DEFAULT_SECONDS if seconds is None else seconds
    outer = _deadline.get()
    deadline = time.monotonic() + limit
    if outer is not None and outer[0] < deadline:
        deadline, limit = outer
    token = _deadline.set((deadline, limit))
    try:
        yield
    finally:
        _deadline.reset(token)


def check_budget(what: str) -> None:
    """Raise GrammarError when the current compile budget is spent.

    Raises:
        GrammarError: ``"grammar too complex: compile budget of N s exceeded while <what>"``.
    """
    got = _deadline.get()
    if got is not None and time.monotonic() > got[0]:
        raise GrammarError(f"grammar too complex: compile budget of {got[1]:g} s exceeded while {what}")
