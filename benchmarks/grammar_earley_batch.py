"""Host time of a constrained decode step for a batch of Earley matchers, on the CPU.

Simulates the scheduler's grammar work for ``--batch`` concurrent requests of one grammar (the
recursive schema ``benchmarks/schemas/recursive_thread.json`` and the EBNF of
``bench_constrained.py``, both on the Earley engine): each step fills the next-token masks of the
whole batch (:func:`~radixlm.grammar.matcher.fill_batch_bitmask`), picks a random allowed
non-stop token per matcher (seeded), advances each matcher by it (``accept_token``) and applies
the jump-forward string (``find_jump_forward_string``, then ``accept_string``). A matcher left
with only the stop token is restarted. Pass 1 uses a fresh compile (cold caches); pass 2 new
matchers of the same compiled grammar (warm caches), same seed unless ``--seed2``.

Per step, thread CPU time of: ``rows`` (the host part of the fill: ``masks.row_ids``, where first
visits are computed), ``gather`` (the rest of ``fill_batch_bitmask``: on the CPU its
``index_select`` copy of ``batch x words`` int32, which runs on the device when serving),
``accept`` and ``jump``; p50 / p99 / total, and the first visits (states computed).

    RADIXLM_SHARED_DATA=/work/shared/data RADIXLM_CACHE=/tmp/rlcache \\
        .venv/bin/python benchmarks/grammar_earley_batch.py --steps 250
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pkg import ensure_radixlm  # noqa: E402

ensure_radixlm()

import torch  # noqa: E402

from radixlm.grammar.compiler import GrammarCompiler  # noqa: E402
from radixlm.grammar.maskbench import load_tokenizer  # noqa: E402
from radixlm.grammar.matcher import GrammarMatcher, fill_batch_bitmask  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PARTS = ("rows", "gather", "accept", "jump")


def load_grammars(names: list[str]) -> dict[str, tuple[str, str]]:
    """``name -> (kind, source)`` of the grammars to run (``thread``: the recursive schema,
    ``ebnf``: bench_constrained.py's EBNF)."""
    out = {}
    for name in names:
        if name == "thread":
            with open(os.path.join(HERE, "schemas", "recursive_thread.json")) as f:
                out[name] = ("json", f.read())
        elif name == "ebnf":
            from bench_constrained import EBNF

            out[name] = ("ebnf", EBNF)
        else:
            raise SystemExit(f"unknown grammar {name!r}")
    return out


def compile_fresh(tok, kind: str, source: str):
    """A compile with a new compiler (nothing cached from an earlier pass)."""
    comp = GrammarCompiler(tok)
    return comp.compile_json_schema(source) if kind == "json" else comp.compile_ebnf(source)


def pick_tokens(bitmask: torch.Tensor, stops: np.ndarray, rng: np.random.Generator) -> list[int]:
    """A random allowed non-stop token per bitmask row (-1: only stop tokens allowed)."""
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little").astype(bool)
    bits[:, stops] = False
    out = []
    for row in bits:
        allowed = np.flatnonzero(row)
        out.append(int(rng.choice(allowed)) if allowed.size else -1)
    return out


def run_pass(compiled, batch: int, steps: int, seed: int) -> dict:
    """One simulated decode of ``steps`` steps; per part, the thread seconds of every step."""
    info = compiled.tokenizer_info
    stops = np.asarray(info.stop_token_ids, dtype=np.int64)
    rng = np.random.default_rng(seed)
    matchers = [GrammarMatcher(compiled) for _ in range(batch)]
    bitmask = torch.zeros((batch, info.mask_words), dtype=torch.int32)
    times = {p: [] for p in PARTS}
    visits = []
    clock = time.thread_time_ns
    for _ in range(steps):
        before = compiled.masks.n_rows, len(compiled.masks._row_of)
        t0 = clock()
        compiled.masks.row_ids([m.mask_state() for m in matchers])
        t1 = clock()
        fill_batch_bitmask(matchers, bitmask)
        t2 = clock()
        visits.append(len(compiled.masks._row_of) - before[1])
        tokens = pick_tokens(bitmask, stops, rng)
        t3 = clock()
        for i, (m, tok) in enumerate(zip(matchers, tokens)):
            if tok < 0:
                ok = m.accept_token(int(stops[0]))
                matchers[i] = GrammarMatcher(compiled)
            else:
                ok = m.accept_token(tok)
            assert ok, "an allowed token was refused"
        t4 = clock()
        for m in matchers:
            s = m.find_jump_forward_string()
            if s:
                assert m.accept_string(s), "the jump-forward string was refused"
        t5 = clock()
        for p, dt in zip(PARTS, (t1 - t0, t2 - t1, t4 - t3, t5 - t4)):
            times[p].append(dt / 1e6)
    return {"times": times, "visits": visits}


def report(label: str, res: dict) -> None:
    """Print one pass's table: per part p50 / p99 / total ms, and first visits."""
    v = np.asarray(res["visits"])
    print(f"{label}: first visits {v.sum()} in {(v > 0).sum()} steps")
    for p in PARTS:
        x = np.asarray(res["times"][p])
        print(f"  {p:7s} p50 {np.percentile(x, 50):7.3f} ms  p99 {np.percentile(x, 99):7.3f} ms  "
              f"total {x.sum():8.1f} ms")
    host = sum(np.asarray(res["times"][p]) for p in ("rows", "accept", "jump"))
    cold = np.asarray(res["times"]["rows"])[v > 0]
    print(f"  host (rows+accept+jump) p50 {np.percentile(host, 50):.3f} ms  p99 "
          f"{np.percentile(host, 99):.3f} ms  total {host.sum():.1f} ms; "
          f"rows on first-visit steps {cold.sum():.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", default="deepseek-llm")
    ap.add_argument("--grammars", default="thread,ebnf", help="comma list of: thread, ebnf")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seed2", type=int, default=None, help="seed of pass 2 (default: --seed)")
    ap.add_argument("--json", default=None, help="write the per-step times here")
    a = ap.parse_args()
    tok = load_tokenizer(a.tokenizer)
    GrammarCompiler(tok)  # NOTE: builds the per-tokenizer caches outside the passes
    gc.collect()
    gc.freeze()
    dump = {}
    for name, (kind, source) in load_grammars(a.grammars.split(",")).items():
        t = time.thread_time()
        compiled = compile_fresh(tok, kind, source)
        print(f"== {name}: engine {type(compiled.engine).__name__}, compile {time.thread_time() - t:.2f} s")
        r1 = run_pass(compiled, a.batch, a.steps, a.seed)
        report("pass 1", r1)
        r2 = run_pass(compiled, a.batch, a.steps, a.seed if a.seed2 is None else a.seed2)
        report("pass 2", r2)
        dump[name] = {"pass1": r1, "pass2": r2}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dump, f)


if __name__ == "__main__":
    main()
