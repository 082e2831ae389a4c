"""Admission-step benchmark (issue 16): one prefill-batch selection with thousands of waiting requests.

CPU only, no model: the scheduler runs over a fake runner (real KV allocator and req_to_token pool,
no forward pass); only ``Scheduler._get_prefill_batch()`` is timed. The prefix cache holds
``--systems`` system prompts; every waiting request is one of them plus a unique suffix (plus, for
a quarter of them, a few already generated tokens: retracted requests). ``--running`` requests are
already running (their remaining tokens are reserved at every admission).

Cases, per schedule policy (``lpm`` falls back to ``fcfs`` above 128 waiting requests):

* ``admit``: the step admits requests until the token budget (``--budget``) is spent;
* ``blocked``: the KV pool is full, nothing is admitted (the policy still orders the queue);
  ``step 1`` is the first step on a new queue, ``step 2`` the next one with nothing changed.

``--baseline-rev REV`` also times the scheduler's admission, policy and ``radix/`` as they were at
git revision ``REV`` (copied from ``git show`` into a temporary package), in the same run on the
same inputs (alternating with this version), and checks that both admit the same requests in the
same order with the same slices.

Usage:
    python benchmarks/bench_admission.py [--waiting 2048] [--iters 15] [--baseline-rev REV]
        [--policies lpm,fcfs,dfs-weight] [--out FILE]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from baseline_tree import load_baseline  # noqa: E402  (same directory)

from radixlm.runtime.memory import ReqToTokenPool, TokenToKVPoolAllocator  # noqa: E402
from radixlm.runtime.request import Req  # noqa: E402
from radixlm.runtime.sampling_params import SamplingParams  # noqa: E402
from radixlm.runtime.scheduler import Scheduler  # noqa: E402
from radixlm.runtime.server_args import ServerArgs  # noqa: E402

VOCAB = 32000


def make_workload(args: argparse.Namespace) -> dict:
    """Token ids of the system prompts, the waiting requests (prompt, output) and running ones."""
    rng = random.Random(args.seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(VOCAB) for _ in range(n)]

    systems = [ids(args.system_len) for _ in range(args.systems)]
    waiting = []
    for i in range(args.waiting):
        prompt = rng.choice(systems) + ids(rng.randint(args.suffix_len // 2, args.suffix_len))
        waiting.append((prompt, ids(rng.randint(1, 8)) if i % 4 == 3 else []))
    return {"systems": systems, "waiting": waiting, "running": [ids(64) for _ in range(args.running)]}


def build(work: dict, args: argparse.Namespace, policy: str, blocked: bool, impl) -> Scheduler:
    """A scheduler (of ``impl``: None = this version, else the baseline package) with the
    system prompts cached, the running requests holding KV and every waiting request queued."""
    pool = args.pool
    runner = SimpleNamespace(
        allocator=TokenToKVPoolAllocator(pool), context_len=1 << 16, eos_token_ids=[],
        req_to_token_pool=ReqToTokenPool(args.running + args.waiting + 2, 4096),
        cfg=SimpleNamespace(vocab_size=VOCAB), max_running_requests=args.running + args.max_admit,
    )
    sargs = ServerArgs(device="cpu", schedule_policy=policy, chunked_prefill_size=args.budget,
                       max_prefill_tokens=args.budget, enable_mixed_chunk=False, max_total_tokens=pool)
    if impl is None:
        sched = Scheduler(sargs, runner, None)
    else:
        cls = type("BaselineScheduler", (impl.scheduler_admission.PrefillAdmission, Scheduler), {})
        sched = cls(sargs, runner, None)
        sched.tree_cache = impl.radix.cache.RadixCache(runner.allocator, req_to_token_pool=runner.req_to_token_pool)
        sched.policy = impl.schedule_policy.SchedulePolicy(policy, sched.tree_cache)
    alloc, cache = runner.allocator, sched.tree_cache
    for seq in work["systems"]:
        cache.insert(list(seq), alloc.alloc(len(seq)))
    for i, ids in enumerate(work["running"]):
        req = Req(rid=f"run{i}", origin_input_ids=list(ids), sampling_params=SamplingParams(max_new_tokens=256))
        req.max_total, req.output_ids = len(ids) + 256, [1] * (i % 200)
        req.req_pool_idx = runner.req_to_token_pool.alloc()
        sched.running.append(req)
    alloc.alloc(args.running * 64)  # NOTE: the running requests' KV
    for i, (prompt, out) in enumerate(work["waiting"]):
        req = Req(rid=f"w{i}", origin_input_ids=list(prompt), sampling_params=SamplingParams(max_new_tokens=128))
        sched.add_request(req)
        req.output_ids = list(out)  # NOTE: as a retracted request
    if blocked:  # NOTE: leave less free KV than any request needs (nothing evictable either)
        cache.inc_lock_ref(cache.root_node)
        for seq in work["systems"]:
            cache.inc_lock_ref(cache.match_prefix(list(seq)).last_node)
        alloc.alloc(alloc.available_size() - 8)
    return sched


def run_case(work, args, policy: str, blocked: bool, impls: list) -> list[tuple[list, list, list]]:
    """Times ``_get_prefill_batch`` twice per fresh scheduler, ``--iters`` schedulers per
    implementation, the implementations alternating (rotating order) in each iteration. Returns,
    per implementation, the samples (ns) of the first and second step and the first step's
    admitted ``(rid, start, end)`` slices."""
    out = [([], [], None) for _ in impls]
    clock = time.perf_counter_ns
    for it in range(args.iters):
        for k in range(len(impls)):
            j = (k + it) % len(impls)
            sched = build(work, args, policy, blocked, impls[j][1])
            gc.collect()
            gc.disable()
            t = clock()
            batch = sched._get_prefill_batch()
            out[j][0].append(clock() - t)
            t = clock()
            sched._get_prefill_batch()
            out[j][1].append(clock() - t)
            gc.enable()
            slices = [] if batch is None else [(s.req.rid, s.start, s.end) for s in batch.slices]
            out[j] = (out[j][0], out[j][1], slices)
    return out


def stats(samples: list[int]) -> tuple[float, float]:
    ms = sorted(s / 1e6 for s in samples)
    return statistics.median(ms), ms[int(0.9 * (len(ms) - 1))]


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--waiting", type=int, default=2048, help="waiting requests")
    ap.add_argument("--running", type=int, default=256, help="requests already running")
    ap.add_argument("--systems", type=int, default=32, help="cached system prompts")
    ap.add_argument("--system-len", type=int, default=512)
    ap.add_argument("--suffix-len", type=int, default=256, help="longest unique suffix per request")
    ap.add_argument("--budget", type=int, default=65536, help="chunked_prefill_size = max_prefill_tokens")
    ap.add_argument("--max-admit", type=int, default=1024, help="max_running_requests - running")
    ap.add_argument("--pool", type=int, default=1 << 20, help="KV pool slots")
    ap.add_argument("--iters", type=int, default=15, help="fresh schedulers timed per case")
    ap.add_argument("--policies", default="lpm,fcfs,dfs-weight")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline-rev", default=None, help="git revision timed as the baseline (same run)")
    ap.add_argument("--out", default=None, help="also write the markdown table to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    impls = [("this version", None)]
    if args.baseline_rev:
        pkg = load_baseline(args.baseline_rev, ["radix", "runtime/schedule_policy.py", "runtime/scheduler_admission.py"])
        impls.append((f"baseline ({args.baseline_rev})", pkg))
    work = make_workload(args)
    lines = [
        f"Command: `python benchmarks/bench_admission.py --waiting {args.waiting} --running {args.running}"
        f" --iters {args.iters} --policies {args.policies}"
        + (f" --baseline-rev {args.baseline_rev}`" if args.baseline_rev else "`"),
        "",
        "| policy | case | implementation | admitted | median (ms) | p90 (ms) |",
        "|---|---|---|---:|---:|---:|",
    ]
    for policy in args.policies.split(","):
        for blocked in (False, True):
            results = run_case(work, args, policy, blocked, impls)
            for (label, _), (first, second, outcome) in zip(impls, results):
                case = "blocked" if blocked else "admit"
                admitted = len({rid for rid, _, _ in outcome})
                rows = [("step 1", first), ("step 2", second)] if blocked else [("", first)]
                for step, samples in rows:
                    med, p90 = stats(samples)
                    lines.append(f"| {policy} | {case} {step} | {label} | {admitted} | {med:.2f} | {p90:.2f} |")
                    print(lines[-1], flush=True)
            if any(r[2] != results[0][2] for r in results):
                raise SystemExit(f"{policy}: this version and the baseline admitted different slices")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
    return report


if __name__ == "__main__":
    main()
