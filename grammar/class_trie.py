"""The vocabulary trie seen through one DFA's byte classes: a much smaller trie, same masks.

Bytes that every state of a DFA maps alike (its *byte classes*: identical columns of the
transition table) are interchangeable in any walk against that DFA. Replacing each byte of each
token by its class's smallest byte merges the trie nodes that differ only within classes; tokens
that become equal are byte-duplicates of one another (:class:`~radixlm.grammar.trie.TokenTrie`
already expands those when packing masks). A regex over ``[a-z ]`` has a handful of classes and
its trie shrinks from ~200k nodes (a 100k vocabulary) to ~1.5k, so every mask walk gets that much
cheaper; a JSON schema with many distinct key letters keeps more. The classes depend only on the
partition, so the compressed trie is cached per tokenizer and partition.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from radixlm.grammar.token_index import RegionCache
from radixlm.grammar.trie import TokenTrie

MAX_SHARE = 0.6  # use a class trie only when it has at most this share of the full trie's nodes
CACHE_SIZE = 32  # class tries kept per tokenizer (one per distinct byte partition)


BLOCK_ROWS = 4096  # rows of the transition table transposed at a time by byte_classes


def byte_classes(trans: np.ndarray) -> np.ndarray:
    """int64 ``[256]``: class id of every byte (bytes with identical transition columns share one),
    numbered by first occurrence so the partition has one canonical form. Exact: columns are
    compared by their bytes, a block of ``BLOCK_ROWS`` states at a time (each block refines the
    partition of the blocks before it; a transposed block stays in cache, where one transpose of
    a 69k-state table took 100-240 ms), stopping once every byte is alone."""
    cls = [0] * 256
    for lo in range(0, max(trans.shape[0], 1), BLOCK_ROWS):
        cols = np.ascontiguousarray(trans[lo : lo + BLOCK_ROWS].T)
        ids: dict[tuple[int, bytes], int] = {}
        cls = [ids.setdefault((c, col.tobytes()), len(ids)) for c, col in zip(cls, cols)]
        if len(ids) == 256:
            break
    return np.asarray(cls, dtype=np.int64)


def class_trie(trie: TokenTrie, cls: np.ndarray) -> TokenTrie:
    """``trie`` with each byte replaced by the smallest byte of its class in ``cls`` (int
    ``[256]``, see :func:`byte_classes`). Node numbering stays breadth-first with children runs
    sorted, tokens ending on one merged node become duplicates of its first token."""
    n_cls = int(cls.max()) + 1
    rep = np.full(n_cls, 255, dtype=np.int64)
    np.minimum.at(rep, cls, np.arange(256))
    new_of = np.zeros(trie.n_nodes, dtype=np.int64)  # old node -> merged node
    parents, bytes_ = [np.full(1, -1, np.int64)], [np.zeros(1, np.int64)]
    depth_start = [0, 1]
    total, prev_lo = 1, 0
    for lo, hi, parent, byte in trie.levels():
        key = (new_of[parent] - prev_lo) * n_cls + cls[byte]
        present = np.zeros((total - prev_lo) * n_cls, dtype=bool)  # NOTE: a dense rank, no sort
        present[key] = True
        distinct = np.flatnonzero(present)
        rank = np.cumsum(present) - 1
        new_of[lo:hi] = total + rank[key]
        parents.append(prev_lo + distinct // n_cls)
        bytes_.append(rep[distinct % n_cls])
        prev_lo = total
        total += distinct.size
        depth_start.append(total)
    # tokens per merged node: the first (by id) stays, the rest become its duplicates.
    tok_node = trie.token_node
    has = tok_node >= 0
    ids = np.flatnonzero(has)
    merged = new_of[tok_node[has]]
    order = np.lexsort((ids, merged))
    ids, merged = ids[order], merged[order]
    lead = np.ones(ids.size, dtype=bool)
    lead[1:] = merged[1:] != merged[:-1]
    node_token = np.full(total, -1, dtype=np.int32)
    node_token[merged[lead]] = ids[lead]
    head = np.maximum.accumulate(np.where(lead, np.arange(ids.size), 0))
    token_node = np.full(tok_node.size, -1, dtype=np.int32)
    token_node[ids] = merged
    return TokenTrie.from_structure(np.asarray(depth_start, dtype=np.int64), np.concatenate(parents),
                                    np.concatenate(bytes_), node_token, token_node,
                                    ids[~lead], ids[head][~lead])


class ClassTries:
    """Per-tokenizer LRU of class tries keyed by byte partition (:func:`byte_classes`).

    ``get(trie, trans)`` returns the class trie for the DFA ``trans`` (with a ``regions``
    attribute: its own :class:`~radixlm.grammar.token_index.RegionCache`, since region entries
    hold node ids), or ``trie`` itself when the classes would not make it at least
    ``1 - MAX_SHARE`` smaller. Thread-safe (compiles run in worker threads)."""

    def __init__(self, capacity: int = CACHE_SIZE) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[bytes, TokenTrie] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, trie: TokenTrie, trans: np.ndarray) -> TokenTrie:
        cls = byte_classes(trans)
        key = cls.astype(np.uint8).tobytes()
        with self._lock:
            got = self.entries.get(key)
            if got is not None:
                self.entries.move_to_end(key)
                return got
        got = class_trie(trie, cls)
        if got.n_nodes > MAX_SHARE * trie.n_nodes:
            got = trie
        else:
            got.regions = RegionCache()
        with self._lock:
            self.entries[key] = got
            if len(self.entries) > self.capacity:
                self.entries.popitem(last=False)
        return got
