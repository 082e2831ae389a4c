"""Warm-up before serving: synthetic requests through the scheduler's own paths.

Without it the first requests a CUDA server sees pay one-time costs in the middle of their steps:
Triton compiles (or loads from its disk cache) the kernel variants that eager prefill and mixed
steps use (extend attention, rotary + KV store, the decode-attention tail of a mixed step), and
CUDA loads the cuBLAS kernels of each new GEMM shape on first use (H200, Llama-3.1-8B dims,
``benchmarks/mixed_steps.py``: a first mixed step of 1,654 tokens took 1.46 s on a cold Triton
cache; first calls of a new GEMM shape cost 300-470 us on the host against 20-30 us after). SGLang
likewise sends a request to itself after start-up (``--skip-server-warmup`` turns it off).

The warm-up runs a full prefill chunk, then, while that request decodes, requests that reuse half
of its prompt (extend attention over a cached prefix, in a mixed step) and short fresh prompts
(the decode graphs' flat rows), a few tokens each. Afterwards the prefix cache is emptied and the
scheduler's counters start from zero, so nothing of it shows in cache hits, metrics or the
mixed-chunk cost model. CUDA only, one rank only (tensor-parallel ranks must run identical steps).
"""

from __future__ import annotations

import logging
import random
import time

from radixlm.runtime.request import Req
from radixlm.runtime.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

WARMUP_PROMPT_TOKENS = 4096  # the longest warm-up prompt (within chunked_prefill_size and context)
WARMUP_NEW_TOKENS = 6


def warm_up(scheduler, force: bool = False) -> float:
    """Run the warm-up requests (module docstring) to completion on ``scheduler``.

    Args:
        scheduler: a freshly created :class:`~radixlm.runtime.scheduler.Scheduler` with nothing
            queued or running.
        force: run on any device and TP size, ``skip_server_warmup`` notwithstanding (tests).

    Returns:
        Seconds spent; 0.0 when skipped (not CUDA, ``skip_server_warmup``, ``tp_size > 1``).
    Raises:
        RuntimeError when a warm-up request does not finish normally (a broken model or kernel
        should fail start-up, not the first user request).
    """
    args, runner = scheduler.args, scheduler.runner
    if not force and (runner.device.type != "cuda" or args.skip_server_warmup or args.tp_size > 1):
        return 0.0
    assert not scheduler.has_work(), "warm up a scheduler with nothing queued or running"
    t0 = time.perf_counter()
    rng = random.Random(0)
    hi = max(min(runner.cfg.vocab_size, 32000) - 1, 11)
    ids = lambda n: [rng.randrange(10, hi) for _ in range(n)]  # noqa: E731
    longest = min(WARMUP_PROMPT_TOKENS, args.chunked_prefill_size, runner.context_len // 2, runner.max_total_tokens // 4)
    if longest < 64:  # NOTE: a KV pool or context this small serves toy runs; nothing to warm
        return 0.0
    first = ids(longest)
    later = [first[: longest // 2] + ids(37), first[: longest // 2] + ids(96), ids(100), ids(29)]
    params = SamplingParams(max_new_tokens=WARMUP_NEW_TOKENS, temperature=0, ignore_eos=True)
    reqs = [Req(f"warmup-{i}", p, params) for i, p in enumerate([first] + later)]
    scheduler.add_request(reqs[0])
    scheduler.step()  # NOTE: the prefill chunk; the others then arrive beside its decodes
    for r in reqs[1:]:
        scheduler.add_request(r)
    while scheduler.has_work():
        scheduler.step()
    bad = [r.rid for r in reqs if len(r.output_ids) != WARMUP_NEW_TOKENS]
    if bad:
        raise RuntimeError(f"warm-up requests {bad} did not finish: {[r.finish_reason for r in reqs]}")
    scheduler.flush_cache()
    scheduler.reset_counters()
    took = time.perf_counter() - t0
    logger.info("warm-up: %d requests in %.2f s", len(reqs), took)
    return took
