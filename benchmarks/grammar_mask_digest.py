"""Digests of every MaskBench bitmask, to compare two trees' masks bit for bit.

Walks radixlm's engine over MaskBench as ``bench_grammar.py`` does (compile each schema, walk each
test instance token by token, one ``fill_next_token_bitmask`` per step) and writes, per schema, a
blake2b digest over the filled bitmask of every step (and the accept / terminate outcome) as JSON.
Two trees gave the same masks when their files are equal (``--compare A B``).

    RADIXLM_SHARED_DATA=/work/shared/data .venv/bin/python benchmarks/grammar_mask_digest.py \
        --tokenizer deepseek-llm --stride 20 --out /tmp/new.json
    .venv/bin/python benchmarks/grammar_mask_digest.py --compare /tmp/base.json /tmp/new.json

Imports the ``radixlm`` that holds the script (its tree's parent first on ``sys.path``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def digests(tokenizer: str, stride: int, closed: bool) -> dict[str, str]:
    """``{schema: hex digest}`` over every step's bitmask of every test instance."""
    import torch

    from radixlm.grammar import GrammarCompiler, GrammarMatcher
    from radixlm.grammar.maskbench import encode_exact, load_cases, load_tokenizer

    tok = load_tokenizer(tokenizer)
    comp = GrammarCompiler(tok)
    info = comp.tokenizer_info
    eos = info.stop_token_ids[0]
    bm = torch.zeros((1, info.mask_words), dtype=torch.int32)
    out = {}
    for name, case in load_cases(stride=stride):
        h = hashlib.blake2b(digest_size=16)
        try:
            g = comp.compile_json_schema(json.dumps(case["schema"]), disable_additional_properties=closed)
        except Exception as e:  # noqa: BLE001
            out[name] = f"error {type(e).__name__}"
            continue
        for t in case["tests"]:
            m = GrammarMatcher(g)
            ok = True
            for tid in encode_exact(tok, info, json.dumps(t["data"])) + [eos]:
                m.fill_next_token_bitmask(bm, 0)
                h.update(bm.numpy().tobytes())
                if not m.accept_token(tid):
                    ok = False
                    break
            h.update(b"T" if ok and m.is_terminated() else b"F")
        out[name] = h.hexdigest()
    return out


def main() -> None:
    """Write digests (``--out``) or compare two digest files (``--compare``)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="deepseek-llm")
    ap.add_argument("--stride", type=int, default=20)
    ap.add_argument("--closed", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--compare", nargs=2, default=None)
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        print(f"{len(a)} / {len(b)} schemas, {len(diff)} differ: {diff[:20]}")
        sys.exit(1 if diff else 0)
    got = digests(args.tokenizer, args.stride, args.closed)
    Path(args.out).write_text(json.dumps(got, indent=0, sort_keys=True))
    print(f"{len(got)} schemas -> {args.out}")


if __name__ == "__main__":
    main()
