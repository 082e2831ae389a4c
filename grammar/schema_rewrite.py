"""Conditional keywords rewritten into ``anyOf`` branches that the converter already handles.

- ``dependentRequired`` / ``dependentSchemas`` / draft-4 ``dependencies``: for each property
  ``p``, either ``p`` is absent, or ``p`` is present together with what it depends on.
- ``if`` / ``then`` / ``else``: ``(if and then) or (not if and else)``; when ``not if`` cannot be
  expressed, only the first branch is kept (sound: it never accepts what the schema rejects, it
  may reject instances that fail ``if``).

The branches of each rewrite are mutually exclusive, so treating them as ``anyOf`` is exact.
"""

from __future__ import annotations

from typing import Any, Callable

from radixlm.grammar.errors import GrammarError

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
    if "if" in out:
        cond, then, other = out.pop("if"), out.pop("then", True), out.pop("else", True)
        branches = [{"allOf": [cond, then]}]
        if negatable(cond):
            branches.append({"allOf": [{"not": cond}, other]})
        pending.append(("anyOf", branches))
    else:  # then / else without if have no effect
        out.pop("then", None)
        out.pop("else", None)
    if pending:
        out["x-any"] = pending
    return out
