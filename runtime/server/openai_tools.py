"""Tool calling and response formats of the OpenAI API, mapped onto constrained decoding.

``tool_choice="required"`` constrains the output to one JSON object ``{"name": ..., "arguments":
{...}}`` whose arguments match the chosen function's parameters; a named function constrains it to
that function's arguments; ``"auto"`` decodes freely and recognizes a call afterwards
(a bare JSON object of that shape, or one inside ``<tool_call>...</tool_call>``).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from radixlm.grammar.schema_drafts import DATA_KEYWORDS, SCHEMA_MAPS
from radixlm.runtime.server.protocol import ResponseFormat, Tool, ToolChoiceFunction
from radixlm.runtime.server.tokenizer_manager import RequestError

_EMPTY_PARAMS = {"type": "object", "properties": {}}
_TAGGED = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


def response_format_schema(fmt: ResponseFormat | None) -> tuple[str | None, bool]:
    """``(json_schema, strict)`` for a ``response_format``: the ``json_schema`` sampling param
    (``None`` for text) and whether ``json_schema.strict`` is true (no undeclared keys)."""
    if fmt is None or fmt.type == "text":
        return None, False
    if fmt.type == "json_object":
        return json.dumps({"type": "object"}), False
    if fmt.json_schema is None:
        raise RequestError("response_format.json_schema is required for type json_schema",
                           param="response_format.json_schema")
    return json.dumps(fmt.json_schema.schema_ or {"type": "object"}), fmt.json_schema.strict is True


def rebase_refs(schema: Any, pointer: str) -> Any:
    """``schema`` to be placed at JSON pointer ``pointer`` (e.g. ``/properties/arguments``) of
    another document: its local ``$ref``s (``#/$defs/X``) become ``#<pointer>/$defs/X`` so they
    still resolve there. Sub-schemas with an ``$id`` (or draft-4 ``id``) of their own start a new
    base and keep their references as written; data keywords (``enum``, ``const``...) are copied
    as is. (pydantic models' ``$defs``: ``openai.pydantic_function_tool`` parameters.)"""
    if isinstance(schema, list):
        return [rebase_refs(x, pointer) for x in schema]
    if not isinstance(schema, dict) or isinstance(schema.get("$id", schema.get("id")), str):
        return schema
    out = {}
    for k, v in schema.items():
        if k == "$ref" and isinstance(v, str) and (v == "#" or v.startswith("#/")):
            out[k] = "#" + pointer + v[1:]
        elif k in DATA_KEYWORDS:
            out[k] = v
        elif k in SCHEMA_MAPS and isinstance(v, dict):
            out[k] = {name: rebase_refs(x, pointer) for name, x in v.items()}
        else:
            out[k] = rebase_refs(v, pointer)
    return out


def _call_schema(tool: Tool, pointer: str) -> dict[str, Any]:
    """The ``{"name": ..., "arguments": ...}`` object of one tool, placed at ``pointer``."""
    params = rebase_refs(tool.function.parameters or _EMPTY_PARAMS, pointer + "/properties/arguments")
    return {
        "type": "object",
        "properties": {"name": {"type": "string", "enum": [tool.function.name]}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def tool_constraint(tools: list[Tool] | None, choice) -> tuple[str | None, str | None, bool]:
    """``(json_schema, forced_function_name, strict)`` for the request's tools and tool_choice.
    ``json_schema`` is ``None`` when decoding is unconstrained (no tools, ``none``, ``auto``);
    ``strict``: a function that may be called has ``strict: true`` (no undeclared keys; closing a
    non-strict function's objects too only narrows it to outputs its schema still accepts)."""
    if not tools or choice in (None, "none", "auto"):
        return None, None, False
    if isinstance(choice, ToolChoiceFunction):
        match = [t for t in tools if t.function.name == choice.function.name]
        if not match:
            raise RequestError(f"tool_choice names unknown function {choice.function.name!r}", param="tool_choice")
        fn = match[0].function
        return json.dumps(fn.parameters or _EMPTY_PARAMS), fn.name, fn.strict is True
    one = len(tools) == 1
    schemas = [_call_schema(t, "" if one else f"/anyOf/{i}") for i, t in enumerate(tools)]
    strict = any(t.function.strict is True for t in tools)
    return json.dumps(schemas[0] if len(schemas) == 1 else {"anyOf": schemas}), None, strict


def _call(name: str, arguments: Any) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": args}}


def parse_tool_calls(text: str, tools: list[Tool] | None, forced: str | None,
                     constrained: bool) -> list[dict[str, Any]] | None:
    """The ``tool_calls`` found in ``text`` (``None`` when it is plain content)."""
    if not tools:
        return None
    names = {t.function.name for t in tools}
    if forced is not None:
        return [_call(forced, text.strip())]
    candidates = [text.strip()] + ([] if constrained else _TAGGED.findall(text))
    calls = []
    for cand in candidates:
        try:
            obj = json.loads(cand)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and obj.get("name") in names and isinstance(obj.get("arguments", {}), dict):
            calls.append(_call(obj["name"], obj.get("arguments", {})))
    return calls or None
