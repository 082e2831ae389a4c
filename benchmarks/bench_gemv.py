"""Decode GEMV benchmark: cuBLAS ``F.linear`` vs ``kernels/gemv.py``'s ``skinny_linear`` (its
default config and every candidate of ``tune_configs()``) on the Llama-3.1-8B and SmolLM2-135M
linear shapes, M in {1, 2, 4, 8, 16}, bf16.

Times are GPU times of CUDA-graph replays (launch overhead excluded, as in the runtime's decode
graphs), per call: each graph holds R calls cycling over enough weight copies (>= 256 MB in all)
that every call reads its weight from HBM, not L2 (as consecutive layers do). Median of several
replays. GB/s counts weight + x + y bytes; % is of 4.8 TB/s (H200 HBM3e). Each config is checked
against the fp32 reference (max abs error) before timing. Rows are printed (and written to
``--out``) as they finish, so a run cut short keeps its results.

    python benchmarks/bench_gemv.py --out benchmarks/results/gemv_h200.md
    python benchmarks/bench_gemv.py --models llama --m 1,4 --quick --out /tmp/gemv.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pkg import ensure_radixlm  # noqa: E402
from model_dims import Out  # noqa: E402

ensure_radixlm()

from radixlm.kernels.gemv import GemvConfig, default_config, skinny_linear, skinny_linear_ref, tune_configs  # noqa: E402

PEAK_GBS = 4800.0
SHAPES = {
    "llama": [("8B qkv", 6144, 4096), ("8B o", 4096, 4096), ("8B gate_up", 28672, 4096), ("8B down", 4096, 14336)],
    "smollm": [("135M qkv", 960, 576), ("135M o", 576, 576), ("135M gate_up", 3072, 576), ("135M down", 576, 1536),
               ("135M lm_head", 49152, 576)],
}
COLD_BYTES = 256 << 20
DEV = "cuda"  # the timed path needs CUDA; a dry run of the table logic may set "cpu"


def time_calls(fn, xs, ws, reps: int) -> float:
    """Median µs per call of ``fn(x_i, w_i)`` from CUDA-graph replays (R calls per graph)."""
    n = len(ws)
    calls = max(n, 16)
    calls = -(-calls // n) * n
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up (compiles) outside capture
        for i in range(min(calls, 3)):
            fn(xs[i % len(xs)], ws[i % n])
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(xs[i % len(xs)], ws[i % n])
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    del g
    return statistics.median(times)


def bench_shape(out: Out, name: str, n: int, k: int, ms: list[int], configs: list[GemvConfig], reps: int,
                deadline: float, best: dict) -> None:
    dt = torch.bfloat16
    w_bytes = n * k * 2
    copies = max(1, min(512, -(-COLD_BYTES // w_bytes)))
    gen = torch.Generator(device=DEV).manual_seed(0)
    ws = [(torch.randn(n, k, device=DEV, generator=gen, dtype=torch.float32) / k**0.5).to(dt) for _ in range(copies)]
    for m in ms:
        xs = [torch.randn(m, k, device=DEV, generator=gen, dtype=torch.float32).to(dt) for _ in range(4)]
        bytes_ = w_bytes + m * k * 2 + m * n * 2
        ref = skinny_linear_ref(xs[0], ws[0])

        def row(label: str, us: float, err: float) -> None:
            gbs = bytes_ / us / 1e3
            out(f"| {name} | {n}x{k} | {m} | {label} | {us:.2f} | {gbs:.0f} | {100 * gbs / PEAK_GBS:.1f} | {err:.2e} |")

        try:
            err = (F.linear(xs[0], ws[0]).float() - ref.float()).abs().max().item()
            t_cublas = time_calls(lambda x, w: F.linear(x, w), xs, ws, reps)
            row("cuBLAS F.linear", t_cublas, err)
        except Exception as e:  # noqa: BLE001
            out(f"| {name} | {n}x{k} | {m} | cuBLAS FAILED: {type(e).__name__}: {e} | | | | |")
            t_cublas = float("nan")
        cands = [("default " + default_config(m, n, k).short(), None)]
        cands += [(c.short(), c) for c in configs if not (c.use_dot is False and m > 4)]
        results = []
        for label, cfg in cands:
            if time.time() > deadline and cfg is not None:
                out(f"| {name} | {n}x{k} | {m} | (budget spent: remaining configs skipped) | | | | |")
                break
            try:
                got = skinny_linear(xs[0], ws[0], config=cfg)
                err = (got.float() - ref.float()).abs().max().item()
                us = time_calls(lambda x, w, c=cfg: skinny_linear(x, w, config=c), xs, ws, reps)
                row(label, us, err)
                if err <= 0.05:  # bf16 outputs of magnitude ~1-4: a few ulps at most
                    results.append((us, label))
                else:
                    out(f"| {name} | {n}x{k} | {m} | {label}: ERROR TOO LARGE, excluded | | | | |")
            except Exception as e:  # noqa: BLE001
                out(f"| {name} | {n}x{k} | {m} | {label} FAILED: {type(e).__name__}: {str(e)[:120]} | | | | |")
                torch.cuda.synchronize()
        if results:
            us, label = min(results)
            best[(name, m)] = (label, us, t_cublas, bytes_)
    del ws


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="markdown file to write (rows appended as they finish)")
    ap.add_argument("--models", default="llama,smollm", help="comma list of: llama, smollm")
    ap.add_argument("--m", default="1,2,4,8,16", help="comma list of row counts")
    ap.add_argument("--reps", type=int, default=7, help="timed graph replays per measurement (median)")
    ap.add_argument("--quick", action="store_true", help="default config + a third of tune_configs()")
    ap.add_argument("--budget-s", type=float, default=480.0,
                    help="after this many seconds only cuBLAS and the default config are timed")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_gemv needs a CUDA device")
    out = Out(args.out)
    ms = [int(v) for v in args.m.split(",")]
    configs = tune_configs()
    if args.quick:
        configs = configs[::3]
    deadline = time.time() + args.budget_s
    out(f"# skinny GEMM (GEMV) vs cuBLAS, bf16 — {datetime.datetime.now():%Y-%m-%d %H:%M}")
    out()
    out(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"triton {__import__('triton').__version__}; CUDA-graph replays, cold weights (>= 256 MB of copies), "
        f"median of {args.reps}; % of {PEAK_GBS / 1000:.1f} TB/s")
    out()
    out("| shape | N x K | M | kernel | µs | GB/s | % peak | max abs err |")
    out("|---|---|---|---|---|---|---|---|")
    best: dict = {}
    for model in args.models.split(","):
        for name, n, k in SHAPES[model.strip()]:
            try:
                bench_shape(out, name, n, k, ms, configs, args.reps, deadline, best)
            except Exception:  # noqa: BLE001
                out(f"| {name} | {n}x{k} | | SHAPE FAILED | | | | |")
                out("```\n" + traceback.format_exc()[-1500:] + "\n```")
            torch.cuda.empty_cache()
    out()
    out("## best skinny_linear config per shape")
    out()
    out("| shape | M | best config | µs | cuBLAS µs | speedup | % peak |")
    out("|---|---|---|---|---|---|---|")
    for (name, m), (label, us, t_cublas, bytes_) in best.items():
        out(f"| {name} | {m} | {label} | {us:.2f} | {t_cublas:.2f} | {t_cublas / us:.2f}x | "
            f"{100 * bytes_ / us / 1e3 / PEAK_GBS:.1f} |")
    layer = [name for name, _, _ in SHAPES["llama"]]
    for m in ms:
        got = [best.get((name, m)) for name in layer]
        if all(got):  # the four 8B linears x 32 layers (lm_head not included)
            out()
            out(f"8B decode linears per step (32 layers, M={m}): cuBLAS {32 * sum(g[2] for g in got):.0f} µs, "
                f"best skinny_linear {32 * sum(g[1] for g in got):.0f} µs")


if __name__ == "__main__":
    main()
