"""Constraint helpers: ``dtype`` -> regex and JSON schema normalization for ``gen``.

The regexes are bounded (at most 9 integer digits, 6 fraction digits, 64 string characters) so the
token FSM always reaches a state where only EOS is allowed: a constrained generation terminates on
its own instead of running into ``max_tokens`` mid-value.
"""

from __future__ import annotations

import json
from typing import Any

REGEX_INT = r"-?[0-9]{1,9}"
REGEX_FLOAT = r"-?[0-9]{1,9}(\.[0-9]{1,6})?"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r'"[^"\\\n]{0,64}"'

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
