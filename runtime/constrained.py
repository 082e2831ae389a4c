"""Grammar-constrained decoding in the runtime (FSM-guided masked decoding, SGLang paper §4).

Compiles each request's ``regex`` / ``json_schema`` / ``ebnf`` in a thread pool (cached per
grammar, with a timeout), gives every constrained request its own ``GrammarMatcher``, fills the
batch's token bitmask before sampling, and advances the matcher with each sampled token. A grammar
that fails to compile, or compiles too slowly, aborts only its own request.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Sequence

import torch

from radixlm.runtime.batch import ScheduleBatch
from radixlm.runtime.request import Req

logger = logging.getLogger(__name__)


class GrammarBackend:
    """Per-engine grammar service.

    Args:
        tokenizer: the HF tokenizer the compiler indexes.
        vocab_size: logits width (may exceed ``len(tokenizer)``).
        timeout_s: compile time limit per grammar (seconds).
    """

    def __init__(self, tokenizer, vocab_size: int, timeout_s: float = 30.0, workers: int = 2) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="radixlm-grammar")
        self._compiler = None
        self._cache: dict[tuple[str, str], Future] = {}
        self.compile_seconds: list[float] = []  # compile durations, for metrics

    def _get_compiler(self):
        if self._compiler is None:
            from radixlm.grammar import GrammarCompiler

            self._compiler = GrammarCompiler(self.tokenizer)
        return self._compiler

    def _compile(self, kind: str, source: str):
        t0 = time.perf_counter()
        compiler = self._get_compiler()
        if kind == "regex":
            out = compiler.compile_regex(source)
        elif kind == "json_schema":
            out = compiler.compile_json_schema(source)
        elif kind == "ebnf":
            out = compiler.compile_ebnf(source)
        else:
            raise ValueError(f"unknown grammar kind {kind!r}")
        self.compile_seconds.append(time.perf_counter() - t0)
        return out

    def submit(self, req: Req) -> None:
        """Start compiling ``req``'s grammar (no-op for unconstrained requests)."""
        spec = req.sampling_params.grammar
        if spec is None:
            return
        if self.tokenizer is None:
            req.extra["grammar_error"] = "constrained decoding needs a tokenizer"
            return
        fut = self._cache.get(spec)
        if fut is None or (fut.done() and fut.exception() is not None):
            fut = self._cache[spec] = self._pool.submit(self._compile, *spec)
        req.extra["grammar_future"] = fut
        req.extra["grammar_deadline"] = time.monotonic() + self.timeout_s

    def poll(self, req: Req) -> bool | str:
        """True when ``req`` may run (no grammar, or its matcher is ready), False while compiling,
        or an error message (compile error or timeout) when it must be aborted."""
        if "grammar_error" in req.extra:
            return req.extra["grammar_error"]
        fut: Future | None = req.extra.get("grammar_future")
        if fut is None or "grammar_matcher" in req.extra:
            return True
        if not fut.done():
            if time.monotonic() > req.extra["grammar_deadline"]:
                return f"grammar compilation timed out after {self.timeout_s:.0f} s"
            return False
        err = fut.exception()
        if err is not None:
            return f"invalid grammar: {err}"
        from radixlm.grammar import GrammarMatcher

        matcher = GrammarMatcher(fut.result())
        # NOTE: a retracted request re-enters with output already generated; replay it.
        for tok in req.output_ids:
            matcher.accept_token(tok)
        req.extra["grammar_matcher"] = matcher
        return True

    def mask_logits(self, logits: torch.Tensor, batch: ScheduleBatch, sample_slices: Sequence[int]) -> None:
        """Apply each constrained request's allowed-token bitmask to its row of ``logits``."""
        rows = [(k, batch.slices[i].req.extra.get("grammar_matcher")) for k, i in enumerate(sample_slices)]
        rows = [(k, m) for k, m in rows if m is not None]
        if not rows:
            return
        from radixlm.grammar import allocate_token_bitmask, apply_token_bitmask_inplace

        bitmask = allocate_token_bitmask(len(rows), logits.shape[1])
        for j, (_, matcher) in enumerate(rows):
            matcher.fill_next_token_bitmask(bitmask, j)
        index = torch.tensor([k for k, _ in rows], dtype=torch.int64, device=logits.device)
        sub = logits[index]
        apply_token_bitmask_inplace(sub, bitmask.to(logits.device))
        logits[index] = sub

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
