"""Shared-prefix (cascade) decode attention vs plain decode attention, one layer, bf16.

A KV pool holds ``G`` groups x ``M`` members that share ``P`` prefix tokens (the same slots, as
the radix cache leaves them) plus each member's own tokens (uniform in ``[U/2, 3U/2]``, mean U,
the current token included). ``decode_attention`` over the ``G*M`` rows is timed without
``shared`` (every row reads its prefix) and with it (each chunk of ``C`` members reads it once),
for a sweep of the shared stage's ``(C, block_n, num_warps)``, then of its split count at the
best of those, and with ``NC`` = capacity (``B // 2`` chunks, most unused, as a CUDA graph
captured for any grouping may have). Model dims: Llama-3.1-8B (32/8 heads, D 128) and
SmolLM2-135M (9/3, D 64).

Times are GPU times per call from CUDA-graph replays (launch overhead excluded, as in the decode
graphs), cycling over enough pool copies (>= 256 MB) that reads come from HBM; median of
``--reps`` replays. "model GB" is the KV bytes each variant must read at least (plain: every
row's keys; shared: each chunk's prefix once + every row's own keys); GB/s = model GB / time.
"max err" is the max abs difference from the plain kernel's output (bf16). Rows are printed (and
written to ``--out``) as they finish.

    python benchmarks/bench_shared_prefix_attention.py --out benchmarks/results/shared_prefix_h200.md
    python benchmarks/bench_shared_prefix_attention.py --models 8b --groups 8 --members 64 --quick
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pkg import ensure_radixlm  # noqa: E402
from model_dims import Out  # noqa: E402

ensure_radixlm()

from radixlm.kernels.decode_attention import decode_attention  # noqa: E402
from radixlm.kernels.shared_prefix_attention import default_num_shared_splits, pack_shared_prefix  # noqa: E402

MODELS = {"8b": ("Llama-3.1-8B", 32, 8, 128), "135m": ("SmolLM2-135M", 9, 3, 64)}
COLD_BYTES = 256 << 20
DEV = "cuda"  # --cpu-dry-run (TRITON_INTERPRET=1, tiny sizes) checks the script's logic on "cpu"


class Workload:
    """``copies`` pools (k, v) and one req_to_token / seq_lens for G groups x M members."""

    def __init__(self, H: int, KH: int, D: int, G: int, M: int, P: int, U: int, seed: int = 0) -> None:
        dev, dt = DEV, (torch.bfloat16 if DEV == "cuda" else torch.float32)
        gen = torch.Generator(device=dev).manual_seed(seed)
        self.H, self.KH, self.D, self.G, self.M, self.P = H, KH, D, G, M, P
        B = self.B = G * M
        own = torch.randint(max(1, U // 2), max(2, 3 * U // 2 + 1), (B,), device=dev, generator=gen)
        self.seq_lens = (own + P).long()
        total = G * P + int(own.sum())
        slot_bytes = 2 * KH * D * 2
        self.copies = max(2, math.ceil(COLD_BYTES / (total * slot_bytes)))
        self.kv = [((torch.randn(total + 1, KH, D, device=dev, generator=gen) * 0.5).to(dt),
                    torch.randn(total + 1, KH, D, device=dev, generator=gen).to(dt)) for _ in range(self.copies)]
        slots = (torch.randperm(total, device=dev, generator=gen) + 1).int()  # page size 1, scattered
        width = P + int(own.max()) + 8
        self.req_to_token = torch.zeros(B + 1, width, dtype=torch.int32, device=dev)
        own_cpu, off = own.tolist(), G * P
        for b in range(B):  # row b of req_to_token is batch row b; group g = rows [g*M, (g+1)*M)
            g = b // M
            self.req_to_token[b, :P] = slots[g * P : (g + 1) * P]
            self.req_to_token[b, P : P + own_cpu[b]] = slots[off : off + own_cpu[b]]
            off += own_cpu[b]
        self.rows = torch.arange(B, device=dev)
        self.q = (torch.randn(B, H, D, device=dev, generator=gen)).to(dt)
        self.out = torch.empty_like(self.q)
        self.own_tokens = int(own.sum())

    def shared(self, C: int, num_chunks: int | None = None):
        groups = [(list(range(g * self.M, (g + 1) * self.M)), self.P, g * self.M) for g in range(self.G)]
        filled = self.G * math.ceil(self.M / C)
        return pack_shared_prefix(groups, self.B, num_chunks or filled, C, DEV), filled

    def model_gb(self, C: int | None) -> float:
        per_tok = 2 * self.KH * self.D * 2
        if C is None:
            return int(self.seq_lens.sum()) * per_tok / 1e9
        return (self.G * math.ceil(self.M / C) * self.P + self.own_tokens) * per_tok / 1e9

    def call(self, i: int, **kw) -> torch.Tensor:
        k, v = self.kv[i % self.copies]
        return decode_attention(self.q, k, v, self.req_to_token, self.rows, self.seq_lens, self.D**-0.5,
                                out=self.out, **kw)


def time_us(w: Workload, reps: int, **kw) -> tuple[float, torch.Tensor]:
    """Median µs per call from CUDA-graph replays of ``calls`` calls over the pool copies, and the
    output of one call on copy 0."""
    if DEV == "cpu":
        t0 = time.perf_counter()
        got = w.call(0, **kw).clone()
        return (time.perf_counter() - t0) * 1e6, got
    calls = max(w.copies, 4)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up (compiles) outside capture
        for i in range(2):
            w.call(i, **kw)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            w.call(i, **kw)
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
    out = w.call(0, **kw).clone()
    torch.cuda.synchronize()
    return statistics.median(times), out


def bench_model(out: Out, key: str, a: argparse.Namespace, deadline: float) -> None:
    name, H, KH, D = MODELS[key]
    w = Workload(H, KH, D, a.groups, a.members, a.prefix, a.own)
    out()
    out(f"## {name} dims (H={H}, KH={KH}, D={D}): {a.groups} groups x {a.members} members, prefix {a.prefix}, "
        f"own ~{a.own} (B={w.B}, {w.copies} pool copies)")
    out()
    out("| variant | C | NC | shared splits | block_n | warps | µs | vs plain | model GB | GB/s | max err |")
    out("|---|---|---|---|---|---|---|---|---|---|---|")
    t_plain, ref = time_us(w, a.reps)
    gb = w.model_gb(None)
    out(f"| plain | - | - | - | 64 | 4 | {t_plain:.1f} | 1.00x | {gb:.3f} | {gb / t_plain * 1e6:.0f} | 0 |")

    def row(label, C, nc, splits, bn, nw, **kw) -> float | None:
        shared, _ = w.shared(C, nc)
        try:
            us, got = time_us(w, a.reps, shared=shared, num_shared_splits=splits, shared_block_n=bn,
                              shared_num_warps=nw, **kw)
        except Exception as e:  # noqa: BLE001
            out(f"| {label} | {C} | {shared.num_chunks} | {splits} | {bn} | {nw} | FAILED: {type(e).__name__}: "
                f"{str(e)[:100]} | | | | |")
            if DEV == "cuda":
                torch.cuda.synchronize()
            return None
        err = (got.float() - ref.float()).abs().max().item()
        gb = w.model_gb(C)
        out(f"| {label} | {C} | {shared.num_chunks} | {splits} | {bn} | {nw} | {us:.1f} | {t_plain / us:.2f}x | "
            f"{gb:.3f} | {gb / us * 1e6:.0f} | {err:.1e} |")
        return us if err < 0.05 else None

    results = []
    for C in a.chunk:
        _, filled = w.shared(C)
        splits = default_num_shared_splits(filled, KH, torch.device(DEV))
        for bn in a.block_n:
            for nw in a.warps:
                if time.time() > deadline:
                    out("| (budget spent: remaining configs skipped) | | | | | | | | | | |")
                    return
                us = row("shared", C, None, splits, bn, nw)
                if us is not None:
                    results.append((us, C, bn, nw, splits))
    if not results:
        return
    _, C, bn, nw, auto = min(results)
    _, filled = w.shared(C)
    for splits in (1, 2, 4, 8, 16):
        if time.time() > deadline:
            break
        if splits != auto:
            us = row("shared, splits", C, None, splits, bn, nw)
            if us is not None:
                results.append((us, C, bn, nw, splits))
    if time.time() < deadline:
        row("shared, NC = B // 2 (capacity)", C, max(filled, w.B // 2), auto, bn, nw)
    us, C, bn, nw, splits = min(results)
    out()
    out(f"best: C={C}, block_n={bn}, warps={nw}, shared splits={splits} (auto {auto} from the filled chunks): "
        f"{us:.1f} µs vs plain {t_plain:.1f} µs ({t_plain / us:.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="markdown file to write (rows appended as they finish)")
    ap.add_argument("--models", default="8b,135m", help="comma list of: " + ", ".join(MODELS))
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--members", type=int, default=64)
    ap.add_argument("--prefix", type=int, default=2048)
    ap.add_argument("--own", type=int, default=256, help="mean own tokens per member (uniform in [U/2, 3U/2])")
    ap.add_argument("--chunk", default="8,16,32", help="comma list of chunk sizes C")
    ap.add_argument("--block-n", default="32,64", help="comma list of the shared stage's block_n")
    ap.add_argument("--warps", default="4,8", help="comma list of the shared stage's num_warps")
    ap.add_argument("--reps", type=int, default=10, help="timed graph replays per measurement (median)")
    ap.add_argument("--quick", action="store_true", help="C=16, block_n=64, warps 4 and 8 only")
    ap.add_argument("--budget-s", type=float, default=55.0,
                    help="per model: after this many seconds, remaining configs are skipped")
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help="check the script on CPU (TRITON_INTERPRET=1, tiny sizes)")
    a = ap.parse_args()
    global DEV
    if a.cpu_dry_run:
        DEV = "cpu"
    elif not torch.cuda.is_available():
        sys.exit("bench_shared_prefix_attention needs a CUDA device")
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    a.chunk, a.block_n, a.warps = ints(a.chunk), ints(a.block_n), ints(a.warps)
    if a.quick:
        a.chunk, a.block_n = [16], [64]
    out = Out(a.out)
    out(f"# shared-prefix (cascade) decode attention vs plain, bf16 — {datetime.datetime.now():%Y-%m-%d %H:%M}")
    out()
    device = torch.cuda.get_device_name() if DEV == "cuda" else "cpu (dry run)"
    out(f"device: {device}, torch {torch.__version__}, triton {__import__('triton').__version__}; "
        f"one layer, CUDA-graph replays, median of {a.reps}")
    for key in a.models.split(","):
        try:
            bench_model(out, key.strip(), a, time.time() + a.budget_s)
        except Exception:  # noqa: BLE001
            out(f"{key}: FAILED")
            out("```\n" + traceback.format_exc()[-1500:] + "\n```")
        if DEV == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
