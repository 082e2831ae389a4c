"""First-visit masks of DFA grammars computed on the decode device (issue 12).

A DFA grammar too large to precompute at compile time (``EAGER_STATES``, grammar/dfa_engine.py)
gets each state's mask on its first visit. On the host that is a vocabulary-trie walk, up to
~0.65 ms for a wide state (a string body with its exits), paid on the decode path while the GPU
waits. On a CUDA device the batch's unseen states instead run through the DFA on the GPU
(:func:`radixlm.kernels.dfa_token_mask`: every token's bytes through the transition table), and
the rows stay cached on the device, keyed by state, for the grammar's lifetime:

- per grammar and device: the int32 transition table ``[n_states, 256]`` (uploaded once) and a row
  cache ``[cap, W]`` that grows by doubling up to ``MAX_ROWS_BYTES`` and is cleared when full (at
  the start of a call, never in the middle of one);
- per tokenizer and device: the vocabulary's bytes (:class:`radixlm.kernels.dfa_mask.TokenBytes`).

Rows equal the host's (:class:`radixlm.grammar.mask_table.MaskTable`): the DFA's token mask, stop
tokens added in accepting states. States the host table already holds are gathered from it; only
the others come from here. Device copies count toward the mask tables' device budget
(``DEVICE_TABLE_BYTES``, least recently used dropped first).

``RADIXLM_DEVICE_MASKS=0`` turns the device path off (every first visit on the host).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np
import torch

MAX_TRANS_BYTES = 256 << 20  # a larger transition table stays on the host path
MAX_ROWS_BYTES = 256 << 20  # row cache per grammar and device
computed = [0]  # rows computed on a device so far, all grammars (for tests and traces)


def enabled() -> bool:
    """``RADIXLM_DEVICE_MASKS`` (default on), read at each call."""
    return os.environ.get("RADIXLM_DEVICE_MASKS", "1") != "0"


def token_bytes(info: Any, device: torch.device):
    """The :class:`TokenBytes` of ``info`` (a TokenizerInfo) on ``device``, built once per device."""
    from radixlm.kernels.dfa_mask import TokenBytes

    cache = info.__dict__.setdefault("_device_token_bytes", {})
    got = cache.get(device)
    if got is None:
        got = cache[device] = TokenBytes.build(info.token_bytes, info.mask_words, device)
    return got


class DeviceDfaMasks:
    """Masks of one DFA grammar's states on one device, computed by the DFA-over-vocabulary kernel.

    Args:
        compiled: a :class:`CompiledGrammar` whose engine is a DFA (``engine.dfa``).
        device: where the rows live (CUDA in serving; CPU runs the torch reference, for tests).
    Thread-safety: one lock guards the slot map.
    """

    def __init__(self, compiled: Any, device: torch.device) -> None:
        dfa = compiled.engine.dfa
        self.device = device
        self.words = compiled.masks.words
        self._info = compiled.tokenizer_info
        self._accept = np.asarray(dfa.accept, dtype=bool)
        self._trans_np = dfa.trans
        self._stop_np = np.asarray(compiled.masks.row_np(0), dtype=np.int32)
        self.max_rows = max(64, MAX_ROWS_BYTES // (4 * self.words))
        self._lock = threading.Lock()
        self._trans: torch.Tensor | None = None
        self._stop: torch.Tensor | None = None
        self._rows: torch.Tensor | None = None
        self._slot: dict[int, int] = {}

    @staticmethod
    def fits(compiled: Any) -> bool:
        """Whether ``compiled`` can use the device path (a DFA engine, table within bounds)."""
        dfa = getattr(compiled.engine, "dfa", None)
        return dfa is not None and dfa.trans.shape[0] * 256 * 4 <= MAX_TRANS_BYTES

    def _ensure(self) -> None:
        if self._trans is None:
            self._trans = torch.from_numpy(np.ascontiguousarray(self._trans_np, dtype=np.int32)).to(self.device)
            self._stop = torch.from_numpy(self._stop_np).to(self.device)
        if self._rows is None:
            self._rows = torch.empty((64, self.words), dtype=torch.int32, device=self.device)

    def slots(self, states: np.ndarray) -> np.ndarray:
        """int64 slot per DFA state of ``states`` (int64 ``[n]``, no dead or None states) in
        :meth:`device_rows`; states seen for the first time are computed in one kernel launch."""
        from radixlm.grammar.mask_table import _touch_device
        from radixlm.kernels import dfa_token_mask

        with self._lock:
            self._ensure()
            slot = self._slot
            todo = [s for s in dict.fromkeys(states.tolist()) if s not in slot]
            if todo and len(slot) + len(todo) > self.max_rows:
                slot.clear()  # NOTE: full: start over, then compute every state of this call
                todo = list(dict.fromkeys(states.tolist()))
            if todo:
                first = len(slot)
                need = first + len(todo)
                if need > self._rows.shape[0]:
                    grown = torch.empty((max(need, 2 * self._rows.shape[0]), self.words),
                                        dtype=torch.int32, device=self.device)
                    grown[:first] = self._rows[:first]
                    self._rows = grown
                ids = torch.from_numpy(np.asarray(todo, dtype=np.int64)).to(self.device, non_blocking=True)
                masks = dfa_token_mask(self._trans, ids, token_bytes(self._info, self.device), self.words)
                acc = self._accept[todo]
                if acc.any():
                    pick = torch.from_numpy(np.flatnonzero(acc)).to(self.device, non_blocking=True)
                    masks[pick] |= self._stop
                self._rows[first:need] = masks
                computed[0] += len(todo)
                for i, s in enumerate(todo):
                    slot[s] = first + i
            out = np.fromiter((slot[s] for s in states.tolist()), dtype=np.int64, count=states.size)
        _touch_device(self)
        return out

    def device_rows(self, device: torch.device) -> torch.Tensor:
        """int32 ``[>= slots, W]`` rows on ``device`` (the one this cache lives on)."""
        assert device == self.device, (device, self.device)
        self._ensure()
        return self._rows

    def rows_cpu(self) -> torch.Tensor:
        """The rows when this cache lives on the CPU (tests run the torch reference there)."""
        assert self.device.type == "cpu", self.device
        self._ensure()
        return self._rows

    def device_bytes(self) -> int:
        return sum(t.numel() * 4 for t in (self._trans, self._rows) if t is not None)

    def drop_device(self) -> None:
        """Free the device tensors (rebuilt, and rows recomputed, on the next call)."""
        with self._lock:
            self._trans = self._stop = self._rows = None
            self._slot = {}


def device_masks(compiled: Any, device: torch.device) -> DeviceDfaMasks | None:
    """``compiled``'s device mask cache on ``device``, or None where the host path serves it (the
    path is off, the grammar is not a DFA, its table is complete, or its DFA is too large)."""
    if not enabled() or compiled.masks.complete or not DeviceDfaMasks.fits(compiled):
        return None
    caches = compiled.__dict__.setdefault("_device_masks", {})
    got = caches.get(device)
    if got is None:
        got = caches[device] = DeviceDfaMasks(compiled, device)
    return got
