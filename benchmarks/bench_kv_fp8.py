"""Decode attention over a bf16 vs an fp8 KV pool (``kv_cache_dtype``), one layer, CUDA events.

Llama-3.1-8B attention dims (32 heads, 8 KV heads, head_dim 128) by default, ``--batch`` rows of
``--context`` keys each at scattered slots; sweeps stage 1's ``block_n`` / ``num_warps`` /
``num_stages`` and prints the time and the KV bytes read per second for each pool dtype, so a
config that lets the fp8 pool's halved bytes show up as time can be picked.

    python benchmarks/bench_kv_fp8.py --batch 512 --context 1280
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_kernels import gpu_time_us  # noqa: E402

from radixlm.kernels.decode_attention import decode_attention  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--context", type=int, default=1280)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--slots", choices=["scattered", "runs"], default="runs",
                    help="runs: each request's keys in one run of slots (a fresh pool); scattered: a permutation")
    a = ap.parse_args()
    B, L, H, KH, D = a.batch, a.context, a.heads, a.kv_heads, a.head_dim
    dev = torch.device("cuda")
    n = B * L
    gen = torch.Generator(device=dev).manual_seed(0)
    order = torch.randperm(n, device=dev, generator=gen) if a.slots == "scattered" else torch.arange(n, device=dev)
    slots = (order + 1).int().view(B, L)
    rows = torch.arange(B, device=dev)
    lens = torch.full((B,), L, device=dev)
    q = torch.randn(B, H, D, device=dev, dtype=torch.bfloat16)
    base_k = torch.randn(n + 1, KH, D, device=dev, dtype=torch.bfloat16)
    base_v = torch.randn(n + 1, KH, D, device=dev, dtype=torch.bfloat16)
    print(f"decode attention, B={B} context={L} H={H} KH={KH} D={D}, slots {a.slots}, {torch.cuda.get_device_name()}")
    print("| pool | block_n | warps | stages | heads fastest | us | KV GB/s | vs bf16 default |")
    print("|---|---|---|---|---|---|---|---|")
    ref_us = None
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        k, v = base_k.to(dtype), base_v.to(dtype)
        nbytes = 2 * B * L * KH * D * k.element_size()
        for block_n, warps, stages, hf in itertools.product((64, 128), (4, 8), (2, 3), (False, True)):
            fn = lambda: decode_attention(q, k, v, slots, rows, lens, D**-0.5, block_n=block_n,  # noqa: E731
                                          num_warps=warps, num_stages=stages, heads_fastest=hf)
            try:
                fn()
            except Exception as e:  # NOTE: a config the compiler refuses (shared memory)
                print(f"| {str(dtype)[6:]} | {block_n} | {warps} | {stages} | {hf} | {type(e).__name__} | | |")
                continue
            us = gpu_time_us(fn, reps=1, iters=a.iters, graph=False)
            if ref_us is None and dtype == torch.bfloat16 and (block_n, warps, stages, hf) == (64, 4, 3, False):
                ref_us = us
            rel = f"{ref_us / us:.2f}x" if ref_us else "-"
            print(f"| {str(dtype)[6:]} | {block_n} | {warps} | {stages} | {hf} | {us:.1f} | {nbytes / us / 1e3:.0f} | {rel} |")


if __name__ == "__main__":
    main()
