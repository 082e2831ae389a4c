"""Incremental, UTF-8-safe detokenization with stop-string detection.

Uses the prefix/read offset scheme of HF text-generation-inference and vLLM: decode a short window
of the last tokens and emit only text past what the window decoded to before, holding back output
while it ends in an incomplete UTF-8 character (U+FFFD).
"""

from __future__ import annotations

import time
from typing import Sequence

import regex

# A stop_regex search may backtrack catastrophically (``(a+)+b`` over "aaaa..."): each search
# gets at most STOP_REGEX_SEARCH_S and a request STOP_REGEX_BUDGET_S in all; past either the
# request ends with an error (:attr:`IncrementalDetokenizer.stop_error`) instead of stalling the
# process that detokenizes for every request.
STOP_REGEX_SEARCH_S = 0.05
STOP_REGEX_BUDGET_S = 1.0


class IncrementalDetokenizer:
    """Accumulates the text of one request's generated tokens.

    Args:
        tokenizer: an HF tokenizer.
        prompt_ids: the prompt (its last tokens seed the window so the first output word is
            decoded with the right leading space).
        skip_special_tokens, spaces_between_special_tokens: passed to ``tokenizer.decode``.
        stop: stop strings; when one appears, :attr:`matched_stop` is set and the text is cut
            before it.
        stop_regex: patterns searched in the decoded output (``re.search`` semantics, through the
            ``regex`` module); the first match ends the text like a stop string, and
            :attr:`matched_stop` is the pattern (SGLang). The search is incremental (a partial
            match tells where a later match may start) and time-bounded
            (``STOP_REGEX_SEARCH_S`` per search, ``STOP_REGEX_BUDGET_S`` per request): past the
            bound :attr:`stop_error` says why and nothing more is searched.
        lazy: without stop strings or patterns, only record the ids and decode when :attr:`text`
            is read (the server's scheduler never reads it: the detokenizer process makes the
            text); :meth:`append` then returns "". Default False.
        source: lazy only: the list the caller appends the generated ids to (the request's
            ``output_ids``; those already in it at construction are not part of the text): it is
            read when :attr:`text` is, and :meth:`append` is then a no-op, so a decode step
            appends each id once (the caller must append exactly the ids it would pass to
            :meth:`append`).
        single_cache: a dict shared by the detokenizers of one tokenizer (e.g. one per scheduler
            or detokenizer process) where the texts of one-token windows are kept (decoding is a
            pure function of the ids; the prefix window is usually the last emitted token).

    Decoding goes straight to the Rust ``tokenizers`` backend of a fast tokenizer (the same
    string as ``tokenizer.decode``, at ~40% of its cost) unless the tokenizer cleans up
    tokenization spaces, which only the HF wrapper does.
    """

    _WINDOW = 5  # prompt tokens used as decoding context

    def __init__(
        self,
        tokenizer,
        prompt_ids: Sequence[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        stop: Sequence[str] = (),
        stop_regex: Sequence[str] = (),
        lazy: bool = False,
        single_cache: dict | None = None,
        source: list[int] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = list(prompt_ids[-self._WINDOW :])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self._text = ""
        self.stop = list(stop)
        self.matched_stop: str | None = None
        self.stop_regex = [regex.compile(p) for p in stop_regex or ()]
        self._regex_from = [0] * len(self.stop_regex)  # NOTE: no match of pattern i starts earlier
        self._regex_budget = STOP_REGEX_BUDGET_S
        self.stop_error: str | None = None
        self._no_stop = not (self.stop or self.stop_regex)  # _add_text only appends
        # NOTE: lazy: ids not decoded yet are _pending[_seen:]; _pending is `source` when given
        lazy = lazy and not (self.stop or self.stop_regex)
        self._follows = lazy and source is not None
        self._pending: list[int] | None = (source if self._follows else []) if lazy else None
        self._seen = len(source) if self._follows else 0
        self._flush_later = False
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None and getattr(tokenizer, "is_fast", False) and not getattr(
                tokenizer, "clean_up_tokenization_spaces", False):
            self._decode_fn = lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
            self._decode_many = lambda seqs: backend.decode_batch(seqs, skip_special_tokens=skip_special_tokens)
            self._batch_key: tuple = (id(backend), skip_special_tokens)
        else:
            self._decode_fn = lambda ids: tokenizer.decode(
                ids, skip_special_tokens=skip_special_tokens, spaces_between_special_tokens=spaces_between_special_tokens)
            self._decode_many = lambda seqs: [self._decode_fn(ids) for ids in seqs]
            self._batch_key = (id(tokenizer), skip_special_tokens, spaces_between_special_tokens)
        # NOTE: texts of one-token windows (the usual prefix window: the last emitted token)
        self._single: dict | None = None if single_cache is None else single_cache.setdefault(self._batch_key, {})

    @property
    def text(self) -> str:
        """The final text so far (cut before a matched stop string)."""
        pending = self._pending
        if pending is not None and len(pending) > self._seen:
            new = pending[self._seen :]
            if self._follows:
                self._seen = len(pending)
            else:
                pending.clear()
            for tid in new:
                self._step(tid)
        if self._flush_later:
            self._flush_later = False
            self._flush()
        return self._text

    def _decode(self, ids: Sequence[int]) -> str:
        return self._decode_fn(ids)

    def append(self, token_id: int) -> str:
        """Add one generated token; returns the newly final text (may be empty; always empty
        when lazy)."""
        if self._pending is not None:
            if not self._follows:
                self._pending.append(token_id)
            return ""
        return self._step(token_id)

    def _step(self, token_id: int) -> str:
        prefix_ids, full_ids = self._windows(token_id)
        single = self._single
        if single is not None and len(prefix_ids) == 1:
            prefix = single.get(prefix_ids[0])
            if prefix is None:
                prefix = single[prefix_ids[0]] = self._decode(prefix_ids)
        else:
            prefix = self._decode(prefix_ids)
        return self._advance(prefix, self._decode(full_ids))

    def _windows(self, token_id: int) -> tuple[list[int], list[int]]:
        """Add one id (eager mode); returns the two windows :meth:`_advance` needs decoded."""
        ids = self.ids
        ids.append(token_id)
        return ids[self.prefix_offset : self.read_offset], ids[self.prefix_offset :]

    def _advance(self, prefix: str, full: str) -> str:
        """Apply the decoded windows of :meth:`_windows`; returns the newly final text."""
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return self._add_text(full[len(prefix) :])
        return ""

    def _add_text(self, new: str) -> str:
        if self._no_stop:
            self._text += new
            return new
        if self.matched_stop is not None:
            return ""
        old_len = len(self._text)
        self._text += new
        if self.stop:
            # NOTE: a stop string may straddle the previous chunk; search from far enough back.
            start = max(0, old_len - max(len(s) for s in self.stop) + 1)
            hits = [(self._text.find(s, start), s) for s in self.stop]
            hits = [(pos, s) for pos, s in hits if pos >= 0]
            if hits:
                pos, s = min(hits)
                self.matched_stop = s
                self._text = self._text[:pos]
                return self._text[old_len:] if pos > old_len else ""
        if self.stop_regex and self.stop_error is None:
            hits = self._search_stop_regex()
            if hits:
                pos, pattern = min(hits)
                self.matched_stop = pattern
                self._text = self._text[:pos]
                return self._text[old_len:] if pos > old_len else ""
        return new

    def _search_stop_regex(self) -> list[tuple[int, str]]:
        """``(start, pattern)`` of each pattern's leftmost match in the text (none: ``[]``).

        One partial search per pattern from where a match may still start: a full match found is
        the leftmost one (as ``re.search``); else a partial match (the text ends inside it) or
        none moves that start forward, so a long output is not searched again from its start.
        Sets :attr:`stop_error` when a search runs past its time bound."""
        hits = []
        t0 = time.perf_counter()
        for i, rx in enumerate(self.stop_regex):
            try:
                m = rx.search(self._text, self._regex_from[i], partial=True,
                              timeout=max(min(STOP_REGEX_SEARCH_S, self._regex_budget), 1e-4))
            except TimeoutError:
                self.stop_error = (f"stop_regex {rx.pattern!r} took too long to search the output "
                                   f"(over {STOP_REGEX_SEARCH_S}s for one search or {STOP_REGEX_BUDGET_S}s in all)")
                return []
            if m is None:
                self._regex_from[i] = len(self._text)
            elif m.partial:
                self._regex_from[i] = m.start()
            else:
                hits.append((m.start(), rx.pattern))
        self._regex_budget -= time.perf_counter() - t0
        if self._regex_budget <= 0 and not hits:
            self.stop_error = f"stop_regex searches took over {STOP_REGEX_BUDGET_S}s for this request"
        return hits

    def flush(self) -> str:
        """At the end: emit any held-back bytes (an incomplete character decodes as U+FFFD).
        A lazy detokenizer only notes it (and returns ""): reading :attr:`text` completes it."""
        if self._pending is not None:
            self._flush_later = True
            return ""
        return self._flush()

    def _flush(self) -> str:
        if self.read_offset < len(self.ids):
            prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
            full = self._decode(self.ids[self.prefix_offset :])
            self.read_offset = len(self.ids)
            return self._add_text(full[len(prefix) :])
        return ""


def append_batch(detoks: Sequence[IncrementalDetokenizer | None], new_ids: Sequence[Sequence[int]]) -> dict[int, Exception]:
    """``detoks[i].append(t)`` for every ``t`` of ``new_ids[i]``, in order, with the same result,
    but decoding the windows of all requests in one ``decode_batch`` call per round (round ``k``
    takes every request's ``k``-th new id) and per tokenizer setting, instead of two ``decode``
    calls per request and token (and one-token prefix windows from the detokenizer's
    ``single_cache``, when it has one). Returns ``{i: error}`` for the requests whose decoding
    raised (their detokenizer is then unusable; the others are unaffected). A ``None``
    detokenizer must come with no ids."""
    failed: dict[int, Exception] = {}
    work = [(i, d, ids) for i, (d, ids) in enumerate(zip(detoks, new_ids)) if ids]
    k = 0
    while work:
        groups: dict[tuple, tuple[list, list]] = {}
        later = []
        for item in work:
            i, d, ids = item
            if d._pending is not None:  # lazy: only record the ids
                if not d._follows:
                    d._pending.extend(ids)
                continue
            g = groups.get(d._batch_key)
            if g is None:
                g = groups[d._batch_key] = ([], [])
            members, windows = g
            window = d.ids
            window.append(ids[k])
            po, ro = d.prefix_offset, d.read_offset
            single = d._single
            if single is not None and ro - po == 1:
                tid = window[po]
                prefix = single.get(tid)
                if prefix is None:  # NOTE: decoded with the others, then remembered
                    members.append((i, d, len(windows), tid))
                    windows.append(window[po:ro])
                else:
                    members.append((i, d, len(windows), prefix))
            else:
                members.append((i, d, len(windows), None))
                windows.append(window[po:ro])
            windows.append(window[po:])
            if len(ids) > k + 1:
                later.append(item)
        for members, windows in groups.values():
            try:
                texts = members[0][1]._decode_many(windows)
            except Exception:  # NOTE: find who: decode them one by one
                texts = None
            for i, d, w, prefix in members:
                try:
                    if prefix.__class__ is not str:  # NOTE: its prefix window was decoded here
                        text = d._decode(windows[w]) if texts is None else texts[w]
                        if prefix is not None and texts is not None:
                            d._single[prefix] = text
                        prefix, w = text, w + 1
                    d._advance(prefix, d._decode(windows[w]) if texts is None else texts[w])
                except Exception as e:
                    failed[i] = e
        work = [item for item in later if item[0] not in failed]
        k += 1
    return failed
