"""Constraint helpers: ``dtype`` -> regex and JSON schema normalization for ``gen``.

The dtype regexes have SGLang's values (``sglang.lang.ir.REGEX_*``), so programs that import them
(``from radixlm.lang.ir import REGEX_INT``) build the same constraints.  The integer and float
patterns allow trailing spaces/newlines; as in SGLang, ``gen(dtype=int|float)`` therefore also stops
at ``" "`` and ``"\\n"`` (:func:`dtype_stop_strings`), which is how such a generation ends.
"""

from __future__ import annotations

import json
import re
from typing import Any

REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""

_DTYPE_REGEX = {
    int: REGEX_INT, "int": REGEX_INT,
    float: REGEX_FLOAT, "float": REGEX_FLOAT,
    bool: REGEX_BOOL, "bool": REGEX_BOOL,
    str: REGEX_STR, "str": REGEX_STR,
}


def dtype_to_regex(dtype: Any) -> str:
    """Regex that the output of ``gen(dtype=...)`` must match.

    Args:
        dtype: ``int``, ``float``, ``bool``, ``str`` or their names.
    Returns:
        the regex string (Python ``re`` syntax, full-match semantics).
    Raises:
        ValueError: for any other dtype.
    """
    try:
        return _DTYPE_REGEX[dtype]
    except (KeyError, TypeError):
        raise ValueError(f"unsupported dtype {dtype!r}; use int, float, bool or str") from None


def dtype_stop_strings(dtype: Any) -> list[str]:
    """Stop strings that ``gen(dtype=...)`` adds (SGLang: ``[" ", "\\n"]`` for int and float)."""
    return [" ", "\n"] if dtype in (int, "int", float, "float") else []


def json_schema_to_str(schema: Any) -> str:
    """Normalize a JSON schema given as a JSON string, a dict, or a pydantic model class.

    Returns:
        the schema serialized as a JSON string (what the native protocol's ``json_schema`` takes).
    Raises:
        TypeError: for other types.
        ValueError: for a string that is not valid JSON.
    """
    if isinstance(schema, str):
        json.loads(schema)  # NOTE: raises ValueError (JSONDecodeError) early, at program build time.
        return schema
    if isinstance(schema, dict):
        return json.dumps(schema)
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return json.dumps(schema.model_json_schema())
    raise TypeError(f"json_schema must be a str, dict or pydantic model class, got {type(schema)}")


def check_regex(pattern: str) -> None:
    """Validate a ``gen(regex=...)`` pattern when the program is built (SGLang's ``gen`` compiles
    it with ``re``).  A pattern Python's ``re`` rejects is still accepted when radixlm's grammar
    parses it (e.g. ``\\p{L}``); only the grammar's message is raised otherwise.

    Raises:
        ValueError: the pattern is not a string or is not a valid regex.
    """
    if not isinstance(pattern, str):
        raise ValueError(f"regex must be a str, got {type(pattern).__name__}")
    try:
        re.compile(pattern)
        return
    except re.error as exc:
        first = exc
    try:
        from radixlm.grammar.regex_parser import parse_regex
    except ImportError:  # NOTE: a client without the runtime's dependencies: re decides
        raise ValueError(f"invalid regex {pattern!r}: {first}") from first
    try:
        parse_regex(pattern)
    except ValueError as exc:
        raise ValueError(f"gen(regex=...): {exc}") from first
