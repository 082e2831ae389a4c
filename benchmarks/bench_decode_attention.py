"""Decode attention launch configs across batch sizes and contexts (CUDA events, median).

For Llama-3.1-8B and SmolLM2-135M attention dims, each ``(batch, context)`` and each stage-1 config
``(block_n, num_warps, num_stages, heads_fastest)`` in ``CONFIGS``: the time of one
``decode_attention`` call (both stages, each request's keys in one run of slots as in a fresh
pool) and its ratio to the first config (the kernel's defaults before heads-fastest launches).

    python benchmarks/bench_decode_attention.py [--kv-cache-dtype fp8_e4m3]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_kernels import gpu_time_us  # noqa: E402

from radixlm.kernels.decode_attention import decode_attention  # noqa: E402

DIMS = {"8B": (32, 8, 128), "135M": (9, 3, 64)}  # heads, KV heads, head_dim
CONFIGS = [(64, 4, 3, False), (64, 4, 3, True), (128, 4, 3, True), (128, 8, 3, True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,16,64,128,256,512")
    ap.add_argument("--contexts", default="512,1280,4096")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8_e4m3"])
    ap.add_argument("--iters", type=int, default=15)
    a = ap.parse_args()
    dev = torch.device("cuda")
    kv_dtype = torch.float8_e4m3fn if a.kv_cache_dtype == "fp8_e4m3" else torch.bfloat16
    print(f"decode attention, KV {kv_dtype}, {torch.cuda.get_device_name()}; configs (block_n, warps, stages, "
          f"heads_fastest): {CONFIGS}")
    print("| dims | batch | context | " + " | ".join(f"cfg {i} us" for i in range(len(CONFIGS))) + " | best vs cfg 0 |")
    print("|---|---|---|" + "---|" * (len(CONFIGS) + 1))
    for name, (H, KH, D) in DIMS.items():
        for L in map(int, a.contexts.split(",")):
            for B in map(int, a.batches.split(",")):
                if B * L > 1 << 21:  # NOTE: keep the pool within a few GiB
                    continue
                n = B * L
                slots = (torch.arange(n, device=dev) + 1).int().view(B, L)
                q = torch.randn(B, H, D, device=dev, dtype=torch.bfloat16)
                k = torch.randn(n + 1, KH, D, device=dev, dtype=torch.bfloat16).to(kv_dtype)
                v = torch.randn(n + 1, KH, D, device=dev, dtype=torch.bfloat16).to(kv_dtype)
                rows, lens = torch.arange(B, device=dev), torch.full((B,), L, device=dev)
                us = [gpu_time_us(lambda c=c: decode_attention(q, k, v, slots, rows, lens, D**-0.5, block_n=c[0],
                                                               num_warps=c[1], num_stages=c[2], heads_fastest=c[3]),
                                  reps=1, iters=a.iters, graph=False) for c in CONFIGS]
                cells = " | ".join(f"{u:.1f}" for u in us)
                print(f"| {name} | {B} | {L} | {cells} | {us[0] / min(us):.2f}x (cfg {us.index(min(us))}) |", flush=True)
                del k, v


if __name__ == "__main__":
    main()
