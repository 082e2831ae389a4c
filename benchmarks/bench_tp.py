"""Tensor parallelism: bs-1 inter-token latency and offline throughput, TP sizes side by side in
one run (issue 15). Random-token prompts, ``ignore_eos``, dummy weights from a config-only folder.

    python benchmarks/bench_tp.py --tp-sizes 1,2                           # CPU, small llama dims
    python benchmarks/bench_tp.py --write-config llama-3.1-8b /tmp/l8b --device cuda \\
        --tp-sizes 1,2 --num-prompts 512 --input-len 1024 --output-len 256      # 2 GPUs

ITL = (latency of a request with ``output_len + 1`` new tokens - latency with 1) / ``output_len``,
so the prefill is left out. Throughput = generated tokens / wall time of all prompts at once.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import time

import torch

SMALL = {"architectures": ["LlamaForCausalLM"], "vocab_size": 32000, "hidden_size": 1024,
         "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4,
         "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "eos_token_id": 2}


def run(path: str, tp: int, args) -> dict:
    from radixlm.runtime.engine import Engine

    rng = random.Random(0)
    vocab = json.load(open(os.path.join(path, "config.json")))["vocab_size"]
    prompts = [[rng.randrange(100, vocab) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
    kw = dict(device=args.device, load_format="dummy", skip_tokenizer_init=True, tp_size=tp)
    if args.max_total_tokens:
        kw["max_total_tokens"] = args.max_total_tokens
    with Engine(path, **kw) as engine:
        def timed(ids, n: int) -> float:
            t = time.perf_counter()
            engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": n, "ignore_eos": True})
            return time.perf_counter() - t

        timed(prompts[0], 8)  # warm-up (Triton JIT, graphs)
        first = min(timed(prompts[1], 1) for _ in range(3))
        full = min(timed(prompts[1], args.output_len + 1) for _ in range(2))
        itl_ms = 1000 * (full - first) / args.output_len
        wall = timed(prompts, args.output_len)
        out = {"tp": tp, "itl_ms": round(itl_ms, 2), "throughput_tok_s": round(len(prompts) * args.output_len / wall, 1),
               "wall_s": round(wall, 2)}
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=None, help="config-only HF folder (default: small llama dims)")
    ap.add_argument("--write-config", nargs=2, metavar=("NAME", "DIR"), help="published dims, see bench_offline.py")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tp-sizes", default="1,2")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--max-total-tokens", type=int, default=None)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    path = args.model_path
    if args.write_config:
        import sys

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_offline import PUBLISHED

        name, path = args.write_config
        os.makedirs(path, exist_ok=True)
        json.dump(PUBLISHED[name], open(os.path.join(path, "config.json"), "w"))
    elif path is None:
        path = "/tmp/radixlm-bench-tp-small"
        os.makedirs(path, exist_ok=True)
        json.dump(SMALL, open(os.path.join(path, "config.json"), "w"))
    rows = [run(path, int(tp), args) for tp in args.tp_sizes.split(",")]
    for r in rows:
        print(f"tp={r['tp']}: bs-1 ITL {r['itl_ms']} ms; {args.num_prompts} x {args.input_len}/{args.output_len}: "
              f"{r['throughput_tok_s']} tok/s ({r['wall_s']} s)", flush=True)
    if args.json_out:
        json.dump(rows, open(args.json_out, "w"), indent=1)


if __name__ == "__main__":
    main()
