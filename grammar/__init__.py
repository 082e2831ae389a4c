"""Grammar-constrained decoding: regex, JSON Schema, EBNF (GBNF or lark syntax) and choices
compiled to token masks against the model's real vocabulary, with jump-forward.

Compile once, match many::

    compiler = GrammarCompiler(tokenizer)
    compiled = compiler.compile_json_schema(schema)
    matcher = GrammarMatcher(compiled)
    bitmask = allocate_token_bitmask(batch, vocab_size)
    matcher.fill_next_token_bitmask(bitmask, i)
    apply_token_bitmask_inplace(logits, bitmask)
    matcher.accept_token(next_token)
"""

from radixlm.grammar.bitmask import allocate_token_bitmask, apply_token_bitmask_inplace
from radixlm.grammar.compiler import CompiledGrammar, GrammarCompiler
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.matcher import GrammarMatcher
from radixlm.grammar.tokenizer_info import TokenizerInfo

__all__ = [
    "CompiledGrammar",
    "GrammarCompiler",
    "GrammarError",
    "GrammarMatcher",
    "TokenizerInfo",
    "allocate_token_bitmask",
    "apply_token_bitmask_inplace",
]
