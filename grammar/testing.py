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


def schema_table_tests(cases: list[tuple]) -> tuple:
    """The two tests of a JSON-Schema accept/reject table, for a test module to bind:
    ``test_table_agrees_with_jsonschema, test_table_token_by_token = schema_table_tests(CASES)``.

    Args:
        cases: ``(name, schema, valid instances, invalid instances)`` tuples.

    Returns:
        ``(agrees, token_by_token)``: pytest functions (parametrized) checking that ``jsonschema``
        judges every instance as the table does, and that each vocabulary of
        :func:`~radixlm.grammar.maskbench.table_vocabularies` walks every valid instance token by
        token, each token allowed by the bitmask, and refuses every invalid one
        (:func:`~radixlm.grammar.maskbench.table_failures`).
    """
    import pytest

    from radixlm.grammar.maskbench import (
        load_compiler, load_tokenizer, schema_validator, table_failures, table_vocabularies,
    )

    @pytest.mark.parametrize("name,schema,valid,invalid", cases, ids=[c[0] for c in cases])
    def agrees(name, schema, valid, invalid) -> None:
        check = schema_validator(schema)
        assert all(check.is_valid(v) for v in valid), name
        assert not any(check.is_valid(v) for v in invalid), name

    @pytest.mark.parametrize("vocab", table_vocabularies())
    def token_by_token(vocab: str) -> None:
        tok, comp = load_tokenizer(vocab), load_compiler(vocab)
        failures = table_failures(comp, tok, cases)
        assert not failures, failures

    return agrees, token_by_token


def dfa_states_along(dfa, text: bytes) -> list[int]:
    """The states of ``dfa`` (a :class:`~radixlm.grammar.byte_dfa.ByteDFA`) after each byte of
    ``text`` from its start, up to where it rejects ``text`` (the states a decode visits)."""
    out, s = [], dfa.start
    for b in text:
        s = dfa.step(s, bytes([b]))
        if not s:
            break
        out.append(s)
    return out
