"""IR of the DSL: small node dataclasses that ``s += ...`` appends to a program.

A program is an ordered list of nodes per state (the root state and each forked child).  Nodes are
plain data: the interpreter (``radixlm.interpreter``) executes them, the tracer records them.  The
design follows SGLang's frontend IR (Zheng et al., "SGLang: Efficient Execution of Structured
Language Model Programs", 2024): constants, generation calls, selections and role markers are the
primitives; ``a + b`` of nodes builds an :class:`ExprList`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, fields, make_dataclass, replace
from typing import Any

from radixlm.lang.choices import ChoicesSamplingMethod
from radixlm.lang.constraints import (  # noqa: F401 - REGEX_* re-exported as in sglang.lang.ir
    REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR, dtype_stop_strings, dtype_to_regex,
)
from radixlm.runtime.sampling_params import SamplingParams as RuntimeSamplingParams

_node_ids = itertools.count()


class Expr:
    """Base of every IR node. ``a + b`` (or ``"text" + node``) concatenates into an ExprList."""

    def __add__(self, other: Any) -> ExprList:
        return ExprList(as_exprs(self) + as_exprs(other))

    def __radd__(self, other: Any) -> ExprList:
        return ExprList(as_exprs(other) + as_exprs(self))


def as_exprs(x: Any) -> list[Expr]:
    """Flatten ``x`` (str, Expr, ExprList, or a list/tuple of those) into a list of leaf nodes.

    Raises:
        TypeError: for values that cannot be appended to a program state.
    """
    if isinstance(x, ExprList):
        return list(x.items)
    if isinstance(x, Expr):
        return [x]
    if isinstance(x, str):
        return [Constant(x)]
    if isinstance(x, (list, tuple)):
        return [e for item in x for e in as_exprs(item)]
    raise TypeError(f"cannot append {type(x).__name__} to a program state (use str or DSL nodes)")


@dataclass(eq=False)
class ExprList(Expr):
    """A sequence of nodes executed in order."""

    items: list[Expr]

    def __str__(self) -> str:
        return " + ".join(str(e) for e in self.items)


@dataclass(eq=False)
class Constant(Expr):
    """Literal text appended to the state."""

    value: str

    def __str__(self) -> str:
        return f"Constant({self.value!r})"


def _plain(value: Any) -> Any:
    """A numpy scalar (``np.int64(16)``, common in benchmark scripts) as the Python number (also
    inside lists, e.g. ``stop_token_ids``); other values unchanged."""
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        return value.item()
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


class _DslSamplingParams:
    """Methods of the DSL's :data:`SamplingParams` (its fields are generated below)."""

    def merged(self, defaults: SamplingParams | None) -> SamplingParams:
        """A copy where every ``None`` field is taken from ``defaults`` (a run's defaults)."""
        if defaults is None:
            return replace(self)
        vals = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in vals.items():
            if v is None:
                vals[k] = getattr(defaults, k)
        return type(self)(**vals)

    def to_native(self) -> dict[str, Any]:
        """The native protocol's ``sampling_params`` dict (``None`` fields omitted; ``dtype``
        turned into ``regex`` and stop strings; ``n`` left out: the interpreter expands it into a
        batch, see ``Backend.generate_n``), for JSON bodies.

        Raises:
            ValueError: for an unsupported ``dtype``.
        """
        out = {k: _plain(getattr(self, k)) for k in _RUNTIME_FIELDS
               if k != "n" and getattr(self, k) is not None}
        if isinstance(out.get("stop"), tuple):
            out["stop"] = list(out["stop"])
        if self.dtype is not None:
            out["regex"] = dtype_to_regex(self.dtype)
            out.pop("json_schema", None)
            out.pop("ebnf", None)
            extra = dtype_stop_strings(self.dtype)
            if extra:
                stop = out.get("stop") or []
                stop = [stop] if isinstance(stop, str) else list(stop)
                out["stop"] = stop + [x for x in extra if x not in stop]
        return out

    def to_runtime(self, **defaults: Any) -> RuntimeSamplingParams:
        """The runtime's :class:`~radixlm.runtime.sampling_params.SamplingParams` of the set fields
        (``defaults`` fill the unset ones), validated once, here (the in-process Engine takes it as
        is). Raises ``ValueError`` naming a bad field or an unsupported ``dtype``."""
        return RuntimeSamplingParams.validated(**{**defaults, **self.to_native()})

    def request_options(self) -> dict[str, Any]:
        """Top-level request fields (logprob options) that are set."""
        return {k: _plain(getattr(self, k)) for k in _REQUEST_FIELDS if getattr(self, k) is not None}

    def describe(self) -> str:
        """Short ``k=v`` list of the set fields, for ``__str__`` of traces."""
        return ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                         if getattr(self, f.name) is not None)


# NOTE: the sampling fields are the runtime's (runtime/sampling_params.py, the one definition);
# the DSL adds request-level options (top-level fields of a native request) and ``dtype``.
_RUNTIME_FIELDS = tuple(f.name for f in fields(RuntimeSamplingParams))
_REQUEST_FIELDS = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")
SamplingParams = make_dataclass(
    "SamplingParams",
    [(name, Any, field(default=None)) for name in (*_RUNTIME_FIELDS, *_REQUEST_FIELDS, "dtype")],
    bases=(_DslSamplingParams,),
)
SamplingParams.__module__ = __name__
SamplingParams.__doc__ = """Sampling parameters of one ``gen`` call; ``None`` means "inherit the run's default".

Fields: every field of the runtime's ``SamplingParams`` (same names and meaning: DESIGN.md
§3.1/§3.2; ``max_new_tokens`` counts tokens, ``temperature`` < 1e-6 is greedy, ``top_k`` -1 disables
it), the request-level logprob options (``return_logprob``, ``logprob_start_len``,
``top_logprobs_num``, ``return_text_in_logprobs``) and ``dtype`` (int/float/str/bool: a regex, see
:meth:`to_native`). ``json_schema`` is a JSON string (``gen`` converts dicts and pydantic classes).
:meth:`to_runtime` gives the runtime's dataclass, :meth:`to_native` the protocol dict.
"""


@dataclass(eq=False)
class Gen(Expr):
    """Call the model and append its completion; stored as variable ``name`` (if given)."""

    name: str | None
    params: SamplingParams = field(default_factory=SamplingParams)

    def __str__(self) -> str:
        extra = self.params.describe()
        return f"Gen({self.name!r}{', ' + extra if extra else ''})"


@dataclass(eq=False)
class Select(Expr):
    """Score ``choices`` as continuations and append the best one (greedy only).

    ``temperature`` must be 0 (SGLang semantics); ``choices_method`` decides how the per-token
    logprobs of each choice are turned into a decision.
    """

    name: str | None
    choices: list[str]
    temperature: float
    choices_method: ChoicesSamplingMethod

    def __str__(self) -> str:
        return f"Select({self.name!r}, choices={self.choices!r}, method={self.choices_method})"


@dataclass(eq=False)
class RoleBegin(Expr):
    """Start of a chat message; the backend's chat template gives its text."""

    role: str

    def __str__(self) -> str:
        return f"RoleBegin({self.role})"


@dataclass(eq=False)
class RoleEnd(Expr):
    """End of a chat message; records the message for ``s.messages()``."""

    role: str

    def __str__(self) -> str:
        return f"RoleEnd({self.role})"


@dataclass(eq=False)
class VarScopeBegin(Expr):
    """Start capturing the text appended from here on into variable ``name``."""

    name: str

    def __str__(self) -> str:
        return f"VarScopeBegin({self.name!r})"


@dataclass(eq=False)
class VarScopeEnd(Expr):
    """Stop capturing: variable ``name`` = the text appended since the matching begin."""

    name: str

    def __str__(self) -> str:
        return f"VarScopeEnd({self.name!r})"


@dataclass(eq=False)
class CommitLazy(Expr):
    """Send the current text as a prefill-only request so its KV enters the prefix cache."""

    def __str__(self) -> str:
        return "CommitLazy()"


@dataclass(eq=False)
class Argument(Expr):
    """Tracing placeholder for a program argument whose value is unknown at trace time."""

    name: str

    def __str__(self) -> str:
        return f"Argument({self.name!r})"

    def __format__(self, spec: str) -> str:
        from radixlm.lang.tracer import StopTracing

        raise StopTracing(f"argument {self.name!r} used in a format string")


@dataclass(eq=False)
class Variable(Expr):
    """Tracing placeholder for ``s["name"]``: the value of a variable produced at run time."""

    name: str
    source: str = "s"

    def __str__(self) -> str:
        return f"Variable({self.source}[{self.name!r}])"

    def __format__(self, spec: str) -> str:
        from radixlm.lang.tracer import StopTracing

        raise StopTracing(f"variable {self.name!r} used in a format string")

    def __bool__(self) -> bool:
        from radixlm.lang.tracer import StopTracing

        raise StopTracing(f"control flow depends on variable {self.name!r}")

    def __eq__(self, other: object) -> bool:  # type: ignore[override]
        return self.__bool__()

    __hash__ = object.__hash__


@dataclass(eq=False)
class Fork(Expr):
    """Trace record: the state forked into ``n`` children (their IR is ``children``)."""

    n: int
    children: list[list[Expr]] = field(default_factory=list)

    def __str__(self) -> str:
        return f"Fork({self.n})"


@dataclass(eq=False)
class Join(Expr):
    """Trace record: children of a fork were joined back (``mode`` as in ``ForkedStates.join``)."""

    mode: str = "gather_variable"

    def __str__(self) -> str:
        return f"Join({self.mode!r})"


@dataclass(eq=False)
class SeparateReasoning(Expr):
    """After ``expr`` ran: move the reasoning part (``<think>...</think>``) of each gen/select
    variable ``x`` inside it into ``x_reasoning_content`` and keep only the answer in ``x`` and in
    the text (SGLang's ``separate_reasoning``).  ``model_type`` ``"deepseek-r1"`` treats output
    without a closing tag as all reasoning."""

    model_type: str | None
    expr: Any = None

    def __str__(self) -> str:
        return f"SeparateReasoning({self.model_type!r})"


def reasoning_variable(name: str | None) -> str:
    """Name of the variable receiving ``name``'s reasoning. Raises ValueError for no name."""
    if not name:
        raise ValueError("separate_reasoning needs a named gen or select")
    return f"{name}_reasoning_content"


# NOTE: SGLang's IR class names, so ``from radixlm.lang.ir import SglGen`` works like sglang's.
SglExpr, SglExprList, SglConstantText, SglGen, SglSelect = Expr, ExprList, Constant, Gen, Select
SglRoleBegin, SglRoleEnd, SglVarScopeBegin, SglVarScopeEnd = RoleBegin, RoleEnd, VarScopeBegin, VarScopeEnd
SglCommitLazy, SglArgument, SglVariable, SglFork = CommitLazy, Argument, Variable, Fork
SglSamplingParams, SglSeparateReasoning = SamplingParams, SeparateReasoning


def __getattr__(name: str) -> Any:
    if name == "SglFunction":
        from radixlm.lang.function import Function

        return Function
    raise AttributeError(f"module 'radixlm.lang.ir' has no attribute {name!r}")
