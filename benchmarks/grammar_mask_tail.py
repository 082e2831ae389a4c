"""What the slowest MaskBench mask steps are made of (issue 12: mask p99 <= 100 µs per request-step).

Walks radixlm's engine over MaskBench as ``bench_grammar.py`` does (compile each schema, walk each
test instance token by token, one ``fill_next_token_bitmask`` per step, a fresh matcher per
instance) and records for every step: wall and thread CPU time, engine kind (``Dfa`` table /
``Earley``), whether a mask was computed (a first visit: ``cold``) or only looked up (``hit``),
the schema, the step's index in its instance, whether a GC collection ran inside it, and with
``--split`` the thread time spent in named engine functions during the step (inclusive times of
wrapped functions; the wrappers cost ~1 µs per call, so ``--split`` runs are for attribution, not
for figures). The steps above the p98 (thread time) are then classified by cause: counts per
``engine:visit`` tag, per dominant function, per schema, and the time split (row lookup + compute
vs the copy into the bitmask).

    RADIXLM_SHARED_DATA=/work/shared/data .venv/bin/python benchmarks/grammar_mask_tail.py \
        --tokenizer deepseek-llm --stride 20 [--split] [--out steps.pkl]

The script imports the ``radixlm`` that holds it (its tree's parent first on ``sys.path``), so a
copy inside another tree (``git archive``) measures that tree.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import pickle
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from radixlm.grammar import GrammarCompiler, GrammarMatcher  # noqa: E402
from radixlm.grammar import compiler as compiler_mod  # noqa: E402
from radixlm.grammar.maskbench import encode_exact, load_cases, load_tokenizer  # noqa: E402

# (module, owner class name or None, function name): wrapped under --split
SPLIT = [
    ("radixlm.grammar.mask_table", "MaskTable", "_add"),
    ("radixlm.grammar.mask_table", "MaskTable", "_fill_missing"),
    ("radixlm.grammar.earley_engine", "EarleyEngine", "mask"),
    ("radixlm.grammar.earley_engine", "EarleyEngine", "spawn"),
    ("radixlm.grammar.earley", "Chart", "_new_column"),
    ("radixlm.grammar.token_index", "ShiftClasses", "__init__"),
    ("radixlm.grammar.earley_engine", "EarleyEngine", "_crossings"),
    ("radixlm.grammar.earley_engine", "EarleyEngine", "_walk_crossings"),
    ("radixlm.grammar.earley_engine", "EarleyEngine", "_walk_paths"),
    ("radixlm.grammar.earley_engine", "EarleyEngine", "_py_walk"),
    ("radixlm.grammar.earley_engine", "EarleyEngine", "_narrow_first_visit"),
    ("radixlm.grammar.earley_engine", None, "pack_tokens"),
    ("radixlm.grammar.earley_engine", None, "walk_from"),
    ("radixlm.grammar.token_index", "DfaIndex", "compute"),
    ("radixlm.grammar.token_index", "DfaIndex", "_few"),
    ("radixlm.grammar.token_index", "DfaIndex", "_delta"),
    ("radixlm.grammar.token_index", "DfaIndex", "_shared"),
    ("radixlm.grammar.token_index", "DfaIndex", "_wide"),
    ("radixlm.grammar.token_index", "DfaIndex", "_single"),
    ("radixlm.grammar.token_index", "DfaIndex", "_finish_exits"),
    ("radixlm.grammar.token_index", "DfaIndex", "_few_exits"),
    ("radixlm.grammar.token_index", "DfaIndex", "_region_entry"),
    ("radixlm.grammar.token_index", "DfaIndex", "_neighbours"),
    ("radixlm.grammar.token_index", None, "walk_from"),
    ("radixlm.grammar.token_index", None, "pack_tokens"),
    ("radixlm.grammar.token_index", None, "share_by_depth"),
    ("radixlm.grammar.token_index", None, "share_whole"),
    ("radixlm.grammar.token_index", None, "share_by_depth_batch"),
    ("radixlm.grammar.token_index", None, "reference_state"),
    ("radixlm.grammar.token_index", None, "pack_few"),
    ("radixlm.grammar.token_index", None, "pair_costs"),
    ("radixlm.grammar.token_index", None, "pair_cost"),
    ("radixlm.grammar.token_index", "DfaIndex", "_region"),
    ("radixlm.grammar.state_costs", "StateCosts", "fill"),
    ("radixlm.grammar.narrow_walk", "NarrowWalker", "tokens"),
    ("radixlm.grammar.narrow_walk", "NarrowWalker", "delta"),
    ("radixlm.grammar.narrow_walk", "NarrowWalker", "__init__"),
]


def _wrap(fn, name: str, acc: dict):
    def wrapper(*a, **k):
        t0 = time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            acc[name] = acc.get(name, 0.0) + time.thread_time() - t0
            acc["#" + name] = acc.get("#" + name, 0) + 1
    wrapper.__wrapped__ = fn
    return wrapper


def install_split(acc: dict) -> None:
    """Wrap the functions of :data:`SPLIT` (those present in this tree) to add their inclusive
    thread time into ``acc`` (name -> seconds)."""
    import importlib

    for mod_name, owner, fn_name in SPLIT:
        mod = importlib.import_module(mod_name)
        target = getattr(mod, owner, None) if owner else mod
        fn = getattr(target, fn_name, None) if target is not None else None
        if fn is None:
            continue
        label = f"{owner or mod_name.rsplit('.', 1)[1]}.{fn_name}"
        setattr(target, fn_name, _wrap(fn, label, acc))


def main() -> None:
    """Run the walk; print the tail's make-up; ``--out`` pickles every step."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="deepseek-llm")
    ap.add_argument("--stride", type=int, default=20)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--closed", action="store_true")
    ap.add_argument("--split", action="store_true", help="time named engine functions per step")
    ap.add_argument("--out", default=None)
    ap.add_argument("--kind", default=None, help="only schemas of this engine kind (Dfa, DfaLazy, Earley)")
    args = ap.parse_args()
    tok = load_tokenizer(args.tokenizer)
    comp = GrammarCompiler(tok)
    info = comp.tokenizer_info
    eos = info.stop_token_ids[0]
    acc: dict[str, float] = {}
    computed = [0, 0.0]  # first-visit computations, their thread time
    plain = compiler_mod.CompiledGrammar._compute

    def counting(self, states):
        computed[0] += 1
        t0 = time.thread_time()
        try:
            return plain(self, states)
        finally:
            computed[1] += time.thread_time() - t0

    compiler_mod.CompiledGrammar._compute = counting
    if args.split:
        install_split(acc)
    gcs = [0]
    gc.callbacks.append(lambda phase, _info: gcs.__setitem__(0, gcs[0] + (phase == "start")))
    cases = []
    for name, case in load_cases(limit=args.limit, stride=args.stride):
        cases.append((name, case, [encode_exact(tok, info, json.dumps(t["data"])) for t in case["tests"]]))
    bm = torch.zeros((1, info.mask_words), dtype=torch.int32)
    gc.collect()
    gc.freeze()
    steps = []  # dicts, one per step
    compiles = []
    for name, case, instances in cases:
        t0 = time.perf_counter()
        try:
            g = comp.compile_json_schema(json.dumps(case["schema"]), disable_additional_properties=args.closed)
        except Exception:  # noqa: BLE001 - coverage is bench_grammar.py's business
            continue
        compiles.append(time.perf_counter() - t0)
        kind = type(g.engine).__name__.replace("Engine", "")
        if kind == "Dfa" and g.masks.complete is False and getattr(g.masks, "_dense", None) is None:
            kind = "DfaLazy"
        if args.kind and kind != args.kind:
            continue
        for ids in instances:
            m = GrammarMatcher(g)
            for at, tid in enumerate(ids + [eos]):
                n0, c0, g0 = computed[0], computed[1], gcs[0]
                acc.clear()
                t0, c_0 = time.perf_counter(), time.thread_time()
                m.fill_next_token_bitmask(bm, 0)
                wall, cpu = time.perf_counter() - t0, time.thread_time() - c_0
                steps.append({"wall": wall, "cpu": cpu, "kind": kind, "cold": computed[0] > n0,
                              "compute": computed[1] - c0, "gc": gcs[0] > g0, "schema": name, "at": at,
                              "split": dict(acc) if args.split else None})
                if not m.accept_token(tid):
                    break
    report(steps, compiles)
    if args.out:
        with open(args.out, "wb") as f:
            pickle.dump({"steps": steps, "compiles": compiles}, f)


def _dominant(split: dict | None) -> str:
    """The innermost-looking wrapped function with the most time (the leaf walkers rank above
    their callers: ties on inclusive time go to the smaller share of the step)."""
    split = {k: v for k, v in (split or {}).items() if not k.startswith("#")}
    if not split:
        return "-"
    top = max(split.values())
    leaves = [k for k, v in split.items() if v >= 0.5 * top and k not in ("MaskTable._fill_missing",
                                                                         "DfaIndex.compute", "EarleyEngine.mask")]
    return min(leaves, key=lambda k: split[k]) if leaves else max(split, key=split.get)


def _cause(step: dict) -> str:
    """A slow step's cause, from its tags and (``--split``) the functions it spent time in."""
    sp = {k: v for k, v in (step["split"] or {}).items() if not k.startswith("#")}
    share = lambda *names: sum(sp.get(n, 0.0) for n in names) / max(step["cpu"], 1e-9)  # noqa: E731
    if not step["cold"]:
        return "table hit" + (" + GC" if step["gc"] else "")
    if step["at"] == 0:
        return "first step (initial state)"
    if share("token_index.share_by_depth", "token_index.share_by_depth_batch", "ShiftClasses.__init__") > 0.4:
        return "maxLength chain copy near its end"
    if step["kind"] == "Earley":
        if "EarleyEngine._walk_crossings" in sp or "Chart._new_column" in sp:
            return "Earley crossings (walks, new chart columns)" + (" + GC" if step["gc"] else "")
        return "Earley terminal state" + (" + GC" if step["gc"] else "")
    if "DfaIndex._single" in sp:
        return f"{step['kind']} wide state off any cycle (full walk)"
    if "DfaIndex._wide" in sp:
        return f"{step['kind']} loop-region state (+ exits)"
    if not sp:
        return f"{step['kind']} first visit" + (" + GC" if step["gc"] else "")
    return f"{step['kind']} narrow state" + (" + GC" if step["gc"] else "")


def report(steps: list[dict], compiles: list[float]) -> None:
    """Print percentiles, then the make-up of the steps above the p98 (thread time)."""
    cpu = np.array([s["cpu"] for s in steps]) * 1e6
    wall = np.array([s["wall"] for s in steps]) * 1e6
    p98 = np.percentile(cpu, 98)
    print(f"steps {cpu.size}: wall p50 {np.percentile(wall, 50):.1f} p99 {np.percentile(wall, 99):.1f} us; "
          f"thread p50 {np.percentile(cpu, 50):.1f} p98 {p98:.1f} p99 {np.percentile(cpu, 99):.1f} us; "
          f"over 100 us (thread) {(cpu > 100).sum()}, (wall) {(wall > 100).sum()}")
    ct = np.array(compiles) * 1e3
    print(f"compile (wall) p50 {np.percentile(ct, 50):.1f} p90 {np.percentile(ct, 90):.1f} ms, {ct.size} schemas")
    for label, sel in (("above p98", [s for s in steps if s["cpu"] * 1e6 > p98]),
                       ("over 100 us", [s for s in steps if s["cpu"] > 100e-6])):
        print(f"\n{label}: {len(sel)} steps")
        tags = collections.Counter(f"{s['kind']}:{'cold' if s['cold'] else 'hit'}{'+gc' if s['gc'] else ''}" for s in sel)
        print("  by engine:visit:", dict(tags.most_common()))
        print("  first step of an instance:", sum(s["at"] == 0 for s in sel))
        print("  by dominant function:", dict(collections.Counter(_dominant(s["split"]) for s in sel).most_common(12)))
        print("  by schema:", collections.Counter(s["schema"] for s in sel).most_common(8))
        print("  by cause:", dict(collections.Counter(_cause(s) for s in sel).most_common()))
        comp = np.array([s["compute"] for s in sel]) * 1e6
        rest = np.array([s["cpu"] - s["compute"] for s in sel]) * 1e6
        if sel:
            print(f"  compute p50 {np.percentile(comp, 50):.0f} us, lookup+copy (rest) p50 {np.percentile(rest, 50):.0f} "
                  f"p90 {np.percentile(rest, 90):.0f} us")
    for tag in sorted({f"{s['kind']}:{'cold' if s['cold'] else 'hit'}" for s in steps}):
        x = np.array([s["cpu"] for s in steps if f"{s['kind']}:{'cold' if s['cold'] else 'hit'}" == tag]) * 1e6
        print(f"  {tag:14s} n {x.size:6d} p50 {np.percentile(x, 50):7.1f} p90 {np.percentile(x, 90):7.1f} "
              f"p99 {np.percentile(x, 99):8.1f} max {x.max():9.0f} us, sum {x.sum() / 1e3:.0f} ms")


if __name__ == "__main__":
    main()
