"""How a constrained JSON document may write its separators (the ``separators`` option of
:func:`radixlm.grammar.json_schema.json_schema_to_ast`).

Without ``any_whitespace`` a JSON document is written in one of the two styles of ``json.dumps``:
spaced (``", "`` / ``": "``, its default) or compact (``","`` / ``":"``). ``"either"`` allows each
separator in either style independently, so every separator leaves the model a choice (a space or
the next token) and jump-forward can never write one. ``"consistent"`` allows both styles but the
first separator written fixes the style for the whole document: from then on every separator,
and with it the key that follows when the schema leaves one choice, is known, and jump-forward
writes it (a token walk of one instance of a closed 6-property object forced 30 of its 55 tokens
instead of 17 with ``"either"``). It is built as the union of one conversion per style; the
automata of the two copies share only the text before the first separator, so a consistent
grammar has about twice the states and compile time of an ``"either"`` one.
"""

from __future__ import annotations

from radixlm.grammar.ast import EMPTY, Node, alt, cat, char, chars, opt, rep

MAX_WS = 20  # any_whitespace: at most this many whitespace characters at a token boundary
SEPARATORS = ("either", "compact", "spaced", "consistent")
RENAMED = "__spaced."  # prefix of the second copy's rule names (see union_of_styles)


def check_separators(any_whitespace: bool, separators: str) -> None:
    """Raises ValueError unless ``separators`` is one of :data:`SEPARATORS` (only ``"either"``
    with ``any_whitespace``)."""
    if separators not in SEPARATORS or any_whitespace and separators != "either":
        raise ValueError(f"separators must be one of {', '.join(SEPARATORS)} (either with any_whitespace), "
                         f"got {separators!r}")


def separator_nodes(any_whitespace: bool, separators: str) -> tuple[Node, Node, Node]:
    """``(comma, colon, inner)``: what a comma between items, a colon after a key, and the space
    inside brackets may be written as, for one style (``"consistent"`` is not one: it is the union
    of the ``"compact"`` and ``"spaced"`` conversions)."""
    if any_whitespace:
        ws = rep(chars((9, 10), (13, 13), (32, 32)), 0, MAX_WS)
        return cat(ws, char(","), ws), cat(ws, char(":"), ws), ws
    space = {"either": opt(char(" ")), "compact": EMPTY, "spaced": char(" ")}[separators]
    return cat(char(","), space), cat(char(":"), space), EMPTY


def union_of_styles(compact: tuple[Node, dict[str, Node]],
                    spaced: tuple[Node, dict[str, Node]]) -> tuple[Node, dict[str, Node]]:
    """``(root, rules)`` accepting either conversion: each copy in a ``scope`` of its own (their
    ``share`` keys come from separate converters); in a grammar, where rules are lowered with
    one ``share`` table, the spaced copy's rules and share keys renamed apart (:data:`RENAMED`)."""
    (a, rules_a), (b, rules_b) = compact, spaced
    if not rules_a and not rules_b:
        return alt(("scope", a), ("scope", b)), {}
    rename = _RenameRefs(RENAMED)
    rules = dict(rules_a)
    rules.update((RENAMED + name, rename(body)) for name, body in rules_b.items())
    return alt(("scope", a), ("scope", rename(b))), rules


class _RenameRefs:
    """A node with every ``("ref", name)`` renamed to ``prefix + name`` and every share key ``k``
    to ``(prefix, k)``: a memoized walk over the AST DAG (shared sub-tuples are rebuilt once;
    embedded automata hold neither)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.done: dict[int, tuple[Node, Node]] = {}  # id -> (node kept alive, renamed)

    def __call__(self, node: Node) -> Node:
        got = self.done.get(id(node))
        if got is not None:
            return got[1]
        kind = node[0]
        if kind == "ref":
            out: Node = ("ref", self.prefix + node[1])
        elif kind in ("cat", "alt"):
            out = (kind, tuple(self(n) for n in node[1]))
        elif kind == "rep":
            out = ("rep", self(node[1]), node[2], node[3])
        elif kind in ("scope", "cold"):
            out = (kind, self(node[1]))
        elif kind == "share":
            out = ("share", (self.prefix, node[1]), self(node[2]))
        else:
            out = node
        self.done[id(node)] = (node, out)
        return out
