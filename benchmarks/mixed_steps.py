"""Which steps make a serving run's ITL tail: drive an in-process scheduler (synchronous steps, a
CUDA sync after each) with a serving row's load and report, per step kind (decode / mixed /
prefill), the count, prefill tokens, decode rows and step times, plus the decode-token-weighted
step time (each decode row of a step waits the whole step: its p50 / p99 approximate ITL).

    python benchmarks/mixed_steps.py --model-path /tmp/l8b --tokenizer-path .device/deepseek-llm \\
        --load gsp [--server-arg mixed_chunk_size=1024]

Loads: ``gsp`` (8 groups x 64 prompts, 2,048-token shared prefix + 128 own, 256 out),
``random`` (512 x 1024 / 256) and ``burst`` (128 x 27 / 256: bench_constrained's shape), all
requests at once or ``--arrivals-per-step K`` before each step, dummy weights, greedy,
``ignore_eos``; ``offline`` (512 x 1024 / 512: bench_offline's issue-16 row); ``small`` (2,048 x
256 / 256: the SmolLM2-dims serving row). ``--show N`` prints the
first N steps. ``--server-arg enable_piecewise_cuda_graph=true``: mixed / prefill steps replay
piecewise CUDA graphs (``runtime/piecewise_graph.py``).
"""

from __future__ import annotations

import argparse
import cProfile
import glob
import json
import os
import pstats
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_decode_kernels import kernel_table  # noqa: E402


def loads(name: str, vocab: int, seed: int = 0) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    ids = lambda n: [rng.randrange(10, vocab - 10) for _ in range(n)]  # noqa: E731
    if name == "gsp":
        prefixes = [ids(2048) for _ in range(8)]
        return [(p + ids(128), 256) for _ in range(64) for p in prefixes]
    if name == "burst":
        return [(ids(27), 256) for _ in range(128)]
    if name == "offline":
        return [(ids(1024), 512) for _ in range(512)]
    if name == "small":
        return [(ids(256), 256) for _ in range(2048)]
    return [(ids(1024), 256) for _ in range(512)]


def _profiler():
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--tokenizer-path", required=True)
    ap.add_argument("--load", choices=["gsp", "random", "burst", "offline", "small"], default="gsp")
    ap.add_argument("--arrivals-per-step", type=int, default=0, help="0: every request before the first step")
    ap.add_argument("--show", type=int, default=0, help="print the first N steps")
    ap.add_argument("--vocab", type=int, default=100000)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max-requests", type=int, default=None, help="first N requests of the load (smoke runs)")
    ap.add_argument("--server-arg", action="append", default=[], help="ServerArgs field=value (repeatable)")
    ap.add_argument("--profile-steps", default="", help="comma-separated step numbers to run under torch.profiler "
                    "(kernel table per step: where a mixed or decode step's time goes)")
    ap.add_argument("--cprofile-steps", default="", help="comma-separated step numbers to run under cProfile "
                    "(host functions by own time per step)")
    a = ap.parse_args()
    import torch

    from radixlm.runtime.model_runner import ModelRunner
    from radixlm.runtime.request import Req
    from radixlm.runtime.sampling_params import SamplingParams
    from radixlm.runtime.scheduler import Scheduler
    from radixlm.runtime.server_args import ServerArgs
    from radixlm.runtime.tokenizer import load_tokenizer

    extra = {k: json.loads(v) for k, v in (s.split("=", 1) for s in a.server_arg)}
    args = ServerArgs(model_path=a.model_path, tokenizer_path=a.tokenizer_path, device=a.device,
                      load_format="dummy", context_length=8192, **extra)
    tok, eos = load_tokenizer(a.tokenizer_path, a.model_path)
    t_init = time.perf_counter()
    sched = Scheduler.create(args, ModelRunner(args, a.model_path, eos), tok)
    pw = getattr(sched.runner, "piecewise", None)
    print(f"runner ready in {time.perf_counter() - t_init:.1f} s; piecewise graphs: "
          + (f"{len(pw.sizes)} buckets up to {pw.max_tokens} tokens, captured in {pw.capture_s:.1f} s" if pw else "off")
          + (f"; {torch.cuda.memory_reserved() / 2**30:.2f} GiB reserved by torch" if a.device == "cuda" else ""))
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    picked = []
    select = sched._select_batch
    sched._select_batch = lambda: picked.append(select()) or picked[-1]
    for i, (ids, out) in enumerate(loads("random", a.vocab, seed=1)[:16]):  # warm-up
        sched.add_request(Req(f"w{i}", ids[:300], SamplingParams(max_new_tokens=8, temperature=0, ignore_eos=True)))
    while sched.has_work():
        sched.step()
    sync()
    picked.clear()
    pending = [Req(f"r{i}", ids, SamplingParams(max_new_tokens=out, temperature=0, ignore_eos=True))
               for i, (ids, out) in enumerate(loads(a.load, a.vocab)[: a.max_requests])]
    per_step = a.arrivals_per_step or len(pending)
    cache = os.environ.get("TRITON_CACHE_DIR")
    seen = set(glob.glob(f"{cache}/*/*.json")) if cache else set()
    steps = []
    profiled = {int(k) for k in a.profile_steps.split(",") if k}
    cprofiled = {int(k) for k in a.cprofile_steps.split(",") if k}
    alloc, last = [], (0, 0, 0)
    t_start = time.perf_counter()
    while pending or sched.has_work():
        for r in pending[:per_step]:
            sched.add_request(r)
        del pending[:per_step]
        prof = _profiler() if len(steps) in profiled else None
        cprof = cProfile.Profile() if len(steps) in cprofiled else None
        t0 = time.perf_counter()
        if cprof is not None:
            cprof.runcall(lambda: (sched.step(), sync()))
        elif prof is not None:
            with prof:
                sched.step()
                sync()
        else:
            sched.step()
            sync()
        if a.device == "cuda":  # NOTE: cudaMalloc / cudaFree calls and allocator retries (each may sync)
            m = torch.cuda.memory_stats()
            now = tuple(m.get(k, 0) for k in ("num_device_alloc", "num_device_free", "num_alloc_retries"))
            alloc.append(tuple(x - y for x, y in zip(now, last)))
            last = now
        b = picked[-1] if picked else None
        if b is not None:
            dec = len(b.slices) if b.mode.name == "DECODE" else b.num_decode
            pre = 0 if b.mode.name == "DECODE" else b.num_tokens - b.num_decode
            kind = "decode" if pre == 0 else ("mixed" if dec else "prefill")
            steps.append((kind, pre, dec, (time.perf_counter() - t0) * 1e3))
        if cprof is not None and steps:
            print(f"cProfiled step {len(steps) - 1} {steps[-1]}")
            st = pstats.Stats(cprof)
            st.sort_stats("tottime").print_stats(22)
            st.sort_stats("cumulative").print_stats(22)
        if prof is not None and steps:
            print(f"profiled step {len(steps) - 1} {steps[-1]}")
            kernel_table(prof, 1, steps[-1][3] * 1e3, sched.runner.cfg.num_hidden_layers, 14)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
        if cache:  # NOTE: Triton kernels compiled during this step (new cache entries)
            new = set(glob.glob(f"{cache}/*/*.json")) - seen
            seen |= new
            for f in sorted(n for n in new if not os.path.basename(n).startswith("__grp__")):
                meta = json.load(open(f))
                print("compiled in step", len(steps), steps[-1] if steps else None, meta.get("name"),
                      {k: v for k, v in meta.items() if k in ("constants", "specialization", "attrs")})
    total = time.perf_counter() - t_start
    for k, st in enumerate(steps[: a.show]):
        print("step", k, st, "allocator:", alloc[k] if k < len(alloc) else "")
    print(f"load {a.load}, args {extra}: {len(steps)} steps, {total:.2f} s")
    print("| kind | steps | prefill tokens p50 / max | decode rows p50 | step ms p50 / p90 / max | seconds |")
    print("|---|---|---|---|---|---|")
    for kind in ("decode", "mixed", "prefill"):
        got = [s for s in steps if s[0] == kind]
        if got:
            print(f"| {kind} | {len(got)} | {pct([s[1] for s in got], .5)} / {max(s[1] for s in got)} | "
                  f"{pct([s[2] for s in got], .5)} | {pct([s[3] for s in got], .5):.1f} / "
                  f"{pct([s[3] for s in got], .9):.1f} / {max(s[3] for s in got):.1f} | "
                  f"{sum(s[3] for s in got) / 1e3:.2f} |")
    weighted = [ms for _, _, dec, ms in steps for _ in range(dec)]
    p50, p99 = pct(weighted, .5), pct(weighted, .99)
    print(f"decode-token-weighted step time p50 {p50:.1f} ms, p99 {p99:.1f} ms, p99/p50 {p99 / p50:.2f}")
    slow = [s for s in steps if s[2] and s[3] >= p99]
    print("steps at or over that p99 (kind, prefill tokens, decode rows, ms):", slow[:12])


if __name__ == "__main__":
    main()
