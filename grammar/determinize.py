"""Subset construction: byte NFA (:class:`radixlm.grammar.automaton._NFA`) -> trimmed byte DFA.

DFA states are frozensets of "important" NFA states (those with byte edges, and the final state).
Embedded DFAs (``("dfa", d)`` nodes, copied into the NFA as blocks of states) are determinized in
bulk: a DFA state that is one non-accepting state of a block only ever leads to other such states
or to the block's accepting states (the only ones with epsilon edges out of the block), so every
non-accepting block state reachable from it without crossing an accepting one becomes a DFA state
at once, its transition row copied from the embedded DFA's table by numpy. The same holds for a
set of blocks that copy one embedded DFA and sit at the same local state (the any-order copies of
a pair read in lockstep): such a group is copied in bulk too. Only the accepting states (merged
with what follows the block) go through the general construction. A block's edge lists are the
embedded DFA's own byte runs, targets local to the block (``_block_offsets`` adds the base).
"""

from __future__ import annotations

from operator import itemgetter

import numpy as np

from radixlm.grammar.budget import check_budget
from radixlm.grammar.byte_dfa import ByteDFA, trim
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.trie import expand

MAX_DFA_STATES = 100_000
LAYER_MIN = 64  # bulk copies of at least this many states are numbered by layers (_layered)
_first = itemgetter(0)


def determinize(nfa, start: int, final: int, bulk: bool = True) -> ByteDFA:
    """The trimmed DFA of ``nfa`` from ``start`` to ``final`` (see the module docstring);
    ``hot`` marks DFA states holding an NFA state reachable without entering a cold branch.
    ``bulk=False``: embedded DFAs through the general construction too (for tests)."""
    n = len(nfa.eps)
    closure: list[frozenset[int] | None] = [None] * n
    eps, nedges = nfa.eps, nfa.edges

    def close(i: int) -> frozenset[int]:
        got = closure[i]
        if got is not None:
            return got
        seen = {i}
        stack = [i]
        out: list[int] = []
        while stack:
            x = stack.pop()
            done = closure[x]
            if done is not None:  # NOTE: a finished closure is taken whole, not walked again
                out.extend(done)
                continue
            if nedges[x] or x == final:
                out.append(x)
            for y in eps[x]:
                if y not in seen:
                    seen.add(y)
                    stack.append(y)
        got = closure[i] = frozenset(out)
        return got

    row_cache: list[list[tuple[int, int, frozenset[int]]] | None] = [None] * n
    offset = _block_offsets(nfa)

    def row_of(i: int) -> list[tuple[int, int, frozenset[int]]]:
        """The byte ranges of NFA state ``i`` as disjoint ranges, each with its target set."""
        got = row_cache[i]
        if got is None:
            off = offset[i]
            got = [(lo, hi, close(off + t)) for lo, hi, t in nedges[i]]
            # NOTE: a block state's runs (``off``: its block's base) are sorted and disjoint
            got = row_cache[i] = got if off else _disjoint(got)
        return got

    hot_nfa = _hot_states(nfa, start) if nfa.gates or any(d.hot is not None for _, d in nfa.blocks) else None
    blocks = nfa.blocks if bulk else []
    block_at = _block_index(nfa) if bulk else None
    # NOTE: per group of blocks (their bases) sharing one embedded DFA: the DFA id of each local
    # state of the group (0: not assigned yet); a single block is a group of one
    luts: dict[tuple[int, ...], np.ndarray] = {}
    ids: dict[frozenset[int], int] = {}
    queue: list[tuple[int, frozenset[int]]] = []  # general DFA states, rows still to build
    flat: list[int] = []  # (DFA id, lo, hi, target) of every general row's byte runs
    accepting: list[int] = []
    bulk_rows: list[tuple] = []  # (first id, local states, lut, embedded DFA, block bases)
    count = [0]

    def add(tgt: frozenset[int]) -> int:
        d = ids[tgt] = count[0] = count[0] + 1
        queue.append((d, tgt))
        if final in tgt:
            accepting.append(d)
        if d > MAX_DFA_STATES:
            raise GrammarError("grammar too large: over %d DFA states" % MAX_DFA_STATES)
        return d

    def from_group(tgt: frozenset[int]) -> int:
        """DFA id of ``tgt`` when it is one non-accepting local state of blocks that copy one
        embedded DFA (0 otherwise): the group's states reachable from it through non-accepting
        ones get their ids and rows at once, copied from the embedded DFA."""
        group = _group_of(tgt, block_at, blocks)
        if group is None:
            return 0
        key, dfa, t = group
        lut = luts.get(key)
        if lut is None:
            lut = luts[key] = np.zeros(dfa.n_states, dtype=np.int32)
        got = int(lut[t])
        if got:
            return got
        inner, barrier = _reach(dfa, t)
        if lut[inner].any():  # NOTE: rare: part of the reach is already copied
            fresh = inner[lut[inner] == 0]
        else:
            fresh = inner
        first = count[0] + 1
        count[0] += fresh.size
        if count[0] > MAX_DFA_STATES:
            raise GrammarError("grammar too large: over %d DFA states" % MAX_DFA_STATES)
        lut[fresh] = np.arange(first, count[0] + 1, dtype=np.int32)
        for a in barrier:
            if not lut[a]:
                union = frozenset().union(*(close(base + a) for base in key))
                d = ids.get(union)
                lut[a] = d if d is not None else add(union)
        # NOTE: the rows are gathered at the end straight into the table (their targets, inner or
        # barrier states, all have their ids now; ``lut`` entries never change once set)
        bulk_rows.append((first, fresh, lut, dfa, key))
        check_budget("determinizing an automaton", fresh.size + len(barrier) + 10)  # NOTE: ~1 per us
        return int(lut[t])

    def target(tgt: frozenset[int]) -> int:
        d = ids.get(tgt)
        if d is None:
            if blocks:
                d = from_group(tgt)
                if d:
                    ids[tgt] = d  # NOTE: the next lookup of this set is one dict hit
                    return d
            d = add(tgt)
        return d

    if target(close(start)) != 1:
        raise AssertionError("the start state must be DFA state 1")
    ids_get = ids.get
    k = 0
    work = 0  # NOTE: budget units: set members and edges handled (a large subset costs more)
    while k < len(queue):
        d, cur = queue[k]
        k += 1
        if len(cur) == 1:
            edges = row_of(next(iter(cur)))
        else:
            edges = _disjoint([e for i in cur for e in row_of(i)])
            work += sum(map(len, (e[2] for e in edges)))
        work += len(cur) + 2 * len(edges)
        if work > 4096:
            check_budget("determinizing an automaton", work >> 2)  # NOTE: ~4 per us; a unit is ~1 us
            work = 0
        for lo, hi, tgt in edges:
            t = ids_get(tgt)  # NOTE: most targets are known: a dict hit, no call
            flat += (d, lo, hi, t if t is not None else target(tgt))
    n_ids = count[0] + 1
    trans = np.zeros((n_ids, 256), dtype=np.int32)
    if flat:
        runs = np.array(flat, dtype=np.int64).reshape(-1, 4)
        width = runs[:, 2] - runs[:, 1] + 1
        cols, owner = expand(runs[:, 1], width)
        trans[runs[owner, 0], cols] = runs[owner, 3]
    for first, fresh, lut, dfa, _ in bulk_rows:
        # NOTE: mode="clip" (indices are states of ``dfa``): "raise" with ``out`` copies via a temporary
        np.take(lut, dfa.trans[fresh], out=trans[first : first + fresh.size], mode="clip")
    accept = np.zeros(n_ids, dtype=bool)
    accept[accepting] = True
    hot = None
    if hot_nfa is not None:
        hot = np.zeros(n_ids, dtype=bool)
        hot_of = hot_nfa.tolist().__getitem__
        hot[[d for d, key in queue if any(map(hot_of, key))]] = True
        for first, fresh, _, _, key in bulk_rows:
            if len(key) == 1:
                hot[first : first + fresh.size] = hot_nfa[fresh + key[0]]
            else:
                states = np.asarray(key, dtype=np.int64)[:, None] + fresh[None, :]
                hot[first : first + fresh.size] = hot_nfa[states].any(axis=0)
    # NOTE: without empty sets or languages every NFA state lies on a path to the final state, so
    # every DFA state (a non-empty set of them) is live: nothing to trim.
    return trim(trans, accept, hot, check=nfa.dead_ends)


def _reach(dfa: ByteDFA, t: int) -> tuple[np.ndarray, list[int]]:
    """States of ``dfa`` reachable from the non-accepting state ``t`` through non-accepting
    states (``t`` first), and the accepting states they lead to; cached on the DFA."""
    cache = dfa.__dict__.setdefault("_reach_cache", {})
    got = cache.get(t)
    if got is None:
        runs = dfa.runs()
        acc = dfa.accept
        seen = {t}
        inner = [t]
        barrier = []
        k = 0
        loop = False  # NOTE: a self-loop (most unbounded loops have one): no layers to look for
        while k < len(inner):
            q = inner[k]
            for _, _, u in runs[q]:
                if u not in seen:
                    seen.add(u)
                    (barrier if acc[u] else inner).append(u)
                elif u == q:
                    loop = True
            k += 1
        got = cache[t] = (np.asarray(inner if loop else _layered(inner, runs), dtype=np.int64), barrier)
    return got


def _layered(inner: list[int], runs: list) -> list[int]:
    """``inner`` (breadth-first from its first state) ordered by longest distance from the first
    state, then breadth-first, when the states form no cycle (else unchanged). NOTE: a bulk copy's
    ids follow this order. Every copy of a counting chain (``maxLength`` string, a DAG) spans the
    same layers (``\\uXXXX`` states 1-5 after the copy's first), so its copies are numbered alike
    from the first one (breadth-first, the first few differ: shift classes never matched them)."""
    m = len(inner)
    if m < LAYER_MIN:
        return inner
    pos = {u: i for i, u in enumerate(inner)}
    succ = [[pos[u] for u in {r[2] for r in runs[q]} if u in pos] for q in inner]
    indeg = [0] * m
    for out in succ:
        for j in out:
            indeg[j] += 1
    layer = [0] * m
    stack = [i for i in range(m) if not indeg[i]]
    done = 0
    while stack:
        i = stack.pop()
        done += 1
        nxt = layer[i] + 1
        for j in succ[i]:
            if layer[j] < nxt:
                layer[j] = nxt
            indeg[j] -= 1
            if not indeg[j]:
                stack.append(j)
    if done < m:  # NOTE: a cycle (an unbounded loop): breadth-first order
        return inner
    return [inner[i] for i in sorted(range(m), key=layer.__getitem__)]  # NOTE: stable: BFS ties


def _disjoint(edges: list[tuple[int, int, frozenset[int]]]) -> list[tuple[int, int, frozenset[int]]]:
    """Byte-range edges as disjoint ranges in byte order (overlaps: the union of the targets)."""
    edges.sort(key=_first)
    prev = -1
    for e in edges:
        if e[0] <= prev:
            break
        prev = e[1]
    else:
        return edges
    # NOTE: most overlaps are equal ranges (several NFA states on the same bytes): merged first
    merged = [edges[0]]
    for e in edges[1:]:
        last = merged[-1]
        if e[0] == last[0] and e[1] == last[1]:
            merged[-1] = (e[0], e[1], last[2] | e[2])
        else:
            merged.append(e)
    prev = -1
    for e in merged:
        if e[0] <= prev:
            break
        prev = e[1]
    else:
        return merged
    cuts = sorted({e[0] for e in edges} | {e[1] + 1 for e in edges})
    out = []
    active: list[tuple[int, int, frozenset[int]]] = []
    j = 0
    for a, b in zip(cuts, cuts[1:]):
        while j < len(edges) and edges[j][0] == a:
            active.append(edges[j])
            j += 1
        active = [e for e in active if e[1] >= a]
        if active:
            if len(active) == 1:
                tgt = active[0][2]
            elif len(active) == 2:
                tgt = active[0][2] | active[1][2]
            else:
                tgt = frozenset().union(*(e[2] for e in active))
            out.append((a, b - 1, tgt))
    return out


def _group_of(tgt: frozenset[int], block_at: list[int], blocks: list) -> tuple[tuple[int, ...], ByteDFA, int] | None:
    """``(bases, dfa, t)`` when every state of ``tgt`` is the same non-accepting local state
    ``t`` of a block copying the same embedded ``dfa`` (``bases``: those blocks, sorted); else
    None."""
    if not tgt:  # NOTE: the closure of a dead end (an empty set or language): no group
        return None
    it = iter(tgt)
    x = next(it)
    j = block_at[x]
    if j < 0:
        return None
    base, dfa = blocks[j]
    t = x - base
    if dfa.accept[t]:
        return None
    if len(tgt) == 1:
        return (base,), dfa, t
    bases = [base]
    for x in it:
        j = block_at[x]
        if j < 0:
            return None
        base, other = blocks[j]
        if other is not dfa or x - base != t:
            return None
        bases.append(base)
    bases.sort()
    return tuple(bases), dfa, t


def _block_index(nfa) -> list[int]:
    """Per NFA state, the index of its block in ``nfa.blocks`` (-1: not a block state)."""
    out = [-1] * len(nfa.eps)
    for j, (base, dfa) in enumerate(nfa.blocks):
        out[base : base + dfa.n_states] = [j] * dfa.n_states
    return out


def _block_offsets(nfa) -> list[int]:
    """Per NFA state, what to add to its edge targets: its block's base for the states of an
    embedded DFA (whose edge lists are the DFA's own runs), else 0."""
    offset = [0] * len(nfa.eps)
    for base, dfa in nfa.blocks:
        offset[base : base + dfa.n_states] = [base] * dfa.n_states
    return offset


def _hot_inner(dfa: ByteDFA) -> np.ndarray:
    """int64 states of ``dfa`` that its start reaches through states it marks hot (all of them
    when it marks none cold); cached on the DFA."""
    got = dfa.__dict__.get("_hot_inner")
    if got is None:
        if dfa.hot is None:
            got = np.arange(1, dfa.n_states)
        else:
            # NOTE: a hot state (one with a hot member) reached only through cold ones stays cold
            runs, hot = dfa.runs(), dfa.hot.tolist()
            seen = {dfa.start}
            stack = [dfa.start]
            while stack:
                for _, _, u in runs[stack.pop()]:
                    if hot[u] and u not in seen:
                        seen.add(u)
                        stack.append(u)
            got = np.asarray(sorted(seen), dtype=np.int64)
        dfa.__dict__["_hot_inner"] = got
    return got


def _hot_states(nfa, start: int) -> np.ndarray:
    """bool ``[n NFA states]``: reachable from ``start`` without entering a cold branch (a gate's
    edges, or a state an embedded DFA marks cold). An embedded DFA is entered only at its start
    state: its states reachable through its hot ones are marked at once (:func:`_hot_inner`),
    and the walk goes on from the block's end."""
    n = len(nfa.eps)
    gate = [False] * n
    for g in nfa.gates:
        gate[g] = True
    entry: dict[int, tuple[int, "ByteDFA"]] = {base + dfa.start: (base, dfa) for base, dfa in nfa.blocks}
    hot = np.zeros(n, dtype=bool)
    seen = [False] * n
    seen[start] = True
    stack = [start]
    eps, edges = nfa.eps, nfa.edges
    while stack:
        x = stack.pop()
        block = entry.get(x)
        if block is not None and block[1].hot is not None and not block[1].hot[block[1].start]:
            continue  # NOTE: a block that is cold from its start stays cold
        hot[x] = True
        if gate[x]:
            continue
        nxt = list(eps[x])
        if block is not None:
            base, dfa = block
            inner = _hot_inner(dfa)
            hot[base + inner] = True
            ends = inner[dfa.accept[inner]]
            if ends.size:  # NOTE: every accepting state leads to the same fragment end
                nxt.extend(eps[base + int(ends[0])])
        else:
            nxt.extend(t for _, _, t in edges[x])
        for y in nxt:
            if not seen[y]:
                seen[y] = True
                stack.append(y)
    return hot
