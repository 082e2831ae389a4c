"""ProgramState (the ``s`` of a running program) and ForkedStates (what ``s.fork(n)`` returns)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

from radixlm.interpreter.executor import StreamExecutor
from radixlm.lang.ir import CommitLazy, Constant, Expr
from radixlm.lang.state import StateBase


class ProgramState(StateBase):
    """A running program's state.

    ``s += x`` appends text or DSL nodes (executed in order off the caller's thread); ``s["x"]``
    waits for variable ``x``; ``s["x"] = v`` sets one.  Reading results of a failed program raises
    :class:`~radixlm.interpreter.executor.ProgramError`; ``s.error()`` returns the failure.

    Attributes:
        ret_value: what the program's Python function returned.
    """

    def __init__(self, executor: StreamExecutor) -> None:
        self.executor = executor
        self.ret_value: Any = None
        # NOTE: a dropped state ends its executor: queued nodes still run, then its lease is released.
        weakref.finalize(self, executor.end)

    def submit(self, nodes: list[Expr]) -> None:
        self.executor.submit(nodes)

    @property
    def stream_executor(self) -> StreamExecutor:
        """SGLang's name for :attr:`executor` (``text_``, ``variables``, ``meta_info``, ...)."""
        return self.executor

    # ---- variables -----------------------------------------------------------------------------

    def __getitem__(self, name: str) -> Any:
        return self.executor.wait_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.executor.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        self.sync()
        return name in self.executor.variables

    def get_var(self, name: str) -> Any:
        """Same as ``s[name]``: waits for the variable, raises if the program failed first."""
        return self.executor.wait_var(name)

    def set_var(self, name: str, value: Any) -> None:
        """Same as ``s[name] = value``."""
        self.executor.set_var(name, value)

    def get_meta_info(self, name: str) -> dict[str, Any] | None:
        """Meta info of the ``gen``/``select`` that produced ``name``: for a gen the native
        response's ``meta_info`` (``prompt_tokens``, ``completion_tokens``, ``cached_tokens``,
        ``finish_reason``, logprobs when asked); for a select the per-choice scores.  ``None``
        when the program produces no such variable; ProgramError if it failed first."""
        try:
            self.executor.wait_var(name)
        except KeyError:
            return None  # NOTE: as SGLang: no such variable -> None
        return self.executor.meta_info.get(name)

    # ---- whole-state results ---------------------------------------------------------------------

    def sync(self) -> None:
        """Wait until every node appended so far has run."""
        self.executor.sync()

    def text(self) -> str:
        """The full text so far (waits for pending nodes)."""
        self.sync()
        return self.executor.text_

    def messages(self) -> list[dict[str, str]]:
        """Closed chat messages as ``[{"role", "content"}]`` (waits for pending nodes)."""
        self.sync()
        return list(self.executor.messages_)

    def error(self) -> BaseException | None:
        """The exception that stopped the program, or ``None`` (waits for pending nodes)."""
        self.sync()
        return self.executor.error_

    def end(self) -> None:
        """Declare that nothing more will be appended (run() does this after the body)."""
        self.executor.end()

    # ---- fork ---------------------------------------------------------------------------------

    def fork(self, size: int = 1, position_ids_offset: Any = None) -> ForkedStates:
        """Split into ``size`` independent states that continue from the current text.

        When ``size > 1``, the text is not empty and the backend's ``fork_commits_prefix`` is set
        (the in-process Engine), the text is first committed with one prefill-only request so the
        children's requests find it in the prefix cache; over HTTP (``RuntimeEndpoint``) nothing
        is sent and the server shares the prefix among the children's requests, so ``fork(3)`` +
        3 gens is 3 requests, as from SGLang's frontend.  ``fork(1)`` and forks of an empty state
        never commit.  ``position_ids_offset`` is accepted and ignored.

        Raises:
            ValueError: ``size`` < 1.
        """
        size = int(size)
        if size < 1:
            raise ValueError("fork size must be >= 1")
        self.sync()
        if size > 1 and self.executor.text_ and self.executor.backend.fork_commits_prefix:
            self.submit([CommitLazy()])
            self.sync()
        return ForkedStates([ProgramState(self.executor.fork_child()) for _ in range(size)], self)

    @contextmanager
    def copy(self, position_ids_offset: Any = None) -> Iterator[ProgramState]:
        """``with s.copy() as c:`` a ``fork(1)`` child, joined (``gather_variable``) on exit."""
        forks = self.fork(1, position_ids_offset)
        try:
            yield forks[0]
        finally:
            forks.join()

    # ---- streaming --------------------------------------------------------------------------

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Yield text as it is appended (generation deltas when run with ``stream=True``).

        Args:
            var_name: only yield the pieces of that variable's generation, and stop once it is
                complete; ``None`` yields everything appended until the program ends.  Without
                ``stream=True`` the variable's value is yielded once, as SGLang does (so
                ``var_scope`` variables and joined lists work too).
        """
        ex = self.executor
        if var_name is not None and not ex.stream:
            yield self.get_var(var_name)
            return
        idx = 0
        while True:
            with ex._cond:
                ex._cond.wait_for(lambda: len(ex.chunks) > idx or ex.finished
                                  or ex.error_ is not None
                                  or (var_name is not None and var_name in ex.variables))
                batch = ex.chunks[idx:]
                idx = len(ex.chunks)
                done = (ex.finished or ex.error_ is not None
                        or (var_name is not None and var_name in ex.variables))
            for var, piece in batch:
                if var_name is None or var == var_name:
                    yield piece
            if done and not batch:
                return

    async def text_async_iter(self, var_name: str | None = None,
                              return_meta_data: bool = False) -> AsyncIterator[Any]:
        """Async version of :meth:`text_iter`; with ``return_meta_data`` yields ``(piece, meta)``
        where meta is the variable's meta info once known (else ``{}``)."""
        loop = asyncio.get_running_loop()
        it = self.text_iter(var_name)
        end = object()
        while True:
            piece = await loop.run_in_executor(None, next, it, end)
            if piece is end:
                return
            if return_meta_data:
                yield piece, self.executor.meta_info.get(var_name or "", {})
            else:
                yield piece

    def __repr__(self) -> str:
        return f"ProgramState({self.text()})"


class ForkedStates:
    """The children of ``s.fork(n)``: index, iterate, ``forks += x`` appends to every child."""

    def __init__(self, states: list[ProgramState], parent: ProgramState) -> None:
        self.states = states
        self.parent = parent
        self._base_vars = dict(parent.executor.variables)
        self._base_len = len(parent.executor.text_)

    @property
    def src_state(self) -> ProgramState:
        """SGLang's name for :attr:`parent`, the forked state."""
        return self.parent

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        # NOTE: makes ``forks[i] += x`` work (``+=`` on the child returns the child itself).
        if value is not self.states[i]:
            raise TypeError("forked states cannot be replaced")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: Any) -> ForkedStates:
        """Append to every child: ``other(i)`` for a callable, ``other[i]`` for a list or tuple
        (one per child), else ``other`` itself. Raises ValueError for a list of the wrong size."""
        if isinstance(other, (list, tuple)) and len(other) != len(self.states):
            raise ValueError(f"{len(other)} items for {len(self.states)} forks")
        for i, st in enumerate(self.states):
            if isinstance(other, (list, tuple)):
                st += other[i]
            elif callable(other):
                st += other(i)
            else:
                st += other
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """Wait for every child and bring results back to the parent.

        Args:
            mode: ``"gather_variable"``: each variable set in the children after the fork becomes a
                list in the parent (``None`` where a child lacks it); ``"concate_and_append"``:
                the children's new text is appended to the parent's text, in child order.
        Raises:
            ValueError: unknown mode. A child's failure becomes the parent's error.
        """
        if mode not in ("gather_variable", "concate_and_append"):
            raise ValueError(f"unknown join mode {mode!r}")
        for st in self.states:
            st.sync()
            st.executor.release_lease()  # NOTE: a joined branch is not extended again
        failed = next((st.executor.error_ for st in self.states if st.executor.error_), None)
        if failed is not None:
            self.parent.executor.set_error(failed)
            return
        if mode == "gather_variable":
            names: list[str] = []
            for st in self.states:
                for k, v in st.executor.variables.items():
                    new = k not in self._base_vars or v is not self._base_vars[k]
                    if new and k not in names:
                        names.append(k)
            for k in names:
                self.parent.executor.set_var(k, [st.executor.variables.get(k) for st in self.states])
        else:
            tail = "".join(st.executor.text_[self._base_len:] for st in self.states)
            self.parent.submit([Constant(tail)])


# NOTE: SGLang's name for the children of a fork.
ProgramStateGroup = ForkedStates
