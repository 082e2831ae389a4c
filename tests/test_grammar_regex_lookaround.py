"""Lookaround, ``\\b`` / ``\\B`` and inner anchors (``grammar/regex_lookaround.py``), checked
against Python ``re`` (ASCII mode: ECMA-262 ``\\w`` / ``\\b`` without the ``u`` flag; ``$`` read
as ``\\Z``, ECMA's end of input): the byte DFAs for search (JSON-Schema ``pattern``) and full
match (``regex`` constraints) on many strings per pattern, the JSON-string encodings of the same
languages, ``compile_regex`` and JSON schemas (``pattern``, ``patternProperties`` and
``propertyNames`` keys) walked token by token with every step allowed by the bitmask, and the
cases that stay errors."""

from __future__ import annotations

import json
import random
import re

import pytest

from radixlm.grammar import GrammarError
from radixlm.grammar.automaton import regex_to_dfa
from radixlm.grammar.budget import compile_budget
from radixlm.grammar.json_scalars import content_dfa
from radixlm.grammar.maskbench import load_compiler, load_tokenizer, run_instance, table_vocabularies
from radixlm.grammar.testing import schema_table_tests
from radixlm.grammar.bitmask import allocate_token_bitmask

# Real SchemaStore patterns, then constructions of every kind (nested, quantified, lookbehind,
# \B, anchors inside groups).
PATTERNS = [
    r'^(?!.*(\{LoggingBlock\}|["<>*?:/\\])).*\.[bB][lL][fF]$',
    r"^(?!interactive|name|style).+$",
    r"^(?!pattern$).*$",
    r"^(?!@@)[@a-zA-Z0-9_-]+$",
    r"^(?!\.)(?!\./).+",
    r"^(?!\.{1,2}$)(?!.*\/)[a-zA-Z0-9\-\._]+$",
    r"^(?!.*\bnative\b)[a-zA-Z][a-zA-Z0-9_]*(\.[a-zA-Z][a-zA-Z0-9_]*)+$",
    r"^(?=[A-Z])[a-zA-Z0-9.,;()\s]*[^.,;!?: \W]$",
    r"\b\d{3}\b",
    r"^https?:\/\/(www\.)?[-a-zA-Z0-9@:%._\+~#=]{1,8}\.[a-zA-Z0-9()]{1,6}\b([-a-zA-Z0-9()@:%_\+.~#?&//=]*)$",
    r"^(?![ \t\n]*\(default(.*)\))[\s\S]*",
    r"^(?!(?:meta|local)$).*$",
    r"^(?!bundle::)(?!with$).*",
    r"^(?!^lucene\.|builtin\.).*",
    r"((?!ab).)*c",  # under a quantifier
    r"(?:a(?=b)|b(?!a))+",
    r"x(?<=[ax]x)y",  # lookbehind
    r"(?<!a)b+(?<=bb)",
    r"(?<=(?<!c)a)b",  # nested lookbehind
    r"(?=(?!b)\w)..",  # nested lookahead
    r"\Bo+\B",
    r"a\b|\bb",
    r"(^|,)a(,|$)",  # inner anchors
    r"(?=.*\d)(?=.*[a-z])[a-z\d]{3,5}",  # password-style
    r"(?!)a|b",  # an assertion that never holds
    r"(?i)(?!abc)[a-c]{3}",
]
EDGES = ["", "a", "b", "ab", "ba", "abc", "ABC", "native", "x.native.y", "foo.native", "a.b", "com.nativex.b", "123",
         " 123 ", "1234", "a.blf", "x{LoggingBlock}.blf", "pattern", "patterns", "with", "within", "bundle::a",
         ".", "..", "./a", ".a", "@@a", "@a", "meta", "metal", "Abc", "Ab.", "lucene.x", "builtin.y", "xxy", "axy",
         "bbb", "bb", "abb", "cab", "cb", "oo", "foo", "fooo", ",a", "a,", ",a,", "https://ab.cd", "http://x.yz/p?q=1",
         " (default x)", "(default)", "default", "a1b", "a1", "ab1c", "\n", "a\n"]


def _py(pattern: str) -> re.Pattern:
    return re.compile(re.sub(r"(?<!\\)\$", r"\\Z", pattern), re.ASCII)


def _strings(pattern: str, n: int, seed: int) -> list[str]:
    """Edge cases plus random strings over the pattern's own characters (and a few others)."""
    alpha = sorted({c for c in pattern if c.isprintable()} | set("ab .,1\n:/é"))
    rng = random.Random(seed)
    out = list(EDGES)
    for _ in range(n):
        k = rng.choice([1, 2, 3, 4, 6, 9, 14])
        out.append("".join(rng.choice(alpha) for _ in range(k)))
    return out


@pytest.mark.parametrize("pattern", PATTERNS)
def test_dfa_agrees_with_re(pattern: str) -> None:
    """search (JSON-Schema semantics) and fullmatch (``regex`` constraints) languages."""
    ref = _py(pattern)
    search, full = regex_to_dfa(pattern, search=True), regex_to_dfa(pattern)
    for s in _strings(pattern, 600, len(pattern)):
        if not s and r"\B" in pattern:
            continue  # NOTE: Python before 3.14 never matches \B in an empty string (ECMA does)
        assert search.matches(s) == bool(ref.search(s)), (pattern, s)
        assert full.matches(s) == bool(ref.fullmatch(s)), (pattern, s)


def _encodings(s: str, rng: random.Random) -> list[str]:
    """JSON strings that decode to ``s`` as ``json.dumps`` writes them (both ``ensure_ascii``
    forms, and a random mix per character)."""
    mixed = [rng.choice([json.dumps(c)[1:-1], json.dumps(c, ensure_ascii=False)[1:-1]]) for c in s]
    return [json.dumps(s), json.dumps(s, ensure_ascii=False), '"' + "".join(mixed) + '"']


@pytest.mark.parametrize("pattern", PATTERNS[::2] + [r"\bx", r"(?<=\\)n", r'(?<!")q'])
def test_json_string_encodings(pattern: str) -> None:
    """The pattern applies to the decoded string, whatever escapes encode it: a lookbehind for
    ``n`` must not see the ``n`` of an escaped newline, ``é`` is one character in either form."""
    ref = _py(pattern)
    dfa = content_dfa(pattern, True)
    rng = random.Random(7)
    strings = _strings(pattern, 200, 3) + ["\\n", "\n", "a\\n", 'x"q', "xq", "ax", "a x"]
    for s in strings:
        if not s and r"\B" in pattern:
            continue
        want = bool(ref.search(s))
        for enc in _encodings(s, rng):
            assert dfa.matches(enc) == want, (pattern, s, enc)


REGEX_CASES = [  # (pattern, strings): compile_regex (fullmatch), walked token by token
    (r"(?!(?:meta|local)$)[a-z]{1,8}", ["meta", "metal", "local", "loc", "x", "", "Meta"]),
    (r"[a-z]+(?<!ing)( [a-z]+(?<!ing))*", ["sing", "song", "the song", "the sing", "singer ok", "ring a bell"]),
    (r"(\b[A-Z][a-z]*\b ?)+", ["Hello World", "Hello world", "Hello  World", "HelloWorld ", "A B C"]),
    (r"((?!--)[a-z-])+", ["a-b", "a--b", "-a-", "--", "abc-def-g"]),
]


@pytest.mark.parametrize("vocab", table_vocabularies())
def test_compile_regex_token_by_token(vocab: str) -> None:
    tok, comp = load_tokenizer(vocab), load_compiler(vocab)
    bitmask = allocate_token_bitmask(1, comp.tokenizer_info.vocab_size)
    for pattern, strings in REGEX_CASES:
        compiled = comp.compile_regex(pattern)
        ref = _py(pattern)
        for s in strings:
            want = bool(ref.fullmatch(s))
            res = run_instance(compiled, tok, s, want, bitmask)
            assert res.mismatch is None, (pattern, s, res.mismatch)
            assert res.accepted == want, (pattern, s, want)


def _table() -> list[tuple]:
    """Schema cases: valid / invalid strings of each pattern decided by Python ``re``."""
    cases = []
    for pattern in PATTERNS[:14:2] + [r"\b\d{3}\b", r"((?!ab).)*c"]:
        ref = _py(pattern)
        pool = [s for s in _strings(pattern, 60, 11) if "\n" not in s or "$" not in pattern]
        valid = [s for s in pool if ref.search(s)][:6]
        invalid = [s for s in pool if not ref.search(s)][:6]
        cases.append((f"pattern {pattern}", {"type": "string", "pattern": pattern}, valid, invalid))
    cases += [
        ("patternProperties: a negative lookahead key", {
            "type": "object", "additionalProperties": False,
            "patternProperties": {r"^(?!x-)[a-z-]+$": {"type": "integer"}, r"^x-": {"type": "string"}}},
         [{"ab": 1}, {"x-a": "s"}, {"a-x": 2, "x-": "t"}, {}],
         [{"x-a": 1}, {"ab": "s"}, {"AB": 1}, {"x-b": 2, "q": 1}]),
        ("propertyNames: \\b and a lookbehind", {
            "type": "object", "propertyNames": {"pattern": r"^\w+\b(?<!_)$"}},
         [{"ab": 1}, {"a_b": 2, "c": None}], [{"ab_": 1}, {"a b": 2}, {"": 1}]),
        ("not pattern with a lookahead", {"type": "string", "not": {"pattern": "^(?=a)"}},
         ["b", "ba", ""], ["a", "ab"]),
    ]
    return cases


test_table_agrees_with_jsonschema, test_table_token_by_token = schema_table_tests(_table())


@pytest.mark.parametrize("pattern,feature", [
    ("".join(f"(?!{c})" for c in "abcdefghijklmn") + ".", "lookaround"),  # 14 distinct assertions
    (r"(?=a)\1", "backreference"),
])
def test_remaining_errors_name_the_feature(pattern: str, feature: str) -> None:
    with pytest.raises(GrammarError, match=re.escape(feature)):
        regex_to_dfa(pattern)


def test_lark_terminal_lookaround_stays_an_error() -> None:
    """A lark terminal's lookaround would see past the terminal: refused, never approximated."""
    from radixlm.grammar.ebnf import lark_to_rules

    with pytest.raises(GrammarError, match="lookaround"):
        lark_to_rules('root: WORD\nWORD: /[a-z]+(?!x)/\n')


def test_pathological_pattern_ends_in_the_budget() -> None:
    """A lookahead whose search automaton is exponential (the 14th character from the end)
    stops with a clean GrammarError, counted in work units."""
    with pytest.raises(GrammarError, match="grammar too complex"), compile_budget(units=200_000, seconds=60):
        regex_to_dfa(r"(?![ab]*a[ab]{14})[ab]*c", search=True)
