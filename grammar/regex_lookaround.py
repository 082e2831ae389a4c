"""Lookaround, ``\\b`` / ``\\B`` and inner anchors compiled exactly into a byte DFA, by markers.

A regex with assertions (``("look", ahead, negative, X)``, ``("wordb", negative)``, ``("bol",)``,
``("eol",)`` nodes of :mod:`radixlm.grammar.regex_parser`) denotes the strings ``s`` for which
some path through the regex matches ``s`` with every assertion on the path true *of the whole
string* at its position (ECMA-262 / Python ``re`` semantics; lookarounds see past the match).

Construction (one *level*: the assertions of a regex, not those nested inside their bodies):

1. Every assertion occurrence gets a **marker**, a byte that never occurs in UTF-8 (``0xC0``,
   ``0xC1``, ``0xF5``-``0xFF``; equal assertions share one). The *marked* language replaces each
   assertion by its marker byte: a marked string records one path and where its assertions sit.
2. Each marker ``m`` has a **bad** language: the marked strings with some occurrence of ``m``
   where its assertion is false, e.g. ``Σ* m X Σ*`` for ``(?!X)``, ``Σ* Y m Σ*`` for ``(?<!Y)``,
   ``Σ* m (?!X) Σ*`` for ``(?=X)`` (a positive assertion fails where its negation holds: a
   nested level), ``Σ* \\w m \\w Σ* | (^|Σ* \\W) m (\\W Σ*|$)`` for ``\\b``. Bad languages are
   whole-string regexes built by the same construction one level down, so assertions nested in
   ``X`` (``(?!.*\\bnative\\b)``) see the whole string too.
3. The result is the marked language minus every bad language (DFA products), with the markers
   erased (epsilon moves, then subset construction): the strings with *some* path whose
   assertions all hold. Markers of outer levels are **transparent** inside a level (every state
   loops on them: the inverse image of erasing them), so that ``Σ``, ``X``, ``\\w`` skip them.

Exact under quantifiers too (``((?!ab).)*``: the marker repeats, the bad language asks for one
bad occurrence). Plain pieces are encoded by the caller's ``encode`` (identity for a ``regex``
constraint; JSON string escapes for a schema ``pattern``: encoding commutes with the Boolean
operations because every encoded string decodes one way). All work is counted by the compile
budget (:func:`radixlm.grammar.budget.check_budget`); a pattern too costly ends as GrammarError.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

import numpy as np

from radixlm.grammar.ast import EMPTY, Node, alt, cat
from radixlm.grammar.automaton import ByteDFA, _NFA, _determinize, dfa_from_ast
from radixlm.grammar.budget import check_budget, compile_budget
from radixlm.grammar.dfa_ops import minimize, product
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.regex_parser import ASSERTIONS, MAX_CP, WORD, negate

Encode = Callable[[Node], Node]
MARKERS = (0xC0, 0xC1) + tuple(range(0xF5, 0x100))  # bytes that never occur in UTF-8
ANY_CHAR: Node = ("set", ((0, MAX_CP),))
ANY: Node = ("rep", ANY_CHAR, 0, None)
W: Node = ("set", WORD)
NW: Node = ("set", negate(WORD))
_CACHE: "OrderedDict[tuple, ByteDFA]" = OrderedDict()
_CACHE_LOCK = threading.Lock()
CACHE_SIZE = 256
MINIMIZE_MAX = 4000  # NOTE: Moore refinement of a long counting chain costs n states per round


def _identity(node: Node) -> Node:
    return node


def lookaround_dfa(tree: Node, search: bool, encode: Encode | None = None) -> ByteDFA:
    """The (minimal) byte DFA of a parsed regex that may hold assertions.

    Args:
        tree: a :func:`radixlm.grammar.regex_parser.parse_regex` AST (anchors, lookarounds,
            ``\\b`` / ``\\B`` anywhere).
        search: True: ``re.search`` semantics (sides not anchored by a leading ``^`` / trailing
            ``$`` of a top-level alternative match anything); False: ``re.fullmatch``.
        encode: maps an assertion-free AST over code points to the AST of its encodings (None:
            UTF-8 itself; :func:`radixlm.grammar.json_lexical.encode_content` for JSON strings).
    Returns:
        The DFA of the encoded strings matched (cached per process by tree, mode and encoder).
    Raises:
        GrammarError: more distinct assertions than markers (13, counting every nesting level),
            or the compile budget spent (a pathological pattern).
    """
    key = (tree, search, encode)
    got = _CACHE.get(key)
    if got is not None:
        return got
    alts = tree[1] if tree[0] == "alt" else (tree,)
    whole = []
    for a in alts:
        items = list(a[1]) if a[0] == "cat" else [a]
        start = end = not search
        while items and items[0] == ("bol",):
            items, start = items[1:], True
        while items and items[-1] == ("eol",):
            items, end = items[:-1], True
        whole.append(cat(*([] if start else [ANY]), *items, *([] if end else [ANY])) if items or not (start and end) else EMPTY)
    with compile_budget():
        out = _Level(encode or _identity).solve(alt(*whole), frozenset())
        if out.n_states <= MINIMIZE_MAX:
            out = minimize(out)
    with _CACHE_LOCK:
        _CACHE[key] = out
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
    return out


def _special(node: Node) -> bool:
    """Whether ``node`` holds an assertion or a marker (else it is a plain regex piece)."""
    kind = node[0]
    if kind in ASSERTIONS or kind == "mark":
        return True
    if kind in ("cat", "alt"):
        return any(_special(n) for n in node[1])
    if kind == "rep":
        return _special(node[1])
    return False


def _assertions(node: Node, out: list[Node]) -> None:
    """The assertion occurrences of one level (not those inside lookaround bodies), in order."""
    kind = node[0]
    if kind in ASSERTIONS:
        if node not in out:
            out.append(node)
    elif kind in ("cat", "alt"):
        for n in node[1]:
            _assertions(n, out)
    elif kind == "rep":
        _assertions(node[1], out)


def _byte_dfa(b: int) -> ByteDFA:
    trans = np.zeros((3, 256), dtype=np.int32)
    trans[1, b] = 2
    return ByteDFA(trans, np.array([False, False, True]), 1)


def _transparent(d: ByteDFA, skip: frozenset[int]) -> ByteDFA:
    """``d`` with every live state looping on the bytes ``skip`` (the strings of ``d`` with those
    bytes inserted anywhere)."""
    if not skip or d.start == 0:
        return d
    check_budget("building a lookaround", d.n_states // 4 + 1)
    trans = d.trans.copy()
    trans[1:, sorted(skip)] = np.arange(1, d.n_states, dtype=np.int32)[:, None]
    return ByteDFA(trans, d.accept.copy(), d.start)


def _bad(a: Node, m: Node) -> Node:
    """Whole-string regex of the marked strings where some occurrence of marker ``m`` sits at a
    position where assertion ``a`` is false."""
    kind = a[0]
    if kind == "look":
        _, ahead, neg, body = a
        if not neg:  # NOTE: a positive assertion fails where its negation holds
            return cat(ANY, m, ("look", ahead, True, body), ANY)
        return cat(ANY, m, body, ANY) if ahead else cat(ANY, body, m, ANY)
    if kind == "bol":
        return cat(ANY, ANY_CHAR, m, ANY)
    if kind == "eol":
        return cat(ANY, m, ANY_CHAR, ANY)
    before_nw = alt(EMPTY, cat(ANY, NW))  # NOTE: the start of the string counts as a non-word
    after_nw = alt(EMPTY, cat(NW, ANY))
    if a[1]:  # \B fails between a word and a non-word character
        return alt(cat(ANY, W, m, after_nw), cat(before_nw, m, W, ANY))
    return alt(cat(ANY, W, m, W, ANY), cat(before_nw, m, after_nw))


class _Level:
    """One compile of a lookaround regex: the encoder and the plain pieces built so far."""

    def __init__(self, encode: Encode) -> None:
        self.encode = encode
        self.pieces: dict[tuple[Node, frozenset[int]], ByteDFA] = {}

    def solve(self, node: Node, skip: frozenset[int]) -> ByteDFA:
        """DFA of the whole-string regex ``node`` (assertions allowed; ``("mark", b)`` nodes are
        the literal byte ``b``) over encoded text with the bytes ``skip`` transparent."""
        found: list[Node] = []
        _assertions(node, found)
        free = [b for b in MARKERS if b not in skip]
        if len(found) > len(free):
            raise GrammarError("unsupported regex feature: lookaround (more than %d distinct "
                               "lookaround / \\b / inner anchor assertions, nesting included)" % len(MARKERS))
        marks = {a: b for a, b in zip(found, free)}
        marked = dfa_from_ast(self.build(node, skip, marks), memo=False)
        if not marks:
            return marked
        inner = skip | frozenset(marks.values())
        for a, b in marks.items():
            if marked.start == 0:
                break
            bad = self.solve(_bad(a, ("mark", b)), inner)
            marked = product(marked, bad, "diff")
        return _erase(marked, sorted(marks.values()))

    def build(self, node: Node, skip: frozenset[int], marks: dict[Node, int]) -> Node:
        """``node`` as an AST over encoded bytes: plain pieces encoded (transparent to ``skip``),
        assertions replaced by their marker bytes."""
        kind = node[0]
        if kind in ASSERTIONS:
            return ("dfa", _byte_dfa(marks[node]))
        if kind == "mark":
            return ("dfa", _byte_dfa(node[1]))
        if not _special(node):
            if not skip:
                return self.encode(node)
            got = self.pieces.get((node, skip))
            if got is None:
                got = self.pieces[(node, skip)] = _transparent(dfa_from_ast(self.encode(node)), skip)
            return ("dfa", got)
        if kind == "cat":
            return cat(*(self.build(n, skip, marks) for n in node[1]))
        if kind == "alt":
            return alt(*(self.build(n, skip, marks) for n in node[1]))
        if kind == "rep":
            return ("rep", self.build(node[1], skip, marks), node[2], node[3])
        raise AssertionError(kind)


def _erase(d: ByteDFA, markers: list[int]) -> ByteDFA:
    """``d`` with the bytes ``markers`` deleted from its strings (epsilon moves, determinized)."""
    if d.start == 0:
        return d
    check_budget("erasing lookaround markers", 4 * d.n_states + 10)
    plain = d.trans.copy()
    plain[:, markers] = 0
    runs = ByteDFA(plain, d.accept, d.start).runs()
    jumps = d.trans[:, markers]
    nfa = _NFA()
    base = nfa.new() - 1  # NOTE: state s of d is NFA state base + s (s >= 1)
    for _ in range(d.n_states - 2):
        nfa.new()
    final = nfa.new()
    nfa.dead_ends = True
    for s in range(1, d.n_states):
        nfa.edges[s + base] = [(lo, hi, t + base) for lo, hi, t in runs[s]]
        eps = [int(t) + base for t in set(jumps[s].tolist()) if t]
        if d.accept[s]:
            eps.append(final)
        nfa.eps[s + base] = eps
    return _determinize(nfa, d.start + base, final)
