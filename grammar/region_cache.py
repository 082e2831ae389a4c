"""Per-tokenizer cache of what a loop region of a DFA admits (see
:mod:`radixlm.grammar.token_index`), keyed by the region's canonical shape."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

SIG_CANDIDATES = 16  # shapes kept per first-row probe (see region_match.match_region)


@dataclass
class RegionEntry:
    """What a loop region admits, independent of where it appears."""

    internal: np.ndarray  # int32 [words]: tokens that end inside the region
    exit_nodes: np.ndarray  # trie nodes whose last byte leaves the region
    exit_from: np.ndarray  # canonical region state before that byte
    accept_nodes: np.ndarray  # nodes ending in an accepting region state (if accept was given)
    codes: np.ndarray | None = None  # int16 [n, 256] canonical table (shapes without accept bits)
    tree: tuple[list[int], list[int]] | None = None  # spanning tree (region_match.spanning_tree)
    check: tuple | None = None  # flat positions inside / outside the region (region_match.build_entry)
    exits: tuple | None = None  # (base mask, walk starts), see region_match.exit_parts
    sig: int | None = None  # the probe it is indexed under (see RegionCache.register)
    hits: int = 0  # first visits it matched (see RegionCache.hit)


def match_cost(entry: RegionEntry) -> int:
    """A first visit's work through ``entry`` (its rows checked, then its exit nodes walked
    below), in arbitrary units: the order candidates are tried in."""
    return 4 * entry.codes.shape[0] + entry.exit_nodes.size


class RegionCache:
    """Per-tokenizer LRU of :class:`RegionEntry` keyed by the region's canonical shape, with an
    index of shapes by the probe of their first row (:mod:`radixlm.grammar.region_match`)."""

    def __init__(self, capacity: int = 512) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[bytes, RegionEntry] = OrderedDict()
        self.by_sig: dict[int, list[bytes]] = {}  # first-row probe -> shape keys, cheapest first
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
                old_key, old = self.entries.popitem(last=False)
                keys = self.by_sig.get(old.sig) if old.sig is not None else None
                if keys is not None and old_key in keys:
                    keys.remove(old_key)
                    if not keys:
                        del self.by_sig[old.sig]

    def register(self, sig: int, key: bytes, entry: RegionEntry) -> None:
        """Index shape ``key`` (its ``entry``, stored; with ``codes``) under the probe ``sig`` of
        its first row (:func:`radixlm.grammar.region_match.row_probe`): the ``SIG_CANDIDATES``
        cheapest shapes per probe, cheapest first (:func:`match_cost`: a small shape is quick to
        check, and one with few exit nodes quick to walk on from; a string body's own shape
        matches the body in any context, whatever larger region the search would find there)."""
        with self._lock:
            entry.sig = sig
            keys = self.by_sig.setdefault(sig, [])
            if key in keys:
                return
            cost = match_cost(entry)  # NOTE: after the shapes that matched before, cheapest first
            at = len(keys)
            while at > 0 and (e := self.entries.get(keys[at - 1])) is not None and e.hits == 0 and match_cost(e) > cost:
                at -= 1
            keys.insert(at, key)
            del keys[SIG_CANDIDATES:]

    def hit(self, sig: int, key: bytes) -> None:
        """Shape ``key`` matched a state under probe ``sig``: mark it recently used, and try it
        first from now on (the shapes that match are few: a string body's, a number's)."""
        with self._lock:
            got = self.entries.get(key)
            if got is not None:
                self.entries.move_to_end(key)
                self.hits += 1
                got.hits += 1
            keys = self.by_sig.get(sig)
            if keys and keys[0] != key and key in keys:
                keys.remove(key)
                keys.insert(0, key)

    def candidates(self, sig: int) -> list[tuple[bytes, RegionEntry]]:
        """``(key, entry)`` of the cached shapes indexed under ``sig`` (evicted ones skipped)."""
        keys = self.by_sig.get(sig)
        if not keys:
            return []
        entries = self.entries
        return [(k, e) for k in list(keys) if (e := entries.get(k)) is not None]
