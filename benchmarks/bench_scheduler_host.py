"""Host work of the server's scheduler per decode step, on CPU, with the model forward stubbed out.

The real scheduler process pieces run: ``Scheduler.create`` (the overlap scheduler by default, as
on CUDA), the shared loop (``run_scheduler_loop``) and ``SchedulerServer._send`` with its msgpack
encoding (the socket replaced by a sink). Only ``ModelRunner.forward_logits`` is replaced, inside
this benchmark, by a stub that returns small precomputed logits (token ids below 64, so greedy
sampling stays cheap); its time is reported apart and left out of the host total. ``--bs``
requests (greedy, ``ignore_eos``; 1 in 8 has a stop-token id it never samples) are admitted and
prefilled, then ``--steps`` decode steps are timed in this thread's CPU time (torch on one thread),
split into

* batch preparation: ``Scheduler._select_batch`` and ``OverlapScheduler._followup``;
* result processing: ``Scheduler._process`` (``OutputProcessor`` and the request bookkeeping);
* output message: ``SchedulerServer._send`` (building and encoding ``BatchTokenIDOut``);
* rest: everything else in the loop (sampling, the host copy of the sampled ids, the loop);
* of which GC: the cyclic garbage collector's share of the above (it runs where objects are made).

The baseline git revision (``--base``) is laid out under /tmp with ``git archive`` and imported as
``radixlm`` in child processes; base and working tree alternate, ``--repeat`` times each, best of
the repeats kept; the output ids of both must agree.

    .venv/bin/python benchmarks/bench_scheduler_host.py [--base HEAD --bs 1 256 512 --steps 64 --repeat 5]

With ``RADIXLM_BENCH_PROFILE=FILE`` in the environment, ``_child`` also writes a cProfile of the
timed steps (thread CPU time) to FILE (its figures then include the profiler's cost).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ("batch preparation", "result processing", "output message", "rest")
VOCAB_STUB = 64  # the stub's logits columns: sampled ids are below this


def base_tree(rev: str) -> str:
    """Lay out revision ``rev`` as ``<dir>/radixlm`` (``git archive``); returns ``<dir>``."""
    sha = subprocess.run(["git", "-C", ROOT, "rev-parse", rev], check=True, capture_output=True, text=True).stdout.strip()
    top = os.path.join(tempfile.gettempdir(), f"radixlm_base_{sha[:12]}")
    if not os.path.isdir(os.path.join(top, "radixlm")):
        os.makedirs(os.path.join(top, "radixlm"), exist_ok=True)
        tar = subprocess.run(["git", "-C", ROOT, "archive", sha], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", os.path.join(top, "radixlm")], input=tar, check=True)
    return top


def _child(model: str, bs: int, steps: int, overlap: bool) -> dict:
    """Run in a child process: the per-step figures of the ``radixlm`` on ``sys.path``."""
    import torch

    torch.set_num_threads(1)
    import radixlm
    from radixlm.runtime.sampling_params import SamplingParams
    from radixlm.runtime.scheduler_loop import run_scheduler_loop
    from radixlm.runtime.server.scheduler_process import SchedulerServer
    from radixlm.runtime.testing import make_scheduler
    from radixlm.runtime.request import Req

    clock = time.thread_time
    spent = dict.fromkeys((*PARTS, "forward (stub)"), 0.0)

    def timed(fn, part):
        def wrapper(*a, **k):
            t0 = clock()
            try:
                return fn(*a, **k)
            finally:
                spent[part] += clock() - t0
        return wrapper

    prompt_len = 32
    sched = make_scheduler(model, max_total_tokens=bs * (prompt_len + steps + 16) + 64, enable_overlap_schedule=overlap,
                           max_running_requests=max(bs, 1), chunked_prefill_size=8192)
    gen = torch.Generator().manual_seed(0)
    pool = torch.randn(steps + 8, bs + 8, VOCAB_STUB, generator=gen)
    step_no = [0]

    def forward_logits(batch, input_ids=None):
        t0 = clock()
        per_slice, n = [], 0
        for s in batch.slices:
            positions = s.logit_positions()
            per_slice.append((n, positions))
            n += len(positions)
        logits = pool[step_no[0] % pool.shape[0], :n].clone()
        step_no[0] += 1
        spent["forward (stub)"] += clock() - t0
        return logits, per_slice

    sched.runner.forward_logits = forward_logits
    server = SchedulerServer.__new__(SchedulerServer)
    server.args, server.rank, server.scheduler, server.runner = sched.args, 0, sched, sched.runner
    server.pending, server.gate = [], None
    server._trace = None  # attributes __init__ sets that _send reads (set for trees that have them)
    server._last_prefills = server._last_prompt = server._last_cached = 0
    sent = []
    server.detok_sock = type("Sink", (), {"send": lambda self, data: sent.append(len(data))})()
    vocab = sched.runner.cfg.vocab_size
    reqs = []
    for i in range(bs):
        ids = torch.randint(VOCAB_STUB, vocab, (prompt_len,), generator=gen).tolist()
        stop_ids = {"stop_token_ids": [VOCAB_STUB + 1]} if i % 8 == 0 else {}
        sp = SamplingParams(max_new_tokens=steps + 4 - (i % 3), temperature=0, ignore_eos=True, **stop_ids)
        reqs.append(Req(f"r{i}", ids, sp))
        sched.add_request(reqs[-1])
    turns = [0]

    def warm() -> bool:  # every request admitted and decoding
        return not sched.waiting and sched.chunked_req is None and sched.stats.num_decode_batches >= 2

    run_scheduler_loop(sched, lambda w: [], server._send, should_stop=warm)
    sched._select_batch = timed(sched._select_batch, "batch preparation")
    if hasattr(sched, "_followup"):
        sched._followup = timed(sched._followup, "batch preparation")
    sched._process = timed(sched._process, "result processing")
    send = timed(server._send, "output message")
    start = sched.stats.num_decode_batches

    def stop() -> bool:
        turns[0] += 1
        if turns[0] > 4 * steps + 16:
            raise RuntimeError("the decode steps did not come (a failing step?)")
        return sched.stats.num_decode_batches - start >= steps

    gc_t0 = [0.0]

    def gc_clock(phase, info):  # NOTE: collections run inside the parts; reported apart as well
        if phase == "start":
            gc_t0[0] = clock()
        else:
            spent["of which GC"] += clock() - gc_t0[0]

    gc.collect()
    for k in spent:
        spent[k] = 0.0
    spent["of which GC"] = 0.0
    gc.callbacks.append(gc_clock)
    prof = None
    if os.environ.get("RADIXLM_BENCH_PROFILE"):  # --profile: cProfile of the timed steps (figures then include its cost)
        import cProfile

        prof = cProfile.Profile(time.thread_time)
        prof.enable()
    t0 = clock()
    run_scheduler_loop(sched, lambda w: [], send, should_stop=stop)
    total = clock() - t0
    if prof is not None:
        prof.disable()
        prof.dump_stats(os.environ["RADIXLM_BENCH_PROFILE"])
    gc.callbacks.remove(gc_clock)
    n = sched.stats.num_decode_batches - start
    spent["rest"] = total - sum(v for k, v in spent.items() if k not in ("rest", "of which GC"))
    run_scheduler_loop(sched, lambda w: [], server._send, should_stop=lambda: not sched.has_work())
    return {"us": {k: v / n * 1e6 for k, v in spent.items()}, "steps": n, "radixlm": radixlm.__file__,
            "outputs": [r.output_ids for r in reqs], "reasons": [r.finish_reason for r in reqs]}


def run_child(root: str | None, model: str, bs: int, steps: int, overlap: bool) -> dict:
    """One measurement in a fresh interpreter importing ``radixlm`` from ``root`` (None: the
    working tree)."""
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]) if sys.argv[1] else None; "
            f"sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); import bench_scheduler_host as b; "
            "print('RESULT' + json.dumps(b._child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == '1')))")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run([sys.executable, "-c", code, root or "", model, str(bs), str(steps), "1" if overlap else "0"],
                         check=True, capture_output=True, text=True, env=env, cwd="/").stdout
    return json.loads(next(line[6:] for line in out.splitlines() if line.startswith("RESULT")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD", help="baseline git revision")
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 256, 512])
    ap.add_argument("--steps", type=int, default=64, help="timed decode steps")
    ap.add_argument("--repeat", type=int, default=5, help="best of N (base and current alternate)")
    ap.add_argument("--no-overlap", action="store_true", help="the plain Scheduler instead of the overlap one")
    args = ap.parse_args()
    from radixlm.runtime.tiny_model import make_tiny_model

    model = os.path.join(tempfile.gettempdir(), "radixlm_bench_tiny_llama")
    if not os.path.exists(os.path.join(model, "config.json")):
        make_tiny_model(model, "llama")
    trees = {"base": base_tree(args.base), "current": None}
    print(f"us per decode step (thread CPU time, best of {args.repeat}); base = {args.base}, current = working "
          f"tree; {'plain' if args.no_overlap else 'overlap'} scheduler; forward stubbed")
    print("| bs | part | base | current | speedup |\n|---:|---|---:|---:|---:|")
    for bs in args.bs:
        best: dict[str, dict[str, float]] = {}
        outs = {}
        for _ in range(args.repeat):
            for name, root in trees.items():
                r = run_child(root, model, bs, args.steps, not args.no_overlap)
                assert (root is None) == r["radixlm"].startswith(ROOT), r["radixlm"]
                outs[name] = (r["outputs"], r["reasons"])
                b = best.setdefault(name, {})
                for k, v in r["us"].items():
                    b[k] = min(b.get(k, float("inf")), v)
                b["host total"] = min(b.get("host total", float("inf")), sum(r["us"][p] for p in PARTS))
        assert outs["base"] == outs["current"], "outputs differ from the baseline's"
        for k in (*PARTS, "host total", "of which GC", "forward (stub)"):
            b, c = best["base"][k], best["current"][k]
            print(f"| {bs} | {k} | {b:.1f} | {c:.1f} | {b / c if c else float('inf'):.2f}x |")


if __name__ == "__main__":
    main()
