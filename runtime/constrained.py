"""Grammar-constrained decoding in the runtime (FSM-guided masked decoding, SGLang paper §4).

Compiles each request's ``regex`` / ``json_schema`` / ``ebnf`` in deadline threads (cached per
grammar; at ``timeout_s`` the compile is interrupted, see :mod:`radixlm.runtime.deadline`) with the configured backend (``--grammar-backend``: radixlm, xgrammar or
llguidance, :mod:`radixlm.grammar.backends`), gives every constrained request its own matcher,
fills the whole batch's token bitmask at once before sampling, and advances the matcher with each
sampled token. A grammar that fails to compile, or compiles too slowly, aborts only its own
request.

Mask fill per decode step (radixlm backend): the host looks up one mask-table row id per request
(precomputed per grammar state, see :mod:`radixlm.grammar.mask_table`), then one gather per
distinct grammar writes the rows into a device bitmask from a device-side copy of the table, and
one kernel applies it. All host work comes before the first device operation, so on CUDA it runs
while the GPU is still busy with the forward pass.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from concurrent.futures import Future
from typing import Sequence

import torch

from radixlm.runtime.batch import ScheduleBatch
from radixlm.runtime.deadline import DeadlineExceeded, submit_with_deadline
from radixlm.runtime.memory import to_device
from radixlm.runtime.request import Req
from radixlm.runtime.sampling_params import GrammarSpec

logger = logging.getLogger(__name__)
# Share of wall time a compile may run (GIL fairness): while the model ran in the last second, and idle.
COMPILE_DUTY_BUSY, COMPILE_DUTY_IDLE = 0.2, 0.5


class GrammarBackend:
    """Per-engine grammar service.

    Args:
        tokenizer: the HF tokenizer the compiler indexes.
        vocab_size: logits width (may exceed ``len(tokenizer)``).
        timeout_s: compile time limit per grammar (seconds).
    """

    def __init__(self, tokenizer, vocab_size: int, timeout_s: float = 30.0, workers: int = 2,
                 backend: str = "radixlm") -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.timeout_s = timeout_s
        self.backend_name = backend
        self._bitmask: torch.Tensor | None = None  # reused device buffer [rows, words]
        # NOTE: compiles run in deadline threads (really stopped at timeout_s), at most `workers`
        # at once, smallest grammar first, so a storm of huge grammars cannot starve small ones.
        self._workers = workers
        self._queued: list[tuple[int, int, tuple[str, str], Future]] = []
        self._active = 0
        self._seq = 0
        self._lock = threading.Lock()
        self.model_ran_at = 0.0  # time.monotonic() of the last forward pass (set by the scheduler)
        self._compiler = None
        self._cache: dict[GrammarSpec, Future] = {}
        self.compile_seconds: list[float] = []  # compile durations, for metrics
        self.mask_seconds = 0.0  # host time in mask_logits so far (traced per turn, RADIXLM_TRACE_DIR)

    def _get_compiler(self):
        """The grammar backend (built on first use; thread-safe enough: built once by a worker)."""
        if self._compiler is None:
            from radixlm.grammar.backends import make_backend

            self._compiler = make_backend(self.backend_name, self.tokenizer, self.vocab_size)
        return self._compiler

    def _compile(self, kind: str, source: str, closed: bool):
        t0 = time.perf_counter()
        out = self._get_compiler().compile(kind, source, disable_additional_properties=closed)
        self.compile_seconds.append(time.perf_counter() - t0)
        return out

    def submit(self, req: Req) -> None:
        """Start compiling ``req``'s grammar (no-op for unconstrained requests)."""
        spec = req.sampling_params.grammar
        if spec is None:
            return
        if self.tokenizer is None:
            req.grammar_error = "constrained decoding needs a tokenizer"
            return
        fut = self._cache.get(spec)
        if fut is None or (fut.done() and fut.exception() is not None):
            fut = self._cache[spec] = Future()
            with self._lock:
                self._seq += 1
                heapq.heappush(self._queued, (len(spec.source), self._seq, spec, fut))
            self._pump()
        req.grammar_future = fut

    def poll(self, req: Req) -> bool | str:
        """True when ``req`` may run (no grammar, or its matcher is ready), False while compiling,
        or an error message (compile error or timeout) when it must be aborted."""
        if req.grammar_error is not None:
            return req.grammar_error
        fut: Future | None = req.grammar_future
        if fut is None or req.grammar_matcher is not None:
            return True
        if not fut.done():
            return False
        err = fut.exception()
        if isinstance(err, DeadlineExceeded):
            return f"grammar compilation timed out after {self.timeout_s:g} s"
        if err is not None:
            return f"invalid grammar: {err}"
        matcher = self._get_compiler().matcher(fut.result())
        # NOTE: a retracted request re-enters with output already generated; replay it.
        for tok in req.output_ids:
            matcher.accept_token(tok)
        req.grammar_matcher = matcher
        return True

    def mask_logits(self, logits: torch.Tensor, batch: ScheduleBatch, sample_slices: Sequence[int]) -> None:
        """Apply each constrained request's allowed-token bitmask to its row of ``logits``
        (float ``[S, V]``, row ``k`` samples for ``batch.slices[sample_slices[k]]``), in place."""
        rows: list[int] = []
        matchers = []
        for k, i in enumerate(sample_slices):
            m = batch.slices[i].req.grammar_matcher
            if m is not None:
                rows.append(k)
                matchers.append(m)
        if not matchers:
            return
        from radixlm.grammar import apply_token_bitmask_inplace

        t0 = time.perf_counter()
        backend = self._get_compiler()
        bitmask = self._buffer(len(matchers), backend.words, logits.device)
        backend.fill_batch(matchers, bitmask)  # NOTE: host work first, then device gathers
        if rows == list(range(logits.shape[0])):
            apply_token_bitmask_inplace(logits, bitmask)
        else:
            apply_token_bitmask_inplace(logits, bitmask, to_device(rows, logits.device))
        self.mask_seconds += time.perf_counter() - t0

    def _buffer(self, n: int, words: int, device: torch.device) -> torch.Tensor:
        buf = self._bitmask
        if buf is None or buf.shape[0] < n or buf.shape[1] != words or buf.device != device:
            buf = self._bitmask = torch.empty((max(n, 64), words), dtype=torch.int32, device=device)
        return buf[:n]

    def _pump(self) -> None:
        """Start queued compiles while fewer than ``workers`` run."""
        while True:
            with self._lock:
                if self._active >= self._workers or not self._queued:
                    return
                _, _, spec, fut = heapq.heappop(self._queued)
                self._active += 1
            inner = submit_with_deadline(self._compile, self.timeout_s, *spec, name="radixlm-grammar",
                                         duty=self._duty)
            inner.add_done_callback(lambda f, fut=fut: self._done(f, fut))

    def _duty(self) -> float:
        return COMPILE_DUTY_BUSY if time.monotonic() - self.model_ran_at < 1.0 else COMPILE_DUTY_IDLE

    def _done(self, inner: Future, fut: Future) -> None:
        with self._lock:
            self._active -= 1
        err = inner.exception()
        fut.set_exception(err) if err is not None else fut.set_result(inner.result())
        self._pump()

    def shutdown(self) -> None:
        with self._lock:
            queued, self._queued = self._queued, []
        for *_, fut in queued:
            fut.cancel()
