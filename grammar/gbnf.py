"""GBNF grammars (llama.cpp's GGML BNF, the EBNF dialect of xgrammar and SGLang's ``ebnf`` field)
-> rules for the Earley engine.

The syntax, as llama.cpp's ``grammars/README.md`` and xgrammar's EBNF documentation describe it::

    # a comment runs to the end of the line
    root      ::= answer ws ("because " reason)?       # the start rule is named ``root``
    answer    ::= "yes" | "no" | "maybe " [0-9]{1,2}
    reason    ::= [^\\n.]+ "."
    ws        ::= [ \\t\\n]*
    empty-ok  ::= | "x"                                # an empty alternative matches ""

- Rules ``name ::= expr``; names are letters, digits, ``-`` and ``_``. A rule runs until the next
  ``name ::=`` (newlines inside a rule are whitespace), so rules may span several lines.
- Alternatives ``|`` (an empty one is the empty string, as llama.cpp's own JSON-schema converter
  writes ``space ::= | " "``), sequences, grouping ``( )``, postfix ``*``, ``+``, ``?``, ``{m}``,
  ``{m,}``, ``{m,n}``, ``{,n}`` (stackable: ``x?*``).
- Terminals are Unicode code points: string literals ``"..."`` and character classes ``[a-z_]``,
  ``[^"\\\\]`` with escapes ``\\n \\t \\r \\f \\v \\0 \\xHH \\uHHHH \\UHHHHHHHH`` and any escaped
  ASCII punctuation (``\\\\ \\" \\] \\- \\^`` ...); ``.`` is any character (newlines included, as in
  llama.cpp). Raw non-ASCII text in the grammar is taken as is (the output is UTF-8).

Rules that are not recursive and are small are inlined into the rules using them (``char``,
``ws``, ``digit`` ...), so the Earley engine sees them as parts of terminal DFAs instead of one
nonterminal step per character; the language is unchanged.
"""

from __future__ import annotations

import re

from radixlm.grammar.ast import EMPTY, Node, alt, cat, rep
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.regex_parser import MAX_CP, negate, normalize

MAX_DEPTH = 64  # nested groups in one rule (parsing is recursive descent), and twice that many
# levels of AST (stacked postfix operators, groups of sequences), which later stages walk recursively
MAX_REPEAT = 10_000  # the largest m or n of ``{m,n}``
INLINE_SIZE = 600  # a non-recursive rule this small (see ``_substitute``) is inlined where used
INLINE_DEPTH = 24  # ... and this shallow (inlining nests rule bodies)

_GBNF_RULE = re.compile(r"(?m)^[ \t]*[A-Za-z0-9_-]+[ \t]*::=")
_NAME = re.compile(r"[A-Za-z0-9_-]+")
_BRACE = re.compile(r"\{[ \t\r\n]*(\d*)[ \t\r\n]*(,?)[ \t\r\n]*(\d*)[ \t\r\n]*\}")
_SIMPLE = {"n": 10, "t": 9, "r": 13, "f": 12, "v": 11, "0": 0}
_HEX = {"x": 2, "u": 4, "U": 8}
ANY_CHAR: Node = ("set", ((0, MAX_CP),))


def is_gbnf(grammar: str) -> bool:
    """Whether ``grammar`` defines its rules GBNF-style (a line starting ``name ::=``) rather than
    in lark syntax (``name: ...``)."""
    return isinstance(grammar, str) and _GBNF_RULE.search(grammar) is not None


class _Tok:
    __slots__ = ("kind", "value", "pos")

    def __init__(self, kind: str, value: object, pos: int) -> None:
        self.kind, self.value, self.pos = kind, value, pos


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks: list[_Tok] = []
        self.k = 0
        self.parens = 0
        self._tokenize()

    # -- positions and errors ------------------------------------------------------------------
    def where(self, pos: int) -> str:
        line = self.text.count("\n", 0, pos) + 1
        col = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return f"line {line}, column {col}"

    def error(self, pos: int, what: str) -> GrammarError:
        return GrammarError(f"invalid GBNF grammar at {self.where(pos)}: {what}")

    # -- tokens --------------------------------------------------------------------------------
    def _tokenize(self) -> None:
        s, i, n = self.text, 0, len(self.text)
        while i < n:
            c = s[i]
            if c in " \t\r\n":
                i += 1
            elif c == "#":
                j = s.find("\n", i)
                i = n if j < 0 else j
            elif s.startswith("::=", i):
                self.toks.append(_Tok("def", None, i))
                i += 3
            elif c in "|()*+?.":
                self.toks.append(_Tok(c, None, i))
                i += 1
            elif c == "{":
                m = _BRACE.match(s, i)
                if m is None:
                    raise self.error(i, "expected a repetition {m}, {m,}, {m,n} or {,n}")
                self.toks.append(_Tok("{", self._bounds(m, i), i))
                i = m.end()
            elif c == '"':
                self.toks.append(_Tok("str", None, i))
                i = self._string(i)
            elif c == "[":
                self.toks.append(_Tok("class", None, i))
                i = self._klass(i)
            else:
                m = _NAME.match(s, i)
                if m is None and c == "=" and self.toks and self.toks[-1].kind == "(":
                    raise self.error(i, "lookahead assertions '(= ...)' (xgrammar) are not supported")
                if m is None:
                    raise self.error(i, f"unexpected character {c!r}")
                self.toks.append(_Tok("name", m.group(), i))
                i = m.end()
        self.toks.append(_Tok("eof", None, n))

    def _bounds(self, m: re.Match, pos: int) -> tuple[int, int | None]:
        a, comma, b = m.groups()
        if not a and not (comma and b):
            raise self.error(pos, f"bad repetition {m.group()!r}")
        lo = int(a) if a else 0
        hi = lo if not comma else (int(b) if b else None)
        if max(lo, hi or 0) > MAX_REPEAT:
            raise self.error(pos, f"repetition count over {MAX_REPEAT}")
        if hi is not None and hi < lo:
            raise self.error(pos, f"bad repetition {m.group()!r}: max < min")
        return lo, hi

    def _char(self, i: int, quote: str) -> tuple[int, int]:
        """One (possibly escaped) character at ``i`` -> (code point, next index)."""
        s = self.text
        if i >= len(s):
            raise self.error(i, "unterminated " + ("string literal" if quote == '"' else "character class"))
        c = s[i]
        if c != "\\":
            return ord(c), i + 1
        if i + 1 >= len(s):
            raise self.error(i, "unterminated escape")
        e = s[i + 1]
        if e in _SIMPLE:
            return _SIMPLE[e], i + 2
        if e in _HEX:
            digits = s[i + 2 : i + 2 + _HEX[e]]
            if len(digits) != _HEX[e] or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise self.error(i, f"\\{e} needs {_HEX[e]} hex digits")
            cp = int(digits, 16)
            if cp > MAX_CP or (quote == '"' and 0xD800 <= cp <= 0xDFFF):
                raise self.error(i, f"\\{e}{digits} is not a Unicode character")
            return cp, i + 2 + _HEX[e]
        if e.isascii() and not e.isalnum() and e.isprintable():
            return ord(e), i + 2
        raise self.error(i, f"unknown escape \\{e}")

    def _string(self, start: int) -> int:
        s, i, cps = self.text, start + 1, []
        while True:
            if i >= len(s):
                raise self.error(start, "unterminated string literal")
            if s[i] == '"':
                break
            cp, i = self._char(i, '"')
            cps.append(cp)
        self.toks[-1].value = cat(*(("set", ((cp, cp),)) for cp in cps)) if cps else EMPTY
        return i + 1

    def _klass(self, start: int) -> int:
        s, i = self.text, start + 1
        neg = s.startswith("^", i)
        i += neg
        ranges: list[tuple[int, int]] = []
        while True:
            if i >= len(s):
                raise self.error(start, "unterminated character class")
            if s[i] == "]":
                break
            at = i
            lo, i = self._char(i, "]")
            hi = lo
            if s.startswith("-", i) and i + 1 < len(s) and s[i + 1] != "]":
                hi, i = self._char(i + 1, "]")
                if hi < lo:
                    raise self.error(at, f"bad character range {s[at:i]!r}: end before start")
            ranges.append((lo, hi))
        if not ranges and not neg:
            raise self.error(start, "empty character class []")
        got = normalize(ranges)
        self.toks[-1].value = ("set", negate(got) if neg else got)
        return i + 1

    # -- grammar -------------------------------------------------------------------------------
    def peek(self, k: int = 0) -> _Tok:
        return self.toks[min(self.k + k, len(self.toks) - 1)]

    def at_rule_start(self) -> bool:
        return self.peek().kind == "name" and self.peek(1).kind == "def"

    def parse(self) -> tuple[dict[str, Node], dict[str, int], list[tuple[str, int]]]:
        rules: dict[str, Node] = {}
        defined: dict[str, int] = {}
        self.refs: list[tuple[str, int]] = []
        while self.peek().kind != "eof":
            tok = self.peek()
            if not self.at_rule_start():
                raise self.error(tok.pos, "expected a rule definition 'name ::= ...'")
            if tok.value in defined:
                first = self.where(defined[tok.value])
                raise self.error(tok.pos, f"rule {tok.value!r} defined twice (first at {first})")
            self.k += 2
            body, _ = self.alternatives()
            nxt = self.peek()
            if nxt.kind != "eof" and not self.at_rule_start():
                raise self.error(nxt.pos, f"unexpected {self._show(nxt)} in rule {tok.value!r}")
            rules[tok.value] = body
            defined[tok.value] = tok.pos
        return rules, defined, self.refs

    def _show(self, tok: _Tok) -> str:
        if tok.kind in ("name", "str", "class", "{"):
            end = self.toks[self.toks.index(tok) + 1].pos
            return repr(self.text[tok.pos : end].strip())
        return {"eof": "end of grammar", "def": "'::='"}.get(tok.kind, repr(tok.kind))

    def alternatives(self) -> tuple[Node, int]:
        """Parse ``seq ('|' seq)*`` -> (node, nesting depth of the node)."""
        node, depth = self.sequence()
        if self.peek().kind != "|":
            return node, depth
        items = [node]
        while self.peek().kind == "|":
            self.k += 1
            node, d = self.sequence()
            items.append(node)
            depth = max(depth, d)
        return alt(*items), depth + 1

    def sequence(self) -> tuple[Node, int]:
        items: list[Node] = []
        depth = 0
        while True:
            tok = self.peek()
            if tok.kind in ("*", "+", "?", "{"):
                raise self.error(tok.pos, f"{self._show(tok)} has nothing before it to repeat")
            if tok.kind not in ("name", "str", "class", ".", "(") or self.at_rule_start():
                return (cat(*items) if items else EMPTY), depth + (len(items) > 1)
            node, d = self.postfix()
            items.append(node)
            depth = max(depth, d)

    def postfix(self) -> tuple[Node, int]:
        node, depth = self.atom()
        while self.peek().kind in ("*", "+", "?", "{"):
            tok = self.peek()
            self.k += 1
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}.get(tok.kind) or tok.value
            node = rep(node, lo, hi)
            depth += 1
            self._check(tok.pos, depth)
        return node, depth

    def _check(self, pos: int, depth: int, limit: int = 2 * MAX_DEPTH) -> None:
        if depth > limit:
            raise self.error(pos, f"nested more than {limit} levels deep")

    def atom(self) -> tuple[Node, int]:
        tok = self.peek()
        self.k += 1
        if tok.kind in ("str", "class"):
            return tok.value, 2
        if tok.kind == ".":
            return ANY_CHAR, 1
        if tok.kind == "name":
            self.refs.append((tok.value, tok.pos))
            return ("ref", tok.value), 1
        self.parens += 1  # "(": the parser recurses once per level
        self._check(tok.pos, self.parens, MAX_DEPTH)
        body, depth = self.alternatives()
        close = self.peek()
        if close.kind != ")":
            raise self.error(close.pos, f"expected ')' to close the '(' at {self.where(tok.pos)}, "
                                        f"got {self._show(close)}")
        self.k += 1
        self.parens -= 1
        self._check(tok.pos, depth)
        return body, depth


def gbnf_to_rules(grammar: str, root: str = "root", inline: bool = True) -> tuple[Node, dict[str, Node]]:
    """Convert a GBNF grammar (the syntax of this module's docstring: llama.cpp's GBNF, xgrammar's
    and SGLang's EBNF).

    Args:
        grammar: the grammar text.
        root: the start rule's name.
        inline: inline small non-recursive rules into their users (same language; False keeps
            every rule a nonterminal, for tests comparing the two).
    Returns:
        ``(start node, rules)`` as :func:`radixlm.grammar.ebnf.lark_to_rules` returns them: rule
        bodies are AST nodes (``cat``/``alt``/``rep``, code-point ``set`` terminals) with
        nonterminals as ``("ref", name)``.
    Raises:
        GrammarError: a syntax error, a rule defined twice or a reference to an undefined rule
            (each naming its line and column), groups nested over ``MAX_DEPTH`` levels, a
            repetition count over ``MAX_REPEAT``, or no rule named ``root``.
    """
    if not isinstance(grammar, str) or not grammar.strip():
        raise GrammarError("ebnf grammar must be a non-empty str")
    parser = _Parser(grammar)
    rules, defined, refs = parser.parse()
    for name, pos in refs:
        if name not in rules:
            raise parser.error(pos, f"undefined rule {name!r}")
    if root not in rules:
        names = ", ".join(sorted(defined, key=defined.get)[:8]) or "none"
        raise GrammarError(f"invalid GBNF grammar: no rule named {root!r} (the start rule; rules defined: {names})")
    return ("ref", root), (_inline(rules) if inline else rules)


def _refs(node: Node, out: set[str]) -> None:
    kind = node[0]
    if kind == "ref":
        out.add(node[1])
    elif kind in ("cat", "alt"):
        for it in node[1]:
            _refs(it, out)
    elif kind == "rep":
        _refs(node[1], out)


def _inline(rules: dict[str, Node]) -> dict[str, Node]:
    """Replace references to small non-recursive rules by their bodies (rules in dependency
    order, so each inlined body is final; recursive rules and their users keep their refs)."""
    deps = {}
    for name, body in rules.items():
        deps[name] = set()
        _refs(body, deps[name])
    users: dict[str, list[str]] = {n: [] for n in rules}
    for name, ds in deps.items():
        for d in ds:
            users[d].append(name)
    waiting = {n: len(ds) for n, ds in deps.items()}
    ready = [n for n, w in waiting.items() if w == 0]
    small: dict[str, tuple[Node, int, int]] = {}
    out: dict[str, Node] = {}
    while ready:  # NOTE: Kahn's order: every rule a ready rule uses is final
        name = ready.pop()
        node, size, depth = _substitute(rules[name], small)
        out[name] = node
        if size <= INLINE_SIZE and depth <= INLINE_DEPTH:
            small[name] = (node, size, depth)
        for u in users[name]:
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.append(u)
    for name, body in rules.items():
        if name not in out:  # recursive, or using a recursive rule
            out[name] = _substitute(body, small)[0]
    return out


def _substitute(node: Node, small: dict[str, tuple[Node, int, int]]) -> tuple[Node, int, int]:
    """``node`` with the ``small`` rules inlined -> (node, size, depth); size counts the copies
    a bounded repetition makes, capped past ``INLINE_SIZE``."""
    kind = node[0]
    if kind == "ref":
        return small.get(node[1], (node, 1, 1))
    if kind in ("cat", "alt"):
        parts = [_substitute(it, small) for it in node[1]]
        size = min(1 + sum(p[1] for p in parts), INLINE_SIZE + 1)
        depth = 1 + max((p[2] for p in parts), default=0)
        build = cat if kind == "cat" else alt
        return build(*(p[0] for p in parts)), size, depth
    if kind == "rep":
        inner, size, depth = _substitute(node[1], small)
        copies = max(1, node[3] if node[3] is not None else node[2] + 1)
        return rep(inner, node[2], node[3]), min(1 + size * copies, INLINE_SIZE + 1), depth + 1
    return node, 1, 1
