"""Regex -> byte DFA: feature table against Python's ``re`` (and interegular where it parses),
UTF-8 at the byte level, search semantics, unsupported features (issue 4, deliverables 1-2)."""

from __future__ import annotations

import random
import re

import pytest

from radixlm.grammar import GrammarError
from radixlm.grammar.automaton import regex_to_dfa
from radixlm.grammar.dfa_ops import exactly_one, product
from radixlm.grammar.utf8 import utf8_sequences

ALPHABET = list("abcxyzABC019-._@ \"\\\n") + ["é", "€", "中", "😀"]

# (pattern, strings that must match, strings that must not) - checked against re.fullmatch too.
FEATURES = [
    ("classes", r"[a-c]+[^a-c\d]", ["abx", "c-"], ["ab1", "d"]),
    ("shorthand", r"\d\w\s\D\W\S", ["1a x!z"], ["a1 x!z"]),
    ("alternation", r"cat|dog|(bird|fish)s?", ["cat", "fishs", "bird"], ["cats", ""]),
    ("repetition bounds", r"a{2,3}b{2}c{,1}x{1,}", ["aabbx", "aaabbcxx"], ["abbx", "aaaabbx", "aabbccx"]),
    ("optional / star / plus", r"ab?c*d+", ["ad", "abccdd"], ["abd?", "abb"]),
    ("lazy quantifiers", r"a+?b*?", ["aab"], ["b"]),
    ("groups", r"(?:ab)+(?P<x>c)(?<y>d)?", ["ababc", "abcd"], ["abab"]),
    ("anchors", r"^abc$", ["abc"], ["abcd", "xabc"]),
    ("anchored alternatives", r"^a$|^b", ["a", "b"], ["ab"]),
    ("escapes", r"\.\*\+\?\(\)\[\]\{\}\|\\\/\-", [".*+?()[]{}|\\/-"], ["x"]),
    ("hex / unicode escapes", r"\x41\u00e9\u{1F600}", ["Aé😀"], ["Ae😀"]),
    ("dot", r"a.c", ["abc", "a😀c", "aéc"], ["a\nc", "ac"]),
    ("unicode class", r"[é-ê中]+", ["éê中", "中"], ["e", "è", "ë"]),
    ("case-insensitive", r"(?i)hello", ["HeLLo", "hello"], ["helo"]),
    ("scoped flag", r"a(?i:bc)d", ["aBCd"], ["ABCd", "aBCD"]),
    ("dotall", r"(?s)a.c", ["a\nc"], ["ac"]),
    ("class with escapes", r"[\]\-\\^x]+", ["]-\\^x"], ["a"]),
    ("empty alternative", r"a(|b)c", ["ac", "abc"], ["abbc"]),
    ("nested repetition", r"((ab){1,2}c){2}", ["abcababc"], ["abc", "ababababc"]),
]


def _strings(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 7))) for _ in range(n)]


@pytest.mark.parametrize("name,pattern,good,bad", FEATURES, ids=[f[0] for f in FEATURES])
def test_regex_features(name: str, pattern: str, good: list[str], bad: list[str]) -> None:
    dfa = regex_to_dfa(pattern)
    for s in good:
        assert dfa.matches(s), (pattern, s)
    for s in bad:
        assert not dfa.matches(s), (pattern, s)
    py = pattern.replace(r"\u{1F600}", "\U0001F600")
    if "\\u{" not in pattern:
        py = re.sub(r"\(\?<(\w+)>", r"(?P<\1>", pattern)
        flags = re.ASCII if any(c in pattern for c in ("\\w", "\\d", "\\s", "\\W", "\\D", "\\S")) else 0
        rx = re.compile(py, flags)
        for s in good + bad + _strings(random.Random(name), 400):
            assert dfa.matches(s) == bool(rx.fullmatch(s)), (pattern, s)


def test_against_interegular() -> None:
    interegular = pytest.importorskip("interegular")
    rng = random.Random(0)
    for pattern in [r"[a-c]{1,3}x?", r"(ab|c)*[0-9]", r"a[^b]c", r"x+y*z?"]:
        fsm = interegular.parse_pattern(pattern).to_fsm()
        dfa = regex_to_dfa(pattern)
        for s in _strings(rng, 300):
            assert dfa.matches(s) == fsm.accepts(s), (pattern, s)


def test_search_semantics() -> None:
    dfa = regex_to_dfa("ab", search=True)
    assert dfa.matches("xxabyy") and not dfa.matches("a b")
    assert regex_to_dfa("^ab", search=True).matches("abz")
    assert not regex_to_dfa("^ab", search=True).matches("zab")
    assert not regex_to_dfa("ab$", search=True).matches("abz")


def test_search_alternatives_share_the_unanchored_ends() -> None:
    """``a|b|c`` under search semantics: alternatives anchored alike share one prefix / suffix, so
    the DFA does not track which of them matched (it grew as 2^n; 17 alternatives timed out)."""
    alts = [f"INTERVAL_{s}" for s in ("TICK", "M1", "M2", "M5", "M10", "H1", "H4", "D1", "W1", "MN1")]
    one = regex_to_dfa(alts[0], search=True).n_states
    dfa = regex_to_dfa("|".join(alts), search=True)
    assert dfa.n_states <= 4 * one
    mixed = "^ab|cd$|ef|^gh$|ij"
    d2 = regex_to_dfa(mixed, search=True)
    rng = random.Random(3)
    texts = ["".join(rng.choice("abcdefghijz") for _ in range(rng.randrange(0, 7))) for _ in range(2000)]
    for text in texts + ["xINTERVAL_M5y", "INTERVAL_M", "gh", "xgh", "ab", "zab", "cd", "cdz"]:
        assert d2.matches(text) == bool(re.search(mixed, text)), text
        assert dfa.matches(text) == bool(re.search("|".join(alts), text)), text


def test_bytes_of_multibyte_characters() -> None:
    dfa = regex_to_dfa("é€")
    data = "é€".encode()
    state = dfa.start
    for i, b in enumerate(data):  # every byte prefix, also mid-character, is a live state
        state = dfa.step(state, bytes([b]))
        assert state != 0, i
    assert dfa.accept[state]
    assert dfa.step(dfa.start, b"\xc3\xa8") == 0  # è: same lead byte, other continuation


def test_utf8_ranges_exact() -> None:
    rng = random.Random(1)
    for _ in range(200):
        lo = rng.randrange(0, 0x10FFFF)
        hi = min(0x10FFFF, lo + rng.choice([0, 5, 300, 70000]))
        seqs = utf8_sequences(lo, hi)
        for cp in (lo, hi, rng.randint(lo, hi), lo - 1, hi + 1):
            if not 0 <= cp <= 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
                continue
            enc = chr(cp).encode()
            hit = any(len(s) == len(enc) and all(a <= x <= b for (a, b), x in zip(s, enc)) for s in seqs)
            assert hit == (lo <= cp <= hi), (lo, hi, cp)


@pytest.mark.parametrize("pattern,feature", [
    (r"(a)\1", "backreference"), (r"\Aword", "escape \\A"),  # NOTE: lookaround, \b: regex_lookaround
    (r"\p{Script=Greek}", "unicode property"), (r"a^*b", "quantified anchor"), (r"a++", "possessive"),
])
def test_unsupported_features_are_named(pattern: str, feature: str) -> None:
    with pytest.raises(GrammarError, match=re.escape(feature)):
        regex_to_dfa(pattern)


def test_invalid_regex() -> None:
    for bad in ["(ab", "ab)", "[a-", "a{3,1}", "*a"]:
        with pytest.raises(GrammarError):
            regex_to_dfa(bad)


def test_products() -> None:
    a, b = regex_to_dfa("[a-z]+"), regex_to_dfa(".{2,3}")
    both, diff = product(a, b, "and"), product(a, b, "diff")
    assert both.matches("ab") and not both.matches("abcd") and not both.matches("a1")
    assert diff.matches("abcd") and not diff.matches("ab")
    one = exactly_one([regex_to_dfa("a+"), regex_to_dfa("aa|b")])
    assert [one.matches(s) for s in ["a", "aa", "aaa", "b", "c"]] == [True, False, True, True, False]


def test_unicode_categories() -> None:
    d = regex_to_dfa(r"\p{Lu}\p{Letter}*\P{N}")
    assert [d.matches(x) for x in ["Ébc!", "abc!", "Éb1", "Zx", "Ωω."]] == [True, False, False, True, True]


def test_work_budget_is_deterministic_and_clean() -> None:
    """The compile budget counts work, not time: a tiny budget fails with a clean error naming
    the step, every time; nested budgets share the outer counters; outside a budget no check
    fails; a budget large enough compiles the same automaton (issue 12)."""
    from radixlm.grammar import automaton
    from radixlm.grammar.budget import budget_spent, check_budget, compile_budget

    pattern = r"[a-z]{0,40}@[a-z]{2,30}\.(com|org|net)"
    errors = []
    for _ in range(2):
        automaton._MEMO.clear()  # NOTE: a memoized automaton costs no work
        with pytest.raises(GrammarError) as e, compile_budget(units=100, seconds=60):
            regex_to_dfa(pattern)
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "work units" in errors[0] and "automaton" in errors[0]
    automaton._MEMO.clear()
    with compile_budget(units=10**7, seconds=60):
        with compile_budget(units=1):  # nested: the outer budget holds
            dfa = regex_to_dfa(pattern)
        assert budget_spent() > 100
    assert dfa.matches("ab@cd.org") and not dfa.matches("ab@c.org")
    check_budget("outside any budget", 10**9)  # a no-op


def test_automata_are_memoized_and_shared() -> None:
    """The same AST compiles once per process; the shared DFA is equal to a fresh build."""
    from radixlm.grammar import automaton
    from radixlm.grammar.automaton import dfa_from_ast, regex_ast

    node = regex_ast(r"(ab|cd)*e{1,3}")
    first = dfa_from_ast(node)
    assert dfa_from_ast(regex_ast(r"(ab|cd)*e{1,3}")) is first
    automaton._MEMO.clear()
    fresh = dfa_from_ast(node)
    assert fresh is not first and (fresh.trans == first.trans).all() and (fresh.accept == first.accept).all()
    for text, ok in [("abcde", True), ("eeee", False), ("abe", True), ("ace", False)]:
        assert first.matches(text) is ok
