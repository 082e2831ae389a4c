"""The byte DFA that every grammar compiles to, and its dead-state trim.

State 0 is the dead state (``trans[0] == 0``); after :func:`trim` every other state can still reach
an accepting state, so "not dead" means "a valid prefix" (see :mod:`radixlm.grammar.automaton`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from radixlm.grammar.trie import expand


@dataclass(eq=False)
class ByteDFA:
    """Deterministic automaton over bytes.

    Attributes:
        trans: int32 ``[n_states, 256]``; state 0 is dead.
        accept: bool ``[n_states]``.
        start: the initial state (1, or 0 when the language is empty).
    """

    trans: np.ndarray
    accept: np.ndarray
    start: int
    _rows: list[list[int]] | None = field(default=None, repr=False)
    _runs: list[tuple[tuple[int, int, int], ...]] | None = field(default=None, repr=False)
    _flat: memoryview | None = field(default=None, repr=False)
    hot: np.ndarray | None = None  # bool [n_states]: reachable without a cold branch (None: all)

    @property
    def n_states(self) -> int:
        return int(self.trans.shape[0])

    def step(self, state: int, data: bytes) -> int:
        """State after ``data`` (0 once dead)."""
        flat = self.flat
        for b in data:
            state = flat[(state << 8) | b]
            if state == 0:
                return 0
        return state

    @property
    def flat(self) -> memoryview:
        """``trans`` as a flat int32 memoryview (``state * 256 + byte``). NOTE: not :attr:`rows`
        for matching: ``trans.tolist()`` cost the first token of a 3k-state DFA ~20 ms (190 ms
        at 19k states) and left n_states lists of 256 ints for every GC pass to traverse."""
        if self._flat is None:
            self._flat = memoryview(np.ascontiguousarray(self.trans, dtype=np.int32).reshape(-1))
        return self._flat

    @property
    def rows(self) -> list[list[int]]:
        if self._rows is None:
            self._rows = self.trans.tolist()
        return self._rows

    def runs(self) -> list[tuple[tuple[int, int, int], ...]]:
        """Per state, its transitions as byte runs ``(lo, hi, target)`` with one live target each
        (state 0 and dead runs left out); computed once per DFA."""
        got = self._runs
        if got is None:
            trans = self.trans
            src, lo = run_starts(trans)
            hi = np.empty_like(lo)
            hi[:-1] = lo[1:] - 1
            hi[-1] = 255
            last = np.ones(src.size, dtype=bool)
            last[:-1] = src[1:] != src[:-1]
            hi[last] = 255
            tgt = trans[src, lo]
            keep = (tgt != 0) & (src != 0)
            src, lo, hi, tgt = src[keep], lo[keep], hi[keep], tgt[keep]
            # NOTE: the tuples are made by zip and cut per state by slices (C loops, not Python)
            flat = list(zip(lo.tolist(), hi.tolist(), tgt.tolist()))
            ptr = np.searchsorted(src, np.arange(self.n_states + 1)).tolist()
            # NOTE: tuples, not lists: the collector untracks tuples of ints (within two passes),
            # so the runs of long-lived (memoized) automata are not traversed again and again
            got = [tuple(flat[a:b]) for a, b in zip(ptr, ptr[1:])]
            self._runs = got
        return got

    def matches(self, text: str | bytes) -> bool:
        data = text.encode("utf-8") if isinstance(text, str) else text
        return bool(self.accept[self.step(self.start, data)])


SMALL_GRAPH = 8_000  # edges up to which the co-reachability walk runs in Python


def trim(trans: np.ndarray, accept: np.ndarray, hot: np.ndarray | None = None,
          check: bool = True) -> ByteDFA:
    """Send every state that cannot reach an accepting state to 0, renumber the rest (``hot``,
    per state, follows the renumbering). ``check=False``: the caller knows every state is live."""
    n = trans.shape[0]
    live = accept.copy()
    live[0] = False
    if not check:
        live[1:] = True
    elif not live[1:].all():
        live = coreachable(trans, live)
    if not live[1]:
        return ByteDFA(np.zeros((1, 256), np.int32), np.zeros(1, bool), 0)
    if live[1:].all():
        return ByteDFA(trans, accept, 1, hot=hot)
    new_id = np.zeros(n, dtype=np.int32)
    kept = np.nonzero(live)[0]
    new_id[kept] = np.arange(1, kept.size + 1, dtype=np.int32)
    out = np.zeros((kept.size + 1, 256), dtype=np.int32)
    out[1:] = new_id[trans[kept]]
    acc = np.zeros(kept.size + 1, dtype=bool)
    acc[1:] = accept[kept]
    hot_out = None
    if hot is not None:
        hot_out = np.zeros(kept.size + 1, dtype=bool)
        hot_out[1:] = hot[kept]
    return ByteDFA(out, acc, int(new_id[1]), hot=hot_out)


def coreachable(trans: np.ndarray, live: np.ndarray) -> np.ndarray:
    """States that reach a ``live`` one (backward search over the distinct edges only: a byte run
    with one target is one edge)."""
    src, col = run_starts(trans)
    dst = trans[src, col]
    keep = (dst != 0) & (src != 0)
    src, dst = src[keep], dst[keep]
    order = np.argsort(dst, kind="stable")
    src_by_dst = src[order]
    n = trans.shape[0]
    starts = np.searchsorted(dst[order], np.arange(n + 1))
    if src.size <= SMALL_GRAPH:  # NOTE: a Python walk: ~0.1 us an edge, not ~30 us a numpy level
        return _walk_back(src_by_dst.tolist(), starts.tolist(), live)
    live = live.copy()
    frontier = np.nonzero(live)[0]
    while frontier.size:
        idx, _ = expand(starts[frontier], starts[frontier + 1] - starts[frontier])
        preds = np.unique(src_by_dst[idx])
        preds = preds[~live[preds]]
        live[preds] = True
        frontier = preds
    return live


def _walk_back(preds: list[int], starts: list[int], live: np.ndarray) -> np.ndarray:
    """``live`` grown by every state with a path into it, given the predecessors of each state
    ``q`` as ``preds[starts[q] : starts[q + 1]]``."""
    out = live.tolist()
    stack = np.flatnonzero(live).tolist()
    while stack:
        q = stack.pop()
        for p in preds[starts[q] : starts[q + 1]]:
            if not out[p]:
                out[p] = True
                stack.append(p)
    return np.asarray(out, dtype=bool)


def run_starts(trans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(state, byte)`` int64 arrays, in row-major order, of every byte that starts a run of
    one target in ``trans`` (int ``[n, 256]``): byte 0, and every byte whose target differs from
    the byte before it."""
    flat = trans.reshape(-1)
    change = np.empty(flat.size, dtype=bool)
    np.not_equal(flat[1:], flat[:-1], out=change[1:])
    change[::256] = True  # NOTE: one flat comparison; row starts set after (7x a 2-D nonzero)
    idx = np.flatnonzero(change)
    return idx >> 8, idx & 255
