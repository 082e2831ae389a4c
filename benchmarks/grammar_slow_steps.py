"""Where a grammar engine's slow mask steps come from (issue 12, mask p99 per request-step).

Runs radixlm's engine over MaskBench like ``bench_grammar.py`` (compile each schema, walk each test
instance token by token, fill the next-token bitmask at every step), but times every step in CPU
thread time (robust to other jobs on the machine) and tags it by engine (DFA / Earley) and by
whether it computed a new mask ("cold": a first visit) or only looked one up ("hit"). Prints the
per-step p50 / p99, the number of steps over 100 µs by tag, the schemas with most slow steps, and
per-tag p50 / p90 / max; ``--out`` pickles ``(steps, compiles)`` for a closer look.

    RADIXLM_SHARED_DATA=../shared/data .venv/bin/python benchmarks/grammar_slow_steps.py --tokenizer deepseek-llm --stride 20
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import pickle
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pkg import ensure_radixlm  # noqa: E402

ensure_radixlm()

from radixlm.grammar.compiler import GrammarCompiler  # noqa: E402
from radixlm.grammar.maskbench import (  # noqa: E402
    count_first_visits, encode_exact, load_cases, load_tokenizer, timed_steps,
)

SLOW_S = 100e-6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", default="deepseek-llm")
    ap.add_argument("--stride", type=int, default=20, help="every n-th MaskBench file")
    ap.add_argument("--out", default=None, help="pickle (steps, compiles) here")
    a = ap.parse_args()
    tok = load_tokenizer(a.tokenizer)
    comp = GrammarCompiler(tok)
    info = comp.tokenizer_info
    eos = info.stop_token_ids[0]
    computed = count_first_visits()
    bm = torch.zeros((1, info.mask_words), dtype=torch.int32)
    gc.collect()
    gc.freeze()
    steps, compiles = [], []  # (seconds, tag, schema), (seconds, schema, engine)
    for name, case in load_cases(stride=a.stride):
        instances = [encode_exact(tok, info, json.dumps(t["data"])) for t in case["tests"]]
        t0 = time.thread_time()
        try:
            g = comp.compile_json_schema(json.dumps(case["schema"]))
        except Exception:  # noqa: BLE001 - coverage is bench_grammar.py's business
            continue
        engine = type(g.engine).__name__.replace("Engine", "")
        compiles.append((time.thread_time() - t0, name, engine))
        for ids in instances:
            steps += [(dt, f"{engine}:{'cold' if cold else 'hit'}", name)
                      for dt, cold in timed_steps(g, ids, eos, bm, computed)]
    report(steps, compiles)
    if a.out:
        with open(a.out, "wb") as f:
            pickle.dump((steps, compiles), f)


def report(steps: list, compiles: list) -> None:
    ts = np.array([s[0] for s in steps]) * 1e6
    slow = [s for s in steps if s[0] > SLOW_S]
    print(f"steps {ts.size}: p50 {np.percentile(ts, 50):.1f} us, p99 {np.percentile(ts, 99):.1f} us; "
          f"over 100 us: {len(slow)}")
    print("over 100 us by tag:", dict(collections.Counter(s[1] for s in slow)))
    print("schemas with most slow steps:", collections.Counter(s[2] for s in slow).most_common(10))
    for tag, n in sorted(collections.Counter(s[1] for s in steps).items()):
        x = np.array([s[0] for s in steps if s[1] == tag]) * 1e6
        print(f"  {tag:12s} n {n:6d}  p50 {np.percentile(x, 50):7.1f}  p90 {np.percentile(x, 90):7.1f}  "
              f"max {x.max():9.0f} us")
    ct = np.array([c[0] for c in compiles]) * 1e3
    print(f"compile (thread time) p50 {np.percentile(ct, 50):.1f} ms, p90 {np.percentile(ct, 90):.1f} ms; "
          f"engines {dict(collections.Counter(c[2] for c in compiles))}")


if __name__ == "__main__":
    main()
