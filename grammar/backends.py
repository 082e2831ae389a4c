"""Grammar backends behind one matcher interface: radixlm's own engine, xgrammar, llguidance.

``make_backend(name, tokenizer, vocab_size)`` returns a :class:`Backend` with ``compile(kind,
source)`` (kind: ``"regex"``, ``"json_schema"``, ``"ebnf"``) and ``matcher(compiled)``; ``compile(..., disable_additional_properties=True)`` closes objects that
declare properties (see :meth:`GrammarCompiler.compile_json_schema`; xgrammar's ``strict_mode``,
a schema rewrite for llguidance); every
matcher offers ``fill_next_token_bitmask(bitmask, index)``, ``accept_token``, ``is_terminated``,
``rollback``, ``find_jump_forward_string``, ``reset``. ``fill_batch(matchers, bitmask)`` fills a
whole batch (radixlm: one gather per grammar from its mask table; peers: one call per matcher into a
CPU buffer, then one copy).

EBNF text is read in each backend's own dialect: lark for radixlm and llguidance, GBNF for
xgrammar. The peers are optional extras: ``pip install 'radixlm[xgrammar]'`` /
``'radixlm[llguidance]'``; asking for a missing one raises ``ImportError`` naming the extra.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any

import torch

from radixlm.grammar.errors import GrammarError
from radixlm.grammar.schema_drafts import DATA_KEYWORDS, SCHEMA_MAPS
from radixlm.grammar.utf8 import decode_complete_prefix

BACKENDS = ("radixlm", "xgrammar", "llguidance")


class Backend(ABC):
    """Compiles constraints and makes matchers (one instance per engine)."""

    name = "base"
    words: int  # int32 words per bitmask row

    @abstractmethod
    def compile(self, kind: str, source: str, *, disable_additional_properties: bool = False) -> Any:
        """Compile ``source`` of ``kind`` (regex / json_schema / ebnf); raises ``GrammarError``.
        ``disable_additional_properties`` applies to json_schema only."""

    @abstractmethod
    def matcher(self, compiled: Any) -> Any:
        """A fresh per-sequence matcher over ``compiled``."""

    def fill_batch(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        """Row ``i`` of int32 ``bitmask [len(matchers), words]`` gets ``matchers[i]``'s mask."""
        cpu = bitmask if bitmask.device.type == "cpu" else torch.empty(bitmask.shape, dtype=torch.int32)
        for i, m in enumerate(matchers):
            m.fill_next_token_bitmask(cpu, i)
        if cpu is not bitmask:
            bitmask.copy_(cpu)


class RadixBackend(Backend):
    """radixlm's engine. ``separators``: how JSON separators may be written (see
    :meth:`GrammarCompiler.compile_json_schema`); default ``"consistent"``: either
    ``json.dumps`` style, the first separator fixing it, so jump-forward writes the rest."""

    name = "radixlm"

    def __init__(self, tokenizer: Any, vocab_size: int, separators: str = "consistent") -> None:
        from radixlm.grammar.compiler import GrammarCompiler
        from radixlm.grammar.json_separators import check_separators

        check_separators(False, separators)
        self.separators = separators

        self.compiler = GrammarCompiler(tokenizer, vocab_size=vocab_size)
        self.words = self.compiler.tokenizer_info.mask_words

    def compile(self, kind: str, source: str, *, disable_additional_properties: bool = False) -> Any:
        c = self.compiler
        if kind == "regex":
            return c.compile_regex(source)
        if kind == "json_schema":
            # NOTE: serving writes consistent separators: jump-forward then writes them
            return c.compile_json_schema(source, disable_additional_properties=disable_additional_properties,
                                         separators=self.separators)
        if kind == "ebnf":
            return c.compile_ebnf(source)
        raise ValueError(f"unknown grammar kind {kind!r}")

    def matcher(self, compiled: Any) -> Any:
        from radixlm.grammar.matcher import GrammarMatcher

        return GrammarMatcher(compiled)

    def fill_batch(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        from radixlm.grammar.matcher import fill_batch_bitmask

        fill_batch_bitmask(matchers, bitmask)


class XGrammarBackend(Backend):
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        try:
            import xgrammar as xgr
        except ImportError as e:
            raise ImportError("grammar backend 'xgrammar' needs: pip install 'radixlm[xgrammar]'") from e
        self.xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.compiler = xgr.GrammarCompiler(info, max_threads=2)
        self.words = (info.vocab_size + 31) // 32

    def compile(self, kind: str, source: str, *, disable_additional_properties: bool = False) -> Any:
        try:
            if kind == "regex":
                return self.compiler.compile_regex(source)
            if kind == "json_schema":
                # NOTE: xgrammar's strict_mode also closes objects without properties and arrays
                return self.compiler.compile_json_schema(source, strict_mode=disable_additional_properties)
            if kind == "ebnf":
                return self.compiler.compile_grammar(source)
        except (RuntimeError, ValueError) as e:
            raise GrammarError(f"xgrammar: {e}") from e
        raise ValueError(f"unknown grammar kind {kind!r}")

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)


def close_objects(schema: str) -> str:
    """``schema`` (JSON text) with ``"additionalProperties": false`` added to every sub-schema that
    declares (non-empty) ``properties`` / ``patternProperties`` and neither ``additionalProperties`` nor
    ``unevaluatedProperties`` (vLLM's rewrite for llguidance). Sub-schemas merged by ``allOf``
    (the holder and its branches) and holders of a ``$ref`` are left open: closing one would forbid
    the others' keys."""

    def walk(node: Any, merged: bool = False) -> Any:
        if isinstance(node, list):
            return [walk(x) for x in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for k, v in node.items():
            if k in SCHEMA_MAPS and isinstance(v, dict):
                out[k] = {name: walk(x) for name, x in v.items()}
            elif k in DATA_KEYWORDS:
                out[k] = v
            else:
                out[k] = [walk(x, True) for x in v] if k == "allOf" and isinstance(v, list) else walk(v)
        if (node.get("properties") or node.get("patternProperties")) and not merged and "allOf" not in node \
                and "$ref" not in node \
                and "additionalProperties" not in node and "unevaluatedProperties" not in node:
            out["additionalProperties"] = False
        return out

    return json.dumps(walk(json.loads(schema), False))


class LLGuidanceMatcher:
    """llguidance's ``LLMatcher`` under the xgrammar-style names."""

    def __init__(self, ll: Any, llt: Any, tok: Any, grammar: str) -> None:
        self._llt = llt
        self._m = ll.LLMatcher(tok, grammar)
        if self._m.is_error():
            raise GrammarError(f"llguidance: {self._m.get_error()}")

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> bool:
        self._llt.fill_next_token_bitmask(self._m, bitmask, index)
        return True

    def accept_token(self, token_id: int) -> bool:
        return bool(self._m.consume_token(token_id)) and not self._m.is_error()

    def is_terminated(self) -> bool:
        return self._m.is_stopped() and not self._m.is_error()

    def rollback(self, num_tokens: int) -> None:
        self._m.rollback(num_tokens)

    def reset(self) -> None:
        self._m.reset()

    def find_jump_forward_string(self) -> str:
        return decode_complete_prefix(bytes(self._m.compute_ff_bytes()))


class LLGuidanceBackend(Backend):
    name = "llguidance"

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        try:
            import llguidance
            import llguidance.hf
            import llguidance.torch
        except ImportError as e:
            raise ImportError("grammar backend 'llguidance' needs: pip install 'radixlm[llguidance]'") from e
        self.ll = llguidance
        self.llt = llguidance.torch
        self.tok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
        self.words = (self.tok.vocab_size + 31) // 32

    def compile(self, kind: str, source: str, *, disable_additional_properties: bool = False) -> Any:
        M = self.ll.LLMatcher
        if kind == "regex":
            grammar = M.grammar_from_regex(source)
        elif kind == "json_schema":
            grammar = M.grammar_from_json_schema(close_objects(source) if disable_additional_properties else source)
        elif kind == "ebnf":
            grammar = M.grammar_from_lark(source)
        else:
            raise ValueError(f"unknown grammar kind {kind!r}")
        err = M.validate_grammar(grammar, self.tok)
        if err:
            raise GrammarError(f"llguidance: {err}")
        return grammar

    def matcher(self, compiled: Any) -> Any:
        return LLGuidanceMatcher(self.ll, self.llt, self.tok, compiled)


def make_backend(name: str, tokenizer: Any, vocab_size: int) -> Backend:
    """The backend called ``name`` (one of :data:`BACKENDS`).

    Raises:
        ValueError: an unknown name. ImportError: the peer package is not installed.
    """
    if name == "radixlm":
        return RadixBackend(tokenizer, vocab_size)
    if name == "xgrammar":
        return XGrammarBackend(tokenizer, vocab_size)
    if name == "llguidance":
        return LLGuidanceBackend(tokenizer, vocab_size)
    raise ValueError(f"grammar backend must be one of {BACKENDS}, got {name!r}")
