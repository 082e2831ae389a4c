"""Constructors for the regex / grammar AST shared by the regex parser, JSON Schema and EBNF.

Nodes are tuples: ``("set", ranges)``, ``("cat", items)``, ``("alt", items)``,
``("rep", node, min, max)``, ``("share", key, node)`` (one automaton fragment reused wherever the
same key appears inside the enclosing ``("scope", node)``; only valid where every use continues
identically), ``("dfa", ByteDFA)`` (an
automaton built separately, e.g. an intersection), ``("cold", node)`` (the same language as
``node``, marked as rarely taken: DFA states reachable only through it get their token masks on
first visit instead of at compile time, see :func:`cold`), and ``("ref", name)`` (a grammar rule;
only in grammars, never inside a regex).
"""

from __future__ import annotations

from typing import Any

Node = tuple[Any, ...]
EMPTY: Node = ("cat", ())
NOTHING: Node = ("set", ())


def chars(*ranges: tuple[int, int]) -> Node:
    return ("set", tuple(ranges))


def char(c: str) -> Node:
    return ("set", ((ord(c), ord(c)),))


def lit(text: str) -> Node:
    """The literal string ``text`` (each character one code point)."""
    if len(text) == 1:
        return char(text)
    return ("cat", tuple(char(c) for c in text))


def cat(*items: Node) -> Node:
    flat: list[Node] = []
    for it in items:
        if it[0] == "cat":
            flat.extend(it[1])
        else:
            flat.append(it)
    if any(it == NOTHING for it in flat):
        return NOTHING
    return flat[0] if len(flat) == 1 else ("cat", tuple(flat))


def alt(*items: Node) -> Node:
    flat: list[Node] = []
    for it in items:
        if it == NOTHING:
            continue
        flat.extend(it[1] if it[0] == "alt" else (it,))
    # NOTE: dedupe only leaves: hashing deep AST tuples is quadratic (tuples do not cache hashes).
    uniq: list[Node] = []
    seen: set[Node] = set()
    for it in flat:
        if it[0] == "set" or it[0] == "cat" and len(it[1]) <= 8 and all(x[0] == "set" for x in it[1]):
            if it in seen:
                continue
            seen.add(it)
        uniq.append(it)
    if not uniq:
        return NOTHING
    return uniq[0] if len(uniq) == 1 else ("alt", tuple(uniq))


def rep(node: Node, lo: int, hi: int | None) -> Node:
    if hi == 0 or node == EMPTY:
        return EMPTY
    if lo == 1 and hi == 1:
        return node
    if node == NOTHING:
        return EMPTY if lo == 0 else NOTHING
    return ("rep", node, lo, hi)


def cold(node: Node) -> Node:
    """``node`` marked as a rarely taken branch (e.g. an undeclared property, properties out of
    schema order): same language; the DFA states reached only through cold branches are left out
    of the compile-time mask precomputation (computed on first visit)."""
    if node in (EMPTY, NOTHING) or node[0] == "cold":
        return node
    return ("cold", node)


def opt(node: Node) -> Node:
    return rep(node, 0, 1)


def star(node: Node) -> Node:
    return rep(node, 0, None)


class Walk:
    """Memoized bottom-up walks over an AST that is a DAG (shared sub-tuples, e.g. a ``$ref``
    target used in many places): every distinct node object is visited once, so a schema whose
    definitions reference each other many levels deep costs linear, not exponential, time.

    NOTE: memo keys are ``id(node)``; the memo keeps each node alive so ids are never reused.
    """

    def __init__(self) -> None:
        self._refs: dict[int, tuple[Node, bool]] = {}
        self._size: dict[int, tuple[Node, int]] = {}
        self._shares: set[object] = set()

    def has_ref(self, node: Node) -> bool:
        """Whether ``node`` contains a ``("ref", name)`` (a grammar rule)."""
        got = self._refs.get(id(node))
        if got is not None:
            return got[1]
        kind = node[0]
        if kind == "ref":
            out = True
        elif kind in ("cat", "alt"):
            out = any(self.has_ref(n) for n in node[1])
        elif kind in ("rep", "scope", "cold"):
            out = self.has_ref(node[1])
        elif kind == "share":
            out = self.has_ref(node[2])
        else:
            out = False
        self._refs[id(node)] = (node, out)
        return out

    def size(self, node: Node) -> int:
        """About how many automaton fragments building ``node`` as a regex creates (its size as
        a tree: repetitions count once per copy; a ``share`` key counts once)."""
        got = self._size.get(id(node))
        if got is not None:
            return got[1]
        kind = node[0]
        if kind in ("cat", "alt"):
            out = 1 + sum(self.size(n) for n in node[1])
        elif kind == "rep":
            copies = node[3] if node[3] is not None else node[2] + 1
            out = 1 + self.size(node[1]) * max(copies, 1)
        elif kind in ("scope", "cold"):
            out = 1 + self.size(node[1])
        elif kind == "share":
            if node[1] in self._shares:
                out = 1
            else:
                self._shares.add(node[1])
                out = 1 + self.size(node[2])
        elif kind == "dfa":
            out = node[1].n_states
        else:
            out = 1
        self._size[id(node)] = (node, out)
        return out


def has_ref(node: Node) -> bool:
    """Whether ``node`` contains a rule reference (one memoized walk; see :class:`Walk`)."""
    return Walk().has_ref(node)
