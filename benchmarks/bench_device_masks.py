"""First-visit mask cost: host trie walk vs the DFA-over-vocabulary kernel (issue 12).

Compiles one JSON schema (default: ``SCHEMA`` of bench_constrained.py) with no compile-time masks,
then for random batches of its DFA states times (a) the host's first visits (fresh
:class:`~radixlm.grammar.token_index.DfaIndex` per batch, thread CPU time) and (b)
:func:`radixlm.kernels.dfa_token_mask` on ``--device`` (CUDA events, after a warm-up), and checks
that both give the same masks.

    .venv/bin/python benchmarks/bench_device_masks.py --tokenizer deepseek-llm --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pkg import ensure_radixlm  # noqa: E402

ensure_radixlm()

import grammar_cold_walks  # noqa: E402

import radixlm.grammar.dfa_engine as dfa_engine  # noqa: E402
from radixlm.grammar.compiler import GrammarCompiler  # noqa: E402
from radixlm.grammar.device_masks import token_bytes  # noqa: E402
from radixlm.grammar.maskbench import load_tokenizer  # noqa: E402
from radixlm.grammar.token_index import DfaIndex, RegionCache  # noqa: E402
from radixlm.kernels import dfa_token_mask  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", default="deepseek-llm", help="a shared tokenizer name or a path")
    ap.add_argument("--schema", default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()
    if os.path.isdir(a.tokenizer):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(a.tokenizer)
    else:
        tok = load_tokenizer(a.tokenizer)
    schema = json.load(open(a.schema)) if a.schema else grammar_cold_walks.default_schema()
    comp = GrammarCompiler(tok)
    info = comp.tokenizer_info
    dfa_engine.EAGER_STATES = 0
    g = comp.compile_json_schema(json.dumps(schema))
    dfa = g.engine.dfa
    dev = torch.device(a.device)
    trans = torch.from_numpy(np.ascontiguousarray(dfa.trans, dtype=np.int32)).to(dev)
    tb = token_bytes(info, dev)
    rng = np.random.default_rng(0)
    print(f"{dfa.n_states} DFA states, vocab {info.vocab_size}, device {dev}")
    for k in a.batches:
        host_s, dev_s, bad = [], [], 0
        for r in range(a.repeat):
            states = rng.choice(np.arange(1, dfa.n_states), k, replace=False)
            index = DfaIndex(dfa.trans, info.trie, info.mask_words, RegionCache())
            t = time.thread_time()
            index.compute(states.tolist())
            host_s.append(time.thread_time() - t)
            ids = torch.from_numpy(states).to(dev)
            dfa_token_mask(trans, ids, tb, info.mask_words)  # NOTE: warm-up (compile, caches)
            if dev.type == "cuda":
                torch.cuda.synchronize()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                out = dfa_token_mask(trans, ids, tb, info.mask_words)
                e1.record()
                torch.cuda.synchronize()
                dev_s.append(e0.elapsed_time(e1) / 1e3)
            else:
                t = time.perf_counter()
                out = dfa_token_mask(trans, ids, tb, info.mask_words)
                dev_s.append(time.perf_counter() - t)
            got = out.cpu().numpy()
            bad += sum(not np.array_equal(got[i], index.masks[int(s)]) for i, s in enumerate(states))
        print(f"batch {k:4d}: host first visits p50 {np.median(host_s) * 1e3:8.3f} ms, "
              f"kernel p50 {np.median(dev_s) * 1e3:8.3f} ms, mismatches {bad}")
        if bad:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
