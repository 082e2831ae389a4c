"""Draft proposal for speculative decoding: n-gram (prompt-lookup) drafts and grammar-forced drafts.

Prompt-lookup decoding (Saxena 2023; vLLM's ``ngram`` proposer, SGLang's ``NGRAM`` algorithm)
proposes the tokens that followed the most recent earlier occurrence of the request's last ``n``
tokens, trying ``n`` from ``max_match_window_size`` down to ``min_match_window_size``. Extraction
and summarize-with-quotes programs copy spans of their input, so such drafts are often right and
cost nothing to propose; the model verifies them all in one forward
(:mod:`radixlm.runtime.speculative_verify`).

The global store of other requests' tokens (:mod:`radixlm.runtime.speculative_store`; SGLang's
NGRAM trie, SuffixDecoding's global tree) proposes too, and its draft is used when the request's
own history gives none or matched a shorter suffix: it knows the structure that requests of the
same task repeat (JSON keys, punctuation, templates) before this request has produced any of it.

For a constrained request the grammar also proposes: the string it forces from the current state
(jump-forward, SGLang paper §4.3) is tokenized and used when it is longer than the n-gram draft,
and any draft is cut at the first token the grammar forbids.

The index per request is incremental (zlib-style hash chains): ``head`` maps each
``min_match_window_size``-gram to the latest position where it ends, ``prev`` links each position
to the previous occurrence of the same gram. Appending a token costs O(1); a proposal walks at most
:data:`MAX_CANDIDATES` occurrences, newest first, comparing at most ``max_match_window_size``
tokens each, so a step never costs O(len).
"""

from __future__ import annotations

from typing import Any, Sequence

MAX_CANDIDATES = 32  # earlier occurrences examined per proposal (zlib's "max_chain")


class NgramIndex:
    """Incremental prompt-lookup index over one request's tokens (prompt followed by output).

    Args:
        min_window: shortest suffix that may match (SGLang ``speculative_ngram_min_match_window_size``,
            vLLM ``prompt_lookup_min``); >= 1.
        max_window: longest suffix compared (``speculative_ngram_max_match_window_size``,
            ``prompt_lookup_max``); >= ``min_window``.
    Raises ``ValueError`` for windows out of range.
    """

    def __init__(self, min_window: int = 1, max_window: int = 12) -> None:
        if min_window < 1 or max_window < min_window:
            raise ValueError(f"need 1 <= min_window <= max_window, got {min_window}, {max_window}")
        self.min_window = min_window
        self.max_window = max_window
        self.tokens: list[int] = []
        self._head: dict[tuple[int, ...], int] = {}  # gram -> last end position with a successor
        self._prev: list[int] = []  # end position -> previous end position of the same gram, or -1

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, new_tokens: Sequence[int]) -> None:
        """Append tokens. The gram ending just before each new token becomes searchable (a gram is
        indexed once a token follows it, so the current suffix never matches itself)."""
        toks, m, head, prev = self.tokens, self.min_window, self._head, self._prev
        for t in new_tokens:
            end = len(toks) - 1  # the gram ending here now gains a successor
            if end >= m - 1:
                gram = tuple(toks[end - m + 1 : end + 1])
                prev[end] = head.get(gram, -1)
                head[gram] = end
            toks.append(int(t))
            prev.append(-1)  # NOTE: set once a successor arrives

    def sync(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        """Bring the index up to ``prompt + output`` (appends only the new tail; rebuilds when the
        sequence is shorter than what was indexed, e.g. after a reset)."""
        total = len(prompt) + len(output)
        if total < len(self.tokens):
            self.__init__(self.min_window, self.max_window)
        have = len(self.tokens)
        if have < len(prompt):
            self.extend(prompt[have:])
            self.extend(output)
        elif have < total:
            self.extend(output[have - len(prompt) :])

    def match(self) -> tuple[int, int]:
        """``(start of the continuation, matched length)`` of the best earlier occurrence of the
        current suffix: the longest match up to ``max_window`` tokens, newest on ties; ``(-1, 0)``
        when the last ``min_window`` tokens never occurred before."""
        toks, m = self.tokens, self.min_window
        n = len(toks)
        if n <= m:
            return -1, 0
        end = self._head.get(tuple(toks[n - m :]) if m > 1 else (toks[-1],), -1)
        best_end, best_len, seen, prev, top = -1, 0, 0, self._prev, self.max_window
        while end >= 0 and seen < MAX_CANDIDATES:
            limit = min(top, end + 1)
            # NOTE: only a longer match replaces the best: reject on its first token (zlib's trick)
            if best_len and (best_len >= limit or toks[end - best_len] != toks[n - 1 - best_len]):
                end = prev[end]
                seen += 1
                continue
            length = m
            while length < limit and toks[end - length] == toks[n - 1 - length]:
                length += 1
            if length > best_len:
                best_end, best_len = end, length
                if length == top:
                    break
            end = prev[end]
            seen += 1
        return (best_end + 1, best_len) if best_end >= 0 else (-1, 0)

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens that followed the best earlier occurrence of the suffix ([] if none)."""
        if k <= 0:
            return []
        start, _ = self.match()
        return self.tokens[start : start + k] if start >= 0 else []


def grammar_cut(matcher: Any, draft: Sequence[int]) -> list[int]:
    """The longest prefix of ``draft`` that ``matcher`` accepts token by token; the matcher is
    rolled back to where it was. ``matcher`` follows the GrammarMatcher API (``accept_token``,
    ``rollback``)."""
    ok = 0
    for t in draft:
        if not matcher.accept_token(t):
            break
        ok += 1
    if ok:
        matcher.rollback(ok)
    return list(draft[:ok])


def forced_draft(matcher: Any, tokenizer: Any, k: int) -> list[int]:
    """Up to ``k`` tokens of the string the grammar forces from the current state
    (``find_jump_forward_string``), tokenized with ``tokenizer`` and cut where the grammar stops
    accepting them token by token ([] when nothing is forced)."""
    if k <= 0 or tokenizer is None:
        return []
    text = matcher.find_jump_forward_string()
    if not text:
        return []
    ids = tokenizer.encode(text, add_special_tokens=False)[:k]
    return grammar_cut(matcher, ids)


def propose(index: NgramIndex, k: int, matcher: Any = None, tokenizer: Any = None, store: Any = None) -> list[int]:
    """The draft for one request (see :func:`propose_with_source`)."""
    return propose_with_source(index, k, matcher, tokenizer, store)[0]


def propose_with_source(index: NgramIndex, k: int, matcher: Any = None, tokenizer: Any = None,
                        store: Any = None) -> tuple[list[int], str]:
    """The draft for one request and where it came from: the request's own n-gram draft, or the
    global store's (drafts from other requests, :mod:`radixlm.runtime.speculative_store`) when
    that matched a longer suffix of the request (own match shorter than ``max_window``) or the
    own draft is empty; for a constrained request (``matcher`` not None) both are first cut at the
    first token the grammar forbids, and the grammar-forced draft wins when longer.

    Choosing by match length rather than by draft length: on the extraction benchmark's outputs
    (offline replay, k = 8) passes per token were 0.318 by match length vs 0.323 taking the store
    only when the own draft is shorter; on extract_json 0.398 vs 0.442 (own drafts after a 1-token
    match are mostly wrong, store drafts after a 1-token match too).

    Args:
        index: the request's :class:`NgramIndex`, already synced with its tokens.
        k: most draft tokens (``speculative_num_draft_tokens``).
        matcher: the request's grammar matcher, or None.
        tokenizer: HF tokenizer for forced strings (needed only with a matcher).
        store: an ``NgramStore`` of other requests' tokens, or None (off).
    Returns: ``(draft, source)``: at most ``k`` token ids (possibly empty) and ``"own"``,
    ``"store"``, ``"grammar"`` or ``""`` (no draft).
    """
    if matcher is not None and matcher.is_terminated():
        return [], ""
    start, own_len = index.match()
    draft, source = (index.tokens[start : start + k] if start >= 0 and k > 0 else []), "own"
    if matcher is not None:
        draft = grammar_cut(matcher, draft)
    if store is not None and own_len < index.max_window and k > 0:
        other, other_len = store.propose(index.tokens[-index.max_window :], k)
        if matcher is not None:
            other = grammar_cut(matcher, other)
        if other and (other_len > own_len or not draft):  # NOTE: the longer context predicts better
            draft, source = other, "store"
    if matcher is not None:
        forced = forced_draft(matcher, tokenizer, k)
        if len(forced) > len(draft):
            draft, source = forced, "grammar"
    return draft, (source if draft else "")
