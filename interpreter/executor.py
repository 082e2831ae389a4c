"""StreamExecutor: runs one state's IR nodes in order on a worker thread (SGLang's design).

The program body (on the caller's thread) only appends nodes; the worker sends the requests.  So a
body that forks, or a batch of programs, keeps many requests in flight and the runtime batches them.
All mutable state is guarded by one condition variable that is notified whenever a variable, a
text chunk, an error or the end of the queue appears, so no waiter can miss a wake-up.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from dataclasses import replace
from typing import Any

from radixlm.interpreter.backend import Backend
from radixlm.interpreter.lease import leasing
from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.ir import (
    CommitLazy, Constant, Expr, ExprList, Gen, RoleBegin, RoleEnd, SamplingParams, Select,
    SeparateReasoning, VarScopeBegin, VarScopeEnd, reasoning_variable,
)

logger = logging.getLogger(__name__)


class ProgramError(RuntimeError):
    """Raised when reading a result of a program that failed; ``__cause__`` is the failure."""


class StreamExecutor:
    """Executes nodes for one program state.

    Attributes:
        text_: the state's text so far (prompt + completions).
        variables: name -> value (str, or list after a fork join).
        meta_info: name -> meta info dict of the gen/select that produced it.
        messages_: chat messages closed so far (``{"role", "content"}``).
        error_: the first exception raised by the program or a request, else ``None``.
        chunks: ``(variable name or None, text piece)`` in the order text was appended.
        lease_id: the cache lease this state's requests carry (``interpreter/lease.py``), or
            ``None`` when the backend keeps no leases; released when the executor ends.
    """

    def __init__(self, backend: Backend, defaults: SamplingParams, stream: bool = False,
                 chat_template: ChatTemplate | None = None,
                 num_api_spec_tokens: int | None = None) -> None:
        self.backend = backend
        self.num_api_spec_tokens = num_api_spec_tokens
        self.speculated_text = ""
        self.defaults = defaults
        self.stream = stream
        self.chat_template = chat_template or backend.chat_template
        self.text_ = ""
        self.variables: dict[str, Any] = {}
        self.meta_info: dict[str, Any] = {}
        self.messages_: list[dict[str, str]] = []
        self.chunks: list[tuple[str | None, str]] = []
        self.error_: BaseException | None = None
        self.children: list[StreamExecutor] = []
        # NOTE: the thread running the program body (the only one that submits nodes).
        self.owner: int | None = None
        self.cur_role: str | None = None
        self._role_pos = 0
        self._scope_pos: dict[str, int] = {}
        self._pending = 0
        self._ended = False
        self._cond = threading.Condition()
        self._queue: queue.Queue[Expr | None] = queue.Queue()
        # NOTE: ``run(use_thread=False)``: ``submit`` returns only once its nodes have run.
        self.inline = False
        self.lease_id: str | None = uuid.uuid4().hex if backend.supports_cache_lease else None
        self._thread = threading.Thread(target=self._work, daemon=True, name="radixlm-executor")
        self._thread.start()

    # ---- called from the program's thread ------------------------------------------------------

    def submit(self, nodes: list[Expr]) -> None:
        """Queue nodes for execution (in order)."""
        with self._cond:
            if self._ended:
                raise RuntimeError("cannot append to a program state that has ended")
            self._pending += len(nodes)
        for node in nodes:
            self._queue.put(node)
        if self.inline:
            self.sync()

    def end(self) -> None:
        """No more nodes will come; the worker exits when the queue is drained. Idempotent."""
        with self._cond:
            if self._ended:
                return
            self._ended = True
            self._cond.notify_all()
        self._queue.put(None)
        for child in self.children:
            child.end()

    def _quiet(self) -> bool:
        """No node is pending and (seen from this thread) none can still be submitted."""
        if self._pending:
            return False
        return self._ended or self.owner is None or self.owner == threading.get_ident()

    def sync(self) -> None:
        """Block until every submitted node has run (or was skipped after an error).

        From a thread other than the program's body (e.g. the caller of ``run(stream=True)``)
        this waits until the body has finished too.
        """
        with self._cond:
            self._cond.wait_for(self._quiet)

    @property
    def finished(self) -> bool:
        """True when ended and idle: no text or variable will change any more."""
        return self._ended and self._pending == 0

    def set_error(self, exc: BaseException) -> None:
        """Record ``exc`` (first one wins) and wake every waiter; later nodes are skipped."""
        with self._cond:
            if self.error_ is None:
                self.error_ = exc
            self._cond.notify_all()

    def set_var(self, name: str, value: Any, meta: Any = None) -> None:
        """Set a variable (and its meta info) and wake its waiters."""
        with self._cond:
            self.variables[name] = value
            if meta is not None:
                self.meta_info[name] = meta
            self._cond.notify_all()

    def wait_var(self, name: str) -> Any:
        """Block until variable ``name`` exists, then return it.

        Raises:
            ProgramError: the program failed before producing it.
            KeyError: the queue is idle and no pending node can produce it.
        """
        with self._cond:
            self._cond.wait_for(lambda: name in self.variables or self.error_ is not None
                                or self._quiet())
            if name in self.variables:
                return self.variables[name]
            if self.error_ is not None:
                raise ProgramError(f"program failed before producing {name!r}: "
                                   f"{self.error_!r}") from self.error_
            raise KeyError(f"variable {name!r} is not produced by this program")

    def fork_child(self) -> StreamExecutor:
        """A new executor starting from a copy of this one's (synced) text, variables, roles."""
        child = StreamExecutor(self.backend, self.defaults, self.stream, self.chat_template,
                               self.num_api_spec_tokens)
        child.owner = self.owner
        child.inline = self.inline
        with self._cond:
            child.text_ = self.text_
            child.variables = dict(self.variables)
            child.meta_info = dict(self.meta_info)
            child.messages_ = list(self.messages_)
            child.cur_role, child._role_pos = self.cur_role, self._role_pos
            child._scope_pos = dict(self._scope_pos)
            child.error_ = self.error_
            self.children.append(child)
        return child

    # ---- worker thread --------------------------------------------------------------------------

    def release_lease(self) -> None:
        """Release this state's cache lease (its prefix will not be extended again); a later
        request of this state takes a new one."""
        lease_id = self.lease_id
        if lease_id is not None:
            self.lease_id = uuid.uuid4().hex
            try:
                self.backend.release_cache_leases([lease_id])
            except Exception as exc:  # noqa: BLE001 - an unreleased lease only waits out its TTL
                logger.warning("releasing cache lease %s failed: %s", lease_id, exc)

    def _work(self) -> None:
        with leasing(self):
            while True:
                node = self._queue.get()
                if node is None:
                    break
                try:
                    if self.error_ is None:
                        self._execute(node)
                except Exception as exc:  # noqa: BLE001 - any failure becomes the state's error
                    logger.debug("program node %s failed", node, exc_info=True)
                    self.set_error(exc)
                finally:
                    with self._cond:
                        self._pending -= 1
                        self._cond.notify_all()
        if self.lease_id is not None:  # NOTE: the program ended: nothing extends this prefix
            self.backend.release_cache_leases([self.lease_id])
            self.lease_id = None

    def _append(self, text: str, var: str | None = None) -> None:
        if text:
            with self._cond:
                self.text_ += text
                self.chunks.append((var, text))
                self._cond.notify_all()

    def _execute(self, node: Expr) -> None:
        hook = getattr(self.backend, "execute_node", None)
        if hook is not None and hook(self, node):
            return  # NOTE: an API backend (sgl.OpenAI) handled the node itself.
        if isinstance(node, Constant):
            self._append(node.value)
        elif isinstance(node, Gen):
            self._gen(node)
        elif isinstance(node, Select):
            decision = self.backend.select(self.text_, node.choices, node.choices_method)
            self._append(decision.decision, node.name)
            if node.name is not None:
                self.set_var(node.name, decision.decision, decision.meta_info)
        elif isinstance(node, RoleBegin):
            if self.cur_role is not None:  # NOTE: SGLang asserts the same
                raise ValueError(f"Nested roles are not allowed: {node.role!r} message opened "
                                 f"inside an open {self.cur_role!r} message")
            system = getattr(self.chat_template, "default_system_prompt", None)
            if system and not self.messages_ and node.role != "system":
                # NOTE: SGLang inserts the template's default system message first.
                for sub in (RoleBegin("system"), Constant(system), RoleEnd("system")):
                    self._execute(sub)
            self._append(self.chat_template.begin(node.role))
            self.cur_role, self._role_pos = node.role, len(self.text_)
        elif isinstance(node, RoleEnd):
            # NOTE: SGLang's messages() hold the content with leading whitespace stripped.
            content = self.text_[self._role_pos:].lstrip()
            with self._cond:
                self.messages_.append({"role": node.role, "content": content})
            self.cur_role = None
            self._append(self.chat_template.end(node.role))
        elif isinstance(node, VarScopeBegin):
            self._scope_pos[node.name] = len(self.text_)
        elif isinstance(node, VarScopeEnd):
            self.set_var(node.name, self.text_[self._scope_pos.pop(node.name, len(self.text_)):])
        elif isinstance(node, CommitLazy):
            self.backend.commit_prefix(self.text_)
        elif isinstance(node, SeparateReasoning):
            self._separate_reasoning(node.expr, node.model_type)
        else:
            raise TypeError(f"{type(node).__name__} nodes only appear in traces; "
                            "they cannot be executed")

    def _gen(self, node: Gen) -> None:
        params = node.params.merged(self.defaults)
        if params.n not in (None, 1):
            # NOTE: SGLang semantics: the variable is the list of n samples, the text gets the first.
            texts, metas = self.backend.generate_n(self.text_, params, int(params.n))
            self._append(texts[0], node.name)
            if node.name is not None:
                self.set_var(node.name, texts, metas)
            return
        if params.max_new_tokens == 0 and params.return_logprob:
            # NOTE: SGLang's prefill samples one token even for max_new_tokens=0, so such a gen
            # reports the next-token distribution (``output_top_logprobs[0]``, used for CoT
            # decoding); the text stays empty. Ask for that one token, keep its logprobs only.
            _, meta = self.backend.generate(self.text_, replace(params, max_new_tokens=1,
                                                                 min_new_tokens=None))
            text = ""
        elif not self.stream:
            text, meta = self.backend.generate(self.text_, params)
            self._append(text, node.name)
        else:
            parts: list[str] = []
            meta: dict[str, Any] = {}
            for delta, meta in self.backend.generate_stream(self.text_, params):
                parts.append(delta)
                if node.name is not None and meta:
                    with self._cond:  # NOTE: as SGLang, the meta info follows the stream
                        self.meta_info[node.name] = meta
                self._append(delta, node.name)
            text = "".join(parts)
        if node.name is not None:
            self.set_var(node.name, text, meta)

    def _separate_reasoning(self, expr: Expr | None, model_type: str | None) -> None:
        if self.stream or expr is None:
            return  # NOTE: as SGLang: not applied to streamed generations.
        if isinstance(expr, ExprList):
            for item in expr.items:
                self._separate_reasoning(item, model_type)
            return
        if not isinstance(expr, (Gen, Select)):
            return
        reasoning, answer = split_reasoning(str(self.variables[expr.name]), model_type)
        self.set_var(reasoning_variable(expr.name), reasoning)
        self.set_var(expr.name, answer)
        with self._cond:
            self.text_ = self.text_[: self._role_pos] + answer


def split_reasoning(text: str, model_type: str | None = None) -> tuple[str, str]:
    """``(reasoning, answer)`` of ``text`` around ``<think>...</think>``.

    Without a closing tag the text is all answer, except for ``model_type`` ``"deepseek-r1"`` (whose
    template opens the think block itself) or text that opens one: then it is all reasoning.
    """
    body = text.lstrip()
    opened = body.startswith("<think>")
    if opened:
        body = body[len("<think>"):]
    if "</think>" in body:
        reasoning, answer = body.split("</think>", 1)
        return reasoning.strip(), answer.lstrip()
    if opened or (model_type or "").lower().startswith("deepseek-r1"):
        return body.strip(), ""
    return "", text
