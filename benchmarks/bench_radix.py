"""Prefix-cache benchmarks (issue 3).

Microbenchmark (CPU only, no model): a RadixCache holding ~10,000 nodes built from sequences that
branch off each other at random points (chat histories / few-shot variants), then

* match + insert of a 4,096-token sequence that shares a random-length prefix with the tree
  (the scheduler's admission match plus the insert at finish; goal: median <= 100 us),
* the same for a full hit (all 4,096 tokens cached) and a full miss (nothing cached),
* match only of a 4,096-token full hit,
* evict(4,096) from the ~10,000-node tree (the tree is refilled between runs, untimed),
* "deep trunk" (issue 16): 5,000 inserts of prompts that share a 2,048-token trunk up to a random
  length, each with a random suffix (~1,900 branch points along the trunk), then match + insert of
  4,096-token requests (the whole trunk + new tokens). ``--baseline DIR`` also times another
  ``RadixCache`` (``DIR/cache_old.py``, e.g. the previous version from git) in the same run.

Token ids are fresh int objects (as from a tokenizer), slots come from a real
``TokenToKVPoolAllocator`` (evict's single ``allocator.free`` call is part of its time).

Usage:
    python benchmarks/bench_radix.py [--nodes 10000] [--seq-len 4096] [--iters 400] [--seed 0]
        [--out benchmarks/results/radix.md] [--deep-inserts 5000] [--baseline-rev REV | --baseline DIR]
        [--deep-only] [--skip-workload]
"""

from __future__ import annotations

import argparse
import array
import gc
import platform
import os
import random
import statistics
import sys
import time

import torch

from radixlm.radix import RadixCache, pack_ids
from radixlm.runtime.memory import ReqToTokenPool, TokenToKVPoolAllocator
from radixlm.runtime.request import Req

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from baseline_tree import load_baseline  # noqa: E402  (same directory)

VOCAB = 32000


def fresh(ids: list[int]) -> list[int]:
    """Same values, new int objects (token ids from a tokenizer are never the tree's objects)."""
    return array.array("l", ids).tolist()


class TreeBuilder:
    """Grows a tree by inserting sequences that branch off random earlier ones."""

    def __init__(self, cache: RadixCache, alloc: TokenToKVPoolAllocator, rng: random.Random):
        self.cache, self.alloc, self.rng = cache, alloc, rng
        self.seqs: list[list[int]] = []

    def random_ids(self, n: int) -> list[int]:
        return [self.rng.randrange(VOCAB) for _ in range(n)]

    def insert_one(self) -> None:
        rng = self.rng
        if len(self.seqs) < 64 or rng.random() < 0.02:
            seq = self.random_ids(rng.randint(64, 1024))  # a new "system prompt"
        else:
            base = rng.choice(self.seqs)
            seq = base[: rng.randint(1, len(base))] + self.random_ids(rng.randint(16, 256))
        # NOTE: match first and allocate only the new part, as the scheduler does (freeing
        # duplicates would copy the allocator's whole free list each time).
        prefix = self.cache.match_prefix(fresh(seq)).indices
        kv = torch.cat([prefix, self.alloc.alloc(len(seq) - prefix.numel())])
        assert self.cache.insert(fresh(seq), kv) == prefix.numel()
        self.seqs.append(seq)

    def grow_to(self, nodes: int) -> int:
        count = self.cache.num_nodes()
        while count < nodes:
            for _ in range(max(1, (nodes - count) // 2)):
                self.insert_one()
            count = self.cache.num_nodes()
        return count


def _stats(name: str, samples_ns: list[int]) -> dict:
    us = sorted(s / 1e3 for s in samples_ns)
    return {
        "case": name,
        "median_us": statistics.median(us),
        "p90_us": us[int(0.9 * (len(us) - 1))],
        "n": len(us),
    }


class MicroRun:
    """The microbenchmark on one cache class: its own ~``--nodes``-node tree (same ``--seed``, same
    tree for every class) and samples. :func:`run_micro` alternates several of these."""

    def __init__(self, args: argparse.Namespace, cache_cls: type) -> None:
        self.args, self.L = args, args.seq_len
        self.alloc = TokenToKVPoolAllocator(2_000_000 + 4 * args.iters * args.seq_len)
        self.cache = cache_cls(self.alloc)
        self.builder = TreeBuilder(self.cache, self.alloc, random.Random(args.seed))
        t0 = time.perf_counter()
        nodes = self.builder.grow_to(args.nodes)
        self.info = {"nodes": nodes, "tokens": self.cache.total_size(), "build_s": time.perf_counter() - t0}
        self.rows_pool = ReqToTokenPool(1, self.L)
        self.cache.req_to_token_pool = self.rows_pool
        self.packer = pack_ids if cache_cls is RadixCache else None  # NOTE: a baseline may predate pack_ids
        self.samples: dict[str, list[int]] = {}

    def _add(self, name: str, ns: int) -> None:
        self.samples.setdefault(name, []).append(ns)

    def timed_match_insert(self, query: list[int], packer=None, hint: bool = False) -> int:
        """match + insert; ``packer``: ids packed once (timed); ``hint``: the insert is hinted."""
        cache, clock = self.cache, time.perf_counter_ns
        kv = self.alloc.alloc(self.L)
        t = clock()
        ids = query if packer is None else packer(query)
        if hint:
            n = cache.insert(ids, kv, hint=cache.match_prefix(ids).last_node)
        else:
            cache.match_prefix(ids)
            n = cache.insert(ids, kv)
        dt = clock() - t
        self.alloc.free(kv[:n])
        return dt

    def timed_request(self, query: list[int]) -> int:
        """Admission match + lock, then cache_finished_req (KV of the new part computed)."""
        cache, clock, rows, L = self.cache, time.perf_counter_ns, self.rows_pool, self.L
        req = Req(rid="bench", origin_input_ids=query[:-1], sampling_params=None)
        req.output_ids = query[-1:]
        t = clock()
        req.prefix_indices, req.last_node = cache.match_prefix(query)
        cache.inc_lock_ref(req.last_node)
        dt = clock() - t
        req.req_pool_idx = rows.alloc()
        p = req.prefix_indices.numel()
        rows.write(req.req_pool_idx, 0, req.prefix_indices)
        rows.write(req.req_pool_idx, p, self.alloc.alloc(L - p))
        req.kv_len = L
        t = clock()
        cache.cache_finished_req(req)
        return dt + clock() - t

    def iteration(self, seq: list[int], miss: list[int], sched: list[int]) -> None:
        """One round of the match/insert cases on the given sequences."""
        L, add = self.L, self._add
        add(f"match + insert, {L} tokens, random shared prefix", self.timed_match_insert(fresh(seq)))
        add(f"match + insert, {L} tokens, full hit", self.timed_match_insert(fresh(seq)))  # all cached now
        if self.packer is not None:
            add(f"match + insert, {L} tokens, full hit, insert hint", self.timed_match_insert(fresh(seq), None, True))
            add(f"match + insert, {L} tokens, full hit, ids packed once (timed) + insert hint",
                self.timed_match_insert(fresh(seq), self.packer, True))
        query = fresh(seq)
        t = time.perf_counter_ns()
        self.cache.match_prefix(query)
        add(f"match only, {L} tokens, full hit", time.perf_counter_ns() - t)
        add(f"match + insert, {L} tokens, full miss", self.timed_match_insert(fresh(miss)))
        add(f"scheduler path (match, lock, cache_finished_req), {L} tokens, random shared prefix",
            self.timed_request(fresh(sched)))

    def evict_once(self) -> None:
        """Refill the tree (untimed), then time ``evict(seq_len)`` with a nearly full pool."""
        self.builder.grow_to(self.args.nodes)
        gc.collect()
        # NOTE: eviction runs when the pool is (nearly) full: keep the free list short.
        hold = self.alloc.alloc(max(0, self.alloc.available_size() - self.args.free_at_evict))
        t = time.perf_counter_ns()
        freed = self.cache.evict(self.L)
        self._add(f"evict({self.L}) from ~{self.args.nodes} nodes", time.perf_counter_ns() - t)
        self.alloc.free(hold)
        assert freed >= self.L


def run_micro(args: argparse.Namespace, classes: list[type]) -> list[tuple[list[dict], dict]]:
    """The microbenchmark for each of ``classes`` (same trees, same queries), the classes
    alternating within each iteration (rotating order). Returns ``(rows, tree info)`` per class."""
    runs = [MicroRun(args, cls) for cls in classes]
    rng, L, seqs = random.Random(args.seed + 1), args.seq_len, runs[0].builder.seqs
    gc.collect()
    gc.freeze()  # NOTE: as a long-running server would; keeps GC passes off the big trees

    def query() -> list[int]:
        base = rng.choice(seqs)
        cut = rng.randint(0, min(len(base), L))
        return base[:cut] + [rng.randrange(VOCAB) for _ in range(L - cut)]

    for it in range(args.iters):
        seq, miss, sched = query(), [rng.randrange(VOCAB) for _ in range(L)], query()
        for k in range(len(runs)):
            runs[(k + it) % len(runs)].iteration(seq, miss, sched)
    for run in runs:
        run.info["nodes_after_match_insert"] = run.cache.num_nodes()
    for it in range(max(1, args.iters // 4)):
        for k in range(len(runs)):
            runs[(k + it) % len(runs)].evict_once()
    out = []
    for run in runs:
        errors = run.cache.check_integrity()
        if errors:
            raise SystemExit(f"integrity check failed after the benchmark: {errors}")
        out.append(([_stats(name, ns) for name, ns in run.samples.items()], run.info))
    gc.unfreeze()
    return out


def build_deep_trunk(cache_cls: type, args: argparse.Namespace) -> tuple:
    """The deep-trunk tree: 5,000 (``--deep-inserts``) prompts sharing a ``seq_len // 2``-token
    trunk up to a random length, each with a random 16-256-token suffix. Returns
    ``(cache, allocator, trunk, tree info)``; the same ``--seed`` gives the same tree."""
    rng = random.Random(args.seed)
    L, trunk_len = args.seq_len, args.seq_len // 2
    alloc = TokenToKVPoolAllocator(args.deep_inserts * 300 + trunk_len + 4 * args.iters * L)
    cache = cache_cls(alloc)
    trunk = [rng.randrange(VOCAB) for _ in range(trunk_len)]
    t0 = time.perf_counter()
    for _ in range(args.deep_inserts):
        seq = trunk[: rng.randint(1, trunk_len)] + [rng.randrange(VOCAB) for _ in range(rng.randint(16, 256))]
        prefix = cache.match_prefix(fresh(seq)).indices
        kv = torch.cat([prefix, alloc.alloc(len(seq) - prefix.numel())])
        assert cache.insert(fresh(seq), kv) == prefix.numel()
    info = {"nodes": cache.num_nodes(), "tokens": cache.total_size(), "build_s": time.perf_counter() - t0}
    return cache, alloc, trunk, info


def run_deep_trunk(variants: list[tuple], args: argparse.Namespace) -> list[tuple[str, dict, dict]]:
    """Deep-trunk case: many branch points on one path; 4,096-token requests (the whole trunk +
    new tokens), ``match_prefix`` + ``insert`` timed together.

    ``variants``: ``(label, cache class, packer, hint)``; ``packer`` (e.g. ``pack_ids``) packs the
    request once (timed) for both calls; ``hint``: the insert gets the match's ``last_node``.
    Variants of one cache class share its tree; the variants alternate within each iteration
    (rotating order), so all see the same load. Returns ``(label, stats row, tree info)``.
    """
    L, trunk_len = args.seq_len, args.seq_len // 2
    trees = {}
    for _, cls, _, _ in variants:
        if cls not in trees:
            trees[cls] = build_deep_trunk(cls, args)
    rng = random.Random(args.seed + 1)
    gc.collect()
    gc.freeze()
    clock = time.perf_counter_ns
    samples: list[list[int]] = [[] for _ in variants]
    for it in range(args.iters):
        for k in range(len(variants)):
            v = (k + it) % len(variants)
            _, cls, packer, hint = variants[v]
            cache, alloc, trunk, _ = trees[cls]
            query = fresh(trunk + [rng.randrange(VOCAB) for _ in range(L - trunk_len)])
            kv = alloc.alloc(L)
            t = clock()
            ids = query if packer is None else packer(query)
            res = cache.match_prefix(ids)
            n = cache.insert(ids, kv, hint=res.last_node) if hint else cache.insert(ids, kv)
            samples[v].append(clock() - t)
            assert res.indices.numel() == n
            alloc.free(kv[:n])
    gc.unfreeze()
    for cache, _, _, _ in trees.values():
        errors = cache.check_integrity()
        if errors:
            raise SystemExit(f"integrity check failed after the deep-trunk run: {errors}")
    name = f"deep trunk: match + insert, {L} tokens, {trunk_len}-token trunk, {args.deep_inserts} inserts"
    return [(label, _stats(name, samples[v]), trees[cls][3]) for v, (label, cls, _, _) in enumerate(variants)]


def format_deep(rows: list[tuple[str, dict, dict]], args: argparse.Namespace) -> str:
    lines = [
        "## Deep trunk (issue 16)",
        "",
        f"Command: `python benchmarks/bench_radix.py --seq-len {args.seq_len} --iters {args.iters}"
        f" --seed {args.seed} --deep-inserts {args.deep_inserts}"
        + (f" --baseline-rev {args.baseline_rev}`" if args.baseline_rev else
           f" --baseline {args.baseline}`" if args.baseline else "`"),
        "",
        "| implementation | tree nodes | median (us) | p90 (us) | runs |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, r, info in rows:
        lines.append(f"| {label} | {info['nodes']} | {r['median_us']:.1f} | {r['p90_us']:.1f} | {r['n']} |")
    if len(rows) > 1 and rows[-1][0].startswith("baseline"):
        base = rows[-1][1]["median_us"]
        lines += [""] + [f"Speedup (median) of {label}: {base / r['median_us']:.2f}x" for label, r, _ in rows[:-1]]
    return "\n".join(lines) + "\n"


def format_micro(rows: list[dict], info: dict, args: argparse.Namespace) -> str:
    lines = [
        "## Prefix cache microbenchmark",
        "",
        f"Command: `python benchmarks/bench_radix.py --nodes {args.nodes} --seq-len {args.seq_len}"
        f" --iters {args.iters} --seed {args.seed} --free-at-evict {args.free_at_evict}`",
        f"Host: {platform.processor() or platform.machine()}, Python {platform.python_version()},"
        f" torch {torch.__version__}. Tree: {info['nodes']} nodes, {info['tokens']} tokens"
        f" (built in {info['build_s']:.1f} s; {info['nodes_after_match_insert']} nodes after the"
        " match/insert runs).",
        "",
        "| case | median (us) | p90 (us) | runs |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['case']} | {r['median_us']:.1f} | {r['p90_us']:.1f} | {r['n']} |")
    goal = rows[0]["median_us"]
    lines += ["", f"Goal match + insert median <= 100 us: {'met' if goal <= 100 else 'NOT met'}"
              f" ({goal:.1f} us, random shared prefix)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=10_000, help="tree size for the microbenchmark")
    ap.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence")
    ap.add_argument("--iters", type=int, default=400, help="timed runs per case")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--free-at-evict", type=int, default=8192,
                    help="free slots left in the pool when evict runs (its free() copies them)")
    ap.add_argument("--out", default=None, help="also write the markdown report to this file")
    ap.add_argument("--skip-workload", action="store_true", help="only the microbenchmark")
    ap.add_argument("--deep-inserts", type=int, default=5000, help="inserts of the deep-trunk tree")
    ap.add_argument("--baseline", default=None,
                    help="directory with cache_old.py: also time its RadixCache on the deep trunk")
    ap.add_argument("--baseline-rev", default=None,
                    help="git revision whose radix/ is timed as the baseline (same run), e.g. 45bd0f3")
    ap.add_argument("--deep-only", action="store_true", help="only the deep-trunk case")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    variants = [("this version", RadixCache, None, False),
                ("this version, insert(hint=match's last_node)", RadixCache, None, True),
                ("this version, ids packed once (pack_ids, timed) + insert hint", RadixCache, pack_ids, True)]
    OldRadixCache = None
    if args.baseline_rev:
        OldRadixCache = load_baseline(args.baseline_rev, ["radix"]).radix.cache.RadixCache
        args.baseline = f"git {args.baseline_rev}"
        variants.append((f"baseline (radix/ at {args.baseline_rev})", OldRadixCache, None, False))
    elif args.baseline:
        sys.path.insert(0, args.baseline)
        from cache_old import RadixCache as OldRadixCache

        variants.append((f"baseline ({args.baseline}/cache_old.py)", OldRadixCache, None, False))
    deep = run_deep_trunk(variants, args)
    report = format_deep(deep, args)
    if not args.deep_only:
        results = run_micro(args, [RadixCache] + ([OldRadixCache] if OldRadixCache is not None else []))
        micro = format_micro(*results[0], args)
        if len(results) > 1:
            old = format_micro(*results[1], args)
            micro += f"\nBaseline (same run, alternating, {deep[-1][0]}):\n\n" + old.split("\n\n", 1)[1]
        report = micro + "\n" + report
    if not (args.skip_workload or args.deep_only):  # issue 3, benchmark part 2: the engine on the CPU tiny model
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_radix_workload import workload_report

        report += "\n" + workload_report()
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)


if __name__ == "__main__":
    sys.exit(main())
