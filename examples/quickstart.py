"""The main job of `make run`: generate on the default model and report throughput.

Usage: python examples/quickstart.py [--model-path PATH] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import time

import radixlm.runtime.engine as engine_mod

PROMPTS = [
    "def fibonacci(n):",
    "import json\n\ndef load(path):",
    "class LRUCache:\n    def __init__(self, capacity):",
    "# Parse the command line arguments\nparser = argparse.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model-path", default=None, help="HF model folder (default: the embedded tiny model)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()
    with engine_mod.Engine(args.model_path, device=args.device) as engine:
        sp = {"max_new_tokens": args.max_new_tokens, "temperature": 0.8, "top_p": 0.95, "seed": 0}
        t0 = time.perf_counter()
        outs = engine.generate(PROMPTS, sp)
        elapsed = time.perf_counter() - t0
        for prompt, out in zip(PROMPTS, outs):
            print("=" * 60)
            print(prompt + out["text"])
        gen = sum(o["meta_info"]["completion_tokens"] for o in outs)
        prompt_tokens = sum(o["meta_info"]["prompt_tokens"] for o in outs)
        print("=" * 60)
        print(f"model: {engine.server_args.model_path}")
        print(f"{len(outs)} requests, {prompt_tokens} prompt + {gen} generated tokens in {elapsed:.2f}s "
              f"-> {gen / elapsed:.1f} output tok/s")
        # The same prompts again: their prefixes now come from the radix cache.
        engine.generate(PROMPTS, {**sp, "max_new_tokens": 1})
        print(f"prefix-cache hit rate so far: {engine.cache_hit_rate:.1%}")


if __name__ == "__main__":
    main()
