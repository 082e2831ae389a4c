"""Conditional keywords rewritten into ``anyOf`` branches that the converter already handles.

- ``dependentRequired`` / ``dependentSchemas`` / draft-4 ``dependencies``: for each property
  ``p``, either ``p`` is absent, or ``p`` is present together with what it depends on.
- ``if`` / ``then`` / ``else``: ``(if and then) or (not if and else)``; when ``not if`` cannot be
  expressed, ``(if and then) or (then and else)`` (just ``then`` without ``else``): sound, it never
  accepts what the schema rejects; it rejects the instances that fail ``if`` and ``then``.

The branches of each exact rewrite are mutually exclusive, so treating them as ``anyOf`` is exact.

An ``allOf`` of ``if`` / ``then`` clauses whose ``if`` each tests one property for a different
constant (a discriminator: ``if type == "a" then ...``) is rewritten at once
(:func:`fold_discriminated`): one ``anyOf`` of ``n + 2`` exclusive cases instead of ``2^n``
combinations of clauses expanded one by one.
"""

from __future__ import annotations

from typing import Any, Callable

import json

from radixlm.grammar.errors import GrammarError
from radixlm.grammar.schema_checks import UNDER
from radixlm.grammar.schema_merge import ANNOTATIONS, guard, unevaluated

DEPENDENCY_KEYWORDS = ("dependencies", "dependentRequired", "dependentSchemas")


def rewrite_conditionals(schema: dict, negatable: Callable[[Any], bool]) -> dict:
    """``schema`` with its conditional keywords turned into ``x-any`` entries.

    Args:
        negatable: whether ``{"not": s}`` can be expressed (by the converter).
    Raises:
        GrammarError: a malformed dependency value.
    """
    if not any(k in schema for k in DEPENDENCY_KEYWORDS + ("if", "then", "else")):
        return schema
    out = dict(schema)
    pending = list(out.get("x-any", []))
    for key in DEPENDENCY_KEYWORDS:
        deps = out.pop(key, None)
        if deps is None:
            continue
        if not isinstance(deps, dict):
            raise GrammarError(f"'{key}' must be an object")
        for prop, dep in deps.items():
            if isinstance(dep, list):
                present: Any = {"required": [prop] + [d for d in dep if d != prop]}
            elif isinstance(dep, (dict, bool)):
                present = {"allOf": [{"required": [prop]}, dep]}
            else:
                raise GrammarError(f"'{key}' of {prop!r} must be a list or a schema")
            pending.append(("anyOf", [{"properties": {prop: False}}, present]))
    if "if" in out and "then" not in out and "else" not in out and not unevaluated(out):
        out.pop("if")  # NOTE: no effect (its annotations matter only to unevaluatedProperties)
    if "if" in out:
        cond, then, other = out.pop("if"), out.pop("then", True), out.pop("else", True)
        u = out  # NOTE: a failed if's (and its then's) annotations do not count
        branches = [{"allOf": [cond, then]}]
        exact = negatable(cond)
        if exact:
            branches.append({"allOf": [guard({"not": cond}, u), other]})
        elif other is True or other == {}:
            # NOTE: then alone holds with the condition or without it (beside unevaluated*, the
            # condition's annotations count in the first branch only)
            branches = branches + [guard(then, u)] if unevaluated(out) else [then]
        else:
            branches.append({"allOf": [guard(then, u), guard(other, u)]})  # NOTE: both: valid whatever the condition
        pending.append(("anyOf" if exact else UNDER, branches))
    else:  # then / else without if have no effect
        out.pop("then", None)
        out.pop("else", None)
    if pending:
        out["x-any"] = pending
    return out


MIN_DISCRIMINATED = 3  # clauses on one property worth rewriting together


def _case(clause: Any) -> tuple[str, str, Any, bool] | None:
    """``(property, canonical constant, constant, required)`` of a clause ``{"if": {"properties":
    {p: {"const": c}}}, "then": ...}`` (``if`` may also require ``p``; no ``else``), else None."""
    if not isinstance(clause, dict) or "if" not in clause or "else" in clause:
        return None
    if any(k not in ("if", "then") and k not in ANNOTATIONS for k in clause):
        return None
    cond = clause["if"]
    if not isinstance(cond, dict) or any(k not in ("properties", "required") and k not in ANNOTATIONS for k in cond):
        return None
    props = cond.get("properties")
    if not isinstance(props, dict) or len(props) != 1:
        return None
    (p, v), = props.items()
    req = cond.get("required", [])
    if not isinstance(v, dict) or req not in ([], [p]) or any(k != "const" and k not in ANNOTATIONS for k in v):
        return None
    if "const" not in v:
        return None
    try:
        return p, json.dumps(v["const"], sort_keys=True), v["const"], bool(req)
    except (TypeError, ValueError):
        return None


def fold_discriminated(branches: list) -> list:
    """``allOf`` branches with the ``if`` / ``then`` clauses on one discriminator property ``p``
    (each ``if`` ``p`` equals a different constant, no ``else``; at least ``MIN_DISCRIMINATED``)
    replaced by one exact ``anyOf`` of exclusive cases, for objects: ``p`` equals the constant of
    clause ``i`` (only that clause's ``then`` applies); ``p`` is present with another value (none
    applies); ``p`` is absent (the ``then`` of every clause whose ``if`` does not require ``p``).
    A non-object instance satisfies every ``if``: the caller applies this to object-only schemas."""
    groups: dict[str, list[int]] = {}
    cases = [_case(b) for b in branches]
    for i, c in enumerate(cases):
        if c is not None:
            groups.setdefault(c[0], []).append(i)
    out = list(branches)
    drop: set[int] = set()
    for p, idx in groups.items():
        keys = [cases[i][1] for i in idx]
        if len(idx) < MIN_DISCRIMINATED or len(set(keys)) != len(keys):
            continue
        thens = [branches[i].get("then", True) for i in idx]
        anyof: list[Any] = [{"allOf": [{"required": [p], "properties": {p: {"const": cases[i][2]}}}, t]}
                            for i, t in zip(idx, thens)]
        anyof.append({"required": [p], "properties": {p: {"not": {"enum": [cases[i][2] for i in idx]}}}})
        anyof.append({"allOf": [{"properties": {p: False}}] + [t for i, t in zip(idx, thens) if not cases[i][3]]})
        out[idx[0]] = {"anyOf": anyof}
        drop.update(idx[1:])
    return [b for i, b in enumerate(out) if i not in drop]
