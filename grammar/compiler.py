"""GrammarCompiler: regex / JSON Schema / EBNF / choices -> CompiledGrammar, cached per tokenizer."""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from typing import Any, Iterable

import numpy as np
import torch

from radixlm.grammar import budget
from radixlm.grammar.ast import alt, lit
from radixlm.grammar.automaton import dfa_from_ast, regex_ast
from radixlm.grammar.budget import budget_share, compile_budget, deep_stack, paused_gc
from radixlm.grammar.dfa_engine import DfaEngine
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.json_orders import SORTED_ORDERS
from radixlm.grammar.json_schema import json_schema_to_ast
from radixlm.grammar.json_separators import check_separators
from radixlm.grammar.mask_table import MaskTable
from radixlm.grammar.token_index import RegionCache
from radixlm.grammar.tokenizer_info import TokenizerInfo

logger = logging.getLogger(__name__)


# A JSON schema first compiles to one DFA within DFA_SHARE of the compile budget; past it (or past
# MAX_DFA_STATES) it compiles as a grammar with the rest.
DFA_SHARE = 0.5
TOO_LARGE = ("grammar too large", "grammar too complex")
ORDERS_SHARE = 0.5  # work of a first compile with the extra property orders, in plain compile budgets


class CompiledGrammar:
    """A grammar compiled against one vocabulary; shared by any number of matchers (thread-safe
    for reading). Attributes: ``kind`` ("regex", "json_schema", "ebnf", "choices"), ``source``,
    ``masks`` (:class:`MaskTable`: the packed mask of every grammar state this grammar has met,
    complete at compile time for DFA grammars, filled on first visit otherwise; owned here and
    shared by every matcher and request of the grammar)."""

    def __init__(self, kind: str, source: str, engine: Any, info: TokenizerInfo) -> None:
        self.kind = kind
        self.source = source
        self.engine = engine
        self.tokenizer_info = info
        self._stop = info.stop_mask()
        table = engine.mask_table(self._stop, self._compute) if hasattr(engine, "mask_table") else None
        self.masks = table if table is not None else MaskTable(info.mask_words, self._stop, self._compute)

    def _compute(self, states: list[Any]) -> list[np.ndarray]:
        engine = self.engine
        many = engine.masks(states) if hasattr(engine, "masks") else [engine.mask(s) for s in states]
        return [m | self._stop if engine.accepting(s) else m for s, m in zip(states, many)]

    def mask_row(self, state: Any) -> torch.Tensor:
        """int32 ``[ceil(vocab_size / 32)]`` tensor of the tokens allowed in ``state`` (cached;
        ``None``: a terminated matcher, stop tokens only)."""
        return torch.from_numpy(self.masks.row_np(int(self.masks.row_ids([state])[0])))

    def __repr__(self) -> str:
        return f"CompiledGrammar(kind={self.kind!r}, source={self.source[:60]!r})"


class GrammarCompiler:
    """Compiles constraints against one tokenizer, caching results (compile once, match many).

    Args:
        tokenizer: a transformers tokenizer, or a :class:`TokenizerInfo`.
        vocab_size: the model's logits width if larger than the tokenizer (extra ids are never
            allowed).
        stop_token_ids: tokens allowed exactly where the grammar accepts (default: EOS).
        cache_size: compiled grammars kept (LRU).
    Thread-safe: the runtime may compile from a thread pool.
    """

    def __init__(self, tokenizer: Any, *, vocab_size: int | None = None,
                 stop_token_ids: Iterable[int] | None = None, cache_size: int = 256) -> None:
        if isinstance(tokenizer, TokenizerInfo):
            self.tokenizer_info = tokenizer
        else:
            self.tokenizer_info = TokenizerInfo.from_huggingface(tokenizer, vocab_size, stop_token_ids)
        self.tokenizer_info.trie  # noqa: B018 - build now, not during the first compile
        self.regions = RegionCache()
        self._cache: OrderedDict[tuple, CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def _cached(self, key: tuple, build: Any) -> CompiledGrammar:
        with self._lock:
            got = self._cache.get(key)
            if got is not None:
                self._cache.move_to_end(key)
                return got
        with paused_gc():
            compiled = build()
        with self._lock:
            self._cache[key] = compiled
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def _dfa_grammar(self, kind: str, source: str, node: Any) -> CompiledGrammar:
        dfa = dfa_from_ast(node, memo=False)  # NOTE: the grammar itself is cached here
        if dfa.start == 0:
            raise GrammarError(f"the {kind} accepts no string")
        return CompiledGrammar(kind, source, DfaEngine(dfa, self.tokenizer_info, self.regions), self.tokenizer_info)

    def compile_regex(self, pattern: str) -> CompiledGrammar:
        """The whole output must match ``pattern`` (Python ``re.fullmatch`` semantics).

        Raises:
            GrammarError: unsupported regex syntax (named), or an empty language.
        """
        if not isinstance(pattern, str):
            raise GrammarError("regex must be a str")
        return self._cached(("regex", pattern), lambda: self._dfa_grammar("regex", pattern, regex_ast(pattern)))

    def compile_choices(self, choices: list[str]) -> CompiledGrammar:
        """The output is exactly one of ``choices``."""
        if not choices or not all(isinstance(c, str) for c in choices):
            raise GrammarError("choices must be a non-empty list of str")
        key = ("choices", tuple(choices))
        return self._cached(key, lambda: self._dfa_grammar("choices", json.dumps(choices), alt(*(lit(c) for c in choices))))

    def compile_json_schema(self, schema: str | dict, *, any_whitespace: bool = False,
                            disable_additional_properties: bool = False,
                            separators: str = "either") -> CompiledGrammar:
        """JSON conforming to ``schema`` (see :mod:`radixlm.grammar.json_schema` for the rules).

        Args:
            schema: JSON text or a dict.
            any_whitespace: allow any JSON whitespace (bounded) between tokens instead of the
                ``json.dumps`` separators only.
            disable_additional_properties: objects that declare properties take no undeclared
                keys unless the schema allows them (``additionalProperties`` /
                ``unevaluatedProperties`` given); vLLM's option of this name, xgrammar's
                ``strict_mode``, what OpenAI's ``strict: true`` requires. Default: JSON Schema's
                semantics (undeclared keys allowed where the schema is silent). A schema too
                large to compile closed (alternatives the open form keeps apart as grammar
                rules) compiles open instead, with a fresh budget, and logs a warning.
            separators: how separators may be written without ``any_whitespace``: ``"either"``
                (default: ``,`` or ``, `` and ``:`` or ``: `` at each one), ``"compact"``,
                ``"spaced"``, or ``"consistent"`` (either style, fixed by the first separator
                for the whole document, so jump-forward writes the later ones; about twice the
                compile work; serving's default; a schema too large for it compiles with
                ``"either"``). See :mod:`radixlm.grammar.json_separators`.
        Raises:
            GrammarError: invalid schema or an unsupported keyword (named in the message).
            ValueError: an unknown ``separators``, or one other than ``"either"`` with
                ``any_whitespace``.
        """
        text = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=False)
        closed = bool(disable_additional_properties)
        check_separators(any_whitespace, separators)
        style = separators
        dfa_spent = [False]  # the first try's single DFA ran out of its share: the retry skips it

        def build() -> CompiledGrammar:
            dfa_spent[0] = False
            try:
                # NOTE: one budget for both tries: one CPU-time backstop, and the retry gets at
                # least a plain compile's work units
                with compile_budget(units=int(budget.DEFAULT_UNITS * (1 + ORDERS_SHARE))):
                    try:
                        with budget_share(ORDERS_SHARE / (1 + ORDERS_SHARE)):
                            return build_once()
                    except GrammarError as e:
                        if not str(e).startswith(TOO_LARGE) or "(CPU time)" in str(e):
                            raise  # NOTE: past the CPU-time backstop: no second try
                    # NOTE: too large with the extra property orders (sorted keys): again
                    # without them, with what the first try left
                    token = SORTED_ORDERS.set(False)
                    try:
                        return build_once()
                    finally:
                        SORTED_ORDERS.reset(token)
            except RecursionError:  # NOTE: a grammar nested past Python's stack, in any pass
                raise GrammarError("schema nesting too deep") from None

        def build_deep() -> CompiledGrammar:
            try:
                return build()
            except GrammarError as e:
                if str(e) != "schema nesting too deep":
                    raise
            # NOTE: deeply nested (not infinite) schemas convert recursively: once more where a
            # deeper stack is allowed (a bounded one: a cycle still ends as this error)
            return deep_stack(build)

        def build_once() -> CompiledGrammar:
            with compile_budget():  # NOTE: a schema too large to compile in time is a GrammarError
                try:
                    if dfa_spent[0]:
                        raise GrammarError(TOO_LARGE[1] + ": the single DFA already ran out (first try)")
                    with budget_share(DFA_SHARE):
                        node, rules = json_schema_to_ast(schema, any_whitespace, closed=closed, separators=style)
                        dfa = None if rules else dfa_from_ast(node, memo=False)
                except GrammarError as e:
                    if not str(e).startswith(TOO_LARGE):
                        raise
                    dfa_spent[0] = SORTED_ORDERS.get()
                    # NOTE: one automaton for the whole schema is too large (copies of undeclared
                    # values, orders): the grammar keeps each piece apart (the Earley engine)
                    node, rules = json_schema_to_ast(schema, any_whitespace, grammar=True, closed=closed,
                                                      separators=style)
                    dfa = None
                if dfa is not None:
                    if dfa.start == 0:
                        raise GrammarError("the json_schema accepts no string")
                    engine = DfaEngine(dfa, self.tokenizer_info, self.regions)
                    return CompiledGrammar("json_schema", text, engine, self.tokenizer_info)
                from radixlm.grammar.earley_engine import EarleyEngine

                engine = EarleyEngine.from_rules(node, rules, self.tokenizer_info, self.regions)
                return CompiledGrammar("json_schema", text, engine, self.tokenizer_info)

        def build_relaxed() -> CompiledGrammar:
            # NOTE: too large as asked: the consistent separators go first (only whitespace is
            # at stake), then the closed objects (with a warning: undeclared keys come back)
            nonlocal closed, style
            while True:
                try:
                    return build_deep()
                except GrammarError as e:
                    if not str(e).startswith(TOO_LARGE) or "(CPU time)" in str(e):
                        raise
                    if style == "consistent":
                        logger.info("json_schema too large with consistent separators (%s): either style", e)
                        style = "either"
                    elif closed:
                        logger.warning("json_schema too large to compile with closed objects (%s): "
                                       "compiled with undeclared keys allowed", e)
                        closed = False
                    else:
                        raise

        return self._cached(("json_schema", text, any_whitespace, closed, separators), build_relaxed)

    def compile_ebnf(self, grammar: str, *, root: str = "root") -> CompiledGrammar:
        """A grammar in GBNF (rules ``name ::= ...``, SGLang's syntax) or lark syntax; ``root``
        names the start rule.

        Raises:
            GrammarError: grammar syntax errors, unknown rules, unsupported regex features.
        """

        def build() -> CompiledGrammar:
            from radixlm.grammar.earley_engine import EarleyEngine
            from radixlm.grammar.ebnf import lark_to_rules

            node, rules = lark_to_rules(grammar, root)
            engine = EarleyEngine.from_rules(node, rules, self.tokenizer_info, self.regions)
            return CompiledGrammar("ebnf", grammar, engine, self.tokenizer_info)

        return self._cached(("ebnf", grammar, root), build)
