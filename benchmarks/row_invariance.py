"""Is a linear layer's row independent of the other rows of its batch? For each decode shape of
Llama-3.1-8B and SmolLM2-135M (bf16), compare row 0 of ``linear(x[:m])`` for m in 2..16 (and 64,
256) with ``linear(x[:1])`` bit for bit, for cuBLAS (``F.linear``) and for radixlm's dispatcher
(``kernels.linear`` with the skinny GEMM on). Prints, per shape and path, the batch sizes at which
row 0 changes and the largest difference.

    python benchmarks/row_invariance.py
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pkg import ensure_radixlm  # noqa: E402

ensure_radixlm()

from radixlm import kernels  # noqa: E402

SHAPES = [("8B qkv", 6144, 4096), ("8B o", 4096, 4096), ("8B gate_up", 28672, 4096), ("8B down", 4096, 14336),
          ("135M qkv", 960, 576), ("135M o", 576, 576), ("135M gate_up", 3072, 576), ("135M down", 576, 1536)]
MS = [2, 3, 4, 8, 9, 16, 17, 64, 256]


def check(fn, w: torch.Tensor, x: torch.Tensor) -> tuple[list[int], float]:
    one = fn(x[:1], w)
    changed, worst = [], 0.0
    for m in MS:
        row = fn(x[:m], w)[:1]
        if not torch.equal(row, one):
            changed.append(m)
            worst = max(worst, (row.float() - one.float()).abs().max().item())
    return changed, worst


def main() -> None:
    torch.manual_seed(0)
    kernels.set_skinny_gemm(True)
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print("| shape | path | batch sizes where row 0 differs from M = 1 | max abs diff |")
    print("|---|---|---|---|")
    for name, n, k in SHAPES:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        x = torch.randn(max(MS), k, device="cuda", dtype=torch.bfloat16)
        for path, fn in (("cuBLAS", F.linear), ("radixlm linear (skinny on)", kernels.linear)):
            changed, worst = check(fn, w, x)
            print(f"| {name} | {path} | {changed or 'none'} | {worst:.3g} |")


if __name__ == "__main__":
    main()
