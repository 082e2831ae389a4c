"""Per-grammar table of packed token masks, one deduplicated int32 row per distinct mask.

A :class:`MaskTable` maps matcher states to row ids of one int32 ``[rows, words]`` table. A decode
step then fills the masks of a whole batch with one gather (``table[row_ids]``), on the CPU or
from a device-side copy of the table (uploaded incrementally, only the rows added since the last
upload). Rows are deduplicated: many grammar states share a mask (after ``{`` only ``"``; every
state inside a string body).

Row 0 is always the stop-only mask (the mask of a terminated matcher).

DFA grammars fill the table for every state at compile time (:meth:`MaskTable.from_dense`); other
engines (Earley) add rows on first visit (:meth:`MaskTable.row_ids`), batched over the states a
step needs, and cached for the grammar's lifetime (bounded by ``max_rows``: past it the table is
cleared at the start of a call, never in the middle of one).
"""

from __future__ import annotations

import threading
import weakref
import zlib
from collections import OrderedDict
from typing import Callable, Hashable, Sequence

import numpy as np
import torch

SPARE_ROWS = 64  # capacity past the rows of a table that grows on first visits (zero pages: free)
MAX_TABLE_BYTES = 256 << 20  # per grammar; a larger table is cleared and refilled on demand
DEVICE_TABLE_BYTES = 1 << 30  # device copies of all grammars together; least recently used go first
_DEVICE_LRU: "OrderedDict[int, weakref.ref]" = OrderedDict()


class MaskTable:
    """State -> packed mask row.

    Args:
        words: int32 words per row (``ceil(vocab_size / 32)``).
        stop_row: int32 ``[words]``, the stop tokens (row 0).
        compute: ``states -> list of int32 [words] masks`` for states not yet in the table (the
            mask the matcher should see, stop tokens included where the state accepts).
        max_rows: row budget before the lazy part of the table is cleared.
    Thread-safety: one writer at a time (a lock guards row insertion).
    """

    def __init__(self, words: int, stop_row: np.ndarray,
                 compute: Callable[[list[Hashable]], list[np.ndarray]] | None,
                 max_rows: int | None = None) -> None:
        self.words = words
        self._compute = compute
        self.max_rows = max_rows or max(64, MAX_TABLE_BYTES // (4 * words))
        self._lock = threading.Lock()
        self._dense: np.ndarray | None = None  # int64 [n_states]: row of each DFA state (-1: not yet)
        self._missing = 0  # DFA states whose row is computed on first visit
        self._reset_storage(np.asarray(stop_row, dtype=np.int32).reshape(1, words), compute is not None)

    def _reset_storage(self, rows: np.ndarray | Sequence[np.ndarray], grows: bool = False) -> None:
        """Start the table over with ``rows`` (int32 ``[n, words]``, or a list of ``[words]`` rows
        written straight into the table: no stacked copy); ``grows``: rows will be added on first
        visits (capacity for SPARE_ROWS more, so the first visits do not copy the table to grow
        it: a growth copies every row, ~50 µs to ms in the step that pays it)."""
        n = len(rows)
        spare = min(SPARE_ROWS, self.max_rows) if grows else 0
        cap = max(16, 1 << int(np.ceil(np.log2(max(n + spare, 1) + 1))))
        # NOTE: zeros, not empty: the pages past the rows are never touched until rows are added
        self._np = np.zeros((cap, self.words), dtype=np.int32)
        if isinstance(rows, np.ndarray):
            self._np[:n] = rows
        else:
            for i, r in enumerate(rows):
                self._np[i] = r
        self.n_rows = n
        self._fixed = n  # rows that are never cleared
        self._by_crc: dict[int, list[int]] | None = None  # row CRC-32 -> ids, built on the first _add
        self._row_of: dict[Hashable, int] = {}
        self._device: dict[torch.device, tuple[torch.Tensor, int]] = {}
        self.generation = getattr(self, "generation", -1) + 1

    @classmethod
    def from_dense(cls, masks: np.ndarray, stop_row: np.ndarray, missing: np.ndarray | None = None,
                   compute: Callable[[list[Hashable]], list[np.ndarray]] | None = None) -> "MaskTable":
        """A table for states ``0..n-1`` from int32 ``[n, words]`` masks (state 0 dead). States
        flagged in bool ``[n]`` ``missing`` (their rows in ``masks`` are ignored) get their row
        from ``compute`` on first visit, then stay (never cleared)."""
        words = masks.shape[1]
        table = cls(words, stop_row, None)
        table._compute = compute
        full = masks.shape[0]
        if missing is not None and missing.any():
            present = np.nonzero(~missing)[0]
            masks = masks[present]  # NOTE: only rows of precomputed states are deduplicated
        allrows = np.concatenate([np.asarray(stop_row, np.int32).reshape(1, words), masks])
        uniq, first, inverse = np.unique(allrows.view(np.dtype((np.void, 4 * words))).ravel(),
                                         return_index=True, return_inverse=True)
        # keep the stop row first: renumber unique rows by first occurrence.
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        table._reset_storage(allrows[first[order]])
        table._dense = rank[inverse.ravel()[1:]].astype(np.int64)
        if missing is not None and missing.any():
            dense = np.full(full, -1, dtype=np.int64)
            dense[present] = table._dense
            table._dense = dense
            table._missing = int(missing.sum())
        return table

    @classmethod
    def from_states(cls, n_states: int, masks: dict[int, np.ndarray], accept: np.ndarray,
                    stop_row: np.ndarray,
                    compute: Callable[[list[Hashable]], list[np.ndarray]] | None = None) -> "MaskTable":
        """A table for DFA states ``0..n_states-1`` from the masks of the precomputed ones
        (``masks``: state -> int32 ``[words]``, stop tokens excluded; ``accept``: bool per state,
        where the stop row is added). The other states get their row from ``compute`` on first
        visit. Rows are deduplicated by identity: states sharing one mask array share a row
        (the token index hands out one array per distinct narrow mask)."""
        stop = np.asarray(stop_row, dtype=np.int32).reshape(-1)
        table = cls(stop.size, stop, None)
        table._compute = compute
        rows = [stop, 0]  # NOTE: written into the table one by one (0: an all-zero row)
        acc_rows: list[int] = []
        dense = np.full(n_states, -1, dtype=np.int64)
        dense[0] = 1  # the dead state: nothing allowed
        by_id: dict[tuple[int, bool], int] = {}
        plain: dict[int, tuple[np.ndarray, int]] = {}  # id -> (mask, row) of non-accepting rows
        for s, m in masks.items():
            acc = bool(accept[s])
            key = (id(m), acc)
            r = by_id.get(key)
            if r is None:
                r = by_id[key] = len(rows)
                rows.append(m)  # NOTE: stop tokens added in the table (see below), no temporary
                if acc:
                    acc_rows.append(r)
                else:
                    plain[id(m)] = (m, r)  # NOTE: holds m, so its id is never reused
            dense[s] = r
        table._reset_storage(rows)  # NOTE: no spare rows: zeroing them cost every compile ~0.1 ms
        if acc_rows:
            table._np[acc_rows] |= stop
        table._dense = dense
        table._missing = int((dense < 0).sum())
        # NOTE: a cold state's row is matched against the precomputed ones by identity only (the
        # token index hands out one array per distinct mask), and by content against the rows
        # added since: hashing every precomputed row on the first cold visit cost up to ~2 ms
        table._plain = plain
        table._by_crc = {}
        return table

    @property
    def complete(self) -> bool:
        """True when every state has a row (no computation ever happens on the decode path)."""
        return self._dense is not None and not self._missing

    def _fill_missing(self, ids: np.ndarray) -> None:
        """Compute the rows of the cold DFA states among ``ids`` (see :meth:`from_dense`)."""
        with self._lock:
            dense = self._dense
            todo = [int(s) for s in dict.fromkeys(ids.tolist()) if s >= 0 and dense[s] < 0]
            if todo:
                plain = getattr(self, "_plain", None) or {}
                for s, mask in zip(todo, self._compute(todo)):
                    hit = plain.get(id(mask))
                    if hit is not None and hit[0] is mask:
                        dense[s] = hit[1]
                    else:
                        dense[s] = self._add(np.asarray(mask, dtype=np.int32))
                self._missing -= len(todo)

    def _add(self, mask: np.ndarray) -> int:
        """Row id of ``mask`` (int32 ``[words]``): an equal row's, or a new row.

        NOTE: rows are found by CRC-32 and compared exactly (a collision only costs a compare):
        hashing a 12.8 KB row as ``bytes`` for a dict cost ~8 µs per first visit, the CRC ~4."""
        if self._by_crc is None:
            self._by_crc = {}
            for i in range(self.n_rows):  # NOTE: ascending: the first of equal rows wins
                self._by_crc.setdefault(zlib.crc32(self._np[i]), []).append(i)
        mask = np.ascontiguousarray(mask, dtype=np.int32)
        key = zlib.crc32(mask)
        same = self._by_crc.get(key)
        if same is not None:
            data = mask.tobytes()
            for i in same:
                if self._np[i].tobytes() == data:
                    return i
        if self.n_rows == self._np.shape[0]:
            grown = np.zeros((2 * self._np.shape[0], self.words), dtype=np.int32)
            grown[: self.n_rows] = self._np[: self.n_rows]
            self._np = grown
        self._np[self.n_rows] = mask
        self._by_crc.setdefault(key, []).append(self.n_rows)
        self.n_rows += 1
        return self.n_rows - 1

    def row_id(self, state: Hashable) -> int:
        """Row of one state (``None``: the stop row); the scalar fast path of :meth:`row_ids`."""
        if state is None:
            return 0
        if self._dense is not None:
            row = int(self._dense[state])
            if row < 0:
                self._fill_missing(np.asarray([state], dtype=np.int64))
                row = int(self._dense[state])
            return row
        got = self._row_of.get(state)
        if got is not None:
            return got
        with self._lock:  # NOTE: one state: row_ids' batching without its list and array work
            got = self._row_of.get(state)
            if got is None and self.n_rows < self.max_rows:
                got = self._row_of[state] = self._add(np.asarray(self._compute([state])[0], dtype=np.int32))
        return got if got is not None else int(self.row_ids([state])[0])

    def known_rows(self, states: Sequence[Hashable]) -> np.ndarray:
        """int64 ``[len(states)]`` row ids of states that already have a row, -1 for the others
        (nothing is computed; ``None``: the stop-only row 0)."""
        if self._dense is not None:
            ids = np.fromiter((-1 if s is None else s for s in states), dtype=np.int64, count=len(states))
            return np.where(ids < 0, 0, self._dense[ids])
        row_of = self._row_of
        return np.fromiter((0 if s is None else row_of.get(s, -1) for s in states), dtype=np.int64,
                           count=len(states))

    def row_ids(self, states: Sequence[Hashable]) -> np.ndarray:
        """int64 ``[len(states)]`` row ids (``None`` state: the stop-only row 0). Computes the
        masks of states seen for the first time in one batched call."""
        if self._dense is not None:
            ids = np.fromiter((-1 if s is None else s for s in states), dtype=np.int64, count=len(states))
            rows = np.where(ids < 0, 0, self._dense[ids])  # NOTE: None (terminated): stop row 0
            if self._missing and (rows < 0).any():
                self._fill_missing(ids[rows < 0])
                rows = np.where(ids < 0, 0, self._dense[ids])
            return rows
        with self._lock:
            row_of = self._row_of
            todo = [s for s in dict.fromkeys(states) if s is not None and s not in row_of]
            if todo and self.n_rows + len(todo) > self.max_rows:
                self._clear_lazy()
                row_of = self._row_of
                todo = [s for s in dict.fromkeys(states) if s is not None]
            if todo:
                for s, mask in zip(todo, self._compute(todo)):
                    row_of[s] = self._add(np.asarray(mask, dtype=np.int32))
            return np.fromiter((0 if s is None else row_of[s] for s in states), dtype=np.int64,
                               count=len(states))

    def _clear_lazy(self) -> None:
        self._reset_storage(self._np[: self._fixed].copy(), True)

    def rows_cpu(self) -> torch.Tensor:
        """int32 ``[n_rows, words]`` CPU view of the table (valid until rows are added)."""
        return torch.from_numpy(self._np[: self.n_rows])

    def row_np(self, row: int) -> np.ndarray:
        return self._np[row]

    def device_rows(self, device: torch.device) -> torch.Tensor:
        """int32 ``[>= n_rows, words]`` copy of the table on ``device``; only the rows added since
        the last call are uploaded (the whole table after a growth past the device capacity)."""
        got = self._device.get(device)
        if got is not None and got[1] == self.n_rows:
            return got[0]
        if got is None or got[0].shape[0] < self.n_rows:
            # NOTE: sized by the rows, not the host capacity (which keeps spare rows, see SPARE_ROWS)
            cap = max(16, 1 << int(np.ceil(np.log2(self.n_rows + 1))))
            dev = torch.empty((cap, self.words), dtype=torch.int32, device=device)
            lo = 0
        else:
            dev, lo = got
        dev[lo : self.n_rows].copy_(torch.from_numpy(self._np[lo : self.n_rows]), non_blocking=False)
        self._device[device] = (dev, self.n_rows)
        _touch_device(self)
        return dev

    def device_bytes(self) -> int:
        return sum(t.numel() * 4 for t, _ in self._device.values())

    def drop_device(self) -> None:
        """Free the device copies (they are rebuilt on the next :meth:`device_rows`)."""
        self._device = {}


def _touch_device(table: MaskTable) -> None:
    """Mark ``table`` most recently used and drop the device copies of the least recently used
    tables past ``DEVICE_TABLE_BYTES`` (never ``table`` itself)."""
    _DEVICE_LRU[id(table)] = weakref.ref(table)
    _DEVICE_LRU.move_to_end(id(table))
    total = 0
    for key in reversed(list(_DEVICE_LRU)):
        t = _DEVICE_LRU[key]()
        if t is None:
            del _DEVICE_LRU[key]
            continue
        total += t.device_bytes()
        if total > DEVICE_TABLE_BYTES and t is not table:
            t.drop_device()
            del _DEVICE_LRU[key]


def gather_rows(tables: Sequence[MaskTable], row_ids: Sequence[np.ndarray], out: torch.Tensor,
                positions: Sequence[np.ndarray]) -> None:
    """Fill ``out[positions[g]] = tables[g] rows row_ids[g]`` for every group ``g`` (CPU or device
    ``out``; int32 ``[B, words]``). One ``index_select`` per distinct grammar."""
    for table, ids, pos in zip(tables, row_ids, positions):
        if out.is_cuda:
            src = table.device_rows(out.device)
            idx = torch.from_numpy(ids).to(out.device, non_blocking=True)
        else:
            src = table.rows_cpu()
            idx = torch.from_numpy(ids)
        if len(pos) == out.shape[0] and np.array_equal(pos, np.arange(out.shape[0])):
            torch.index_select(src, 0, idx, out=out)
        else:
            p = torch.from_numpy(np.asarray(pos, dtype=np.int64)).to(out.device, non_blocking=True)
            out.index_copy_(0, p, src.index_select(0, idx))
