"""Rules with regular right-hand sides -> a context-free grammar over terminal DFAs.

Every maximal ``ref``-free piece of a rule becomes one terminal (a byte DFA), so the parser only
sees the recursive structure; terminals never match the empty string (a nullable piece becomes an
optional nonterminal instead), which keeps the chart finite. Pieces with the same DFA (a schema's
many string-valued properties) share one terminal, so the engine walks and caches each once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from radixlm.grammar.ast import Node, Walk
from radixlm.grammar.budget import check_budget
from radixlm.grammar.automaton import ByteDFA, _trim, dfa_from_ast
from radixlm.grammar.errors import GrammarError

MAX_TERMINALS = 5000
# A ref-free piece larger than this (``Walk.size``) that holds ``share`` fragments is lowered
# structurally (each fragment a nonterminal) instead of as one terminal: an object of many optional
# properties in order is one fragment per position, and as one DFA every position would carry a
# trie of all the keys still allowed (quadratic; partial-mypy: over 100k states).
SPLIT_SIZE = 1500


def non_nullable(dfa: ByteDFA) -> ByteDFA | None:
    """The DFA without the empty string (None if nothing is left)."""
    if dfa.start == 0 or not dfa.accept[dfa.start]:
        return dfa if dfa.start else None
    n = dfa.n_states
    trans = np.zeros((n + 1, 256), dtype=np.int32)
    trans[:n] = dfa.trans
    trans[n] = dfa.trans[dfa.start]
    accept = np.zeros(n + 1, dtype=bool)
    accept[:n] = dfa.accept
    # NOTE: _trim renumbers from state 1 as the start, so put the new start first.
    order = np.r_[0, n, np.arange(1, n)]
    inv = np.empty(n + 1, dtype=np.int32)
    inv[order] = np.arange(n + 1)
    trans = inv[trans[order]]
    out = _trim(trans, accept[order])
    return out if out.start else None


@dataclass
class CFG:
    """Symbols: terminal ``t >= 0``; nonterminal ``n`` encoded as ``-(n + 1)``."""

    terminals: list[ByteDFA] = field(default_factory=list)
    nt_names: list[str] = field(default_factory=list)
    prods: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    start: int = 0
    ignore: list[int] = field(default_factory=list)
    _by_shape: dict[tuple, list[int]] = field(default_factory=dict, repr=False)  # see terminal()

    def nt(self, name: str) -> int:
        self.nt_names.append(name)
        return len(self.nt_names) - 1

    def terminal(self, dfa: ByteDFA, share: bool = True) -> int:
        """The terminal id of ``dfa``: an earlier terminal with an identical DFA when ``share``.

        NOTE: two symbols with the same language are interchangeable in a CFG, so sharing changes
        no parse; ``%ignore`` terminals are never shared (the engine treats them apart)."""
        shape = (dfa.trans.shape[0], dfa.start, dfa.accept.tobytes())
        if share:
            for t in self._by_shape.get(shape, ()):
                other = self.terminals[t]
                if other is dfa or np.array_equal(other.trans, dfa.trans):
                    return t
        if len(self.terminals) >= MAX_TERMINALS:
            raise GrammarError("grammar too large: over %d terminals" % MAX_TERMINALS)
        self.terminals.append(dfa)
        if share:
            self._by_shape.setdefault(shape, []).append(len(self.terminals) - 1)
        return len(self.terminals) - 1


def drop_unproductive(cfg: CFG) -> None:
    """Remove every production that uses a nonterminal deriving no terminal string (a rule
    without a base case: a schema object that requires itself, a property whose value accepts
    nothing); such a nonterminal is the empty language, so the grammar's language is unchanged.

    NOTE: the Earley engine's masks allow a token when it continues *some* parse, which is only
    sound when every predicted nonterminal can complete: an unproductive one would let the output
    walk into a state where no token (not even the stop token) is allowed.

    Raises GrammarError when the start symbol itself derives nothing."""
    uses: list[list[int]] = [[] for _ in cfg.nt_names]   # nonterminal -> productions using it
    missing = [0] * len(cfg.prods)                     # unproven nonterminals per production
    ready: list[int] = []
    for p, (_, rhs) in enumerate(cfg.prods):
        for s in rhs:
            if s < 0:
                uses[-s - 1].append(p)
                missing[p] += 1
        if not missing[p]:
            ready.append(p)
    productive = [False] * len(cfg.nt_names)
    while ready:
        lhs = cfg.prods[ready.pop()][0]
        if productive[lhs]:
            continue
        productive[lhs] = True
        for p in uses[lhs]:
            missing[p] -= 1
            if not missing[p]:
                ready.append(p)
    if not productive[cfg.start]:
        raise GrammarError("the grammar matches no output")
    if not all(productive):
        cfg.prods = [(lhs, rhs) for lhs, rhs in cfg.prods
                     if productive[lhs] and all(s >= 0 or productive[-s - 1] for s in rhs)]


class Lowering:
    """Builds a :class:`CFG` from ``rules`` (name -> AST with ``("ref", name)`` nodes)."""

    def __init__(self, rules: dict[str, Node]) -> None:
        self.rules = rules
        self.cfg = CFG()
        self.named: dict[str, int] = {}
        self.order: list[str] = []  # named rules in the order first referenced
        self.shared: dict[object, int] = {}
        self.walk = Walk()
        self.sizes = Walk()  # NOTE: apart from ``walk``: its share counts depend on the visit order
        self.symbols: dict[int, tuple[Node, int | None]] = {}
        self._split: dict[int, tuple[Node, bool]] = {}
        self._shares: dict[int, tuple[Node, bool]] = {}

    def split(self, node: Node) -> bool:
        """Whether ``node`` is lowered structurally: it has a rule reference, or it is a large
        piece with ``share`` fragments (see ``SPLIT_SIZE``)."""
        got = self._split.get(id(node))
        if got is None:
            out = self.walk.has_ref(node) or (node[0] in ("cat", "alt", "rep", "scope", "cold", "share")
                                               and self._has_share(node) and self.sizes.size(node) > SPLIT_SIZE)
            got = self._split[id(node)] = (node, out)
        return got[1]

    def _has_share(self, node: Node) -> bool:
        got = self._shares.get(id(node))
        if got is None:
            kind = node[0]
            if kind == "share":
                out = True
            elif kind in ("cat", "alt"):
                out = any(self._has_share(n) for n in node[1])
            elif kind in ("rep", "scope", "cold"):
                out = self._has_share(node[1])
            else:
                out = False
            got = self._shares[id(node)] = (node, out)
        return got[1]

    def build(self, root: Node, ignore: list[Node] = ()) -> CFG:
        start = self.cfg.nt("<start>")
        self.cfg.start = start
        body = self.seq(root)
        if body is None:  # NOTE: e.g. a schema no value satisfies once lowered
            raise GrammarError("the grammar matches no output")
        self.cfg.prods.append((start, tuple(body)))
        # NOTE: only the rules the start reaches (lowering one may name more): an unused rule
        # would still cost its terminals and their masks
        done = 0
        while done < len(self.order):
            name = self.order[done]
            done += 1
            for alt_seq in self.alts(self.rules[name]):
                self.cfg.prods.append((self.named[name], tuple(alt_seq)))
        for node in ignore:
            dfa = non_nullable(dfa_from_ast(node))
            if dfa is not None:
                self.cfg.ignore.append(self.cfg.terminal(dfa, share=False))
        drop_unproductive(self.cfg)
        return self.cfg

    def _named(self, name: str) -> int:
        if name not in self.named:
            if name not in self.rules:
                raise GrammarError(f"undefined rule {name!r}")
            self.named[name] = self.cfg.nt(name)
            self.order.append(name)
        return self.named[name]

    def symbol(self, node: Node) -> int | None:
        """One symbol for ``node`` (None: the node matches nothing); one per distinct node object,
        so a node shared in many places (a DAG) is lowered once."""
        got = self.symbols.get(id(node))
        if got is None:
            check_budget("lowering a grammar")
            got = self.symbols[id(node)] = (node, self._symbol(node))
        return got[1]

    def _symbol(self, node: Node) -> int | None:
        while node[0] in ("scope", "cold") and self.split(node):
            node = node[1]
        kind = node[0]
        if kind == "ref":
            return -(self._named(node[1]) + 1)
        if not self.split(node):
            return self.leaf(node)
        if kind == "share":
            got = self.shared.get(node[1])
            if got is None:
                got = self.shared[node[1]] = self.cfg.nt("<share>")
                for s in self.alts(node[2]):
                    self.cfg.prods.append((got, tuple(s)))
            return -(got + 1)
        aux = self.cfg.nt("<aux>")
        if kind == "rep":
            self._rep(aux, node[1], node[2], node[3])
        else:
            for s in self.alts(node):
                self.cfg.prods.append((aux, tuple(s)))
        return -(aux + 1)

    def leaf(self, node: Node) -> int | None:
        """The symbol of a ref-free ``node`` as one terminal DFA (an optional nonterminal when it
        matches the empty string; None when it matches nothing)."""
        dfa = dfa_from_ast(node)
        if dfa.start == 0:
            return None
        nn = non_nullable(dfa)
        if not dfa.accept[dfa.start]:
            return self.cfg.terminal(dfa)
        aux = self.cfg.nt("<opt>")
        self.cfg.prods.append((aux, ()))
        if nn is not None:
            self.cfg.prods.append((aux, (self.cfg.terminal(nn),)))
        return -(aux + 1)

    def _rep(self, aux: int, item: Node, lo: int, hi: int | None) -> None:
        x = self.symbol(item)
        if x is None:
            if lo == 0:
                self.cfg.prods.append((aux, ()))
            return
        if hi is None:
            loop = self.cfg.nt("<star>")
            self.cfg.prods.append((loop, ()))
            self.cfg.prods.append((loop, (-(loop + 1), x)))
            self.cfg.prods.append((aux, (x,) * lo + (-(loop + 1),)))
            return
        tail: tuple[int, ...] = ()
        for _ in range(hi - lo):
            opt = self.cfg.nt("<opt>")
            self.cfg.prods.append((opt, ()))
            self.cfg.prods.append((opt, (x,) + tail))
            tail = (-(opt + 1),)
        self.cfg.prods.append((aux, (x,) * lo + tail))

    def seq(self, node: Node) -> list[int] | None:
        """One alternative: the node as a symbol sequence, ref-free runs merged into terminals."""
        while node[0] in ("scope", "cold") and self.split(node):
            node = node[1]
        items = node[1] if node[0] == "cat" else (node,)
        out: list[int] = []
        run: list[Node] = []

        def flush() -> bool:
            if run:
                # NOTE: a run as one terminal, not split again (a large cat of small pieces)
                s = self.leaf(("cat", tuple(run))) if len(run) > 1 else self.symbol(run[0])
                run.clear()
                if s is None:
                    return False
                out.append(s)
            return True

        for it in items:
            if self.split(it):
                if not flush():
                    return None
                s = self.symbol(it)
                if s is None:
                    return None
                out.append(s)
            else:
                run.append(it)
        return out if flush() else None

    def alts(self, node: Node) -> list[list[int]]:
        while node[0] in ("scope", "cold") and self.split(node):
            node = node[1]
        if node[0] != "alt":
            s = self.seq(node)
            return [] if s is None else [s]
        plain = [it for it in node[1] if not self.split(it)]
        out = []
        if plain:
            if len(plain) > 1:
                x = self.leaf(("alt", tuple(plain)))
                s = None if x is None else [x]
            else:
                s = self.seq(plain[0])
            if s is not None:
                out.append(s)
        for it in node[1]:
            if self.split(it):
                s = self.seq(it)
                if s is not None:
                    out.append(s)
        return out


def lower(root: Node, rules: dict[str, Node], ignore: list[Node] = ()) -> CFG:
    return Lowering(rules).build(root, list(ignore))
