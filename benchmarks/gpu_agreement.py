"""Greedy agreement of radixlm (Triton kernels + CUDA graphs, bf16) with HF transformers on a
random-weight model of Llama-3.1-8B's dimensions: the first ``--tokens`` greedy tokens of several
prompts. HF initializes the weights; they are saved and loaded by radixlm from safetensors.

Random weights give flat next-token distributions, so bf16 rounding may flip near-ties; at the
first divergence the HF logit margin between the two tokens is printed, which tells a near-tie
(margin ~ bf16 noise) from a real disagreement.
"""

from __future__ import annotations

import argparse
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_offline import PUBLISHED  # noqa: E402


@torch.no_grad()
def report(hf, prompts: list[list[int]], ours: list[list[int]], ref: list[list[int]]) -> int:
    """Print, per prompt, how many greedy tokens agree and the HF logit margin at the first
    divergence; returns the number of prompts whose tokens all agree."""
    exact = 0
    for p, a, b in zip(prompts, ours, ref):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(b))
        if n == len(b):
            exact += 1
            print(f"prompt of {len(p)} tokens: all {len(b)} tokens agree")
            continue
        logits = hf(torch.tensor([p + b[:n]], device="cuda")).logits[0, -1].float()
        margin = (logits[b[n]] - logits[a[n]]).item()
        print(f"prompt of {len(p)} tokens: first {n} tokens agree; at {n} HF prefers {b[n]} over ours {a[n]} "
              f"by {margin:.4f} logits (top logit {logits.max().item():.3f})")
    return exact


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default="/tmp/llama-3.1-8b-random")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=6)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = dict(PUBLISHED["llama-3.1-8b"])
    torch.manual_seed(0)
    with torch.device("cuda"):
        hf = AutoModelForCausalLM.from_config(LlamaConfig(**cfg), dtype=torch.bfloat16).eval()
    hf.save_pretrained(args.dir)
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 128000) for _ in range(rng.randrange(8, 200))] for _ in range(args.prompts)]
    ref = []
    for p in prompts:
        ids = torch.tensor([p], device="cuda")
        out = hf.generate(ids, max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False, pad_token_id=0)
        ref.append(out[0, len(p) :].tolist())
    from radixlm.runtime.engine import Engine

    with Engine(args.dir, device="cuda", dtype="bfloat16", skip_tokenizer_init=True, context_length=4096,
                mem_fraction_static=0.5) as engine:
        sp = {"max_new_tokens": args.tokens, "temperature": 0, "ignore_eos": True}
        ours = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=sp)]
    exact = report(hf, prompts, ours, ref)
    print(f"exact agreement on {exact}/{len(prompts)} prompts over {args.tokens} tokens")


if __name__ == "__main__":
    main()
