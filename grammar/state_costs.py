"""Walk-cost bounds of many DFA states at once (:meth:`radixlm.grammar.token_index.DfaIndex.cost2`).

``cost2(s)`` bounds the trie nodes a mask walk from ``s`` visits through its live two-byte
prefixes: for every live byte run ``[lo, hi)`` of ``s``'s row going to ``r``, the run's width plus
the trie's two-byte pair weights of first bytes in the run and second bytes live from ``r``. The
scalar method costs ~10 numpy calls per state; an eager compile asks it of hundreds of states,
so :func:`pair_costs` does the same sums for a whole batch in a few calls (same integers).
"""

from __future__ import annotations

import numpy as np

from radixlm.grammar.trie import TokenTrie

FEW_STATES = 4  # StateCosts.fill sums this few states one by one
CHUNK = 256  # states per batch (bounds the [runs, 256] temporaries: ~7 runs per state)


def pair_costs(trans: np.ndarray, trie: TokenTrie, states: np.ndarray) -> np.ndarray:
    """int64 ``[k]``: ``cost2`` of each state in int64 ``states [k]`` (rows of ``trans``, int
    ``[n_states, 256]``, 0 dead), exactly as the scalar computation gives it."""
    out = np.zeros(states.size, dtype=np.int64)
    cum = trie.pair_prefix()  # int64 [257, 256]
    for lo in range(0, states.size, CHUNK):
        rows = trans[states[lo : lo + CHUNK]]
        change = np.empty(rows.shape, dtype=bool)
        change[:, 0] = True
        np.not_equal(rows[:, 1:], rows[:, :-1], out=change[:, 1:])
        idx = np.flatnonzero(change)
        owner, starts = idx >> 8, idx & 255
        ends = np.empty_like(starts)
        ends[:-1] = starts[1:]
        ends[-1] = 256
        ends[np.flatnonzero(owner[1:] != owner[:-1])] = 256  # NOTE: a row's last run ends at 256
        tgt = rows.reshape(-1)[idx]
        live = tgt != 0
        owner, starts, ends, tgt = owner[live], starts[live], ends[live], tgt[live]
        per_run = ((cum[ends] - cum[starts]) * (trans[tgt] != 0)).sum(axis=1) + (ends - starts)
        np.add.at(out, lo + owner, per_run)
    return out


def pair_cost(trans: np.ndarray, trie: TokenTrie, s: int) -> int:
    """``cost2`` of the one state ``s`` (the scalar path of :func:`pair_costs`, fewer numpy calls):
    per byte run of its row (one target each), the run's pair weights as a difference of prefix
    sums over first bytes."""
    row = trans[s]
    change = np.empty(256, dtype=bool)
    change[0] = True
    np.not_equal(row[1:], row[:-1], out=change[1:])
    starts = np.flatnonzero(change)
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:]
    ends[-1] = 256
    live = row[starts] != 0
    starts, ends = starts[live], ends[live]
    cum = trie.pair_prefix()
    live2 = trans[row[starts]] != 0
    return int(((cum[ends] - cum[starts]) * live2).sum()) + int((ends - starts).sum())


class StateCosts:
    """Live bytes and one-byte walk costs of DFA states, computed for the states asked about (a
    compile asks about the hot states only, often a small part of a large DFA) and kept.

    Args:
        trans: int ``[n_states, 256]`` DFA transitions (0 dead).
        byte_weight: ``[256]`` trie nodes below each first byte.
    """

    def __init__(self, trans: np.ndarray, byte_weight: np.ndarray) -> None:
        self.trans = trans
        self.weight = byte_weight.astype(np.float64)
        self._weight = byte_weight.astype(np.int64)  # NOTE: the same sums, exact in either
        self._n_live = np.full(trans.shape[0], -1, dtype=np.int64)  # -1: not computed yet
        self._cost = np.full(trans.shape[0], -1, dtype=np.int64)
        self._all = False

    def fill(self, states: np.ndarray) -> np.ndarray:
        """Compute the entries of int64 ``states`` (duplicates allowed) not known yet; returns
        the int64 cost array (``[n_states]``; entries of states never asked about are -1)."""
        todo = states[self._cost[states] < 0]
        if 0 < todo.size <= FEW_STATES:
            for s in todo.tolist():  # NOTE: einsum costs ~25 µs more in a cold first visit
                live = self.trans[s] != 0
                self._n_live[s] = np.count_nonzero(live)
                self._cost[s] = self._weight[live].sum()
        elif todo.size:
            live = self.trans[todo] != 0
            self._n_live[todo] = live.sum(axis=1)
            # NOTE: einsum, not a matmul: BLAS would spread this over its worker threads (exact:
            # integer-valued sums, the same in any batch)
            self._cost[todo] = np.einsum("ij,j->i", live, self.weight).astype(np.int64)
        return self._cost

    def cost_of(self, s: int) -> int:
        """Trie nodes below the live first bytes of state ``s``."""
        got = int(self._cost[s])
        return got if got >= 0 else int(self.fill(np.asarray([s], dtype=np.int64))[s])

    def live_of(self, s: int) -> int:
        """Live bytes of state ``s``."""
        if self._cost[s] < 0:
            self.fill(np.asarray([s], dtype=np.int64))
        return int(self._n_live[s])

    def all(self) -> tuple[np.ndarray, np.ndarray]:
        """``(n_live, cost)``, int64 ``[n_states]`` each, complete."""
        if not self._all:
            self.fill(np.arange(self.trans.shape[0], dtype=np.int64))
            self._all = True
        return self._n_live, self._cost
