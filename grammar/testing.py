"""Grammars shared by the grammar tests and benchmarks (lark EBNF, as ``kind="ebnf"`` reads it)."""

from __future__ import annotations

# JSON values (lark's common terminals; whitespace ignored between tokens): a recursive grammar
# whose masks need the Earley engine's crossings at every terminal boundary.
JSON_EBNF = r"""
root: value
?value: object | array | ESCAPED_STRING | SIGNED_NUMBER | "true" | "false" | "null"
array: "[" [value ("," value)*] "]"
object: "{" [pair ("," pair)*] "}"
pair: ESCAPED_STRING ":" value
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
"""

# Arithmetic with precedence, unary minus and inline whitespace.
ARITH_EBNF = """
root: expr
?expr: term (("+" | "-") term)*
?term: factor (("*" | "/") factor)*
?factor: NUMBER | "(" expr ")" | "-" factor
%import common.NUMBER
%import common.WS_INLINE
%ignore WS_INLINE
"""
