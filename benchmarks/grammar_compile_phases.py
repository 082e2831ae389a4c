"""Where MaskBench compile time goes, per phase, in thread CPU time (issue 12's compile p50 work).

Compiles the MaskBench schemas in the order ``bench_grammar.py`` does (one compiler, so the
per-process automaton memo warms up the same way) and splits each compile into: the front end
(``json_schema_to_ast``: schema -> AST, including the scalar automata it builds), the top-level
DFA (``dfa_from_ast`` of the root), the engine (``DfaEngine`` / ``EarleyEngine``: eager masks) and
the rest. Reports p50 / p90 per phase, and the schemas nearest the compile median.

    RADIXLM_SHARED_DATA=/work/shared/data .venv/bin/python benchmarks/grammar_compile_phases.py \
        --tokenizer deepseek-llm --stride 20 [--json out.json]

Run with ``PYTHONPATH=<other tree's parent>`` to measure another checkout (A/B).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import radixlm.grammar.compiler as comp  # noqa: E402
from radixlm.grammar import GrammarCompiler, GrammarError  # noqa: E402
from radixlm.grammar.maskbench import load_cases, load_tokenizer  # noqa: E402

PHASES = ("front", "dfa", "engine", "other")


def _timed(phase: str, fn, acc: dict):
    def wrapper(*a, **k):
        t0 = time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            acc[phase] = acc.get(phase, 0.0) + time.thread_time() - t0
    return wrapper


def main() -> None:
    """Compile every selected schema once; print per-phase thread-time percentiles."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="deepseek-llm")
    ap.add_argument("--stride", type=int, default=20)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--json", default=None, help="write per-schema figures here")
    args = ap.parse_args()
    acc: dict[str, float] = {}
    comp.json_schema_to_ast = _timed("front", comp.json_schema_to_ast, acc)
    comp.dfa_from_ast = _timed("dfa", comp.dfa_from_ast, acc)
    comp.DfaEngine = _timed("engine", comp.DfaEngine, acc)
    import radixlm.grammar.earley_engine as ee

    ee.EarleyEngine.from_rules = classmethod(_timed("engine", ee.EarleyEngine.from_rules.__func__, acc))
    tok = load_tokenizer(args.tokenizer)
    compiler = GrammarCompiler(tok)
    cases = load_cases(limit=args.limit, stride=args.stride)
    gc.collect()
    gc.freeze()
    rows = []
    for name, case in cases:
        acc.clear()
        t0, w0 = time.thread_time(), time.perf_counter()
        try:
            compiler.compile_json_schema(json.dumps(case["schema"]))
            err = None
        except GrammarError as e:
            err = str(e)[:80]
        total, wall = time.thread_time() - t0, time.perf_counter() - w0
        row = {"name": name, "total": total, "wall": wall, "error": err}
        row.update({p: acc.get(p, 0.0) for p in PHASES[:-1]})
        row["other"] = total - sum(row[p] for p in PHASES[:-1])
        rows.append(row)
    ok = [r for r in rows if r["error"] is None]
    for key in ("wall", "total") + PHASES:
        xs = np.array([r[key] for r in ok]) * 1e3
        print(f"{key:7s} p50 {np.percentile(xs, 50):7.2f} ms  p90 {np.percentile(xs, 90):7.2f}  "
              f"max {xs.max():8.1f}  sum {xs.sum():8.0f}")
    med = np.percentile([r["total"] for r in ok], 50)
    near = sorted(ok, key=lambda r: abs(r["total"] - med))[:10]
    print("near the median:")
    for r in near:
        print(f"  {r['name']:40s} " + " ".join(f"{p}={r[p] * 1e3:.1f}" for p in ("total",) + PHASES))
    print("errors:", sum(r["error"] is not None for r in rows), "of", len(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows))


if __name__ == "__main__":
    main()
