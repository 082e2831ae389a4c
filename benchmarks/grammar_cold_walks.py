"""First-visit mask cost of a large JSON schema: compile, then random token walks (issue 12).

A schema whose DFA has more hot states than ``EAGER_STATES`` (grammar/dfa_engine.py) gets no
compile-time masks: every state a request reaches is a first visit while serving. This compiles
one schema (default: ``SCHEMA`` of benchmarks/bench_constrained.py, the server benchmark's JSON
mode) and runs ``--walks`` random walks of up to ``--steps`` tokens, each step taking the next
token uniformly among the allowed non-stop tokens (seeded), with a fresh matcher per walk (masks
stay cached across walks, as in a server). Times are thread CPU time (robust to other jobs on the
machine): compile, and the mask of every step (p50 / p99 / max, sum, steps over 100 µs, and the
sum over first visits only). ``--check N`` recomputes the masks of the first N distinct states
through a fresh plain :class:`~radixlm.grammar.token_index.DfaIndex` walk and fails on a mismatch.

    RADIXLM_SHARED_DATA=../shared/data .venv/bin/python benchmarks/grammar_cold_walks.py --tokenizer deepseek-llm
    RADIXLM_SHARED_DATA=../shared/data .venv/bin/python benchmarks/grammar_cold_walks.py --schema my_schema.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pkg import ensure_radixlm  # noqa: E402

ensure_radixlm()

from radixlm.grammar.compiler import GrammarCompiler  # noqa: E402
from radixlm.grammar.matcher import GrammarMatcher  # noqa: E402
from radixlm.grammar.maskbench import count_first_visits, load_tokenizer  # noqa: E402


def default_schema() -> dict:
    """``SCHEMA`` from bench_constrained.py (read from its source: that script imports requests)."""
    import ast

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_constrained.py")
    tree = ast.parse(open(path).read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "SCHEMA":
            return ast.literal_eval(node.value)
    raise SystemExit("SCHEMA not found in bench_constrained.py")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", default="deepseek-llm")
    ap.add_argument("--schema", default=None, help="JSON schema file (default: bench_constrained's SCHEMA)")
    ap.add_argument("--walks", type=int, default=40)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", type=int, default=0, help="verify the masks of this many states")
    a = ap.parse_args()
    schema = json.load(open(a.schema)) if a.schema else default_schema()
    tok = load_tokenizer(a.tokenizer)
    comp = GrammarCompiler(tok)
    info = comp.tokenizer_info
    computed = count_first_visits()
    stops = set(info.stop_token_ids)
    gc.collect()
    gc.freeze()
    t0 = time.thread_time()
    g = comp.compile_json_schema(json.dumps(schema))
    compile_s = time.thread_time() - t0
    engine = g.engine
    n_hot = int(getattr(engine, "hot", np.zeros(0)).size)
    rng = random.Random(a.seed)
    times, cold, states = [], [], []
    for _ in range(a.walks):
        m = GrammarMatcher(g)
        for _ in range(a.steps):
            before = computed[0]
            t = time.thread_time()
            row = m.next_token_mask()
            times.append(time.thread_time() - t)
            cold.append(computed[0] > before)
            states.append(getattr(m, "_history", [None])[-1])  # NOTE: the engine state, for --check
            bits = np.unpackbits(row.view(np.uint8), bitorder="little")[: info.tokenizer_size]
            allowed = [int(x) for x in np.flatnonzero(bits) if int(x) not in stops]
            if not allowed or not m.accept_token(rng.choice(allowed)):
                break
    ts = np.asarray(times) * 1e6
    cold = np.asarray(cold)
    print(f"{a.tokenizer}: {type(engine).__name__}, {getattr(engine, 'n_states', '?')} states "
          f"({n_hot} hot), eager={getattr(engine, 'eager', '?')}")
    print(f"compile {compile_s * 1e3:.1f} ms; steps {ts.size} ({int(cold.sum())} first visits); "
          f"mask p50 {np.percentile(ts, 50):.1f} p99 {np.percentile(ts, 99):.1f} max {ts.max():.0f} us; "
          f"sum {ts.sum() / 1e3:.1f} ms (first visits {ts[cold].sum() / 1e3:.1f} ms); "
          f">100us {int((ts > 100).sum())}")
    if a.check:
        _check(g, engine, info, [s for s in dict.fromkeys(states) if s is not None][: a.check])


def _check(g, engine, info, states: list) -> None:
    """Compare the served masks of DFA ``states`` with a fresh plain walk of the full trie."""
    from radixlm.grammar.token_index import DfaIndex, RegionCache

    if not hasattr(engine, "dfa"):
        print("check: not a DFA grammar, skipped")
        return
    ref = DfaIndex(engine.dfa.trans, info.trie, info.mask_words, RegionCache())
    bad = sum(not np.array_equal(engine.mask(s), ref.mask(s)) for s in states)
    print(f"check: {len(states)} states, {bad} mismatches")
    if bad:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
