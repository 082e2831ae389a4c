"""Tokenization at arrival, off the event loop and batched (issue 16).

Requests that arrive together are tokenized in one call of the tokenizer (HF fast tokenizers
encode a list in parallel in Rust, outside the GIL) on a worker thread: the texts of every request
that arrived in the same event-loop turn, or while the previous batch was being encoded, form the
next batch (texts with and without special tokens, e.g. rendered chat prompts, go in separate
calls). A batch ``/generate`` (a list of prompts) is one request of the batch, so its prompts are
always tokenized in one call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from radixlm.runtime.tokenizer import encode_batch


class TokenizeBatcher:
    """Collects texts to tokenize and encodes them in batches on ``run_off_loop``'s threads.

    Args:
        tokenizer: an HF tokenizer (``encode`` and, for batching, ``__call__`` on a list).
        run_off_loop: ``await run_off_loop(fn, *args)`` runs ``fn`` off the event loop.
        max_batch_texts: texts per tokenizer call at most (a larger backlog takes several calls).
    """

    def __init__(self, tokenizer: Any, run_off_loop: Callable, max_batch_texts: int = 4096) -> None:
        self.tokenizer, self._run, self.max_batch_texts = tokenizer, run_off_loop, max_batch_texts
        self._queue: list[tuple[list[str], bool, asyncio.Future]] = []
        self._draining = False
        self.calls = 0  # tokenizer calls made (for tests and metrics)

    async def encode(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids of each of ``texts`` (as ``tokenizer.encode(text, add_special_tokens=...)``).
        Raises what the tokenizer raises for these texts (an error in another request's text does
        not reach this one)."""
        if not texts:
            return []
        fut = asyncio.get_running_loop().create_future()
        self._queue.append((list(texts), bool(add_special_tokens), fut))
        if not self._draining:
            self._draining = True
            asyncio.get_running_loop().create_task(self._drain())  # NOTE: runs after this turn's arrivals
        return await fut

    async def _drain(self) -> None:
        try:
            while self._queue:
                special = self._queue[0][1]
                batch, rest, size = [], [], 0
                for item in self._queue:  # NOTE: same flag, up to max_batch_texts; the rest waits
                    if item[1] == special and (not batch or size + len(item[0]) <= self.max_batch_texts):
                        batch.append(item)
                        size += len(item[0])
                    else:
                        rest.append(item)
                self._queue = rest
                await self._encode_batch(batch, special)
        finally:
            self._draining = False

    async def _encode_batch(self, batch: list[tuple[list[str], bool, asyncio.Future]], special: bool) -> None:
        texts = [t for ts, _, _ in batch for t in ts]
        try:
            self.calls += 1
            ids = await self._run(encode_batch, self.tokenizer, texts, special)
        except Exception as e:
            if len(batch) > 1:  # NOTE: one request's bad text must not fail the others: each alone
                for item in batch:
                    await self._encode_batch([item], special)
            elif not batch[0][2].done():
                batch[0][2].set_exception(e)
            return
        start = 0
        for ts, _, fut in batch:
            if not fut.done():
                fut.set_result(ids[start:start + len(ts)])
            start += len(ts)
