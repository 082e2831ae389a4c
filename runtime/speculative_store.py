"""A bounded n-gram store over recent requests' tokens: speculative drafts from OTHER requests.

Prompt lookup (:class:`radixlm.runtime.speculative.NgramIndex`) only finds what the request itself
has seen. Requests of one task repeat structure that a single request has not produced yet: the
JSON keys and punctuation of an extraction format, a tool-call template, the first tokens after the
chat template's assistant header. SGLang's ``NGRAM`` algorithm keeps one trie over all requests'
recent tokens for this, and SuffixDecoding (Oliaro et al. 2024, arXiv:2411.04975) a suffix tree over
previous outputs with frequency counts; this store serves the same purpose with the index layout of
``NgramIndex``, which makes appending O(1) per token and a proposal O(window):

* a ring buffer of the last ``capacity`` tokens of finished requests (prompt + output, in order of
  finishing, each sequence followed by a separator that no request token equals, so no match or
  continuation crosses from one request into the next);
* hash chains over it: ``head`` maps each ``gram``-token key to the newest position where such a
  gram ends (and a token follows it), ``prev`` links each position to the previous occurrence of
  the same key. When the buffer wraps, the evicted position's ``head`` entry (if it is the newest
  of its key) is dropped, so ``head`` never holds more than ``capacity`` entries;
* a proposal walks at most :data:`MAX_CANDIDATES` occurrences of the request's last ``gram``
  tokens, newest first, keeps those with the longest match (up to ``max_window`` tokens of the
  request's suffix), and then extends the draft token by token with the continuation most of the
  newest :data:`MAX_VOTERS` of them agree on (ties: the newest), dropping those that disagree — the
  frequency estimate of SuffixDecoding and SGLang's ``PROB`` match type, restricted to the most
  recent occurrences.

Memory bound: three 8-byte arrays of ``capacity`` entries (tokens, chain links, keys) plus a dict of
at most ``min(capacity, distinct grams)`` entries (~100 bytes each; with ``gram == 1`` at most the
vocabulary size): about 24 MB + 4 MB for the default 1,000,000 tokens and a 49k vocabulary, and
never more than ~125 bytes per token of capacity.
"""

from __future__ import annotations

from array import array
from collections import deque
from typing import Sequence

SEP = -1  # separator between sequences (no token id equals it)
MAX_CANDIDATES = 32  # occurrences examined per proposal, newest first (as NgramIndex)
MAX_VOTERS = 8  # newest longest matches that vote on the continuation (the walk stops at as many
# matches of the longest possible length)


class NgramStore:
    """Recent requests' tokens with n-gram hash chains (see the module docstring).

    Args:
        capacity: most tokens held (separators included); the oldest are overwritten. >= 1.
        gram: tokens of the lookup key; a match is at least this long (the server passes
            ``speculative_ngram_min_match_window_size``). >= 1.
        max_window: longest suffix compared (``speculative_ngram_max_match_window_size``).
    Raises ``ValueError`` for out-of-range arguments.
    """

    def __init__(self, capacity: int, gram: int = 1, max_window: int = 12) -> None:
        if capacity < 1 or gram < 1 or max_window < gram:
            raise ValueError(f"need capacity >= 1 and 1 <= gram <= max_window, got {capacity}, {gram}, {max_window}")
        self.capacity, self.gram, self.max_window = capacity, gram, max_window
        self.clear()

    def clear(self) -> None:
        """Forget every token (pending ones included)."""
        cap = self.capacity
        self._toks = array("q", [SEP]) * cap  # slot p % cap: token at absolute position p
        self._prev = array("q", [-1]) * cap  # slot of an indexed end position: previous one of its key
        self._keys = array("q", [0]) * cap  # slot of an indexed end position: its key
        self._indexed = bytearray(cap)  # slot holds an indexed end position
        self._head: dict[int, int] = {}  # key -> newest indexed end position
        self._end = 0  # absolute position of the next token
        self._pending: deque[list] = deque()  # [tokens, next offset] waiting for feed budget
        self._pending_n = 0  # tokens in _pending not written yet (at most capacity)

    def __len__(self) -> int:
        """Tokens held (separators included), at most ``capacity``."""
        return min(self._end, self.capacity)

    @property
    def pending_tokens(self) -> int:
        """Queued tokens not written yet (never more than ``capacity`` plus one sequence)."""
        return self._pending_n

    def _key(self, seq: Sequence[int], end: int) -> int:
        """Key of the gram ``seq[end - gram + 1 : end + 1]`` (the token itself for 1-grams; else
        the tuple's hash: a collision only costs a wasted candidate, matches compare tokens)."""
        g = self.gram
        return seq[end] if g == 1 else hash(tuple(seq[end - g + 1 : end + 1]))

    # ------------------------------------------------------------------ writing
    def add(self, tokens: Sequence[int]) -> None:
        """Queue one finished sequence (prompt + output); :meth:`feed` writes it. Only its last
        ``capacity - 1`` tokens can be held; when the queue holds more than ``capacity`` tokens,
        the oldest sequences not yet started are dropped (they would be overwritten anyway)."""
        if len(tokens) <= self.gram or self.capacity < 2:
            return
        seq = list(tokens[-(self.capacity - 1) :])
        self._pending.append([seq, 0])
        self._pending_n += len(seq)
        pend = self._pending
        while self._pending_n > self.capacity and len(pend) > 1:
            i = 1 if pend[0][1] else 0  # NOTE: a sequence being written is finished first
            self._pending_n -= len(pend[i][0])
            del pend[i]

    def feed(self, budget: int | None = None) -> int:
        """Write up to ``budget`` queued tokens (all when None); returns how many were written.
        Each token costs O(1) (one chain link, at most one ``head`` entry dropped)."""
        done = 0
        while self._pending and (budget is None or done < budget):
            item = self._pending[0]
            seq, off = item
            stop = len(seq) if budget is None else min(len(seq), off + budget - done)
            self._write(seq, off, stop)
            done += stop - off
            self._pending_n -= stop - off
            item[1] = stop
            if stop == len(seq):
                self._pending.popleft()
                self._put(SEP)
        return done

    def _put(self, token: int) -> int:
        """Write one token at the end; evict the position it overwrites. Returns its slot."""
        cap, p = self.capacity, self._end
        slot = p % cap
        if p >= cap and self._indexed[slot]:
            key = self._keys[slot]
            if self._head.get(key) == p - cap:  # NOTE: the newest of its key: the whole chain is gone
                del self._head[key]
            self._indexed[slot] = 0
        self._toks[slot] = token
        self._end = p + 1
        return slot

    def _write(self, seq: list[int], start: int, stop: int) -> None:
        """Write ``seq[start:stop]``; the gram ending before each token becomes searchable."""
        g, cap, head, prev, keys, indexed = self.gram, self.capacity, self._head, self._prev, self._keys, self._indexed
        for i in range(start, stop):
            if i >= g:  # the gram seq[i-g:i] (all of this sequence) now has a successor
                end = self._end - 1
                key = self._key(seq, i - 1)
                s = end % cap
                prev[s] = head.get(key, -1)
                keys[s] = key
                indexed[s] = 1
                head[key] = end
            self._put(seq[i])

    # ------------------------------------------------------------------ reading
    def match(self, context: Sequence[int]) -> tuple[list[int], int]:
        """The end positions of the longest matches of ``context``'s suffix among the newest
        :data:`MAX_CANDIDATES` occurrences of its last ``gram`` tokens (newest first; the walk
        ends early at :data:`MAX_VOTERS` matches of ``min(len(context), max_window)`` tokens), and
        that length (``([], 0)`` when none matches ``gram`` tokens)."""
        g, cap, toks, prev = self.gram, self.capacity, self._toks, self._prev
        n = len(context)
        if n < g:
            return [], 0
        e = self._head.get(self._key(context, n - 1), -1)
        lo = max(0, self._end - cap)  # oldest live position
        best, cands, seen, top = 0, [], 0, min(n, self.max_window)
        while e >= lo and seen < MAX_CANDIDATES:
            seen += 1
            s, limit = e % cap, min(top, e - lo + 1)
            if best > 1 and (best > limit or toks[(e - best + 1) % cap] != context[n - best]):
                e = prev[s]  # NOTE: cannot reach the best length (zlib's first-mismatch test)
                continue
            length = 0
            if s >= limit:  # NOTE: no wrap-around within the window: plain indexing
                while length < limit and toks[s - length] == context[n - 1 - length]:
                    length += 1
            else:
                while length < limit and toks[(e - length) % cap] == context[n - 1 - length]:
                    length += 1
            if length >= g:
                if length > best:
                    best, cands = length, [e]
                elif length == best:
                    cands.append(e)
                    if length == top and len(cands) >= MAX_VOTERS:
                        break  # NOTE: enough full-length matches to vote
            e = prev[s]
        return cands, best

    def propose(self, context: Sequence[int], k: int) -> tuple[list[int], int]:
        """Up to ``k`` tokens following the longest matches of ``context``'s suffix, each the
        continuation most surviving candidates agree on (ties: the newest), and the match length.

        Args:
            context: the request's last tokens (at most ``max_window`` are compared).
            k: most draft tokens.
        Returns: ``(draft, match_len)``; ``([], 0)`` when nothing matches.
        Cost: at most ``MAX_CANDIDATES * max_window + MAX_VOTERS * k`` token comparisons.
        """
        if k <= 0:
            return [], 0
        cands, best = self.match(context)
        cands = cands[:MAX_VOTERS]
        cap, toks, end, draft = self.capacity, self._toks, self._end, []
        while cands and len(draft) < k:
            j = len(draft) + 1
            pairs = [(c, toks[(c + j) % cap]) for c in cands if c + j < end]
            votes = [t for _, t in pairs if t != SEP]
            if not votes:
                break
            t = votes[0]
            if 2 * votes.count(t) <= len(votes):  # NOTE: no majority for the newest: most frequent, newest on ties
                t = max(votes, key=votes.count)
            draft.append(t)
            cands = [c for c, u in pairs if u == t]
        return draft, (best if draft else 0)
