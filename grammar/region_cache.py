"""Per-tokenizer cache of what a loop region of a DFA admits (see
:mod:`radixlm.grammar.token_index`), keyed by the region's canonical shape."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np


@dataclass
class RegionEntry:
    """What a loop region admits, independent of where it appears."""

    internal: np.ndarray  # int32 [words]: tokens that end inside the region
    exit_nodes: np.ndarray  # trie nodes whose last byte leaves the region
    exit_from: np.ndarray  # canonical region state before that byte
    accept_nodes: np.ndarray  # nodes ending in an accepting region state (if accept was given)


class RegionCache:
    """Per-tokenizer LRU of :class:`RegionEntry` keyed by the region's canonical shape."""

    def __init__(self, capacity: int = 512) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[bytes, RegionEntry] = OrderedDict()
        self.hits = self.misses = 0
        self._lock = threading.Lock()  # NOTE: compile threads and the scheduler share one cache

    def get(self, key: bytes) -> RegionEntry | None:
        """The entry of a region shape (its canonical hash), marked recently used; None if absent."""
        with self._lock:
            got = self.entries.get(key)
            if got is not None:
                self.entries.move_to_end(key)
                self.hits += 1
            return got

    def put(self, key: bytes, entry: RegionEntry) -> None:
        """Store a new region shape's entry, dropping the least recently used past capacity."""
        with self._lock:
            self.misses += 1
            self.entries[key] = entry
            if len(self.entries) > self.capacity:
                self.entries.popitem(last=False)
