"""Boolean operations on byte DFAs (product construction): intersection, difference, union."""

from __future__ import annotations

import numpy as np

from radixlm.grammar.automaton import MAX_DFA_STATES, ByteDFA, _trim, dfa_from_ast
from radixlm.grammar.budget import check_budget
from radixlm.grammar.errors import GrammarError


def product(a: ByteDFA, b: ByteDFA, mode: str) -> ByteDFA:
    """``mode``: ``"and"`` (both accept) or ``"diff"`` (a accepts, b does not).

    Breadth-first over the reachable state pairs, one level at a time: the rows of a whole level
    are computed together (numpy), only new pairs are numbered in Python."""
    if mode not in ("and", "diff"):
        raise ValueError(mode)
    if a.start == 0 or (mode == "and" and b.start == 0):
        return ByteDFA(np.zeros((1, 256), np.int32), np.zeros(1, bool), 0)
    nb = b.n_states
    rep, cls = _joint_classes(a.trans, b.trans)
    # NOTE: one column per byte class of both tables (bytes every state of a and b maps alike):
    # the rows and the dedupe of each level are that much narrower than 256 bytes
    ta, tb = a.trans[:, rep].astype(np.int64), b.trans[:, rep].astype(np.int64)
    start = a.start * nb + b.start
    ids: dict[int, int] = {start: 1}
    order = [start]
    rows: list[np.ndarray] = []
    frontier = np.asarray([start], dtype=np.int64)
    while frontier.size:
        ra, rb = ta[frontier // nb], tb[frontier % nb]
        codes = ra * nb + rb
        dead = ra == 0
        if mode == "and":
            dead |= rb == 0
        codes[dead] = 0
        uniq, inv = np.unique(codes, return_inverse=True)
        mapped = np.zeros(uniq.size, dtype=np.int32)
        fresh = []
        for j, c in enumerate(uniq.tolist()):
            if c == 0:
                continue
            d = ids.get(c)
            if d is None:
                d = ids[c] = len(order) + 1
                order.append(c)
                fresh.append(c)
            mapped[j] = d
        if len(order) > MAX_DFA_STATES:
            raise GrammarError("grammar too large: over %d DFA states" % MAX_DFA_STATES)
        # NOTE: ~1 us per 32 cells of a level's rows (numpy) and per new pair numbered (Python)
        check_budget("intersecting automata", (frontier.size * len(rep)) // 32 + len(fresh) + 20)
        rows.append(mapped[inv.reshape(-1)].reshape(codes.shape))
        frontier = np.asarray(fresh, dtype=np.int64)
    trans = np.zeros((len(order) + 1, 256), dtype=np.int32)
    trans[1:] = np.concatenate(rows)[:, cls]
    pairs = np.asarray(order, dtype=np.int64)
    acc_b = b.accept[pairs % nb]
    accept = np.zeros(len(order) + 1, dtype=bool)
    accept[1:] = a.accept[pairs // nb] & (acc_b if mode == "and" else ~acc_b)
    return _trim(trans, accept)


def difference_finite(a: ByteDFA, b: ByteDFA) -> ByteDFA:
    """``product(a, b, "diff")`` for a ``b`` whose language is finite (an acyclic DFA, e.g. the
    declared keys of an object; otherwise ``ValueError``): the same automaton up to state
    numbering, built without per-level numpy work. The pairs ``(a state, b state)`` along b's
    paths are numbered in Python (b's rows are sparse: only the bytes b continues with differ
    from a's row); a string that leaves b goes on in a copy of a (the pairs ``(a state, dead)``),
    of which only the states reachable from the pairs are kept."""
    if a.start == 0 or b.start == 0:
        return a
    if _has_cycle(b):
        raise ValueError("not a finite language")
    a_flat, b_runs = a.flat, b.runs()  # NOTE: not a.rows: n_states lists kept for every GC pass
    order = [(a.start, b.start)]
    ids = {order[0]: 1}
    cols: list[int] = []  # (pair id, byte, target pair) of every byte b continues with
    k = 0
    while k < len(order):
        sa, sb = order[k]
        k += 1
        row = sa << 8
        for lo, hi, tb in b_runs[sb]:
            for c in range(lo, hi + 1):
                ta = a_flat[row | c]
                if ta:
                    pair = (ta, tb)
                    d = ids.get(pair)
                    if d is None:
                        d = ids[pair] = len(order) + 1
                        order.append(pair)
                    cols += (k, c, d)
    check_budget("subtracting automata", 4 * len(order) + 20)
    n_pairs = len(order)
    pairs = np.asarray(order, dtype=np.int64)
    base = a.trans[pairs[:, 0]]  # [pairs, 256]: a's states, where no pair continues
    over = np.asarray(cols, dtype=np.int64).reshape(-1, 3)
    base[over[:, 0] - 1, over[:, 1]] = 0
    entry = np.zeros(a.n_states, dtype=bool)
    entry[base] = True
    entry[0] = False
    kept = _reachable(a, set(np.flatnonzero(entry).tolist()))  # NOTE: a's states in the copy
    new_id = np.zeros(a.n_states, dtype=np.int32)
    new_id[kept] = np.arange(n_pairs + 1, n_pairs + 1 + kept.size, dtype=np.int32)
    trans = np.zeros((n_pairs + 1 + kept.size, 256), dtype=np.int32)
    trans[1 : n_pairs + 1] = new_id[base]
    trans[over[:, 0], over[:, 1]] = over[:, 2]
    trans[n_pairs + 1 :] = new_id[a.trans[kept]]
    accept = np.zeros(trans.shape[0], dtype=bool)
    accept[1 : n_pairs + 1] = a.accept[pairs[:, 0]] & ~b.accept[pairs[:, 1]]
    accept[n_pairs + 1 :] = a.accept[kept]
    return _trim(trans, accept)


def _reachable(d: ByteDFA, entry: set[int]) -> np.ndarray:
    """int64 sorted states of ``d`` reachable from ``entry`` (included); the states reachable
    from each state are computed once per DFA (bit sets, cached on it)."""
    if d.n_states > 512:  # NOTE: too many states for bit sets of every state's reach
        runs = d.runs()
        seen = set(entry)
        stack = list(entry)
        while stack:
            for _, _, t in runs[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return np.asarray(sorted(seen), dtype=np.int64)
    reach = d.__dict__.get("_reach_bits")
    if reach is None:
        runs = d.runs()
        reach = [0] * d.n_states
        for s in range(1, d.n_states):
            seen = {s}
            stack = [s]
            while stack:
                for _, _, t in runs[stack.pop()]:
                    if t not in seen:
                        seen.add(t)
                        stack.append(t)
            reach[s] = sum(1 << t for t in seen)
        d.__dict__["_reach_bits"] = reach
    bits = 0
    for s in entry:
        bits |= reach[s]
    return np.asarray([s for s in range(d.n_states) if bits >> s & 1], dtype=np.int64)


def _has_cycle(d: ByteDFA) -> bool:
    """Whether ``d``'s state graph (live states) has a cycle (its language is then infinite,
    every state of a trimmed DFA being live); cached on the DFA."""
    got = d.__dict__.get("_has_cycle")
    if got is None:
        runs = d.runs()
        indeg = [0] * d.n_states
        for r in runs:
            for _, _, t in r:
                indeg[t] += 1
        stack = [s for s in range(1, d.n_states) if not indeg[s]]
        done = 0
        while stack:
            s = stack.pop()
            done += 1
            for _, _, t in runs[s]:
                indeg[t] -= 1
                if not indeg[t]:
                    stack.append(t)
        got = d.__dict__["_has_cycle"] = done < d.n_states - 1
    return got


_WEIGHTS = np.random.default_rng(12).integers(1, 2**62, size=(2, 2**16), dtype=np.int64)


def _joint_classes(ta: np.ndarray, tb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Byte classes shared by two transition tables (int ``[n, 256]``): ``(rep, cls)``, int64:
    ``rep[c]`` the first byte of class ``c``, ``cls[byte]`` its class. Columns are compared by a
    random 64-bit hash, then checked exactly (a collision falls back to one class per byte)."""
    if ta.shape[0] > _WEIGHTS.shape[1] or tb.shape[0] > _WEIGHTS.shape[1]:
        every = np.arange(256)
        return every, every
    # NOTE: integer einsum (wrapping arithmetic; no BLAS), one hash per column
    h = np.einsum("ij,i->j", ta.astype(np.int64), _WEIGHTS[0, : ta.shape[0]])
    h ^= np.einsum("ij,i->j", tb.astype(np.int64), _WEIGHTS[1, : tb.shape[0]])
    _, rep, cls = np.unique(h, return_index=True, return_inverse=True)
    cls = cls.reshape(-1)
    if not ((ta[:, rep[cls]] == ta).all() and (tb[:, rep[cls]] == tb).all()):
        every = np.arange(256)
        return every, every
    return rep, cls


def union(dfas: list[ByteDFA]) -> ByteDFA:
    return dfa_from_ast(("alt", tuple(("dfa", d) for d in dfas)))


def is_empty(d: ByteDFA) -> bool:
    return d.start == 0


def exactly_one(dfas: list[ByteDFA]) -> ByteDFA:
    """Strings accepted by exactly one of ``dfas`` (JSON Schema ``oneOf``)."""
    if len(dfas) == 1:
        return dfas[0]
    parts = []
    for i, d in enumerate(dfas):
        others = [o for j, o in enumerate(dfas) if j != i]
        overlap = [o for o in others if not is_empty(product(d, o, "and"))]
        parts.append(product(d, union(overlap), "diff") if overlap else d)
    return union(parts)


def minimize(d: ByteDFA) -> ByteDFA:
    """The minimal DFA of ``d``'s language (Moore's partition refinement, vectorized over byte
    classes: bytes with identical columns in every state are refined together). ``hot`` states
    (see :func:`radixlm.grammar.ast.cold`) stay hot when any merged state was hot."""
    n = d.n_states
    if n <= 2 or d.start == 0:
        return d
    cols, inverse = np.unique(d.trans.T, axis=0, return_inverse=True)
    table = cols.T.astype(np.int64)  # [n, byte classes]
    cls = np.where(d.accept, 2, 1).astype(np.int64)
    cls[0] = 0
    count = len(np.unique(cls))
    while True:
        check_budget("minimizing an automaton", n // 2 + 1)
        sig = np.concatenate([cls[:, None], cls[table]], axis=1)
        _, new = np.unique(sig, axis=0, return_inverse=True)
        new = new.reshape(-1).astype(np.int64)
        n_new = int(new.max()) + 1
        cls = new
        if n_new == count:
            break
        count = n_new
    # renumber: the dead state's class is 0, the others in order of first appearance
    order = np.full(count, -1, dtype=np.int64)
    order[cls[0]] = 0
    nxt = 1
    reps = np.zeros(count, dtype=np.int64)
    for s in range(n):
        c = cls[s]
        if order[c] < 0:
            order[c] = nxt
            nxt += 1
            reps[order[c]] = s
    ids = order[cls]
    trans = np.zeros((count, 256), dtype=np.int32)
    trans[1:] = ids[d.trans[reps[1:]]]
    accept = np.zeros(count, dtype=bool)
    accept[ids] = d.accept
    hot = None
    if d.hot is not None:
        hot = np.zeros(count, dtype=bool)
        np.logical_or.at(hot, ids, d.hot)
    return ByteDFA(trans, accept, int(ids[d.start]), hot=hot)
