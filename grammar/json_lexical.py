"""Regex ASTs for JSON lexical pieces: strings (and their escapes), integer / decimal ranges,
literal values (``enum`` / ``const``)."""

from __future__ import annotations

import itertools
import json
from decimal import Decimal
from typing import Any

import numpy as np

from radixlm.grammar.ast import EMPTY, NOTHING, Node, alt, cat, char, chars, lit, opt, rep, star
from radixlm.grammar.automaton import ByteDFA
from radixlm.grammar.regex_parser import MAX_CP, normalize

_HEX = "0123456789abcdef"
# An enum / const object of at most this many keys (and this long as JSON) matches in every key
# order; a larger one only in the order the schema writes it (a sound restriction).
LITERAL_ORDERS_MAX, LITERAL_ORDERS_CHARS = 4, 200
ENUM_ORDERS_CHARS = 2_000  # an enum longer than this (as JSON) keeps its objects' written order
_SHORT_ESC = {0x22: '"', 0x5C: "\\", 0x2F: "/", 0x08: "b", 0x0C: "f", 0x0A: "n", 0x0D: "r", 0x09: "t"}


def _digit_set(a: int, b: int, base: int) -> Node:
    if base == 10:
        return chars((48 + a, 48 + b))
    ranges = []
    for v in range(a, b + 1):
        c = _HEX[v]
        ranges.append((ord(c), ord(c)))
        if c.isalpha():
            ranges.append((ord(c.upper()), ord(c.upper())))
    return ("set", normalize(ranges))


def _fixed(lo: list[int], hi: list[int], base: int) -> Node:
    """Digit strings of fixed width with value in [lo, hi] (digits given most significant first)."""
    if not lo:
        return EMPTY
    if lo[0] == hi[0]:
        return cat(_digit_set(lo[0], lo[0], base), _fixed(lo[1:], hi[1:], base))
    k = len(lo) - 1
    parts = []
    first_full, last_full = lo[0], hi[0]
    if any(lo[1:]):
        parts.append(cat(_digit_set(lo[0], lo[0], base), _fixed(lo[1:], [base - 1] * k, base)))
        first_full += 1
    tail = None
    if any(d != base - 1 for d in hi[1:]):
        tail = cat(_digit_set(hi[0], hi[0], base), _fixed([0] * k, hi[1:], base))
        last_full -= 1
    if first_full <= last_full:
        parts.append(cat(_digit_set(first_full, last_full, base), rep(_digit_set(0, base - 1, base), k, k)))
    if tail is not None:
        parts.append(tail)
    return alt(*parts)


def _digits(v: int, width: int, base: int) -> list[int]:
    out = []
    for _ in range(width):
        out.append(v % base)
        v //= base
    return out[::-1]


def hex4_range(lo: int, hi: int) -> Node:
    """Four hex digits (either case) with value in [lo, hi]."""
    return _fixed(_digits(lo, 4, 16), _digits(hi, 4, 16), 16)


def _nonneg_int(a: int, b: int | None) -> Node:
    """Canonical decimal naturals in [a, b] (b None: unbounded)."""
    if b is not None and b < a:
        return NOTHING
    la = len(str(a))
    lb = len(str(b)) if b is not None else la
    parts = []
    for n in range(la, lb + 1):
        lo = max(a, 10 ** (n - 1) if n > 1 else 0)
        hi = min(b, 10**n - 1) if b is not None else 10**n - 1
        if lo <= hi:
            parts.append(_fixed(_digits(lo, n, 10), _digits(hi, n, 10), 10))
    if b is None:
        parts.append(cat(chars((49, 57)), rep(chars((48, 57)), la, None)))
    return alt(*parts)


def int_range(lo: int | None, hi: int | None) -> Node:
    """Canonical JSON integers in [lo, hi] (None: unbounded); ``-0`` is not produced."""
    parts = []
    if hi is None or hi >= 0:
        parts.append(_nonneg_int(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        a = max(1, -hi) if hi is not None else 1
        parts.append(cat(char("-"), _nonneg_int(a, -lo if lo is not None else None)))
    return alt(*parts)


DIGIT = chars((48, 57))
INT = int_range(None, None)
FRAC = cat(char("."), rep(DIGIT, 1, None))
EXP = cat(chars((69, 69), (101, 101)), opt(chars((43, 43), (45, 45))), rep(DIGIT, 1, None))
NUMBER = cat(opt(char("-")), _nonneg_int(0, None), opt(FRAC), opt(EXP))
# Numbers that are not integers, as plain decimals (a fraction with a non-zero digit; no exponent)
FRACTION = cat(opt(char("-")), _nonneg_int(0, None), char("."), rep(DIGIT, 0, None), chars((49, 57)), rep(DIGIT, 0, None))


def _frac_ge(b: str, strict: bool) -> Node:
    """Fraction digit strings F (non-empty) with 0.F >= 0.b (> when strict); b has no trailing 0."""
    nz = cat(star(DIGIT), chars((49, 57)), star(DIGIT))
    if not b:
        return nz if strict else rep(DIGIT, 1, None)
    parts = []
    for i, d in enumerate(b):
        v = int(d)
        if v < 9:
            parts.append(cat(lit(b[:i]), chars((49 + v, 57)), star(DIGIT)))
    parts.append(cat(lit(b), nz if strict else star(DIGIT)))
    return alt(*parts)


def _frac_le(b: str, strict: bool) -> Node:
    """Fraction digit strings F (non-empty) with 0.F <= 0.b (< when strict)."""
    if not b:
        return NOTHING if strict else rep(char("0"), 1, None)
    parts = []
    for i, d in enumerate(b):
        v = int(d)
        if v > 0:
            parts.append(cat(lit(b[:i]), chars((48, 47 + v)), star(DIGIT)))
        if i >= 1:
            parts.append(lit(b[:i]))
    if not strict:
        parts.append(cat(lit(b), star(char("0"))))
    return alt(*parts)


def _split(d: Decimal) -> tuple[int, str]:
    n = int(d)  # NOTE: d >= 0 here, so int() is floor.
    frac = format(d - n, "f")
    frac = frac.split(".")[1].rstrip("0") if "." in frac else ""
    return n, frac


def _pos_number(lo: Decimal, lo_x: bool, hi: Decimal | None, hi_x: bool) -> Node:
    """Non-negative decimals (no exponent) in the interval, as ``int ("." digits)?``."""
    n_lo, f_lo = _split(lo)
    dot = char(".")
    ge_absent_ok = not f_lo and not lo_x
    ge = cat(dot, _frac_ge(f_lo, lo_x))
    ge = opt(ge) if ge_absent_ok else ge
    if hi is None:
        return alt(cat(int_range(n_lo + 1, None), opt(FRAC)), cat(int_range(n_lo, n_lo), ge))
    if hi < lo or (hi == lo and (lo_x or hi_x)):
        return NOTHING
    n_hi, f_hi = _split(hi)
    le = cat(dot, _frac_le(f_hi, hi_x))
    le = opt(le) if (not hi_x or f_hi) else le
    if n_lo == n_hi:
        from radixlm.grammar.automaton import dfa_from_ast
        from radixlm.grammar.dfa_ops import product

        both = product(dfa_from_ast(ge), dfa_from_ast(le), "and")
        return cat(int_range(n_lo, n_lo), ("dfa", both)) if both.start else NOTHING
    parts = [cat(int_range(n_lo, n_lo), ge), cat(int_range(n_hi, n_hi), le)]
    if n_hi - n_lo >= 2:
        parts.append(cat(int_range(n_lo + 1, n_hi - 1), opt(FRAC)))
    return alt(*parts)


def number_range(lo: Decimal | None, lo_x: bool, hi: Decimal | None, hi_x: bool) -> Node:
    """JSON numbers in the interval (``*_x``: exclusive). Unbounded: any JSON number; bounded:
    plain decimals without exponent."""
    if lo is None and hi is None:
        return NUMBER
    parts = []
    if hi is None or hi > 0 or (hi == 0 and not hi_x):
        low = lo if lo is not None and lo > 0 else Decimal(0)
        parts.append(_pos_number(low, lo_x if lo is not None and lo >= 0 else False, hi, hi_x))
    if lo is None or lo < 0:
        # -y with y > 0, -hi <= y <= -lo.
        low = -hi if hi is not None and hi < 0 else Decimal(0)
        low_x = hi_x if hi is not None and hi < 0 else True
        parts.append(cat(char("-"), _pos_number(low, low_x, -lo if lo is not None else None, lo_x)))
    return alt(*parts)


def multiple_of_int_dfa(k: int) -> ByteDFA:
    """Canonical JSON integers divisible by ``k`` (``k`` >= 1)."""
    # states: 1 start, 2 after '-', 3 after a leading 0 (accept), 4 + r: remainder r after digits.
    n = 4 + k
    trans = np.zeros((n, 256), dtype=np.int32)
    trans[1, ord("-")] = 2
    trans[1, ord("0")] = 3
    for s in (1, 2):
        for d in range(1, 10):
            trans[s, 48 + d] = 4 + d % k
    for r in range(k):
        for d in range(10):
            trans[4 + r, 48 + d] = 4 + (r * 10 + d) % k
    accept = np.zeros(n, dtype=bool)
    accept[3] = accept[4] = True
    from radixlm.grammar.automaton import _trim

    return _trim(trans, accept)


# --- strings -----------------------------------------------------------------------------------

def _intersect(ranges: tuple[tuple[int, int], ...], lo: int, hi: int) -> list[tuple[int, int]]:
    return [(max(a, lo), min(b, hi)) for a, b in ranges if a <= hi and b >= lo]


def encoded_char(ranges: tuple[tuple[int, int], ...]) -> Node:
    """The JSON-string encodings of one character from ``ranges``: raw where JSON allows it, the
    short escapes, and ``\\uXXXX`` (surrogate pairs above the BMP) for controls, ``"``, ``\\``
    and non-ASCII characters (what ``json.dumps`` writes with ``ensure_ascii``)."""
    special = {0x22, 0x5C}
    raw = [r for r in _intersect(ranges, 0x20, MAX_CP)]
    raw_ranges: list[tuple[int, int]] = []
    for a, b in raw:
        cur = a
        for s in sorted(special):
            if cur <= s <= b:
                if cur < s:
                    raw_ranges.append((cur, s - 1))
                cur = s + 1
        if cur <= b:
            raw_ranges.append((cur, b))
    parts: list[Node] = [("set", normalize(raw_ranges))] if raw_ranges else []
    members = set()
    for a, b in ranges:
        for c in _SHORT_ESC:
            if a <= c <= b:
                members.add(c)
    if members:
        parts.append(cat(char("\\"), ("set", normalize([(ord(_SHORT_ESC[c]),) * 2 for c in members]))))
    uni = _intersect(ranges, 0, 0x1F) + [(c, c) for c in (0x22, 0x5C) if c in members]
    uni += _intersect(ranges, 0x80, 0xD7FF) + _intersect(ranges, 0xE000, 0xFFFF)
    esc = char("\\")
    u = char("u")
    for a, b in normalize(uni):
        parts.append(cat(esc, u, hex4_range(a, b)))
    for a, b in _intersect(ranges, 0x10000, MAX_CP):
        parts.append(_surrogates(a, b))
    return alt(*parts)


def _surrogates(a: int, b: int) -> Node:
    """``\\uD8xx\\uDCxx`` pairs for the code points a..b (all above the BMP)."""
    esc_u = lit("\\u")

    def pair(hi_lo: int, hi_hi: int, lo_lo: int, lo_hi: int) -> Node:
        return cat(esc_u, hex4_range(hi_lo, hi_hi), esc_u, hex4_range(lo_lo, lo_hi))

    ha, la = 0xD800 + ((a - 0x10000) >> 10), 0xDC00 + ((a - 0x10000) & 0x3FF)
    hb, lb = 0xD800 + ((b - 0x10000) >> 10), 0xDC00 + ((b - 0x10000) & 0x3FF)
    if ha == hb:
        return pair(ha, ha, la, lb)
    parts = [pair(ha, ha, la, 0xDFFF), pair(hb, hb, 0xDC00, lb)]
    if hb - ha >= 2:
        parts.append(pair(ha + 1, hb - 1, 0xDC00, 0xDFFF))
    return alt(*parts)


# One character of a JSON string (what minLength / maxLength count): raw, a short escape, a
# ``\\uXXXX`` escape outside the surrogates, or a surrogate pair (one code point above the BMP).
# NOTE: lone surrogate escapes (valid JSON syntax, not Unicode text) are left out: counted as one
# character each, a pair read as two lone halves would pass a minLength it fails (a sound restriction).
HEX = ("set", ((48, 57), (65, 70), (97, 102)))
STRING_CHAR = alt(
    chars((0x20, 0x21), (0x23, 0x5B), (0x5D, MAX_CP)),
    cat(char("\\"), ("set", normalize([(ord(c), ord(c)) for c in '"\\/bfnrt']))),
    cat(lit("\\u"), alt(hex4_range(0, 0xD7FF), hex4_range(0xE000, 0xFFFF))),
    cat(lit("\\u"), hex4_range(0xD800, 0xDBFF), lit("\\u"), hex4_range(0xDC00, 0xDFFF)),
)
QUOTE = char('"')


def string(min_len: int = 0, max_len: int | None = None) -> Node:
    return cat(QUOTE, rep(STRING_CHAR, min_len, max_len), QUOTE)


def encode_content(node: Node) -> Node:
    """Map an AST over decoded string characters to one over their JSON encodings."""
    kind = node[0]
    if kind == "set":
        return encoded_char(node[1]) if node[1] else NOTHING
    if kind in ("cat", "alt"):
        parts = tuple(encode_content(n) for n in node[1])
        return cat(*parts) if kind == "cat" else alt(*parts)
    if kind == "rep":
        return rep(encode_content(node[1]), node[2], node[3])
    if kind == "share":
        return ("share", ("enc", node[1]), encode_content(node[2]))
    raise AssertionError(kind)


def string_literal(text: str) -> Node:
    """The JSON string ``text`` in every ``json.dumps`` encoding (ASCII escapes or raw UTF-8)."""
    parts = [QUOTE]
    for c in text:
        o = ord(c)
        if 0x20 <= o < 0x7F and c not in '"\\/':
            parts.append(char(c))
        else:
            parts.append(encoded_char(((o, o),)))
    parts.append(QUOTE)
    return cat(*parts)


def literal_exact(value: Any) -> bool:
    """Whether :func:`value_literal` spells every JSON text equal to ``value`` that a schema's
    automaton may hold (what a ``not`` must subtract): no number inside an array or object (``1``
    is also ``1.00``, ``1e0``), no object too large for every key order."""
    if isinstance(value, list):
        return all(not _is_num(v) and literal_exact(v) for v in value)
    if isinstance(value, dict):
        small = len(value) <= LITERAL_ORDERS_MAX and len(json.dumps(value)) <= LITERAL_ORDERS_CHARS
        return small and all(not _is_num(v) and literal_exact(v) for v in value.values())
    return True


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def value_literal(value: Any, comma: Node, colon: Node, open_ws: Node, orders: bool = True) -> Node:
    """A JSON value (enum / const member) with the allowed whitespace between tokens; ``orders``:
    a small object in every key order (else in the order written, a sound restriction)."""
    if isinstance(value, str):
        return string_literal(value)
    if value is None or isinstance(value, bool):
        return lit(json.dumps(value))
    if isinstance(value, int):
        return alt(lit(str(value)), lit(f"{value}.0"))
    if isinstance(value, float):
        forms = [lit(json.dumps(value))]
        if value.is_integer():
            forms.append(lit(str(int(value))))
        return alt(*forms)
    if isinstance(value, list):
        if not value:
            return cat(char("["), open_ws, char("]"))
        items = []
        for i, v in enumerate(value):
            if i:
                items.append(comma)
            items.append(value_literal(v, comma, colon, open_ws, orders))
        return cat(char("["), open_ws, *items, open_ws, char("]"))
    if isinstance(value, dict):
        if not value:
            return cat(char("{"), open_ws, char("}"))
        pairs = [cat(string_literal(k), colon, value_literal(v, comma, colon, open_ws, orders)) for k, v in value.items()]
        # NOTE: key order does not matter to JSON equality: every order of a small object
        small = orders and len(pairs) <= LITERAL_ORDERS_MAX and len(json.dumps(value)) <= LITERAL_ORDERS_CHARS
        orders = itertools.permutations(pairs) if small else [pairs]
        forms = []
        for order in orders:
            items = [order[0]]
            for p in order[1:]:
                items += [comma, p]
            forms.append(cat(*items))
        return cat(char("{"), open_ws, alt(*forms), open_ws, char("}"))
    raise TypeError(type(value))
