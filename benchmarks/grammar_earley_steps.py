"""First-visit mask steps of the Earley engine over MaskBench, best of several runs (issue 12).

Like ``grammar_slow_steps.py`` but only for the schemas that compile to the Earley engine, and
robust to a loaded machine: the whole walk (compile each schema with a fresh compiler, walk each
test instance token by token, fill the next-token bitmask at every step) is repeated ``--repeat``
times and each step keeps its smallest thread CPU time. Prints, over the steps that computed a new
mask (first visits), the count over 100 µs, p50 / p90 / p99, and the schemas with most slow steps.

    RADIXLM_SHARED_DATA=../shared/data .venv/bin/python benchmarks/grammar_earley_steps.py --tokenizer deepseek-llm --stride 20
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pkg import ensure_radixlm  # noqa: E402

ensure_radixlm()

from radixlm.grammar.compiler import GrammarCompiler  # noqa: E402
from radixlm.grammar.maskbench import (  # noqa: E402
    count_first_visits, encode_exact, load_cases, load_tokenizer, timed_steps,
)


def one_run(tok, cases: list, computed: list) -> list[tuple[float, bool, str]]:
    """``(thread seconds, first visit?, schema)`` of every mask step of the Earley schemas."""
    import torch

    comp = GrammarCompiler(tok)
    info = comp.tokenizer_info
    eos = info.stop_token_ids[0]
    bm = torch.zeros((1, info.mask_words), dtype=torch.int32)
    out = []
    for name, schema, instances in cases:
        try:
            g = comp.compile_json_schema(schema)
        except Exception:  # noqa: BLE001 - coverage is bench_grammar.py's business
            continue
        if type(g.engine).__name__ != "EarleyEngine":
            continue
        for ids in instances:
            out += [(dt, cold, name) for dt, cold in timed_steps(g, ids, eos, bm, computed)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", default="deepseek-llm")
    ap.add_argument("--stride", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    tok = load_tokenizer(a.tokenizer)
    info = GrammarCompiler(tok).tokenizer_info
    cases = [(name, json.dumps(c["schema"]), [encode_exact(tok, info, json.dumps(t["data"])) for t in c["tests"]])
             for name, c in load_cases(stride=a.stride)]
    computed = count_first_visits()
    gc.collect()
    gc.freeze()
    runs = [one_run(tok, cases, computed) for _ in range(a.repeat)]
    assert len({len(r) for r in runs}) == 1, "runs took different steps"
    best = [(min(r[i][0] for r in runs), runs[0][i][1], runs[0][i][2]) for i in range(len(runs[0]))]
    cold = np.array([s[0] for s in best if s[1]]) * 1e6
    slow = [s for s in best if s[1] and s[0] > 100e-6]
    print(f"Earley steps {len(best)}, first visits {cold.size}: p50 {np.percentile(cold, 50):.1f} us, "
          f"p90 {np.percentile(cold, 90):.1f} us, p99 {np.percentile(cold, 99):.1f} us, "
          f"sum {cold.sum() / 1e3:.1f} ms; over 100 us: {len(slow)} (best of {a.repeat} runs)")
    print("schemas with most slow steps:", collections.Counter(s[2] for s in slow).most_common(8))


if __name__ == "__main__":
    main()
