"""GBNF grammars (llama.cpp / xgrammar / SGLang ``ebnf`` syntax) through ``compile_ebnf``: accept /
reject tables walked token by token through the bitmask on real vocabularies, agreement with the
lark form of the same grammars, small rules inlined or not, syntax errors with positions, and the
``ebnf`` sampling parameter constraining the in-process Engine."""

from __future__ import annotations

import re

import pytest

from radixlm.grammar import GrammarError
from radixlm.grammar.compiler import CompiledGrammar
from radixlm.grammar.earley_engine import EarleyEngine
from radixlm.grammar.ebnf import lark_to_rules
from radixlm.grammar.gbnf import MAX_DEPTH, gbnf_to_rules, is_gbnf
from radixlm.grammar.maskbench import (allocate_token_bitmask, load_compiler, load_tokenizer, run_instance,
                                       table_vocabularies)
from radixlm.grammar.testing import ARITH_EBNF, JSON_EBNF

YES_NO = r'root ::= "yes" | "no" | "maybe " [0-9]'

JSON_GBNF = r"""
root   ::= ws value ws
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( ws "," ws member )* ws )? "}"
member ::= string ws ":" ws value
array  ::= "[" ws ( value ( ws "," ws value )* ws )? "]"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws     ::= [ \t\n]*
"""

ARITH_GBNF = r"""
root   ::= expr
expr   ::= term (ws [-+] ws term)*
term   ::= factor (ws [*/] ws factor)*
factor ::= number | "(" ws expr ws ")" | "-" factor
number ::= [0-9]{1,3} ("." [0-9]{1,2})?
ws     ::= " "{0,2}
"""

# Dashed and underscored names, rules over several lines, comments, an escaped quote in a class.
KV_GBNF = r"""
# key=value entries, one per line
root ::= entry
         ( "\n" entry )*        # more entries on later lines
entry ::= key-name "=" value-text
key-name ::= [a-z] [a-z0-9_\-]*
value-text ::=
    quoted-value   # 'single quoted'
  | bare_value2
quoted-value ::= "'" [^'\n]* "'"
bare_value2 ::= [A-Za-z0-9.]+
"""

UNICODE_GBNF = r"""
root     ::= greeting " " emoji{1,3}
greeting ::= "héllo" | "\u65e5\u672c" | "\x41\U0001F600"
emoji    ::= [\U0001F600-\U0001F64F] | "★"
"""

MISC_GBNF = r"""
root ::= "<" .{2} ">" opt "!"{,2} tail
opt  ::= | "x" |
tail ::= ([^a-c]{2,})?
"""

GBNF_CASES = [
    ("yes-no", YES_NO, ["yes", "no", "maybe 7"], ["maybe", "yes ", "Yes", "maybe 77", "", "nomaybe 1"]),
    ("json", JSON_GBNF,
     ['{"a": [1, {"b": null}], "c": "x\\"y\\\\n"}', "[]", "  [ true , false ]\n", '"\\u00e9 日本 😀"',
      "-0.5e+3", '{"k":{"k":{"k":[[[]]]}}}'],
     ['{"a" 1}', "[1,]", "nul", '"abc', "01", '"a\\qb"', '{"a":1}}', '"\\u00g0"', '"tab\there"']),
    ("arith", ARITH_GBNF, ["1+2*3", "(1 + 2) * -3.25", "((999))", "12 /  4", "-(-1)"],
     ["1234", "1.234", "1+", "(1", "1   + 2", "1 2", "()"]),
    ("kv", KV_GBNF, ["a=1", "max-len=2.5\nname_x='hello world'", "k=''", "z-=''"],
     ["A=1", "a=", "a=1\n", "a = 1", "x='unterminated", "a=1\n\nb=2"]),
    ("unicode", UNICODE_GBNF, ["héllo 😀", "日本 ★★", "A😀 🙏😀★"],
     ["hello 😀", "日本 ", "日本 ★★★★", "A😀 a", "héllo 🚀"]),
    ("misc", MISC_GBNF, ["<ab>", "<\n日>x!!", "<..>!zz", "<ab>xdef"],
     ["<a>", "<abc>", "<ab>xxa", "<ab>!!!a", "<ab>da"]),
]

# The lark form of some GBNF grammars above: both must accept exactly the same table.
LARK_FORMS = {
    "yes-no": 'root: "yes" | "no" | "maybe " /[0-9]/',
    "arith": r"""
root: expr
expr: term (ws /[-+]/ ws term)*
term: factor (ws /[*\/]/ ws factor)*
factor: NUMBER | "(" ws expr ws ")" | "-" factor
NUMBER: /[0-9]{1,3}(\.[0-9]{1,2})?/
ws: " "? " "?
""",
    "json": r"""
root: ws value ws
?value: object | array | STRING | NUMBER | "true" | "false" | "null"
object: "{" ws (member (ws "," ws member)* ws)? "}"
member: STRING ws ":" ws value
array: "[" ws (value (ws "," ws value)* ws)? "]"
STRING: /"([^"\\\x00-\x1f]|\\(["\\\/bfnrt]|u[0-9a-fA-F]{4}))*"/
NUMBER: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/
ws: /[ \t\n]+/?
""",
}

CASE_IDS = [c[0] for c in GBNF_CASES]
VOCABS = table_vocabularies()


def _walk_table(compiled, tok, good: list[str], bad: list[str]) -> list[tuple[str, bool]]:
    """Every string token by token (bitmask and ``accept_token`` must agree at each step, and the
    stop token ends it); returns the strings judged against expectation."""
    bitmask = allocate_token_bitmask(1, compiled.tokenizer_info.vocab_size)
    wrong = []
    for text, want in [(t, True) for t in good] + [(t, False) for t in bad]:
        res = run_instance(compiled, tok, text, want, bitmask)
        assert res.mismatch is None, (text, res.mismatch)
        if res.accepted != want:
            wrong.append((text, want))
    return wrong


def _compile_rules(comp, node, rules, source: str) -> CompiledGrammar:
    engine = EarleyEngine.from_rules(node, rules, comp.tokenizer_info, comp.regions)
    return CompiledGrammar("ebnf", source, engine, comp.tokenizer_info)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("name,grammar,good,bad", GBNF_CASES, ids=CASE_IDS)
def test_gbnf_table_token_by_token(vocab: str, name: str, grammar: str, good: list[str], bad: list[str]) -> None:
    comp, tok = load_compiler(vocab), load_tokenizer(vocab)
    assert is_gbnf(grammar)
    assert not _walk_table(comp.compile_ebnf(grammar), tok, good, bad)


@pytest.mark.parametrize("name,grammar,good,bad", GBNF_CASES, ids=CASE_IDS)
def test_gbnf_without_inlining_agrees(name: str, grammar: str, good: list[str], bad: list[str]) -> None:
    """Every rule kept a nonterminal (no small rule inlined): the same language."""
    comp, tok = load_compiler(VOCABS[0]), load_tokenizer(VOCABS[0])
    node, rules = gbnf_to_rules(grammar, inline=False)
    assert not _walk_table(_compile_rules(comp, node, rules, grammar), tok, good, bad)


@pytest.mark.parametrize("name", sorted(LARK_FORMS))
def test_lark_form_accepts_the_same_table(name: str) -> None:
    comp, tok = load_compiler(VOCABS[0]), load_tokenizer(VOCABS[0])
    _, grammar, good, bad = next(c for c in GBNF_CASES if c[0] == name)
    assert not is_gbnf(LARK_FORMS[name])
    assert not _walk_table(comp.compile_ebnf(LARK_FORMS[name]), tok, good, bad)
    assert not _walk_table(comp.compile_ebnf(grammar), tok, good, bad)


def test_lark_grammars_still_go_to_lark() -> None:
    for g in (JSON_EBNF, ARITH_EBNF, 'root: "a ::= b"', 'root: x\nx: "::="'):
        assert not is_gbnf(g)
        lark_to_rules(g)


def test_root_argument_and_empty_alternatives() -> None:
    comp, tok = load_compiler(VOCABS[0]), load_tokenizer(VOCABS[0])
    g = 'start ::= "a" mid "b"\nmid ::= | "x" |\nroot ::= "never"'
    assert not _walk_table(comp.compile_ebnf(g, root="start"), tok, ["ab", "axb"], ["axxb", "never", "a"])
    assert not _walk_table(comp.compile_ebnf('root ::= ""'), tok, [""], ["a"])
    node, rules = gbnf_to_rules('root ::= a\na ::= b\nb ::= "b"+')
    assert node == ("ref", "root") and set(rules) == {"root", "a", "b"}


ERRORS = [
    ('root ::= "a" (', "line 1, column 15"),                        # unclosed group
    ('root ::= "a"\nitem ::= "b" missing', "line 2, column 14"),    # undefined rule
    ('root ::= "a\\q"', "line 1, column 12"),                       # unknown escape
    ('root ::= [z-a]', "line 1, column 11"),                        # reversed range
    ('root ::= * "a"', "line 1, column 10"),                        # nothing to repeat
    ('root ::= "a" )', "line 1, column 14"),
    ('root ::= "a"{3,2}', "line 1, column 13"),
    ('root ::= "a"{2', "line 1, column 13"),
    ('root ::= "a"\n\n  root ::= "b"', "line 3, column 3"),          # defined twice
    ('root ::= "abc', "line 1, column 10"),                         # unterminated string
    ('root ::= [abc', "line 1, column 10"),
    ('root ::= []', "line 1, column 10"),
    ('root ::= "a" @ "b"', "line 1, column 14"),
    ('root ::= "\\uD800"', "line 1, column 11"),                    # a lone surrogate
    ('root ::= "\\x4"', "line 1, column 11"),
    ("# only a comment\nroot ::= x\n  x ::= y", "line 3, column 9"),
    ('"a" ::= "b"\nroot ::= "c"', "line 1, column 1"),
    ('root ::= "a" (= "b")', "line 1, column 15"),                  # xgrammar lookahead
]


@pytest.mark.parametrize("grammar,where", ERRORS, ids=[str(i) for i in range(len(ERRORS))])
def test_syntax_errors_name_their_position(grammar: str, where: str) -> None:
    with pytest.raises(GrammarError, match=re.escape(where)):
        gbnf_to_rules(grammar)
    with pytest.raises(GrammarError, match=re.escape(where)):
        load_compiler(VOCABS[0]).compile_ebnf(grammar)


def test_missing_root_and_bounded_nesting() -> None:
    with pytest.raises(GrammarError, match="no rule named 'root'.*start"):
        gbnf_to_rules('start ::= "a"')
    with pytest.raises(GrammarError, match="no rule named 'main'"):
        gbnf_to_rules('root ::= "a"', root="main")
    for deep in ("(" * 100_000 + '"a"' + ")" * 100_000, '"a"' + "*" * 100_000,
                 "(" * 50_000 + '"a"*)' * 50_000):
        with pytest.raises(GrammarError, match="nested more than"):
            gbnf_to_rules("root ::= " + deep)
    ok = "(" * MAX_DEPTH + '"a"' + ")" * MAX_DEPTH
    comp, tok = load_compiler(VOCABS[0]), load_tokenizer(VOCABS[0])
    assert not _walk_table(comp.compile_ebnf("root ::= " + ok), tok, ["a"], ["aa"])
    # a long chain of rules, each inlining the next: still compiles (inlining stops nesting)
    chain = "".join(f"r{i} ::= (r{i + 1} \"x\")?\n" for i in range(300)) + 'r300 ::= "y"\nroot ::= r0'
    assert not _walk_table(comp.compile_ebnf(chain), tok, ["", "x", "xxx", "y" + "x" * 300],
                           ["xy", "y", "y" + "x" * 299, "x" * 301])


def test_engine_gbnf_constrains_output(tiny_llama) -> None:
    """SGLang's ``ebnf`` sampling parameter in GBNF syntax constrains the in-process Engine."""
    from radixlm.runtime.engine import Engine

    arith = r'root ::= num ([-+*] num){0,3}' + "\n" + r'num ::= [1-9] [0-9]{0,2}'
    with Engine(tiny_llama, device="cpu", max_total_tokens=4096, max_running_requests=8) as engine:
        outs = engine.generate(["Answer yes or no: ", "Is it? "],
                               [{"max_new_tokens": 8, "temperature": 0, "ebnf": 'root ::= "yes" | "no"'}] * 2)
        for out in outs:
            assert out["meta_info"]["finish_reason"]["type"] == "stop", out["meta_info"]
            assert out["text"] in ("yes", "no"), out["text"]
        for seed in range(3):
            out = engine.generate("Sum: ", {"max_new_tokens": 24, "temperature": 1.0, "seed": seed, "ebnf": arith})
            if out["meta_info"]["finish_reason"]["type"] == "stop":
                assert re.fullmatch(r"[1-9][0-9]{0,2}([-+*][1-9][0-9]{0,2}){0,3}", out["text"]), out["text"]
        bad = engine.generate("x", {"max_new_tokens": 4, "ebnf": 'root ::= "a" undefined-rule'})
        assert bad["meta_info"]["finish_reason"]["type"] == "abort"
        assert "undefined rule 'undefined-rule'" in bad["meta_info"]["finish_reason"]["message"]


def test_fuzzed_grammars_parse_or_raise_grammar_error() -> None:
    """Random grammar-ish text after ``root ::=``: a rule set the CFG lowering takes, or a
    GrammarError; never another exception or a hang."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    from radixlm.grammar.cfg import lower

    pieces = st.sampled_from(['"a"', '"\\x41"', "[a-c]", "[^\\n]", ".", "(", ")", "|", "*", "+", "?", "{2}",
                              "{1,3}", "{,2}", "{2,}", " ", "\n", "# c\n", "root", "x", "x ::= ", '"b"', "\\",
                              "[", "]", '"', "{", "::=", "-", "é"])

    @settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(body=st.lists(pieces, max_size=16).map("".join))
    def check(body: str) -> None:
        try:
            node, rules = gbnf_to_rules("root ::= " + body)
            lower(node, rules)
        except GrammarError:
            pass

    check()
