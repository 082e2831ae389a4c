"""Cost of a speculative verify step vs a plain decode step on a large model (issue 14): replay the
decode CUDA graphs of 1 row (one request decoding) and of 1 + k rows (one request verifying k
drafts, as ``ModelRunner._forward_flat_decode`` runs it), with every row reading ``context`` keys.

    python benchmarks/bench_verify_step.py --write-config llama-3.1-8b /tmp/l8b --context 1024
    python benchmarks/bench_verify_step.py --config-dir MODEL_DIR --context 512   # any config.json
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_dims import add_model_args, model_dir, replay_ms  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(ap)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--drafts", default="2,4,8")
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args()

    from radixlm.runtime.model_runner import ModelRunner
    from radixlm.runtime.server_args import ServerArgs

    path, name = model_dir(ap, a)
    args = ServerArgs(model_path=path, load_format="dummy", device="cuda", context_length=a.context + 64,
                      max_total_tokens=a.context + 64, max_running_requests=16, cuda_graph_max_bs=16)
    runner = ModelRunner(args, path, [0])
    g = runner.cuda_graph
    row = runner.req_to_token_pool.alloc()
    slots = runner.allocator.alloc(a.context + 16)
    runner.req_to_token_pool.write(row, 0, slots)

    def step_ms(n: int) -> float:
        g.req_pool_indices[:n].fill_(row)
        g.seq_lens[:n].copy_(torch.arange(a.context - n + 1, a.context + 1, device="cuda"))
        g.positions[:n].copy_(g.seq_lens[:n] - 1)
        g.out_cache_loc[:n].copy_(slots[a.context - n : a.context])
        return replay_ms(g.graphs[n], a.iters)

    base = step_ms(1)
    print(f"{name} dims, context {a.context}, {torch.cuda.get_device_name()}")
    print("| step | rows | ms | vs decode |\n|---|---|---|---|")
    print(f"| decode | 1 | {base:.3f} | 1.00x |")
    for k in map(int, a.drafts.split(",")):
        n = next(s for s in g.sizes if s >= k + 1)
        ms = step_ms(n)
        print(f"| verify k={k} | {k + 1} (graph {n}) | {ms:.3f} | {ms / base:.2f}x |")


if __name__ == "__main__":
    main()
