"""EBNF grammars (lark syntax, or GBNF) -> rules for the Earley engine.

A grammar whose rules are written ``name ::= ...`` is GBNF (llama.cpp's, xgrammar's and SGLang's
``ebnf`` syntax) and goes to :mod:`radixlm.grammar.gbnf`; anything else is lark syntax:

lark parses the grammar and expands its EBNF (``?``, ``*``, ``+``, ``[]``, templates, imports like
``%import common.WS``) into plain rules; terminals become regex ASTs (lark's own regexps, parsed
by :mod:`radixlm.grammar.regex_parser`). ``%ignore`` terminals are allowed between any two
symbols. Semantics are scannerless: a terminal may end wherever its regex matches (no
longest-match lexing and no terminal priorities).
"""

from __future__ import annotations

from radixlm.grammar.ast import Node, alt, cat, rep
from radixlm.grammar.automaton import regex_ast
from radixlm.grammar.errors import GrammarError


# Lookbehind idioms of lark's own grammar library, rewritten without lookaround.
_IDIOMS = {
    r'".*?(?<!\\)(\\\\)*?"': r'"(?:[^"\\\n]|\\.)*"',  # common.ESCAPED_STRING
}


def _terminal_regex(text: str) -> str:
    for old, new in _IDIOMS.items():
        text = text.replace(old, new)
    return text


def lark_to_rules(grammar: str, root: str = "root") -> tuple[Node, dict[str, Node]]:
    """Convert a lark grammar, or a GBNF one (rules written ``name ::= ...``, see
    :func:`radixlm.grammar.gbnf.gbnf_to_rules`); ``root`` names the start rule.

    Returns:
        ``(start node, rules)`` with nonterminals as ``("ref", name)``.
    Raises:
        GrammarError: syntax errors, a missing ``root`` rule, unsupported terminal regexes.
    """
    from radixlm.grammar.gbnf import gbnf_to_rules, is_gbnf

    if is_gbnf(grammar):
        return gbnf_to_rules(grammar, root)
    try:
        from lark import Lark
        from lark.exceptions import LarkError
    except ImportError as e:  # pragma: no cover - lark is a dependency
        raise GrammarError("EBNF grammars need the 'lark' package") from e
    if not isinstance(grammar, str) or not grammar.strip():
        raise GrammarError("ebnf grammar must be a non-empty str")
    try:
        parser = Lark(grammar, start=root, parser="earley", lexer="dynamic", keep_all_tokens=True)
    except LarkError as e:
        raise GrammarError(f"invalid EBNF grammar: {e}") from None
    except Exception as e:  # noqa: BLE001 - lark raises assorted errors on bad input
        raise GrammarError(f"invalid EBNF grammar: {type(e).__name__}: {e}") from None
    terms: dict[str, Node] = {}
    for t in parser.terminals:
        try:
            terms[t.name] = regex_ast(_terminal_regex(t.pattern.to_regexp()), lookaround=False)
        except GrammarError as e:
            raise GrammarError(f"terminal {t.name}: {e}") from None
    ign_nodes = [terms[n] for n in parser.ignore_tokens if n in terms]
    ign = rep(alt(*ign_nodes), 0, None) if ign_nodes else None
    rules: dict[str, Node] = {}
    for r in parser.rules:
        items: list[Node] = []
        for i, sym in enumerate(r.expansion):
            if i and ign is not None:
                items.append(ign)
            if sym.is_term:
                if sym.name not in terms:
                    raise GrammarError(f"terminal {sym.name} has no definition")
                items.append(terms[sym.name])
            else:
                items.append(("ref", sym.name))
        body = ("cat", tuple(items))
        name = r.origin.name
        rules[name] = alt(rules[name], body) if name in rules else body
    if root not in rules:
        raise GrammarError(f"root rule {root!r} not found")
    start = cat(ign, ("ref", root), ign) if ign is not None else ("ref", root)
    return start, rules
