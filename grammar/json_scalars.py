"""JSON Schema keywords of scalars -> regex AST: strings (length, pattern, format) and numbers
(bounds, multipleOf)."""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

import numpy as np

from radixlm.grammar.ast import NOTHING, Node, cat
from radixlm.grammar.automaton import ByteDFA, _trim, dfa_from_ast, regex_ast
from radixlm.grammar.budget import check_budget
from radixlm.grammar.dfa_ops import minimize, product
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.json_lexical import QUOTE, STRING_CHAR, encode_content, int_range, number_range, string

_LEAP = r"([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
_DATE = (r"([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
         r"|02-(0[1-9]|1[0-9]|2[0-8]))|" + _LEAP + "-02-29)")
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_H16 = r"[0-9a-fA-F]{1,4}"
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
_PCT = r"%[0-9A-Fa-f]{2}"
_VARNAME = rf"([A-Za-z0-9_]|{_PCT})(\.?([A-Za-z0-9_]|{_PCT}))*"
_VARSPEC = _VARNAME + r"(:[1-9][0-9]{0,3}|\*)?"
# RFC 6570 level 4: literals (no CTL, space, quote, %, <, >, \, ^, `, {, |, }) or %XX, and
# expressions {op? varspec(,varspec)*}
_URI_TEMPLATE = (rf"([^\x00-\x20\"'%<>\\^`{{|}}\x7f-\x9f]|{_PCT}|\{{[+#./;?&=,!@|]?{_VARSPEC}(,{_VARSPEC})*\}})*")
# Decoded-string regexes (full match) of the formats we check; unknown formats are annotations.
FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": _DATE + "[Tt]" + _TIME,
    "email": r"[^\s@]+@[^\s@]+",
    "idn-email": r"[^\s@]+@[^\s@]+",
    "hostname": _LABEL + r"(\." + _LABEL + ")*",
    "ipv4": rf"({_OCTET}\.){{3}}{_OCTET}",
    "ipv6": rf"(({_H16}:){{7}}{_H16}|(({_H16}:){{0,6}}{_H16})?::(({_H16}:){{0,6}}{_H16})?)",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "uri": r"[A-Za-z][A-Za-z0-9+.-]*:[^\s\"<>\\^`{|}]*",
    "uri-reference": r"[^\s\"<>\\^`{|}]*",
    "iri": r"[A-Za-z][A-Za-z0-9+.-]*:[^\s\"<>\\^`{|}]*",
    "json-pointer": r"(/([^~/]|~[01])*)*",
    "relative-json-pointer": r"(0|[1-9][0-9]*)(#|(/([^~/]|~[01])*)*)",
    "uri-template": _URI_TEMPLATE,
    "duration": r"P(([0-9]+Y)?([0-9]+M)?([0-9]+D)?(T([0-9]+H)?([0-9]+M)?([0-9]+(\.[0-9]+)?S)?)?|[0-9]+W)",
}




def valid_regex(depth: int = 3) -> str:
    """A regular subset of the regexes valid in both Python ``re`` and ECMA-262 (with and without
    the ``u`` flag), for ``format: regex``: literals, ``.``, escapes of metacharacters and
    ``\\d \\w \\s \\n ...``, classes (ranges within digits / lower / upper case from its first or
    to its last character: ``a-f``, ``1-9``; a literal ``-`` first or last),
    groups ``( )`` / ``(?: )`` nested at most ``depth`` levels, alternation, one quantifier per atom
    (``* + ? {n} {n,} {n,m}`` with ``n <= m <= 99``, two-digit
    bounds in different tens, lazy ``?``), ``^ $ \\b \\B`` (not quantified). A sound
    restriction: a valid regex outside it (deeper groups, lookaround, ``[b-e]``, ``{12,15}``) is
    refused, never an invalid one accepted."""
    lit = r"[^\\^$.|?*+()\[\]{}]"
    esc = r"\\[\\^$.|?*+()\[\]{}/dDwWsSnrtfv]"
    ranges = "|".join(f"{lo}-[{lo}-{hi}]|[{lo}-{hi}]-{hi}" for lo, hi in ("09", "az", "AZ"))
    esc_in = r"\\[\\\[\]^\-./dDwWsSnrtfv]"
    item = rf"([^\\\[\]\-]|{esc_in}|{ranges})"
    first = rf"([^\\\[\]\-^]|{esc_in}|{ranges})"  # NOTE: a leading ^ would negate
    klass = rf"\[\^?(-|-?{first}{item}*-?)\]"  # NOTE: a literal - only first or last
    counts = "|".join([rf"{a},([{a}-9]|[1-9][0-9])" for a in range(10)]
                      + [rf"{t}[0-9],[{t + 1}-9][0-9]" for t in range(1, 9)])
    counts = rf"\{{({counts})\}}"
    quant = rf"([*+?]|\{{[0-9]{{1,4}},?\}}|{counts})\??"
    body = None
    for _ in range(depth + 1):
        atom = rf"{lit}|\.|{esc}|{klass}" + (rf"|\((\?:)?{body}\)" if body else "")
        body = rf"(({atom})({quant})?|[\^$]|\\[bB]|\|)*"
    return body


FORMATS["regex"] = valid_regex()
MAX_EXACT_LEN = 64  # length bounds up to this are unrolled in the AST, longer ones counted
# A maxLength counted with a pattern of n DFA states costs about n * maxLength product states:
# past PATTERN_LENGTH_WORK the length bound is lowered (to MIN_LOWERED at least; sound)
PATTERN_LENGTH_WORK = 40_000
MIN_LOWERED = 32
MIN_RETRIED = 16  # where even that product is too large, lowered by quarters down to this
MAX_COUNTED = 512  # maxLength above this is lowered to it (sound); minLength above it is an error
_CHAR_DFA: list[ByteDFA] = []


def counted_string(lo: int, hi: int | None) -> ByteDFA:
    """The JSON strings of ``lo``..``hi`` characters (None: unbounded), built directly as layers
    of the one-character DFA (a character's DFA is prefix-free: its accepting states are final)."""
    if not _CHAR_DFA:
        _CHAR_DFA.append(dfa_from_ast(STRING_CHAR))
    one = _CHAR_DFA[0]
    inner = [q for q in range(1, one.n_states) if not one.accept[q]]
    local = {q: j for j, q in enumerate(inner)}
    k, start = len(inner), local[one.start]
    layers = (hi if hi is not None else lo) + 1
    same = np.full((k, 256), -1, dtype=np.int64)
    done = np.zeros((k, 256), dtype=bool)
    for j, q in enumerate(inner):
        row = one.trans[q]
        for b in np.nonzero(row)[0].tolist():
            t = int(row[b])
            if one.accept[t]:
                done[j, b] = True
            else:
                same[j, b] = local[t]
    n = 3 + layers * k  # 0 dead, 1 before the opening quote, 2 after the closing quote
    trans = np.zeros((n, 256), dtype=np.int32)
    for i in range(layers):
        off = 3 + i * k
        nxt = off + k + start if i + 1 < layers else (off + start if hi is None else 0)
        block = np.where(same >= 0, off + same, np.where(done, nxt, 0))
        trans[off : off + k] = block
        if i >= lo:
            trans[off + start, 0x22] = 2
    trans[1, 0x22] = 3 + start
    accept = np.zeros(n, dtype=bool)
    accept[2] = True
    return _trim(trans, accept)


def content_dfa(pattern: str, search: bool) -> ByteDFA:
    """The JSON strings (with quotes, every encoding) whose decoded text matches ``pattern``
    (memoized per process: the returned DFA is shared, never to be modified)."""
    key = (pattern, search)
    got = _CONTENT_DFAS.get(key)
    if got is not None:
        check_budget("building an automaton", 2)
        return got
    # NOTE: the AST of a class over every encoding (\w, non-ASCII ranges) costs ~10 ms to build,
    # before the automaton memo can find it: an object met again at each level of a deep schema
    # rebuilt its patternProperties' ASTs unseen by the budget (flatpak: 1,451 times)
    check_budget("building an automaton", 20 * len(pattern) + 50)
    got = dfa_from_ast(cat(QUOTE, regex_ast(pattern, search, encode=encode_content), QUOTE))
    if len(_CONTENT_DFAS) >= CONTENT_MEMO:
        _CONTENT_DFAS.pop(next(iter(_CONTENT_DFAS)))
    _CONTENT_DFAS[key] = got
    return got


CONTENT_MEMO = 512  # patterns' automata kept per process (oldest out first)
_CONTENT_DFAS: dict[tuple[str, bool], ByteDFA] = {}


def format_dfa(name: str) -> ByteDFA:
    """The JSON strings of a checked ``format`` (minimal DFA, built once per process)."""
    got = _FORMAT_DFAS.get(name)
    if got is None:
        got = _FORMAT_DFAS[name] = minimize(content_dfa(FORMATS[name], False))
    return got


_FORMAT_DFAS: dict[str, ByteDFA] = {}


def string_node(schema: dict, extra: dict) -> Node:
    """``type: string`` with minLength / maxLength / pattern / format."""
    lo = int(schema.get("minLength", 0))
    hi = schema.get("maxLength")
    hi = None if hi is None else int(hi)
    if hi is not None and hi < lo:
        return NOTHING
    if lo > MAX_COUNTED:
        raise GrammarError(f"unsupported: string minLength above {MAX_COUNTED}")
    if hi is not None and hi > MAX_COUNTED:
        hi = MAX_COUNTED  # NOTE: a sound restriction: longer strings are rejected
    base = string(lo, hi) if lo <= MAX_EXACT_LEN and (hi is None or hi <= MAX_EXACT_LEN) else ("dfa", counted_string(lo, hi))
    patterns = [p for p in [schema.get("pattern")] + list(extra.get("pattern", [])) if p is not None]
    formats = [f for f in [schema.get("format")] + list(extra.get("format", [])) if f in FORMATS]
    if not patterns and not formats:
        return base
    dfas = [content_dfa(p, True) for p in patterns] + [format_dfa(f) for f in formats]
    out = dfas[0]
    for d in dfas[1:]:
        out = product(out, d, "and")
    if lo or hi is not None:
        if hi is not None and out.n_states * hi > PATTERN_LENGTH_WORK:
            # NOTE: the length counter times a large pattern automaton: a lower maxLength keeps the
            # product small (a sound restriction: longer strings are rejected)
            hi = min(hi, max(lo, PATTERN_LENGTH_WORK // out.n_states, MIN_LOWERED))
            base = string(lo, hi) if hi <= MAX_EXACT_LEN else ("dfa", counted_string(lo, hi))
        while True:
            try:
                out = product(out, dfa_from_ast(base), "and")
                break
            except GrammarError:
                # NOTE: the product is still too large: a lower maxLength again (sound), down to
                # the minLength or MIN_RETRIED
                if hi is None or hi * 3 // 4 < max(lo, MIN_RETRIED):
                    raise
                hi = hi * 3 // 4
                base = string(lo, hi) if hi <= MAX_EXACT_LEN else ("dfa", counted_string(lo, hi))
    return ("dfa", out) if out.start else NOTHING


def _dec(v: Any, key: str) -> Decimal:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise GrammarError(f"'{key}' must be a number")
    try:
        return Decimal(repr(v)) if isinstance(v, float) else Decimal(v)
    except InvalidOperation:
        raise GrammarError(f"'{key}' is not a finite number") from None


def bounds(schema: dict) -> tuple[Decimal | None, bool, Decimal | None, bool]:
    """(lo, lo_exclusive, hi, hi_exclusive) from minimum / maximum / exclusive* (drafts 4 and 6+)."""
    lo = hi = None
    lo_x = hi_x = False
    if "minimum" in schema:
        lo = _dec(schema["minimum"], "minimum")
        lo_x = schema.get("exclusiveMinimum") is True
    if "maximum" in schema:
        hi = _dec(schema["maximum"], "maximum")
        hi_x = schema.get("exclusiveMaximum") is True
    em, eM = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if em is not None and not isinstance(em, bool):
        v = _dec(em, "exclusiveMinimum")
        if lo is None or v >= lo:
            lo, lo_x = v, True
    if eM is not None and not isinstance(eM, bool):
        v = _dec(eM, "exclusiveMaximum")
        if hi is None or v <= hi:
            hi, hi_x = v, True
    return lo, lo_x, hi, hi_x


def _multiple_dfa(c: int, p: int) -> ByteDFA:
    """Decimals (no exponent) whose value is a multiple of ``c / 10**p``: the scaled value
    ``v * 10**p`` must be an integer divisible by ``c``. States track the remainder and how many
    fraction digits were read."""
    # state ids: 1 start, 2 after '-', 3 leading '0', then (phase, r): phase 0 = integer digits,
    # phase 1..p+1 = after '.' with phase-1 fraction digits read (p+1: beyond p, zeros only).
    def sid(phase: int, r: int) -> int:
        return 4 + phase * c + r

    n = 4 + (p + 2) * c
    trans = np.zeros((n, 256), dtype=np.int32)
    accept = np.zeros(n, dtype=bool)
    trans[1, ord("-")] = 2
    trans[1, ord("0")] = trans[2, ord("0")] = 3
    for s in (1, 2):
        for d in range(1, 10):
            trans[s, 48 + d] = sid(0, d % c)
    for r in range(c):
        for d in range(10):
            trans[sid(0, r), 48 + d] = sid(0, (r * 10 + d) % c)
        for phase in range(1, p + 1):
            for d in range(10):
                trans[sid(phase, r), 48 + d] = sid(phase + 1, (r * 10 + d) % c)
        trans[sid(p + 1, r), 48] = sid(p + 1, r)
        # the value is complete once padded to p fraction digits: r * 10**(p - read) % c == 0.
        accept[sid(0, r)] = r * 10**p % c == 0
        for phase in range(1, p + 2):
            read = min(phase - 1, p)
            accept[sid(phase, r)] = phase > 1 and r * 10 ** (p - read) % c == 0
    accept[3] = True
    trans[3, ord(".")] = sid(1, 0)
    for r in range(c):
        trans[sid(0, r), ord(".")] = sid(1, r)
    return _trim(trans, accept)


MULT_DECIMALS = 6  # fraction digits of a number's multipleOf (the automaton tracks them)
MULT_INT_DECIMALS = 40  # of an integer's (reduced to an integer modulus: 1e-8 divides every integer)


def number_node(schema: dict, extra: dict, integer: bool) -> Node:
    """``type: integer`` / ``number`` with bounds and multipleOf."""
    lo, lo_x, hi, hi_x = bounds(schema)
    if integer:
        ilo = ihi = None
        if lo is not None:
            ilo = math.floor(lo) + 1 if (lo_x or lo != math.floor(lo)) else int(lo)
        if hi is not None:
            ihi = math.ceil(hi) - 1 if (hi_x or hi != math.ceil(hi)) else int(hi)
        node = int_range(ilo, ihi) if ilo is None or ihi is None or ilo <= ihi else NOTHING
    else:
        node = number_range(lo, lo_x, hi, hi_x)
    mults = [m for m in [schema.get("multipleOf")] + list(extra.get("multipleOf", [])) if m is not None]
    for m in mults:
        q = Fraction(str(_dec(m, "multipleOf")))
        if q <= 0:
            raise GrammarError("'multipleOf' must be positive")
        p = 0
        while q.denominator != 1:
            q *= 10
            p += 1
            if p > (MULT_INT_DECIMALS if integer else MULT_DECIMALS):
                raise GrammarError(f"multipleOf {m} (too many decimals)")
        c = int(q)
        if integer:  # v * 10**p divisible by c  <=>  v divisible by c / gcd(c, 10**p)
            c, p = c // math.gcd(c, 10**p), 0
        if c > 5000:
            raise GrammarError(f"multipleOf {m} (modulus too large)")
        d = _multiple_dfa(c, p)
        node = ("dfa", product(dfa_from_ast(node), d, "and"))
    return node


BOUND_CLAMP = 10**40  # number bounds beyond +-10^40 are clamped to it (a sound restriction)


def clamped_bounds(schema: dict) -> dict:
    """``schema`` with a lower bound below ``-BOUND_CLAMP`` raised to it and an upper bound above
    ``BOUND_CLAMP`` lowered to it (a sound restriction: a 309-digit bound such as
    ``-1.79769e308`` is an automaton of thousands of states, a bound of 10^40 one of ~100)."""
    out = None
    for key, sign in (("minimum", -1), ("exclusiveMinimum", -1), ("maximum", 1), ("exclusiveMaximum", 1)):
        v = schema.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v * sign > BOUND_CLAMP:
            out = dict(schema) if out is None else out
            out[key] = sign * BOUND_CLAMP
    return schema if out is None else out
