"""A small regex parser (Python / ECMA-262 subset) producing an AST over Unicode code points.

Supported: literals and escapes (``\\n \\t \\xhh \\uhhhh \\u{h..} \\/``), classes with ranges and
negation, ``. \\d \\D \\w \\W \\s \\S``, Unicode general categories (``\\p{L} \\P{Nd}
\\p{Letter}``), groups ``( ) (?: ) (?P<n> ) (?<n> )``, alternation,
``* + ? {n} {n,} {n,m} {,m}`` (lazy ``?`` suffixes are accepted and ignored: a constraint is about
the language, not the match), a leading ``(?i)`` / ``(?s)``, and ``^`` / ``$`` at the ends of the
pattern or of its top-level alternatives (elsewhere they are assertions, like lookarounds).
Lookahead ``(?= ) (?! )``, lookbehind ``(?<= ) (?<! )`` and ``\\b`` / ``\\B`` (ASCII word
characters, as ECMA-262 without the ``u`` flag) parse into assertion nodes, compiled exactly by
:mod:`radixlm.grammar.regex_lookaround`. Anything else (backreferences, possessive quantifiers,
``\\A \\Z \\G``) raises :class:`GrammarError` naming it.

AST nodes are tuples: ``("set", ranges)`` with ranges a sorted tuple of disjoint inclusive
``(lo, hi)`` code-point pairs, ``("cat", items)``, ``("alt", items)``, ``("rep", node, min, max)``
(max None: unbounded), ``("bol",)``, ``("eol",)``; assertions ``("look", ahead, negative, node)``
(``ahead``: lookahead, else lookbehind) and ``("wordb", negative)`` (``\\b``; ``\\B`` when
negative).
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache
from typing import Any

from radixlm.grammar.errors import GrammarError

MAX_CP = 0x10FFFF
Node = tuple[Any, ...]
Ranges = tuple[tuple[int, int], ...]

DIGIT: Ranges = ((48, 57),)
WORD: Ranges = ((48, 57), (65, 90), (95, 95), (97, 122))
SPACE: Ranges = ((9, 13), (32, 32), (160, 160), (5760, 5760), (8192, 8202), (8232, 8233), (8239, 8239), (8287, 8287), (12288, 12288))  # \s: of ECMA-262 and Python alike
SPACE_ANY: Ranges = tuple(sorted(SPACE + ((0x1C, 0x1F), (0x85, 0x85), (0xFEFF, 0xFEFF))))  # \S: a space of neither
_SIMPLE_ESC = {"n": 10, "t": 9, "r": 13, "f": 12, "v": 11, "a": 7, "0": 0}


def normalize(ranges: list[tuple[int, int]]) -> Ranges:
    """Sort and merge overlapping / adjacent ranges."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((a, b) for a, b in out)


def negate(ranges: Ranges) -> Ranges:
    """Complement over all code points (surrogates included: they never occur in UTF-8 anyway)."""
    out, prev = [], 0
    for lo, hi in ranges:
        if lo > prev:
            out.append((prev, lo - 1))
        prev = hi + 1
    if prev <= MAX_CP:
        out.append((prev, MAX_CP))
    return tuple(out)


def casefold(ranges: Ranges) -> Ranges:
    """Add the other case of every letter in the ranges (ASCII, and per char below U+0250)."""
    extra = []
    for lo, hi in ranges:
        for c in range(lo, min(hi, 0x24F) + 1):
            ch = chr(c)
            for o in (ch.lower(), ch.upper()):
                if len(o) == 1 and o != ch:
                    extra.append((ord(o), ord(o)))
    return normalize(list(ranges) + extra)


_LONG_NAMES = {
    "Letter": "L", "Lowercase_Letter": "Ll", "Uppercase_Letter": "Lu", "Titlecase_Letter": "Lt",
    "Modifier_Letter": "Lm", "Other_Letter": "Lo", "Mark": "M", "Number": "N", "Decimal_Number": "Nd",
    "Letter_Number": "Nl", "Other_Number": "No", "Punctuation": "P", "Symbol": "S", "Separator": "Z",
    "Space_Separator": "Zs", "Other": "C", "Control": "Cc", "digit": "Nd", "Alphabetic": "L",
}


@lru_cache(maxsize=None)
def unicode_category(name: str) -> Ranges | None:
    """Code-point ranges of a Unicode general category (``L``, ``Lu``, ``Nd``, ``Letter``, ...;
    also ``gc=`` / ``General_Category=`` forms); None for other properties (scripts, ...)."""
    name = name.split("=", 1)[1] if name.split("=", 1)[0] in ("gc", "General_Category") and "=" in name else name
    cat = _LONG_NAMES.get(name, name)
    if not (1 <= len(cat) <= 2 and cat[0] in "LMNPSZC" and (len(cat) == 1 or cat[1].islower())):
        return None
    out: list[tuple[int, int]] = []
    for cp in range(MAX_CP + 1):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        got = unicodedata.category(chr(cp))
        if got == cat or (len(cat) == 1 and got[0] == cat):
            if out and out[-1][1] == cp - 1:
                out[-1] = (out[-1][0], cp)
            else:
                out.append((cp, cp))
    return tuple(out) if out else None


def lit(text: str) -> Node:
    """AST for a literal string."""
    return ("cat", tuple(("set", ((ord(c), ord(c)),)) for c in text))


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.s = pattern
        self.i = 0
        self.icase = False
        self.dotall = False

    def error(self, what: str) -> GrammarError:
        return GrammarError(f"unsupported regex feature: {what} (at offset {self.i} in {self.s!r})")

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def take(self) -> str:
        if self.i >= len(self.s):
            raise GrammarError(f"invalid regex {self.s!r}: unexpected end")
        c = self.s[self.i]
        self.i += 1
        return c

    def parse(self) -> Node:
        while self.s.startswith("(?", self.i) and self.i + 2 < len(self.s) and self.s[self.i + 2] in "imsx":
            j = self.s.find(")", self.i)
            flags = self.s[self.i + 2 : j]
            if j < 0 or not set(flags) <= set("imsx") or ":" in flags:
                break
            self.icase |= "i" in flags
            self.dotall |= "s" in flags
            if "x" in flags:
                raise self.error("verbose flag (?x)")
            self.i = j + 1
        node = self.alt()
        if self.i != len(self.s):
            raise GrammarError(f"invalid regex {self.s!r}: unbalanced ')' at offset {self.i}")
        return node

    def alt(self) -> Node:
        items = [self.cat()]
        while self.peek() == "|":
            self.i += 1
            items.append(self.cat())
        return items[0] if len(items) == 1 else ("alt", tuple(items))

    def cat(self) -> Node:
        items = []
        while self.i < len(self.s) and self.peek() not in "|)":
            items.append(self.quantified())
        return items[0] if len(items) == 1 else ("cat", tuple(items))

    def quantified(self) -> Node:
        node = self.atom()
        while True:
            c = self.peek()
            if c == "*":
                lo, hi = 0, None
            elif c == "+":
                lo, hi = 1, None
            elif c == "?":
                lo, hi = 0, 1
            elif c == "{" and self._is_brace_quant():
                lo, hi = self._brace()
            else:
                return node
            if c != "{":
                self.i += 1
            if node[0] in ("bol", "eol"):
                raise self.error("quantified anchor")
            if self.peek() == "?":
                self.i += 1
            elif self.peek() == "+":
                raise self.error("possessive quantifier")
            node = ("rep", node, lo, hi)

    def _is_brace_quant(self) -> bool:
        j = self.s.find("}", self.i)
        body = self.s[self.i + 1 : j] if j > 0 else ""
        parts = body.split(",")
        return j > 0 and 1 <= len(parts) <= 2 and all(p.isdigit() or p == "" for p in parts) and body != ","

    def _brace(self) -> tuple[int, int | None]:
        j = self.s.find("}", self.i)
        body = self.s[self.i + 1 : j]
        self.i = j + 1
        if "," not in body:
            return int(body), int(body)
        a, b = body.split(",")
        lo, hi = int(a) if a else 0, (int(b) if b else None)
        if hi is not None and hi < lo:
            raise GrammarError(f"invalid regex {self.s!r}: bad repetition {{{body}}}")
        return lo, hi

    def atom(self) -> Node:
        c = self.take()
        if c == "(":
            return self.group()
        if c == "[":
            return self.charset(self.klass())
        if c == ".":
            return self.charset(((0, MAX_CP),) if self.dotall else ((0, 9), (11, MAX_CP)))
        if c == "^":
            return ("bol",)
        if c == "$":
            return ("eol",)
        if c == "\\":
            if self.peek() in ("b", "B"):
                return ("wordb", self.take() == "B")
            return self.charset(self.escape(in_class=False))
        if c in "*+?":
            raise GrammarError(f"invalid regex {self.s!r}: nothing to repeat at offset {self.i - 1}")
        return self.charset(((ord(c), ord(c)),))

    def charset(self, ranges: Ranges) -> Node:
        return ("set", casefold(ranges) if self.icase else ranges)

    def group(self) -> Node:
        if self.peek() == "?":
            self.i += 1
            c = self.take()
            if c == ":":
                pass
            elif c == "P" and self.peek() == "<" or c == "<" and self.peek() not in "=!":
                j = self.s.find(">", self.i)
                if j < 0:
                    raise GrammarError(f"invalid regex {self.s!r}: unterminated group name")
                self.i = j + 1
            elif c in "=!" or c == "<":
                ahead = c != "<"
                neg = (c if ahead else self.take()) == "!"
                body = self.alt()
                if self.take() != ")":
                    raise GrammarError(f"invalid regex {self.s!r}: missing ')'")
                return ("look", ahead, neg, body)
            elif c == "P" and self.peek() == "=":
                raise self.error("backreference")
            elif c in "imsx-":
                j = self.s.find(":", self.i - 1)
                flags = self.s[self.i - 1 : j]
                if j < 0 or not set(flags) <= set("imsx-") or "x" in flags or ")" in flags:
                    raise self.error(f"group flags (?{flags}")
                on = flags.split("-")[0]
                off = flags.split("-")[1] if "-" in flags else ""
                saved = (self.icase, self.dotall)
                self.icase = (self.icase or "i" in on) and "i" not in off
                self.dotall = (self.dotall or "s" in on) and "s" not in off
                self.i = j + 1
                node = self.alt()
                self.icase, self.dotall = saved
                if self.take() != ")":
                    raise GrammarError(f"invalid regex {self.s!r}: missing ')'")
                return node
            else:
                raise self.error(f"group extension (?{c}")
        node = self.alt()
        if self.take() != ")":
            raise GrammarError(f"invalid regex {self.s!r}: missing ')'")
        return node

    def escape(self, in_class: bool) -> Ranges:
        c = self.take()
        if c in "dDwWsS":
            base = {"d": DIGIT, "w": WORD, "s": SPACE, "S": SPACE_ANY}[c if c == "S" else c.lower()]
            return negate(base) if c.isupper() else base
        if c in _SIMPLE_ESC and not (c == "0" and self.peek().isdigit()):
            v = _SIMPLE_ESC[c]
            return ((v, v),)
        if c == "b" and in_class:
            return ((8, 8),)
        if c == "c" and self.peek().isascii() and self.peek().isalpha():  # ECMA-262 control escape
            return ((ord(self.take()) % 32,) * 2,)
        if c == "x":
            return self._hex(2)
        if c == "u":
            if self.peek() == "{":
                j = self.s.find("}", self.i)
                v = int(self.s[self.i + 1 : j], 16)
                self.i = j + 1
                return ((v, v),)
            return self._hex(4)
        if c == "U":
            return self._hex(8)
        if c.isdigit():
            raise self.error("backreference / octal escape \\" + c)
        if c in "pP" and self.peek() == "{":
            j = self.s.find("}", self.i)
            if j < 0:
                raise GrammarError(f"invalid regex {self.s!r}: unterminated \\{c}{{")
            name = self.s[self.i + 1 : j]
            self.i = j + 1
            ranges = unicode_category(name)
            if ranges is None:
                raise self.error(f"unicode property \\{c}{{{name}}}")
            return negate(ranges) if c == "P" else ranges
        if c in "bBAzZGpPkN":
            raise self.error("escape \\" + c)
        if c.isalnum():
            raise self.error("escape \\" + c)
        return ((ord(c), ord(c)),)

    def _hex(self, n: int) -> Ranges:
        h = self.s[self.i : self.i + n]
        if len(h) != n or any(ch not in "0123456789abcdefABCDEF" for ch in h):
            raise GrammarError(f"invalid regex {self.s!r}: bad hex escape at offset {self.i}")
        self.i += n
        v = int(h, 16)
        return ((v, v),)

    def klass(self) -> Ranges:
        neg = self.peek() == "^"
        if neg:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            c = self.take()
            if c == "]" and not first:
                break
            first = False
            if c == "[" and self.peek() == ":":
                raise self.error("POSIX class [:...:]")
            lo_r = self.escape(in_class=True) if c == "\\" else ((ord(c), ord(c)),)
            if self.peek() == "-" and self.peek(1) not in ("]", "") and len(lo_r) == 1 and lo_r[0][0] == lo_r[0][1]:
                self.i += 1
                c2 = self.take()
                hi_r = self.escape(in_class=True) if c2 == "\\" else ((ord(c2), ord(c2)),)
                if len(hi_r) != 1 or hi_r[0][0] != hi_r[0][1]:
                    raise GrammarError(f"invalid regex {self.s!r}: bad class range")
                lo, hi = lo_r[0][0], hi_r[0][0]
                if hi < lo:
                    raise GrammarError(f"invalid regex {self.s!r}: bad class range")
                ranges.append((lo, hi))
            else:
                ranges.extend(lo_r)
        out = normalize(ranges)
        return negate(out) if neg else out


def parse_regex(pattern: str) -> Node:
    """Parse ``pattern`` into an AST (anchors kept as ``bol`` / ``eol`` nodes)."""
    return _Parser(pattern).parse()


def strip_anchors(node: Node) -> list[tuple[Node, bool, bool]]:
    """Split into top-level alternatives, each ``(body, anchored_start, anchored_end)``.

    Raises GrammarError when an anchor is anywhere but the ends of a top-level alternative.
    """
    alts = node[1] if node[0] == "alt" else (node,)
    out = []
    for a in alts:
        items = list(a[1]) if a[0] == "cat" else [a]
        # unwrap a single group like ^(a|b)$ -> handled since groups are inlined as alt nodes.
        start = bool(items) and items[0] == ("bol",)
        if start:
            items = items[1:]
        end = bool(items) and items[-1] == ("eol",)
        if end:
            items = items[:-1]
        body: Node = ("cat", tuple(items))
        if _has_anchor(body):
            if len(items) == 1 and items[0][0] == "alt":
                out.extend((b, s or start, e or end) for b, s, e in strip_anchors(items[0]))
                continue
            raise GrammarError("unsupported regex feature: '^' or '$' inside the pattern")
        out.append((body, start, end))
    return out


ASSERTIONS = frozenset({"look", "wordb", "bol", "eol"})


def has_lookaround(node: Node) -> bool:
    """Whether ``node`` holds a lookaround or ``\\b`` / ``\\B`` assertion (anchors not counted)."""
    kind = node[0]
    if kind in ("look", "wordb"):
        return True
    if kind in ("cat", "alt"):
        return any(has_lookaround(n) for n in node[1])
    if kind == "rep":
        return has_lookaround(node[1])
    return False


def _has_anchor(node: Node) -> bool:
    kind = node[0]
    if kind in ("bol", "eol"):
        return True
    if kind in ("cat", "alt"):
        return any(_has_anchor(n) for n in node[1])
    if kind == "rep":
        return _has_anchor(node[1])
    return False
