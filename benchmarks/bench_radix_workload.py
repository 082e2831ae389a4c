"""Radix-cache workload benchmark (issue 3): shared system prompt vs no sharing, same run.

64 requests share a 1,024-token system prompt, each with a distinct 64-token question and a
32-token answer (random token ids, ``ignore_eos``), on the CPU tiny model by default. Reports
throughput and cache hit rate with the cache on (lpm, fcfs) and off, the optimum hit rate (the
shared fraction of prompt tokens), and the overhead of the cache at 0% hit rate.

    python benchmarks/bench_radix_workload.py [--model-path PATH] [--device cpu]
"""

from __future__ import annotations

import argparse
import random
import time

from radixlm.runtime.engine import Engine


def workload(n: int, system_len: int, question_len: int, vocab: int, shared: bool, seed: int = 0):
    rng = random.Random(seed)
    system = [rng.randrange(10, vocab - 10) for _ in range(system_len)]
    prompts = []
    for _ in range(n):
        head = system if shared else [rng.randrange(10, vocab - 10) for _ in range(system_len)]
        prompts.append(head + [rng.randrange(10, vocab - 10) for _ in range(question_len)])
    return prompts


def run(path: str | None, prompts, output_len: int, device: str, **server_args) -> tuple[float, float]:
    sp = {"max_new_tokens": output_len, "temperature": 0, "ignore_eos": True}
    total = sum(len(p) + output_len for p in prompts) + 1024
    with Engine(path, device=device, max_total_tokens=total, **server_args) as engine:
        engine.generate(input_ids=[[11, 12, 13]], sampling_params={**sp, "max_new_tokens": 2})  # warm-up
        t0 = time.perf_counter()
        engine.generate(input_ids=prompts, sampling_params=sp)
        dt = time.perf_counter() - t0
        info = engine.get_server_info()
        hit = (info["cached_tokens"]) / max(info["prompt_tokens"] - 3, 1)
    return len(prompts) * output_len / dt, hit


def workload_report(model_path: str | None = None, device: str = "cpu", num_requests: int = 64,
                    system_len: int = 1024, question_len: int = 64, output_len: int = 32) -> str:
    """Run the five configurations and return the markdown table."""
    vocab = 2000
    shared = workload(num_requests, system_len, question_len, vocab, shared=True)
    distinct = workload(num_requests, system_len, question_len, vocab, shared=False)
    optimum = (num_requests - 1) * system_len / sum(len(p) for p in shared)
    rows = []
    for name, prompts, kw in [
        ("shared prefix, cache off", shared, {"disable_radix_cache": True}),
        ("shared prefix, cache on (lpm)", shared, {"schedule_policy": "lpm"}),
        ("shared prefix, cache on (fcfs)", shared, {"schedule_policy": "fcfs"}),
        ("distinct prompts, cache off", distinct, {"disable_radix_cache": True}),
        ("distinct prompts, cache on (lpm)", distinct, {"schedule_policy": "lpm"}),
    ]:
        tput, hit = run(model_path, prompts, output_len, device, **kw)
        rows.append((name, tput, hit))
    lines = [
        f"## Engine workload ({device}): {num_requests} requests, {system_len}-token system prompt + "
        f"{question_len}-token question, {output_len}-token answer; optimum hit rate {optimum:.1%}",
        "",
        "| configuration | output tok/s | hit rate | vs cache off |",
        "|---|---|---|---|",
    ]
    base = {"shared": rows[0][1], "distinct": rows[3][1]}
    for name, tput, hit in rows:
        ref = base["shared" if name.startswith("shared") else "distinct"]
        lines.append(f"| {name} | {tput:,.1f} | {hit:.1%} | {tput / ref:.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--system-len", type=int, default=1024)
    ap.add_argument("--question-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    args = ap.parse_args()
    print(workload_report(args.model_path, args.device, args.num_requests, args.system_len,
                          args.question_len, args.output_len))


if __name__ == "__main__":
    main()
