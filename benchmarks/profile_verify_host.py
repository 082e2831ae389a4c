"""Host time of a speculative verify step vs a plain decode step, split by phase (issue 14).

On an H200 at batch 1 a verify step costs the GPU time of a decode step plus host work that cannot
overlap (the next drafts depend on this step's accepted tokens). This script measures that host
work on the CPU: it drives a plain and an n-gram :class:`Scheduler` step by step over the same
prompts (batch ``--batch``, greedy), with the decode CUDA graphs *emulated* (the real
``CudaGraphRunner.replay`` host code fills its input buffers, then an eager forward stands in for
the graph launch), so a verify step takes the same code path as on the GPU. Every phase is timed
exclusively (``time.perf_counter`` around the functions named below; nested phases are
subtracted from their parent) and the forward itself is reported apart, not as host work:

  schedule      Scheduler.step and _select_batch minus the phases below (admission checks, ...)
  draft         NgramDrafter.drafts (index sync, n-gram match, grammar cut)
  build batch   _get_decode_batch minus drafting (slot allocation, req_to_token writes, slices)
  input prep    forward_logits / flat-decode / CudaGraphRunner.replay host work (graph inputs)
  logits        ModelRunner._postprocess minus what follows (sampling for decode rows)
  verify        postprocess_verify + run_verify + verify_drafts (greedy: argmax, host compare)
  mask rows     mask_draft_rows (min_new_tokens / grammar masks of draft rows)
  output proc   OutputProcessor.process (append tokens, stop checks, detokenizer)
  settle        settle_verify_slice (free rejected slots, kv_len, counters)
  process       Scheduler._process minus output proc and settle

On the CPU a tensor op also computes (on the GPU it only launches), so phases with vocab-wide
ops read high; ``--ops`` also counts the aten ops per phase (each is a kernel launch on the GPU).
Several ``--tree`` give a before/after table from one run (children alternate, ``--rounds`` times):

    git archive BASE | (mkdir -p /tmp/rl_before/radixlm && tar -x -C /tmp/rl_before/radixlm)
    RADIXLM_CACHE=/tmp/rlcache .venv/bin/python benchmarks/profile_verify_host.py \\
        --tree before=/tmp/rl_before/radixlm --tree after=. --num-prompts 3 --max-new-tokens 48
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

PHASES = ["schedule", "draft", "build batch", "input prep", "logits", "mask rows", "verify",
          "output proc", "settle", "process"]


class PhaseClock:
    """Exclusive wall time per phase for the current step (``cur``); ``wrap`` times a function."""

    def __init__(self) -> None:
        self.cur: dict[str, float] = defaultdict(float)
        self.ops: dict[str, int] = defaultdict(int)
        self.stack: list[list] = []  # [phase, child seconds]

    def wrap(self, phase: str, fn):
        def timed(*a, **k):
            self.stack.append([phase, 0.0])
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                dt = time.perf_counter() - t0
                _, child = self.stack.pop()
                self.cur[phase] += dt - child
                if self.stack:
                    self.stack[-1][1] += dt
        timed.timed_fn = fn
        return timed

    def phase(self) -> str:
        return self.stack[-1][0] if self.stack else "schedule"


def patch(clock: PhaseClock, obj, name: str, phase: str) -> None:
    """Time ``obj.name`` as ``phase`` (a module function timed for an earlier clock is re-wrapped)."""
    fn = getattr(obj, name, None)
    fn = getattr(fn, "timed_fn", fn)
    if fn is None:
        print(f"note: {getattr(obj, '__name__', obj)}.{name} not found, not timed", file=sys.stderr)
        return
    setattr(obj, name, clock.wrap(phase, fn))


def emulate_graphs(runner, max_bs: int) -> None:
    """Install a CudaGraphRunner whose graphs are eager forwards (CPU): replay's host work is real."""
    import torch

    from radixlm.runtime.cuda_graph import CudaGraphRunner

    class EagerGraph:
        def __init__(self, owner, bs):
            self.owner, self.bs = owner, bs

        def replay(self):
            out = self.owner._forward(self.bs)
            self.owner.outputs.setdefault(self.bs, torch.empty_like(out)).copy_(out)

    class Emulated(CudaGraphRunner):
        def _capture_all(self):
            self.graphs = {bs: EagerGraph(self, bs) for bs in self.sizes}

        def replay(self, *a, **k):  # the graph output buffers exist once replayed
            n = len(a[1] if len(a) > 1 else k["positions"])
            bs = self.sizes[bisect.bisect_left(self.sizes, n)]
            if bs not in self.outputs:
                self.outputs[bs] = torch.empty(bs, self.runner.cfg.vocab_size)
            return super().replay(*a, **k)

    if not torch.cuda.is_available():  # NOTE: CPU-only torch cannot pin; a pinned copy is a plain one here
        torch.Tensor.pin_memory = lambda self, *a, **k: self
    runner.cuda_graph = Emulated(runner, max_bs, runner.req_to_token_pool.alloc())


def instrument(clock: PhaseClock, sched) -> None:
    from radixlm.runtime import speculative_worker

    runner = sched.runner
    for name in ("forward", "compute_logits"):
        setattr(runner.model, name, clock.wrap("forward", getattr(runner.model, name)))
    patch(clock, sched, "_select_batch", "schedule")
    patch(clock, sched, "_get_decode_batch", "build batch")
    if sched.spec_drafter is not None:
        patch(clock, sched.spec_drafter, "drafts", "draft")
    patch(clock, sched.runner, "forward_logits", "input prep")
    patch(clock, sched.runner, "_postprocess", "logits")
    patch(clock, sched, "_process", "process")
    patch(clock, sched.output_processor, "process", "output proc")
    for name, phase in (("build_verify_batch", "build batch"), ("postprocess_verify", "verify"),
                        ("run_verify", "verify"), ("verify_drafts", "verify"),
                        ("mask_draft_rows", "mask rows"), ("settle_verify_slice", "settle")):
        patch(clock, speculative_worker, name, phase)
    for g in runner.cuda_graph.graphs.values():
        g.replay = clock.wrap("forward", g.replay)


_COUNTING: list = []  # the clock that host-to-device copies are counted into


def count_copies(clock: PhaseClock) -> None:
    """Count host-to-device copies per phase (``h2d``) into ``clock`` from now on: every
    ``to_device`` and ``pin_memory`` call (on CPU both are no-ops; on CUDA each is a pinned staging
    copy plus a ``cudaMemcpyAsync``). Call after :func:`emulate_graphs` (it replaces pin_memory)."""
    import torch

    from radixlm.runtime import memory

    def counted(fn):
        def wrapper(*a, **k):
            c = _COUNTING[-1]
            c.ops["h2d " + c.phase()] += 1
            return fn(*a, **k)
        wrapper.counted = True
        return wrapper

    _COUNTING.append(clock)
    if not getattr(torch.Tensor.pin_memory, "counted", False):
        torch.Tensor.pin_memory = counted(torch.Tensor.pin_memory)
    original = memory.to_device
    if not getattr(original, "counted", False):
        for mod in [m for name, m in sys.modules.items() if name.startswith("radixlm.")]:
            if getattr(mod, "to_device", None) is original:
                mod.to_device = counted(original)


def count_ops(clock: PhaseClock):
    """A dispatch mode counting aten ops into the phase that issued them."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            clock.ops["ops " + clock.phase()] += 1
            return func(*args, **(kwargs or {}))

    return Counter()


def child(a) -> None:
    """Run both engines over the prompts; print per step its kind, phase seconds and op counts."""
    tree = Path(a.tree_dir).resolve()
    if tree.name == "radixlm":
        sys.path.insert(0, str(tree.parent))
    import torch

    import radixlm
    from radixlm.runtime.default_model import resolve_model_path
    from radixlm.runtime.model_runner import ModelRunner
    from radixlm.runtime.request import Req
    from radixlm.runtime.sampling_params import SamplingParams
    from radixlm.runtime.scheduler import Scheduler
    from radixlm.runtime.server_args import ServerArgs
    from radixlm.runtime.tokenizer import load_tokenizer

    if Path(radixlm.__file__).resolve().parent != tree:
        raise SystemExit(f"imported {radixlm.__file__}, not the tree {tree}")
    torch.set_num_threads(a.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_speculative import workloads

    path = resolve_model_path(a.model_path)
    tok, eos = load_tokenizer(path, path)
    prompts = workloads(a.num_prompts, a.seed)[a.workload]
    ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                              add_generation_prompt=True)) for t, _ in prompts]
    result = {}
    for engine in ("plain", "ngram"):
        spec = dict(speculative_algorithm="ngram", speculative_num_draft_tokens=a.k) if engine == "ngram" else {}
        args = ServerArgs(model_path=path, device="cpu", dtype=a.dtype, max_total_tokens=8192,
                          cuda_graph_max_extend_tokens=16, **spec)
        runner = ModelRunner(args, path, eos)
        emulate_graphs(runner, 64)
        count_copies(clock := PhaseClock())  # NOTE: after emulate_graphs (it replaces pin_memory)
        sched = Scheduler.create(args, runner, tok)
        instrument(clock, sched)
        kind = []
        run_batch = sched._run_batch

        def tagged(batch, run_batch=run_batch, kind=kind):
            drafted = batch.verify and any(s.draft_ids for s in batch.slices)
            kind.append("verify" if drafted else "decode" if batch.mode.name == "DECODE" else "prefill")
            return run_batch(batch)

        sched._run_batch = tagged
        step = clock.wrap("schedule", sched.step)
        counter = count_ops(clock) if a.ops else None
        steps, outs = [], []
        for i in range(0, len(ids), a.batch):
            reqs = [Req(f"r{i + j}", list(p), SamplingParams(max_new_tokens=a.max_new_tokens, temperature=0,
                                                              **prompts[0][1]))
                    for j, p in enumerate(ids[i : i + a.batch])]
            for r in reqs:
                sched.add_request(r)
            while sched.has_work():
                clock.cur, clock.ops = defaultdict(float), defaultdict(int)
                kind.clear()
                if counter is not None:
                    with counter:
                        step()
                else:
                    step()
                steps.append({"kind": kind[0] if kind else "idle", "phases": dict(clock.cur), "ops": dict(clock.ops)})
            outs += [r.output_ids for r in reqs]
        result[engine] = {"steps": steps, "outs": outs}
        runner.release()
    print("JSON" + json.dumps(result))


def summarize(steps: list[dict], kind: str) -> dict:
    """Median exclusive ms per phase (and host total, forward) over the steps of ``kind``."""
    chosen = [s for s in steps if s["kind"] == kind]
    if not chosen:
        return {}
    med = lambda f: statistics.median(f(s) for s in chosen)  # noqa: E731
    table = {p: med(lambda s: s["phases"].get(p, 0.0)) * 1e3 for p in PHASES}
    table["host total"] = med(lambda s: sum(v for k, v in s["phases"].items() if k != "forward")) * 1e3
    table["forward"] = med(lambda s: s["phases"].get("forward", 0.0)) * 1e3
    table["steps"] = len(chosen)
    counts = {}
    for what in ("ops", "h2d"):
        for p in PHASES:
            counts[f"{what} {p}"] = med(lambda s: s["ops"].get(f"{what} {p}", 0))
        counts[f"{what} host total"] = med(lambda s: sum(v for k, v in s["ops"].items()
                                                          if k.startswith(what) and not k.endswith("forward")))
    table["counts"] = counts
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", default=[],
                    help="NAME=DIR of a radixlm package tree (repeatable; default: this one)")
    ap.add_argument("--rounds", type=int, default=1, help="runs per tree, alternating trees")
    ap.add_argument("--model-path", default=None, help="default: SmolLM2-135M-Instruct")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--workload", default="extraction", help="a bench_speculative.py workload")
    ap.add_argument("--num-prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch", type=int, default=1, help="requests per batch (added together)")
    ap.add_argument("--k", type=int, default=4, help="speculative_num_draft_tokens")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ops", action="store_true", help="also count aten ops per phase (slows the host)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tree-dir", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)
    trees = [t.split("=", 1) for t in a.tree] or [["this", str(Path(__file__).resolve().parents[1])]]
    argv = sys.argv[1:]
    rest, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x == "--tree" or x == "--rounds":
            skip = True
        elif not (x.startswith("--tree=") or x.startswith("--rounds=")):
            rest.append(x)
    runs: dict[str, dict[str, list]] = {name: {"plain": [], "ngram": [], "outs": []} for name, _ in trees}
    for _ in range(a.rounds):
        for name, d in trees:
            cmd = [sys.executable, __file__, "--child", "--tree-dir", d, *rest]
            out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ})
            if out.returncode:
                raise SystemExit(f"tree {name} failed:\n{out.stderr[-4000:]}")
            res = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("JSON")][-1][4:])
            for eng in ("plain", "ngram"):
                runs[name][eng] += res[eng]["steps"]
            runs[name]["outs"].append((res["plain"]["outs"], res["ngram"]["outs"]))
    print(f"model={a.model_path or 'SmolLM2-135M-Instruct'} dtype={a.dtype} workload={a.workload} "
          f"prompts={a.num_prompts} max_new_tokens={a.max_new_tokens} batch={a.batch} k={a.k} "
          f"threads={a.threads} rounds={a.rounds}; median ms per step (exclusive), CPU, graphs emulated")
    cols = []
    for name, _ in trees:
        cols.append((f"{name} decode", summarize(runs[name]["plain"], "decode")))
        cols.append((f"{name} verify", summarize(runs[name]["ngram"], "verify")))
        cols.append((f"{name} spec no-draft", summarize(runs[name]["ngram"], "decode")))
    cols = [(n, t) for n, t in cols if t]
    print("| phase (ms) | " + " | ".join(n for n, _ in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for p in PHASES + ["host total", "forward", "steps"]:
        print(f"| {p} | " + " | ".join(f"{t[p]}" if p == "steps" else f"{t[p]:.3f}" for _, t in cols) + " |")
    print("\nper step: host-to-device copies" + (" / aten ops (each a launch on the GPU)" if a.ops else ""))
    print("| phase | " + " | ".join(n for n, _ in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for p in PHASES + ["host total"]:
        cells = [f"{t['counts'][f'h2d {p}']:.0f}" + (f" / {t['counts'][f'ops {p}']:.0f}" if a.ops else "")
                 for _, t in cols]
        print(f"| {p} | " + " | ".join(cells) + " |")
    for name, _ in trees:
        same = all(p == n for p, n in runs[name]["outs"])
        steps = runs[name]["ngram"]
        n_tok = sum(len(o) for _, outs in runs[name]["outs"] for o in outs)
        print(f"{name}: greedy outputs with speculation identical to plain: {'yes' if same else 'NO'}; "
              f"ngram steps (all kinds) per output token {len(steps) / max(n_tok, 1):.3f}")


if __name__ == "__main__":
    main()
