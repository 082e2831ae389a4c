"""Program-aware cache leases vs plain LRU (issue 17): ``run_batch`` of multi-call programs under a
KV pool too small to hold them all, on the in-process Engine (CPU, default model).

The workload mixes three program shapes, each over its own ~220-token context document:
interactive multi-turn chats (a user thinks 4-8 s between turns), and agent programs that churn
quickly: ReAct loops (thought ``gen``, action ``select``, a 0.2-0.6 s tool, an observation
appended) and tree-of-thought (plan, ``fork(3)`` ideas, an evaluator, ``select`` of the best,
final answer). While a chat waits on its user, agent programs start and end; plain LRU then
evicts the waiting chat's prefix (older than what the ended programs left behind) and the next
turn recomputes it; a lease keeps it, and the ended programs' prefixes go first.

Reported per configuration (same workload, same engine, cache flushed in between): the prefix-cache
hit rate (cached / prompt tokens over every request the scheduler admitted), the workload's
optimum hit rate, throughput (programs/s and generated tokens/s over the wall time, tool and think
time included), and the leased tokens evicted under pressure. The optimum replays the run's own
trace against an unbounded cache: each request matches, when it was first admitted, every sequence
cached before that scheduler step (prompts after their prefill, prompt + output when finished),
capped as the scheduler caps matches (the last prompt token, ``logprob_start_len``). No eviction
policy can beat it on that trace.

    python benchmarks/bench_leases.py [--programs 24] [--threads 8] [--pool 1800 ...] [--repeats 1]
"""

from __future__ import annotations

import argparse
import random
import time

import radixlm as sgl
from radixlm.radix.cache import RadixCache

WORDS = ("river mountain copper signal harbor lantern orchard basalt meadow falcon glacier ember "
         "tunnel quartz willow beacon canyon saffron timber comet violet anchor marble thistle "
         "prairie cobalt ferry granite monsoon pepper silver tundra walnut zephyr").split()
GEN = 8
THINK_S = (4.0, 8.0)  # a chat user's think time between turns, seconds
TOOL_S = (0.2, 0.6)  # tool / evaluator latency of the agent programs, seconds


def make_doc(rng: random.Random, sentences: int = 10) -> str:
    """A unique context document (~22 tokens per sentence with the default tokenizer)."""
    out = []
    for k in range(sentences):
        words = " ".join(rng.choice(WORDS) for _ in range(9))
        out.append(f"Fact {k}: the {words} is number {rng.randint(10, 999)}.")
    return " ".join(out)


def chat(s, doc: str, rng: random.Random) -> None:
    s += sgl.system("Answer briefly, using this record.\n" + doc)
    for q in ("What is the record about?", "Which fact mentions a number above 500?",
              "Summarize it in five words."):
        s += sgl.user(q)
        s += sgl.assistant(sgl.gen("a", max_tokens=GEN, temperature=0))
        s["a"]  # noqa: B018 - the user reads the answer, then thinks
        time.sleep(rng.uniform(*THINK_S))


def react(s, doc: str, rng: random.Random) -> None:
    s += "You can use the tools search and lookup.\nContext: " + doc + "\nQuestion: which fact is largest?\n"
    for k in range(3):
        s += f"Thought {k}:" + sgl.gen(f"t{k}", max_tokens=GEN, stop="\n", temperature=0)
        s += f"\nAction {k}: " + sgl.select(f"act{k}", ["search", "lookup", "finish"])
        s[f"act{k}"]  # noqa: B018 - the tool runs on the chosen action
        time.sleep(rng.uniform(*TOOL_S))
        s += f"\nObservation {k}: the {rng.choice(WORDS)} value is {rng.randint(10, 999)}.\n"


def tree_of_thought(s, doc: str, rng: random.Random) -> None:
    s += "Context: " + doc + "\nProblem: find the two related facts.\nPlan:"
    s += sgl.gen("plan", max_tokens=GEN, temperature=0)
    forks = s.fork(3)
    forks += lambda i: f"\nIdea {i + 1}:" + sgl.gen("idea", max_tokens=GEN, temperature=0)
    forks.join()
    time.sleep(rng.uniform(*TOOL_S))  # an external evaluator scores the ideas
    s += "\nBest idea: " + sgl.select("best", ["1", "2", "3"])
    s += "\nAnswer:" + sgl.gen("answer", max_tokens=GEN, temperature=0)


KINDS = {"chat": chat, "react": react, "tot": tree_of_thought}


@sgl.function
def program(s, kind: str, pid: int):
    rng = random.Random(pid)
    KINDS[kind](s, make_doc(rng), rng)


class Trace:
    """Records, per scheduler step, the first admissions and the cache inserts of one run."""

    def __init__(self, engine) -> None:
        self.sched, self.cache = engine.scheduler, engine.scheduler.tree_cache
        self.step_no = 0
        self.pending: list = []
        self.admits: list[tuple[int, list[int], int]] = []  # (step, ids, match cap)
        self.inserts: list[tuple[int, list[int]]] = []  # (step, cached tokens)
        sched, cache = self.sched, self.cache
        orig_step, orig_add = sched.step, sched.add_request
        orig_fin, orig_unfin = cache.cache_finished_req, cache.cache_unfinished_req

        def step():
            out = orig_step()
            keep = []
            for r in self.pending:
                if r.admitted_once:
                    cap = r.num_tokens - 1
                    if r.return_logprob:
                        cap = min(cap, r.logprob_start)
                    self.admits.append((self.step_no, list(r.origin_input_ids), cap))
                elif not r.finished:
                    keep.append(r)
            self.pending = keep
            self.step_no += 1
            return out

        def add(req):
            orig_add(req)
            self.pending.append(req)

        def fin(req):
            if req.req_pool_idx is not None:
                self.inserts.append((self.step_no, req.all_ids[: req.kv_len]))
            orig_fin(req)

        def unfin(req):
            self.inserts.append((self.step_no, req.all_ids[: req.kv_len]))
            orig_unfin(req)

        sched.step, sched.add_request = step, add
        cache.cache_finished_req, cache.cache_unfinished_req = fin, unfin

    def close(self) -> None:
        for obj, names in ((self.sched, ("step", "add_request")),
                           (self.cache, ("cache_finished_req", "cache_unfinished_req"))):
            for name in names:
                del obj.__dict__[name]

    def optimum(self) -> tuple[float, int]:
        """(hit rate of an unbounded cache on this trace, prompt tokens)."""
        tree = RadixCache(None)  # key-only: nothing is ever evicted
        import torch

        events = [(s, 1, ids, 0) for s, ids in self.inserts] + [(s, 0, ids, cap) for s, ids, cap in self.admits]
        events.sort(key=lambda e: (e[0], e[1]))  # NOTE: a step's admissions see the cache before it
        hit = total = 0
        for _, kind, ids, cap in events:
            if kind == 1:
                if ids:
                    tree.insert(ids, torch.zeros(len(ids), dtype=torch.int64))
            else:
                total += len(ids)
                hit += min(int(tree.match_prefix(ids[: max(cap, 0)]).indices.numel()), cap)
        return hit / max(total, 1), total


def run(engine, items: list[dict], threads: int, leases: bool) -> dict:
    """One configuration; returns its figures."""
    sgl.global_config.enable_cache_leases = leases
    for _ in range(100):  # NOTE: refused while requests are in flight
        if engine.flush_cache():
            break
        time.sleep(0.1)
    else:
        raise RuntimeError("the cache could not be flushed")
    stats = engine.scheduler.stats
    p0, c0, g0 = stats.prompt_tokens, stats.cached_tokens, stats.generated_tokens
    ev0 = engine.scheduler.tree_cache.leases.evicted_tokens
    trace = Trace(engine)
    t0 = time.perf_counter()
    try:
        states = program.run_batch(items, backend=engine, num_threads=threads)
        wall = time.perf_counter() - t0
    finally:
        trace.close()
    errors = [st.error() for st in states if st.error() is not None]
    if errors:
        raise RuntimeError(f"{len(errors)} programs failed, e.g. {errors[0]!r}")
    prompt, cached = stats.prompt_tokens - p0, stats.cached_tokens - c0
    opt, traced = trace.optimum()
    assert traced == prompt, (traced, prompt)  # the trace saw every admitted request
    return {"hit": cached / prompt, "optimum": opt, "prompt": prompt, "wall": wall,
            "programs_s": len(items) / wall, "gen_tok_s": (stats.generated_tokens - g0) / wall,
            "leased_evicted": engine.scheduler.tree_cache.leases.evicted_tokens - ev0,
            "leases_left": engine.scheduler.tree_cache.num_leases()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-path", default=None, help="default: SmolLM2-135M-Instruct")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--programs", type=int, default=24)
    ap.add_argument("--threads", type=int, default=8, help="programs in flight (run_batch num_threads)")
    ap.add_argument("--pool", type=int, nargs="+", default=[1800],
                    help="max_total_tokens (KV slots); several values run one after the other")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    kinds = list(KINDS)
    items = [{"kind": kinds[i % len(kinds)], "pid": args.seed * 1000 + i} for i in range(args.programs)]
    rows = []
    for pool in args.pool:
        with sgl.Engine(args.model_path, device=args.device, max_total_tokens=pool) as engine:
            program.run(kind="chat", pid=-1, backend=engine).sync()  # warm-up
            for rep in range(args.repeats):
                for leases in (False, True):
                    r = run(engine, items, args.threads, leases)
                    rows.append(("leases" if leases else "plain LRU", pool, rep, r))
                    print(f"{rows[-1][0]:>9} pool {pool} rep {rep}: hit {r['hit']:.1%} (optimum {r['optimum']:.1%})"
                          f" {r['programs_s']:.2f} programs/s {r['gen_tok_s']:.1f} gen tok/s wall {r['wall']:.1f} s"
                          f" leased tokens evicted {r['leased_evicted']}", flush=True)
    print(f"\n{args.programs} programs ({', '.join(kinds)}), {args.threads} in flight, {args.device}\n")
    print("| pool (KV slots) | config | run | prompt tokens | hit rate | optimum | gap to optimum | programs/s |"
          " gen tok/s | wall s | leased tokens evicted |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, pool, rep, r in rows:
        print(f"| {pool} | {name} | {rep} | {r['prompt']} | {r['hit']:.1%} | {r['optimum']:.1%} | "
              f"{(r['optimum'] - r['hit']) * 100:.1f} pts | {r['programs_s']:.2f} | {r['gen_tok_s']:.1f} | "
              f"{r['wall']:.1f} | {r['leased_evicted']} |")


if __name__ == "__main__":
    main()
