"""``stop_regex`` in the incremental detokenizer: the same cut as ``re.search`` over the whole
output after every token (SGLang's semantics), searched incrementally, and a pattern that
backtracks catastrophically ends its request with an error instead of stalling the process."""

from __future__ import annotations

import random
import re
import time
from types import SimpleNamespace

import pytest

from radixlm.runtime.detokenizer import STOP_REGEX_BUDGET_S, IncrementalDetokenizer

PATTERNS = [r"\d\d", r"ab|xabc", r"xab|a", r"(?<=a)b", r"^x", r"a.*?b", r"\bend\b", r"b{2,3}x",
            r"(?:a|1)+\n", r"[^ab]{4}", r"x$", r"(a|aa)+b"]


class CharTokenizer:
    """Token id = code point (a slow, non-fast tokenizer: the detokenizer's generic path)."""

    is_fast = False

    def decode(self, ids, skip_special_tokens=True, spaces_between_special_tokens=True):
        return "".join(map(chr, ids))


def _run(text: str, patterns: list[str]) -> tuple[str, str | None]:
    d = IncrementalDetokenizer(CharTokenizer(), [ord(" ")], stop_regex=patterns)
    for ch in text:
        d.append(ord(ch))
        if d.matched_stop is not None:
            break
    d.flush()
    assert d.stop_error is None
    return d.text, d.matched_stop


def _reference(text: str, patterns: list[str]) -> tuple[str, str | None]:
    for end in range(1, len(text) + 1):
        hits = [(m.start(), p) for p in patterns if (m := re.search(p, text[:end]))]
        if hits:
            pos, p = min(hits)
            return text[:pos], p
    return text, None


@pytest.mark.parametrize("seed", range(6))
def test_incremental_search_cuts_where_re_search_does(seed):
    rng = random.Random(seed)
    for _ in range(150):
        text = "".join(rng.choice("ab1x \nend") for _ in range(rng.randrange(1, 40)))
        patterns = rng.sample(PATTERNS, rng.randrange(1, 3))
        assert _run(text, patterns) == _reference(text, patterns), (text, patterns)


def test_catastrophic_pattern_ends_with_an_error_in_bounded_time():
    d = IncrementalDetokenizer(CharTokenizer(), [ord(" ")], stop_regex=[r"(a|aa)+b"])
    t0 = time.perf_counter()
    for ch in "a" * 60 + "c" + "a" * 5:
        d.append(ord(ch))
    elapsed = time.perf_counter() - t0
    assert d.matched_stop is None and d.stop_error is not None and "stop_regex" in d.stop_error
    assert elapsed < STOP_REGEX_BUDGET_S + 2.0
    assert d.text.startswith("a" * 60)  # searching stopped; the text is still kept


def test_stop_error_finishes_the_request_with_a_400():
    from radixlm.runtime.output_processor import OutputProcessor

    detok = SimpleNamespace(matched_stop=None, stop_error="stop_regex '(a|aa)+b' took too long")
    req = SimpleNamespace(sampling_params=SimpleNamespace(stop_token_ids=[], ignore_eos=True, max_new_tokens=50),
                          detok=detok, grammar_matcher=None, output_ids=[5], origin_input_ids=[1])
    proc = SimpleNamespace(eos=set(), context_len=100)
    out = OutputProcessor.finish_reason(proc, req, 5)
    assert out == {"type": "abort", "status_code": 400, "message": detok.stop_error}
