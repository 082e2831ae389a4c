"""Regex AST -> byte-level NFA (UTF-8 expanded) -> trimmed byte DFA with a numpy transition table.

The DFA works on bytes, not characters, so that tokens ending inside a multi-byte character (byte-
level BPE, SentencePiece byte fallback) are walked like any other. State 0 is the dead state
(``trans[0] == 0``); every other state can still reach an accepting state (the DFA is trimmed), so
"not dead" means "a valid prefix".
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

import numpy as np

from radixlm.grammar.budget import check_budget
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.ast import Node
from radixlm.grammar.byte_dfa import ByteDFA, trim as _trim  # noqa: F401 (re-exported)
from radixlm.grammar.determinize import MAX_DFA_STATES, determinize as _determinize  # noqa: F401
from radixlm.grammar.regex_parser import MAX_CP, has_lookaround, parse_regex, strip_anchors
from radixlm.grammar.utf8 import utf8_sequences

MAX_NFA_STATES = 400_000
ANY: Node = ("rep", ("set", ((0, MAX_CP),)), 0, None)


class _NFA:
    def __init__(self) -> None:
        self.eps: list[list[int] | tuple[int, ...]] = []
        # NOTE: a block state's (see ``blocks``) edge targets are local to its block
        self.edges: list[list[tuple[int, int, int]]] = []
        self.shared: dict[object, tuple[int, int]] = {}
        self.gates: list[int] = []  # states whose epsilon edges enter a cold branch
        self.blocks: list[tuple[int, ByteDFA]] = []  # embedded DFAs: (first NFA state, DFA)
        self.dead_ends = False  # an empty set or language was built: some states may be dead

    def new(self) -> int:
        if len(self.eps) >= MAX_NFA_STATES:
            raise GrammarError("grammar too large: over %d automaton states" % MAX_NFA_STATES)
        if len(self.eps) & 4095 == 4095:  # NOTE: not at 0: a small automaton costs no full 4096
            check_budget("building an automaton", 4096)
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def build(self, node: Node) -> tuple[int, int]:
        kind = node[0]
        if kind == "share":
            got = self.shared.get(node[1])
            if got is None:
                got = self.shared[node[1]] = self.build(node[2])
            return got
        if kind == "dfa":
            return self._embed(node[1])
        if kind == "scope":  # NOTE: fresh share fragments for every place the node is built
            saved, self.shared = self.shared, {}
            try:
                return self.build(node[1])
            finally:
                self.shared = saved
        if kind == "cold":
            gate = self.new()
            a, b = self.build(node[1])
            self.eps[gate].append(a)
            self.gates.append(gate)
            return gate, b
        if kind == "set":
            return self._set(node[1])
        if kind == "cat":
            s = e = self.new()
            for item in node[1]:
                a, b = self.build(item)
                self.eps[e].append(a)
                e = b
            return s, e
        if kind == "alt":
            s, e = self.new(), self.new()
            if not node[1]:
                self.dead_ends = True
            for item in node[1]:
                a, b = self.build(item)
                self.eps[s].append(a)
                self.eps[b].append(e)
            return s, e
        if kind == "rep":
            return self._rep(node[1], node[2], node[3])
        if kind in ("bol", "eol"):
            raise GrammarError("unsupported regex feature: '^' or '$' inside the pattern")
        if kind == "ref":
            raise GrammarError(f"rule reference {node[1]!r} inside a regular expression")
        raise AssertionError(kind)

    def _embed(self, dfa: "ByteDFA") -> tuple[int, int]:
        """An NFA fragment copying ``dfa``: a block of ``dfa.n_states`` states whose edge lists
        are the DFA's own byte runs (shared, targets local to the block: the determinizer adds
        the block's base, see :mod:`radixlm.grammar.determinize`); accepting states have an
        epsilon edge to the fragment's end."""
        n = dfa.n_states
        base = len(self.eps)
        if base + n >= MAX_NFA_STATES:
            raise GrammarError("grammar too large: over %d automaton states" % MAX_NFA_STATES)
        # NOTE: a bulk copy costs ~20 ns a state (1/50 of a unit); determinizing it is charged there
        check_budget("building an automaton", n // 32 + 1)
        # NOTE: one slice assignment per block, not a Python loop per state; block states are
        # never appended to (only a fragment's own start and end are), so they share ``()``.
        self.eps.extend([()] * n)
        self.edges.extend(dfa.runs())
        self.blocks.append((base, dfa))
        end = self.new()
        for s in np.nonzero(dfa.accept)[0].tolist():
            self.eps[base + s] = (end,)
        start = self.new()
        if dfa.start:
            self.eps[start].append(base + dfa.start)
        else:
            self.dead_ends = True
        return start, end

    def _set(self, ranges: tuple[tuple[int, int], ...]) -> tuple[int, int]:
        s, e = self.new(), self.new()
        tails: dict[tuple[tuple[int, int], ...], int] = {(): e}
        for lo, hi in ranges:
            for seq in utf8_sequences(lo, hi):
                state = s
                for i, (blo, bhi) in enumerate(seq):
                    rest = seq[i + 1 :]
                    nxt = tails.get(rest)
                    existed = nxt is not None
                    if nxt is None:
                        nxt = tails[rest] = self.new()
                    self.edges[state].append((blo, bhi, nxt))
                    if existed:  # NOTE: a shared tail already has its own edges on to ``e``.
                        break
                    state = nxt
        if not self.edges[s]:
            self.dead_ends = True  # NOTE: an empty set
        return s, e

    def _rep(self, node: Node, lo: int, hi: int | None) -> tuple[int, int]:
        s = e = self.new()
        for _ in range(lo):
            a, b = self.build(node)
            self.eps[e].append(a)
            e = b
        if hi is None:
            a, b = self.build(node)
            loop = self.new()
            self.eps[e].append(loop)
            self.eps[loop].append(a)
            self.eps[b].append(loop)
            end = self.new()
            self.eps[loop].append(end)
            return s, end
        end = self.new()
        for _ in range(hi - lo):
            self.eps[e].append(end)
            a, b = self.build(node)
            self.eps[e].append(a)
            e = b
        self.eps[e].append(end)
        return s, end


_MEMO: "OrderedDict[Node, ByteDFA]" = OrderedDict()
_MEMO_LOCK = threading.Lock()
MEMO_SIZE = 1024  # automata kept per process (LRU) ...
MEMO_STATES = 60_000  # ... holding at most this many states together (1 KiB each)
_memo_states = [0]


MEMO_HASH_LIMIT = 100_000  # NOTE: hashing a tuple tree costs ~20 ns a node, every lookup


def _tree_size(node: Node, seen: dict[int, int]) -> int:
    """Nodes of ``node`` expanded as a tree (what hashing it visits), capped above
    ``MEMO_HASH_LIMIT``; linear in the DAG (memoized by ``id``)."""
    got = seen.get(id(node))
    if got is not None:
        return got
    kind = node[0] if isinstance(node, tuple) and node else None
    if kind in ("cat", "alt"):
        kids = node[1]
    elif kind in ("rep", "scope", "cold"):
        kids = (node[1],)
    elif kind == "share":
        kids = (node[2],)
    else:
        kids = ()
    out = 1
    for k in kids:
        out += _tree_size(k, seen)
        if out > MEMO_HASH_LIMIT:
            break
    out = min(out, MEMO_HASH_LIMIT + 1)
    seen[id(node)] = out
    return out


def dfa_from_ast(node: Node, memo: bool = True) -> ByteDFA:
    """Full-match DFA of an anchor-free AST.

    Memoized per process by the node (ASTs are hashable tuples; an embedded ``("dfa", d)`` counts
    by identity): the same sub-automaton met again (a property key, a format, an extras value, a
    ``$ref`` target) in this or a later schema is not rebuilt. The returned DFA is shared: callers
    must not modify it in place. ``memo=False``: neither looked up nor kept (a whole grammar,
    cached by the compiler: it would only push reusable sub-automata out of the memo).
    """
    try:
        if not memo:
            raise TypeError
        size = _tree_size(node, {})
        # NOTE: the walk and the hash are work too, memo hit or not (a schema that asks for the
        # same automata 10^5 times spent its CPU here, unseen by the budget)
        check_budget("building an automaton", size // 2 + 4)
        if size > MEMO_HASH_LIMIT:  # NOTE: hashing expands a shared DAG as a tree
            raise TypeError
        got = _MEMO.get(node)
    except (TypeError, RecursionError):  # NOTE: unhashable (never built here) or too deep: no memo
        got, node_key = None, None
    else:
        node_key = node
    if got is not None:
        with _MEMO_LOCK:
            if node_key in _MEMO:
                _MEMO.move_to_end(node_key)
        return got
    nfa = _NFA()
    s, e = nfa.build(node)
    check_budget("building an automaton", len(nfa.eps) & 4095)  # NOTE: the states not counted yet
    out = _determinize(nfa, s, e)
    if node_key is not None and out.n_states <= MEMO_STATES // 8:
        with _MEMO_LOCK:
            if node_key not in _MEMO:
                _MEMO[node_key] = out
                _memo_states[0] += out.n_states
            while len(_MEMO) > MEMO_SIZE or _memo_states[0] > MEMO_STATES:
                _memo_states[0] -= _MEMO.popitem(last=False)[1].n_states
    return out


def regex_to_dfa(pattern: str, search: bool = False) -> ByteDFA:
    """DFA of a regex.

    Args:
        pattern: regex text (see :mod:`radixlm.grammar.regex_parser` for the syntax).
        search: False: the whole output must match (``re.fullmatch``); ``^``/``$`` at the ends are
            no-ops. True: JSON-Schema ``pattern`` semantics (``re.search``): unanchored ends
            match anything.
    Raises:
        GrammarError: unsupported syntax or a pattern too large to compile.
    """
    return dfa_from_ast(regex_ast(pattern, search))


def regex_ast(pattern: str, search: bool = False, encode: "Callable[[Node], Node] | None" = None,
              lookaround: bool = True) -> Node:
    """Anchor-free AST of ``pattern`` with the given match semantics (see :func:`regex_to_dfa`).

    ``encode``: applied to the code-point AST (e.g. JSON string escapes); the result is encoded.
    A pattern with lookarounds, ``\\b`` / ``\\B`` or anchors inside becomes one ``("dfa", d)``
    node built by :mod:`radixlm.grammar.regex_lookaround` (exact); ``lookaround=False`` (lark
    terminals, whose lookarounds would see past the terminal) raises GrammarError for them.
    """
    tree = parse_regex(pattern)
    try:
        if has_lookaround(tree):
            raise _Assertions
        parts = strip_anchors(tree)
    except (_Assertions, GrammarError):
        if not lookaround:
            if has_lookaround(tree):
                raise GrammarError("unsupported regex feature: lookaround or \\b in a grammar terminal") from None
            raise
        from radixlm.grammar.regex_lookaround import lookaround_dfa

        return ("dfa", lookaround_dfa(tree, search, encode))
    # NOTE: alternatives anchored alike share one unanchored prefix / suffix: one copy of each per
    # alternative would make the DFA track which alternatives matched (2^n states for n of them)
    groups: dict[tuple[bool, bool], list[Node]] = {}
    for body, a_start, a_end in parts:
        groups.setdefault((a_start or not search, a_end or not search), []).append(body)
    alts = []
    for (a_start, a_end), bodies in groups.items():
        items = [bodies[0] if len(bodies) == 1 else ("alt", tuple(bodies))]
        if not a_start:
            items.insert(0, ANY)
        if not a_end:
            items.append(ANY)
        alts.append(("cat", tuple(items)) if len(items) > 1 else items[0])
    out = alts[0] if len(alts) == 1 else ("alt", tuple(alts))
    return encode(out) if encode is not None else out


class _Assertions(Exception):
    """A pattern with assertions inside (lookaround, word boundary, inner anchors)."""
