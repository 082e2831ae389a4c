"""Robustness benchmark (issue 13): hostile traffic against a live server.

Phases, all against one server (tiny random model by default; ``--model-path`` for another):

1. quiet: latency of normal greedy requests (the reference p99);
2. fuzz: ``--fuzz`` requests with malformed JSON, wrong types, extreme numbers, deep nesting,
   invalid Unicode, bad grammars and bad tools over /generate, /v1/completions, /v1/chat/completions;
3. streams: ``--streams`` concurrent streaming requests, ``--disconnect`` of them dropped by the
   client after the first chunk;
4. grammar storm: ``--storm`` requests with huge, slow EBNF grammars while normal traffic runs
   (normal p99 during the storm vs quiet).

Prints counts by HTTP status, hangs (no answer within ``--hang-s``), connection resets, leaked KV
slots and request rows (after the server is idle and its cache flushed), and the p99s.
``--out`` appends a markdown section to a results file.

    python benchmarks/bench_robustness.py --fuzz 10000 --streams 500 --storm 8
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import random
import sys
import time

import aiohttp

NORMAL = {"text": "def main():", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
EXTREME = [-1, 0, 1, 2**31, 2**63, 2**64, 10**12, -(2**63), 1e-300, 1e300, math.inf, -math.inf, math.nan, True,
           None, "", "\ud800", "x" * 300, [], {}, [1, "a"], {"a": {"b": [None]}}, 0.5, 7]
SAMPLING = ["max_new_tokens", "min_new_tokens", "n", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p",
            "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "ignore_eos", "regex",
            "json_schema", "ebnf", "seed"]
TOP = ["text", "input_ids", "return_logprob", "logprob_start_len", "top_logprobs_num", "rid", "stream"]
OPENAI = ["n", "max_tokens", "temperature", "top_p", "logprobs", "top_logprobs", "stop", "seed", "prompt", "messages",
          "tools", "tool_choice", "response_format", "chat_template_kwargs", "echo", "stop_token_ids"]
BAD_GRAMMARS = [("regex", "a**"), ("regex", "("), ("regex", "x{99999}"), ("json_schema", {"type": "array", "minItems": -5}),
                ("json_schema", "not json"), ("json_schema", {"$ref": "#/x"}), ("ebnf", "root: ("), ("ebnf", "x: 1"),
                ("stop_regex", "[z-a]"), ("regex", "[a-z]{1,3}"), ("json_schema", {"type": "integer"})]


def fuzz_body(rng: random.Random) -> tuple[str, bytes]:
    """One hostile request: ``(path, body bytes)``."""
    kind = rng.randrange(7)
    if kind == 0:
        return rng.choice(["/generate", "/v1/completions", "/v1/chat/completions"]), rng.randbytes(rng.randrange(60))
    if kind == 1:
        depth = rng.choice([50, 300, 1000, 5000])
        return "/generate", ('{"text": ' + "[" * depth + "]" * depth + "}").encode()
    if kind == 2:
        body = {"text": rng.choice(["hi", "\ud800", "a\udfffb", "🙂"]), "sampling_params": {"max_new_tokens": 4}}
        body["sampling_params"][rng.choice(SAMPLING)] = rng.choice(EXTREME)
    elif kind == 3:
        body = {"text": "hi", "sampling_params": {"max_new_tokens": 4}, rng.choice(TOP): rng.choice(EXTREME)}
    elif kind == 4:
        field, value = rng.choice(BAD_GRAMMARS)
        body = {"text": "hi", "sampling_params": {"max_new_tokens": 4, field: value}}
    elif kind == 5:
        path = rng.choice(["/v1/completions", "/v1/chat/completions"])
        body = {"model": "m", "max_tokens": 4, "stream": rng.random() < 0.3}
        body["prompt" if path == "/v1/completions" else "messages"] = (
            "hi" if path == "/v1/completions" else [{"role": "user", "content": "hi"}])
        field, value = rng.choice(OPENAI), rng.choice(EXTREME)
        if field != "max_tokens" or value is not None:  # NOTE: no max_tokens = up to the context: long
            body[field] = value
        if isinstance(body.get("max_tokens"), int) and 8 < body["max_tokens"] < 2**31:
            body["max_tokens"] = 8
        return path, json.dumps(body, allow_nan=True).encode()
    else:
        body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": rng.choice(["f", "", "\ud800", 5]),
                                                            "parameters": rng.choice(EXTREME + [{"type": "object"}])}}],
                "tool_choice": rng.choice(["auto", "required", "none", "bogus", {"type": "function"}])}
        return "/v1/chat/completions", json.dumps(body, allow_nan=True).encode()
    for k, v in list(body.get("sampling_params", {}).items()):
        if k == "max_new_tokens" and isinstance(v, int) and 8 < v < 2**31:
            body["sampling_params"][k] = 8  # NOTE: valid lengths stay short
    return "/generate", json.dumps(body, allow_nan=True).encode()


class Tally:
    def __init__(self) -> None:
        self.status: collections.Counter = collections.Counter()
        self.hangs = 0
        self.resets = 0

    async def send(self, session: aiohttp.ClientSession, url: str, data: bytes, hang_s: float) -> int | None:
        try:
            async with session.post(url, data=data, headers={"Content-Type": "application/json"},
                                    timeout=aiohttp.ClientTimeout(total=hang_s)) as res:
                await res.read()
                self.status[res.status] += 1
                return res.status
        except asyncio.TimeoutError:
            self.hangs += 1
        except aiohttp.ClientError:
            self.resets += 1
        return None


def p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))] if xs else float("nan")


async def normal_latencies(session, url: str, count: int, concurrency: int, hang_s: float) -> list[float]:
    out: list[float] = []
    sem = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with sem:
            t0 = time.perf_counter()
            async with session.post(url + "/generate", json=NORMAL, timeout=aiohttp.ClientTimeout(total=hang_s)) as r:
                await r.read()
                assert r.status == 200, await r.text()
            out.append(time.perf_counter() - t0)

    await asyncio.gather(*(one() for _ in range(count)))
    return out


async def fuzz(session, url: str, n: int, concurrency: int, hang_s: float, seed: int) -> Tally:
    tally, rng, sem = Tally(), random.Random(seed), asyncio.Semaphore(concurrency)
    bodies = [fuzz_body(rng) for _ in range(n)]

    async def one(path: str, data: bytes) -> None:
        async with sem:
            await tally.send(session, url + path, data, hang_s)

    await asyncio.gather(*(one(p, d) for p, d in bodies))
    return tally


async def streams(session, url: str, n: int, disconnect: float, hang_s: float, seed: int) -> dict:
    rng = random.Random(seed)
    stats = collections.Counter()

    async def one(drop: bool) -> None:
        body = {"text": "for i in range(", "stream": True, "sampling_params": {"max_new_tokens": 16, "temperature": 0}}
        try:
            async with session.post(url + "/generate", json=body, timeout=aiohttp.ClientTimeout(total=hang_s)) as res:
                stats[f"status_{res.status}"] += 1
                async for line in res.content:
                    if drop and line.startswith(b"data:"):
                        stats["disconnected"] += 1
                        return  # NOTE: leaving the context closes the connection mid-stream
                    if line.strip() == b"data: [DONE]":
                        stats["completed"] += 1
        except asyncio.TimeoutError:
            stats["hangs"] += 1
        except aiohttp.ClientError:
            stats["resets"] += 1

    await asyncio.gather(*(one(rng.random() < disconnect) for _ in range(n)))
    return dict(stats)


def storm_grammar(i: int, words: int) -> str:
    return "root: " + " ".join(f'"s{i}w{k}"' for k in range(words))


async def grammar_storm(session, url: str, n: int, words: int, normal: int, hang_s: float) -> tuple[Tally, list[float]]:
    tally = Tally()
    bodies = [json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 4, "ebnf": storm_grammar(i, words)}}).encode()
              for i in range(n)]
    storm = asyncio.gather(*(tally.send(session, url + "/generate", b, hang_s) for b in bodies))
    await asyncio.sleep(0.5)  # NOTE: the compiles are running when the normal traffic starts
    lat = await normal_latencies(session, url, normal, 4, hang_s)
    await storm
    return tally, lat


async def leaks(session, url: str) -> dict:
    for _ in range(100):
        async with session.post(url + "/flush_cache") as r:
            if r.status == 200:
                break
        await asyncio.sleep(0.2)
    async with session.get(url + "/get_server_info") as r:
        info = await r.json()
    return {"leaked_kv_slots": info["max_total_num_tokens"] - info["kv_available_tokens"],
            "leaked_req_rows": info["req_rows_total"] - info["req_rows_available"]}


async def main_async(args, url: str) -> dict:
    conn = aiohttp.TCPConnector(limit=max(args.streams, args.concurrency) + 16)
    async with aiohttp.ClientSession(connector=conn) as session:
        await normal_latencies(session, url, 4, 1, args.hang_s)  # warm-up
        quiet = await normal_latencies(session, url, args.normal, 4, args.hang_s)
        t0 = time.perf_counter()
        fz = await fuzz(session, url, args.fuzz, args.concurrency, args.hang_s, args.seed)
        fuzz_s = time.perf_counter() - t0
        st = await streams(session, url, args.streams, args.disconnect, args.hang_s, args.seed)
        storm, during = await grammar_storm(session, url, args.storm, args.storm_words, args.normal, args.hang_s)
        leak = await leaks(session, url)
    return {"quiet_p99_s": p99(quiet), "storm_p99_s": p99(during), "fuzz": fz, "fuzz_s": fuzz_s, "streams": st,
            "storm": storm, **leak}


def report(res: dict, args) -> str:
    fz, storm = res["fuzz"], res["storm"]
    five = sum(v for k, v in fz.status.items() if k >= 500) + sum(v for k, v in storm.status.items() if k >= 500)
    lines = [
        f"fuzz: {args.fuzz} requests in {res['fuzz_s']:.1f} s; by status {dict(sorted(fz.status.items()))}; "
        f"hangs {fz.hangs}; resets {fz.resets}",
        f"streams: {args.streams} concurrent, {args.disconnect:.0%} disconnecting: {res['streams']}",
        f"grammar storm: {args.storm} EBNF grammars of {args.storm_words} words: by status "
        f"{dict(sorted(storm.status.items()))}; hangs {storm.hangs}; resets {storm.resets}",
        f"normal p99: quiet {res['quiet_p99_s'] * 1e3:.0f} ms, during the storm {res['storm_p99_s'] * 1e3:.0f} ms "
        f"(ratio {res['storm_p99_s'] / res['quiet_p99_s']:.2f})",
        f"5xx: {five}; leaked KV slots: {res['leaked_kv_slots']}; leaked request rows: {res['leaked_req_rows']}",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="an already running server (default: start one on the tiny model)")
    ap.add_argument("--model-path", help="model for the started server (default: the tiny random model)")
    ap.add_argument("--fuzz", type=int, default=10_000)
    ap.add_argument("--streams", type=int, default=500)
    ap.add_argument("--disconnect", type=float, default=0.2)
    ap.add_argument("--storm", type=int, default=8)
    ap.add_argument("--storm-words", type=int, default=3000)
    ap.add_argument("--normal", type=int, default=40, help="normal requests per latency sample")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--hang-s", type=float, default=120.0)
    ap.add_argument("--grammar-timeout-s", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="append a markdown section to this file")
    args = ap.parse_args()
    srv = None
    url = args.url
    if url is None:
        from radixlm.runtime.server.testing import ServerProcess
        from radixlm.runtime.tiny_model import tiny_model_path

        srv = ServerProcess(["--model-path", args.model_path or tiny_model_path(), "--grammar-compile-timeout-s",
                             str(args.grammar_timeout_s), "--max-running-requests", "64"], ready_timeout=600)
        url = srv.url
    try:
        res = asyncio.run(main_async(args, url))
    finally:
        if srv is not None:
            srv.stop()
    text = report(res, args)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(f"\n## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n`python {' '.join(sys.argv)}`\n\n")
            f.write("".join(f"- {line}\n" for line in text.splitlines()))


if __name__ == "__main__":
    main()
