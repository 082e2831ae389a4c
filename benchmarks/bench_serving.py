"""Online serving benchmark: an async load generator for any server speaking the SGLang-native
(``/generate``) or OpenAI (``/v1/completions``) API.

Requests arrive as a Poisson process (``--request-rate R``), at a fixed rate (``--fixed-rate``) or
all at once (``inf``). Datasets: ``random`` (random token ids, input/output lengths drawn from
``[len * ratio, len]``) and ``generated-shared-prefix`` (``--gsp-num-groups`` groups of prompts
that share a long system prompt: the case the radix cache is for). Prompts are sent as token ids
so lengths are exact; outputs use ``ignore_eos`` so they are exactly as long as asked.

Reports request and token throughput, TTFT, ITL and end-to-end latency (mean, p50, p99), and the
server's prefix-cache hit rate over the run (from ``/get_server_info`` when the server has it).

    python benchmarks/bench_serving.py --base-url http://127.0.0.1:30000 \\
        --dataset generated-shared-prefix --num-prompts 64 --request-rate 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import aiohttp
import numpy as np


@dataclass
class Result:
    ok: bool = False
    prompt_len: int = 0
    output_len: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    chunk_t: list[float] = field(default_factory=list)  # perf_counter of each chunk with new tokens
    error: str = ""


# ---------------------------------------------------------------- datasets
def random_dataset(rng: random.Random, n: int, in_len: int, out_len: int, ratio: float, vocab: int):
    """``n`` (prompt ids, output len) with lengths uniform in ``[len * ratio, len]``."""
    out = []
    for _ in range(n):
        li = rng.randint(max(int(in_len * ratio), 1), in_len)
        lo = rng.randint(max(int(out_len * ratio), 1), out_len)
        out.append(([rng.randrange(vocab) for _ in range(li)], lo))
    return out


def shared_prefix_dataset(rng: random.Random, groups: int, per_group: int, sys_len: int, q_len: int,
                          out_len: int, vocab: int):
    """``groups * per_group`` prompts; each group shares a ``sys_len``-token system prompt."""
    out = []
    for _ in range(groups):
        system = [rng.randrange(vocab) for _ in range(sys_len)]
        for _ in range(per_group):
            out.append((system + [rng.randrange(vocab) for _ in range(q_len)], out_len))
    rng.shuffle(out)
    return out


# ---------------------------------------------------------------- clients
async def _sse(resp: aiohttp.ClientResponse):
    async for raw in resp.content:
        line = raw.strip()
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            yield json.loads(data)


async def send_native(session, url: str, ids: list[int], out_len: int, headers: dict) -> Result:
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": out_len, "temperature": 0.0, "ignore_eos": True}}
    res, t0 = Result(prompt_len=len(ids)), time.perf_counter()
    last, seen = t0, 0
    async with session.post(url + "/generate", json=body, headers=headers) as resp:
        if resp.status != 200:
            res.error = await resp.text()
            return res
        async for chunk in _sse(resp):
            if "error" in chunk:
                res.error = str(chunk["error"])
                return res
            n = chunk["meta_info"]["completion_tokens"]
            now = time.perf_counter()
            if n > seen:
                res.chunk_t.append(now)
                if seen == 0:
                    res.ttft = now - t0
                else:
                    res.itl.extend([(now - last) / (n - seen)] * (n - seen))
                last, seen = now, n
    res.ok, res.output_len, res.e2e = seen > 0 or out_len == 0, seen, time.perf_counter() - t0
    return res


async def send_openai(session, url: str, ids: list[int], out_len: int, headers: dict, model: str) -> Result:
    body = {"model": model, "prompt": ids, "max_tokens": out_len, "temperature": 0.0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    res, t0 = Result(prompt_len=len(ids)), time.perf_counter()
    last, chunks = t0, 0
    async with session.post(url + "/v1/completions", json=body, headers=headers) as resp:
        if resp.status != 200:
            res.error = await resp.text()
            return res
        async for chunk in _sse(resp):
            if chunk.get("usage"):
                res.output_len = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                now = time.perf_counter()
                res.chunk_t.append(now)
                if chunks == 0:
                    res.ttft = now - t0
                else:
                    res.itl.append(now - last)
                last, chunks = now, chunks + 1
    res.ok, res.e2e = True, time.perf_counter() - t0
    res.output_len = res.output_len or chunks
    return res


# ---------------------------------------------------------------- driver
async def _get_json(session, url: str, headers: dict) -> dict | None:
    try:
        async with session.get(url, headers=headers) as resp:
            return await resp.json() if resp.status == 200 else None
    except aiohttp.ClientError:
        return None


async def _drive(base_url: str, jobs: list[tuple[list[int], int, float]], backend: str, headers: dict, model: str,
                 timeout: float, concurrency: int, start=None) -> tuple[list[Result], float, float, float]:
    """Send ``jobs`` (prompt ids, output length, arrival offset in seconds) from one event loop;
    returns the results, the start time (perf_counter), the duration and this process's CPU
    seconds. ``start()`` (if given) is called once the session is ready, right before the clock
    starts (the processes of a multi-process client wait on a barrier there)."""
    # NOTE: aiohttp's default connector opens at most 100 connections at once, which silently capped
    # every "all at once" load at 100 concurrent requests; concurrency is --max-concurrency's job.
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout), connector=connector) as session:
        sem = asyncio.Semaphore(max(1, concurrency))

        async def one(ids, out_len, offset, t0):
            delay = t0 + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            async with sem:
                try:
                    if backend == "openai":
                        return await send_openai(session, base_url, ids, out_len, headers, model)
                    return await send_native(session, base_url, ids, out_len, headers)
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    return Result(prompt_len=len(ids), error=repr(e))

        if start is not None:
            start()
        t0, cpu0 = time.perf_counter(), time.process_time()
        results = await asyncio.gather(*(one(ids, n, off, t0) for ids, n, off in jobs))
        return list(results), t0, time.perf_counter() - t0, time.process_time() - cpu0


def _child(k, jobs, base_url, backend, headers, model, timeout, concurrency, barrier, out) -> None:
    """Process ``k`` of a multi-process client: drive ``jobs``, put ``(k, results, cpu s)`` on ``out``."""
    results, _, _, cpu = asyncio.run(_drive(base_url, jobs, backend, headers, model, timeout, concurrency,
                                            start=barrier.wait))
    out.put((k, results, cpu))


def _drive_processes(args, jobs, headers: dict, model: str, n: int) -> tuple[list[Result], float, float]:
    """``jobs`` dealt round-robin to ``n`` spawned processes, which start on
    one barrier (their clocks agree: perf_counter is CLOCK_MONOTONIC); returns the results in job
    order, the duration and the CPU seconds of all the processes. ``--max-concurrency`` is split
    evenly between them."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(n + 1), ctx.Queue()
    conc = -(-(args.max_concurrency or len(jobs) or 1) // n)
    procs = [ctx.Process(target=_child, args=(k, jobs[k::n], args.base_url, args.backend, headers, model,
                                              args.timeout, conc, barrier, out), daemon=True) for k in range(n)]
    for p in procs:
        p.start()
    barrier.wait(timeout=300)
    t0 = time.perf_counter()
    got = [out.get(timeout=args.timeout) for _ in procs]
    duration = time.perf_counter() - t0
    for p in procs:
        p.join()
    results: list[Result] = [Result()] * len(jobs)
    for k, shard, _ in got:
        results[k::n] = shard
    return results, duration, sum(c for _, _, c in got)


async def run(args) -> dict:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        info = await _get_json(session, args.base_url + "/get_server_info", headers) or {}
        model_info = await _get_json(session, args.base_url + "/get_model_info", headers) or {}
        vocab = args.vocab_size or info.get("vocab_size") or 32000
        rng = random.Random(args.seed)
        if args.dataset == "random":
            reqs = random_dataset(rng, args.num_prompts, args.random_input_len, args.random_output_len,
                                  args.random_range_ratio, vocab)
        else:
            reqs = shared_prefix_dataset(rng, args.gsp_num_groups, args.gsp_prompts_per_group,
                                         args.gsp_system_prompt_len, args.gsp_question_len, args.gsp_output_len, vocab)
        if args.flush_cache:
            async with session.post(args.base_url + "/flush_cache", headers=headers) as resp:
                await resp.read()
        before = await _get_json(session, args.base_url + "/get_server_info", headers) or {}
    model = model_info.get("served_model_name") or model_info.get("model_path") or "default"
    arrivals = np.random.default_rng(args.seed)
    jobs, offset = [], 0.0
    for ids, out_len in reqs:
        jobs.append((ids, out_len, offset))
        if args.request_rate != float("inf"):
            offset += 1.0 / args.request_rate if args.fixed_rate else arrivals.exponential(1.0 / args.request_rate)
    # NOTE: --max-concurrency caps the processes (one request at a time is one process)
    n = min(args.client_processes, args.max_concurrency or len(jobs), max(1, len(jobs)))
    if n > 1:
        results, duration, cpu = await asyncio.get_running_loop().run_in_executor(
            None, _drive_processes, args, jobs, headers, model, n)
    else:
        results, _, duration, cpu = await _drive(args.base_url, jobs, args.backend, headers, model, args.timeout,
                                                 args.max_concurrency or len(jobs) or 1)
    args.client_cpu_share = cpu / duration
    args.results = results
    async with aiohttp.ClientSession(timeout=timeout) as session:
        after = await _get_json(session, args.base_url + "/get_server_info", headers) or {}
    return summarize(args, results, duration, before, after)


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) * 1000 if xs else float("nan")


def summarize(args, results: list[Result], duration: float, before: dict, after: dict) -> dict:
    ok = [r for r in results if r.ok]
    itl = [x for r in ok for x in r.itl]
    hit = None
    if "prompt_tokens" in after and "cached_tokens" in after:
        dp = after["prompt_tokens"] - before.get("prompt_tokens", 0)
        hit = (after["cached_tokens"] - before.get("cached_tokens", 0)) / dp if dp else 0.0
    return {
        "backend": args.backend, "dataset": args.dataset, "request_rate": args.request_rate,
        "completed": len(ok), "failed": len(results) - len(ok),
        "first_error": next((r.error for r in results if not r.ok), ""),
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "input_throughput": sum(r.prompt_len for r in ok) / duration,
        "output_throughput": sum(r.output_len for r in ok) / duration,
        "ttft_mean_ms": float(np.mean([r.ttft for r in ok])) * 1000 if ok else float("nan"),
        "ttft_p50_ms": _pct([r.ttft for r in ok], 50), "ttft_p99_ms": _pct([r.ttft for r in ok], 99),
        "itl_p50_ms": _pct(itl, 50), "itl_p99_ms": _pct(itl, 99),
        "e2e_p50_ms": _pct([r.e2e for r in ok], 50), "e2e_p99_ms": _pct([r.e2e for r in ok], 99),
        "server_cache_hit_rate": hit,
        # NOTE: CPU seconds of all client processes per second; near 1.0 per process the client
        # itself is saturated, and its queueing shows up in TTFT / ITL (see --client-processes)
        "client_cpu_share": getattr(args, "client_cpu_share", None),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:30000")
    p.add_argument("--backend", choices=["native", "openai"], default="native")
    p.add_argument("--api-key", default=None)
    p.add_argument("--dataset", choices=["random", "generated-shared-prefix"], default="random")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--random-input-len", type=int, default=256)
    p.add_argument("--random-output-len", type=int, default=64)
    p.add_argument("--random-range-ratio", type=float, default=0.5)
    p.add_argument("--gsp-num-groups", type=int, default=4)
    p.add_argument("--gsp-prompts-per-group", type=int, default=16)
    p.add_argument("--gsp-system-prompt-len", type=int, default=512)
    p.add_argument("--gsp-question-len", type=int, default=32)
    p.add_argument("--gsp-output-len", type=int, default=32)
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (inf: all at once)")
    p.add_argument("--fixed-rate", action="store_true", help="fixed gaps instead of Poisson arrivals")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--client-processes", type=int, default=1,
                   help="load-generator processes (requests dealt round-robin): one Python event loop "
                        "parsing hundreds of streams reads them late and in bursts")
    p.add_argument("--vocab-size", type=int, default=None, help="default: the server's, else 32000")
    p.add_argument("--flush-cache", action="store_true", help="flush the server's prefix cache first")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--output-file", default=None, help="append the summary as one JSON line")
    p.add_argument("--chunk-log", default=None,
                   help="write each request's chunk arrival times (perf_counter, i.e. CLOCK_MONOTONIC) as JSON "
                        "lines, for benchmarks/itl_tail.py beside a server traced with RADIXLM_TRACE_DIR")
    args = p.parse_args(argv)
    summary = asyncio.run(run(args))
    if args.chunk_log:
        with open(args.chunk_log, "w") as f:
            for i, r in enumerate(args.results):
                f.write(json.dumps({"req": i, "ok": r.ok, "t": r.chunk_t}) + "\n")
    for k, v in summary.items():
        print(f"{k:>22}: {v:.3f}" if isinstance(v, float) else f"{k:>22}: {v}")
    if args.output_file:
        with open(args.output_file, "a") as f:
            f.write(json.dumps(summary) + "\n")
    return summary


if __name__ == "__main__":
    main()
