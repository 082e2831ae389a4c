"""Constructors for the regex / grammar AST shared by the regex parser, JSON Schema and EBNF.

Nodes are tuples: ``("set", ranges)``, ``("cat", items)``, ``("alt", items)``,
``("rep", node, min, max)``, ``("share", key, node)`` (one automaton fragment reused wherever the
same key appears inside the enclosing ``("scope", node)``; only valid where every use continues
identically), ``("dfa", ByteDFA)`` (an
automaton built separately, e.g. an intersection), and ``("ref", name)`` (a grammar rule; only in
grammars, never inside a regex).
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


def opt(node: Node) -> Node:
    return rep(node, 0, 1)


def star(node: Node) -> Node:
    return rep(node, 0, None)


def has_ref(node: Node) -> bool:
    kind = node[0]
    if kind == "ref":
        return True
    if kind in ("cat", "alt"):
        return any(has_ref(n) for n in node[1])
    if kind == "rep":
        return has_ref(node[1])
    if kind == "share":
        return has_ref(node[2])
    if kind == "scope":
        return has_ref(node[1])
    return False
