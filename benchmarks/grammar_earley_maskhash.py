"""Mask fingerprints along every MaskBench test instance, for bit-identity checks between trees.

Compiles every ``--stride``-th MaskBench schema, walks each test instance token by token (as
``bench_grammar.py`` does) and writes one line per step: ``schema, instance, step, blake2b of the
packed int32 mask``; a schema that does not compile writes its error class instead. Run it in two
trees and compare the outputs with ``--compare A B`` (exit 1 on any difference; prints the first
ones). ``--earley-only`` keeps the schemas that run on the Earley engine.

    RADIXLM_SHARED_DATA=../shared/data .venv/bin/python benchmarks/grammar_earley_maskhash.py \
        --tokenizer deepseek-llm --stride 7 --out /tmp/new.txt
    PYTHONPATH=/tmp/base_pkg .venv/bin/python benchmarks/grammar_earley_maskhash.py ... --out /tmp/old.txt
    .venv/bin/python benchmarks/grammar_earley_maskhash.py --compare /tmp/old.txt /tmp/new.txt
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pkg import ensure_radixlm  # noqa: E402

ensure_radixlm()


def fingerprints(tokenizer: str, stride: int, earley_only: bool, out_path: str) -> None:
    """Write the per-step mask fingerprints of every test instance to ``out_path``."""
    from radixlm.grammar.compiler import GrammarCompiler
    from radixlm.grammar.maskbench import encode_exact, load_cases, load_tokenizer
    from radixlm.grammar.matcher import GrammarMatcher

    tok = load_tokenizer(tokenizer)
    comp = GrammarCompiler(tok)
    info = comp.tokenizer_info
    eos = info.stop_token_ids[0]
    with open(out_path, "w") as out:
        for name, case in load_cases(stride=stride):
            try:
                g = comp.compile_json_schema(json.dumps(case["schema"]))
            except Exception as e:  # noqa: BLE001 - the error class is part of the fingerprint
                if not earley_only:
                    out.write(f"{name}\t-\t-\t{type(e).__name__}\n")
                continue
            if earley_only and type(g.engine).__name__ != "EarleyEngine":
                continue
            for i, t in enumerate(case["tests"]):
                ids = encode_exact(tok, info, json.dumps(t["data"]))
                m = GrammarMatcher(g)
                for k, tid in enumerate(ids + [eos]):
                    h = hashlib.blake2b(m.next_token_mask().tobytes(), digest_size=8).hexdigest()
                    ok = m.accept_token(tid)
                    out.write(f"{name}\t{i}\t{k}\t{h}{'' if ok else ' rejected'}\n")
                    if not ok:
                        break


def compare(a: str, b: str) -> int:
    """Number of differing lines between two fingerprint files (first ten printed)."""
    la, lb = open(a).read().splitlines(), open(b).read().splitlines()
    diff = [(x, y) for x, y in zip(la, lb) if x != y]
    if len(la) != len(lb):
        print(f"line counts differ: {len(la)} vs {len(lb)}")
    for x, y in diff[:10]:
        print(f"- {x}\n+ {y}")
    print(f"{len(la)} / {len(lb)} lines, {len(diff)} differ")
    return len(diff) + abs(len(la) - len(lb))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", default="deepseek-llm")
    ap.add_argument("--stride", type=int, default=7)
    ap.add_argument("--earley-only", action="store_true")
    ap.add_argument("--out", default="/tmp/maskhash.txt")
    ap.add_argument("--compare", nargs=2, default=None, metavar=("OLD", "NEW"))
    a = ap.parse_args()
    if a.compare:
        sys.exit(1 if compare(*a.compare) else 0)
    fingerprints(a.tokenizer, a.stride, a.earley_only, a.out)


if __name__ == "__main__":
    main()
