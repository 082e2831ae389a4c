"""Where a decode step's GPU time goes (issue 16, bs-1 ITL): replay the decode CUDA graph of
``--batch-size`` rows at ``--context`` keys each under ``torch.profiler`` and list the kernels
by total device time per step, with the step's wall time from CUDA events.

    python benchmarks/profile_decode_kernels.py --config-dir MODEL_DIR --batch-size 1 --context 512
    python benchmarks/profile_decode_kernels.py --write-config llama-3.1-8b /tmp/l8b
    python benchmarks/profile_decode_kernels.py --config-dir MODEL_DIR --compare

``--compare`` profiles, in one process, four settings of the ``AttentionBackend`` switches, from
the fewest launches per layer to those of before: (1) rotary, KV store, attention and the split
merge in one launch (``decode_rotary_in_attention``, not the default: only valid for graphs that
replay true decode steps, see runtime/attention.py; this script replays only those); (2)
rotary + KV store in one kernel, attention merging its splits in its own launch (arrival
counters); (3) the default: the same with the two-launch attention (stage 2 merges; on the H200
the counters of (2) cost more than the launch they save); (4) rotary, store_kv, attention stage 1
and stage 2 separate (before issue 16).

Dummy weights. A step of a small model is bound by the number of kernels (each costs a few µs
even when it moves little data), so the table's ``launches / step`` column matters as much as
the times.
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
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8_e4m3", "fp8_e5m2"])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--compare", action="store_true", help="fused launches, then the separate ones")
    ap.add_argument("--separate", action="store_true", help="only setting (4) of --compare (default: (3), the runtime default)")
    a = ap.parse_args()
    from radixlm.runtime.attention import AttentionBackend

    path, name = model_dir(ap, a)
    # (rotary in attention, rotary + store fused, one-launch merge)
    settings = [(True, True, True), (False, True, True), (False, True, False), (False, False, False)]
    for i, (in_attn, fused, one) in enumerate(settings, 1):
        if a.compare or i == (4 if a.separate else 3):
            B = AttentionBackend
            B.decode_rotary_in_attention, B.fuse_rotary_store, B.decode_one_launch = in_attn, fused, one
            print(f"\n## ({i}) rotary + store_kv {'in attention' if in_attn else 'fused' if fused else 'separate'}, "
                  f"decode attention {'one launch (arrival counters)' if one else 'two launches (stage 2)'}")
            profile_step(a, path, name)
            torch.cuda.synchronize()


def profile_step(a: argparse.Namespace, path: str, name: str) -> None:
    """Capture the decode graphs of a fresh runner (with the switches as set) and profile a step."""
    from radixlm.runtime.model_runner import ModelRunner
    from radixlm.runtime.server_args import ServerArgs

    bs, ctx = a.batch_size, a.context
    args = ServerArgs(model_path=path, load_format="dummy", device="cuda", context_length=ctx + 64,
                      kv_cache_dtype=a.kv_cache_dtype,
                      max_total_tokens=bs * (ctx + 16), max_running_requests=max(bs, 16), cuda_graph_max_bs=max(bs, 16))
    runner = ModelRunner(args, path, [0])
    g = runner.cuda_graph
    n = next(s for s in g.sizes if s >= bs)
    for i in range(bs):
        row = runner.req_to_token_pool.alloc()
        slots = runner.allocator.alloc(ctx + 1)
        runner.req_to_token_pool.write(row, 0, slots)
        g.req_pool_indices[i].fill_(row)
        g.out_cache_loc[i].copy_(slots[ctx])
    g.seq_lens[:bs].fill_(ctx + 1)
    g.positions[:bs].fill_(ctx)
    graph = g.graphs[n]
    step_ms = replay_ms(graph, a.iters, warmup=10)

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(a.iters):
            graph.replay()
        torch.cuda.synchronize()
    print(f"{name} dims, batch {bs} (graph {n}), context {ctx}, {torch.cuda.get_device_name()}, "
          f"{runner.cfg.num_hidden_layers} layers")
    kernel_table(prof, a.iters, step_ms * 1000, runner.cfg.num_hidden_layers, a.top)
    runner.release()


def kernel_table(prof, steps: int, step_us: float, layers: int, top: int) -> None:
    """Print the CUDA kernels of a ``torch.profiler`` capture of ``steps`` steps: per kernel name
    the device time per step (us), launches per step and us per launch, longest first, after a
    line with the step's wall time ``step_us``, the kernel sum and the gaps between them."""
    rows = {}
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        t, c = rows.get(e.name, (0.0, 0))
        rows[e.name] = (t + e.device_time, c + 1)
    total = sum(t for t, _ in rows.values()) / steps
    launches = sum(c for _, c in rows.values()) / steps
    print(f"step: {step_us:.1f} us; sum of kernel times {total:.1f} us; "
          f"{launches:.0f} kernels / step ({launches / layers:.1f} per layer); gaps {step_us - total:.1f} us")
    print("| kernel | us / step | launches / step | us / launch |\n|---|---:|---:|---:|")
    for k, (t, c) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"| {k[:90]} | {t / steps:.1f} | {c / steps:.0f} | {t / c:.2f} |")


if __name__ == "__main__":
    main()
