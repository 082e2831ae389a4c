"""Mask time and cyclic-GC time of walking a schema corpus's instances (issue 12: large schemas).

For each named schema of a corpus laid out as SchemaStore's (``--schemas`` folder of NAME.json,
``--valid`` folder of NAME/ instance folders): compile it once, then walk every instance token by
token (:func:`radixlm.grammar.maskbench.run_instance`), as a serving process would after
``gc.freeze()`` of its start-up objects (the compiled grammar and what the walks build stay
tracked). Prints per schema: steps, mask p50 / p99 / steps over 1 ms, the walk's wall time, the
time spent in cyclic-GC passes (``gc.callbacks``) by generation, and the objects the collector
still tracks afterwards.

    RADIXLM_SHARED_DATA=/work/shared/data .venv/bin/python benchmarks/grammar_corpus_walks.py \\
        --schemas /tmp/schemastore/src/schemas/json --valid /tmp/schemastore/src/test \\
        claude-code-settings detekt-1.22.0 liquibase

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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _pkg import ensure_radixlm  # noqa: E402

ensure_radixlm()

from radixlm.grammar import GrammarCompiler  # noqa: E402
from radixlm.grammar.bitmask import allocate_token_bitmask  # noqa: E402
from radixlm.grammar.maskbench import load_tokenizer, run_instance  # noqa: E402


def main() -> None:
    """Compile and walk each named schema; print one line per schema."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="+")
    ap.add_argument("--schemas", type=Path, required=True)
    ap.add_argument("--valid", type=Path, required=True)
    ap.add_argument("--tokenizer", default="deepseek-llm")
    args = ap.parse_args()
    tok = load_tokenizer(args.tokenizer)
    gc.collect()
    gc.freeze()
    spent = {0: 0.0, 1: 0.0, 2: 0.0}
    began = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            spent[info["generation"]] += time.perf_counter() - began[0]

    gc.callbacks.append(on_gc)
    for name in args.names:
        compiler = GrammarCompiler(tok)
        grammar = compiler.compile_json_schema((args.schemas / f"{name}.json").read_text(encoding="utf-8-sig"))
        bitmask = allocate_token_bitmask(1, grammar.tokenizer_info.vocab_size)
        texts = [json.dumps(json.loads(f.read_text(encoding="utf-8-sig")))
                 for f in sorted((args.valid / name).glob("*.json"))]
        for g in spent:
            spent[g] = 0.0
        t0 = time.perf_counter()
        times: list[float] = []
        for text in texts:
            times += run_instance(grammar, tok, text, True, bitmask).mask_times
        wall = time.perf_counter() - t0
        us = np.array(times) * 1e6
        print(f"{name:32s} {type(grammar.engine).__name__:12s} steps {us.size:6d} mask p50 {np.median(us):5.0f} "
              f"p99 {np.percentile(us, 99):6.0f} us, >1 ms {int((us > 1000).sum()):5d}; walk {wall:6.2f} s, "
              f"GC {sum(spent.values()):5.2f} s (gen0/1/2 {spent[0]:.2f}/{spent[1]:.2f}/{spent[2]:.2f}), "
              f"tracked {len(gc.get_objects())}")
        del grammar, compiler
        gc.collect()


if __name__ == "__main__":
    main()
