"""GPU check of radixlm's Triton kernels: correctness at real sizes and microbenchmarks vs torch.

Llama-3.1-8B shapes (32 q heads, 8 kv heads, head_dim 128, hidden 4096, intermediate 14336, vocab
128256), bf16, page-size-1 KV pool with scattered slots. Every kernel is checked against its torch
reference (relative error ``||a - b|| / ||b|| <= 1e-2``), then timed beside its baseline in the same
run: decode attention vs SDPA on contiguous KV (effective bandwidth over the KV bytes, next to the
card's copy bandwidth), extend attention vs SDPA flash, small ops vs torch eager and torch.compile.
Times are GPU times from CUDA-graph replays (launch overhead excluded), median of several runs.

    python benchmarks/gpu_kernels.py --out benchmarks/results/kernels_h200.md
    python benchmarks/gpu_kernels.py --only decode,extend --quick
    python benchmarks/gpu_kernels.py --only window --out /tmp/window.md   # sliding-window kernels
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pkg import ensure_radixlm  # noqa: E402

ensure_radixlm()

from radixlm.kernels.activation import silu_and_mul, silu_and_mul_ref  # noqa: E402
from radixlm.kernels.bitmask import apply_token_bitmask_ref, apply_token_bitmask_triton  # noqa: E402
from radixlm.kernels.decode_attention import (  # noqa: E402
    decode_attention,
    decode_attention_ref,
    default_num_kv_splits,
)
from radixlm.kernels.extend_attention import extend_attention, extend_attention_ref  # noqa: E402
from radixlm.kernels.rmsnorm import fused_add_rmsnorm, fused_add_rmsnorm_ref, rmsnorm, rmsnorm_ref  # noqa: E402
from radixlm.kernels.rotary import apply_rotary, apply_rotary_ref, compute_cos_sin_cache  # noqa: E402
from radixlm.kernels.store_kv import store_kv, store_kv_ref  # noqa: E402

H, KH, D, HIDDEN, INTER, VOCAB = 32, 8, 128, 4096, 14336, 128256
LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}
DT = torch.bfloat16
DEV = "cuda"
LINES: list[str] = []


def emit(line: str = "") -> None:
    print(line, flush=True)
    LINES.append(line)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def gpu_time_us(fn, reps: int = 10, iters: int = 5, graph: bool = True) -> float:
    """Median GPU time of one ``fn()`` in microseconds (``reps`` calls per CUDA-graph replay)."""
    fn()
    torch.cuda.synchronize()
    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
        run = g.replay
    else:
        def run():
            for _ in range(reps):
                fn()
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / reps)
    return sorted(times)[len(times) // 2]


def make_pool(lens: list[int], kv_heads: int = KH, contiguous: bool = False, extra: int = 1000):
    """bf16 K/V pool with the sequences' slots scattered (a random permutation) and req_to_token."""
    total = sum(lens)
    n = total + extra
    k = torch.randn(n + 1, kv_heads, D, device=DEV, dtype=DT)
    v = torch.randn(n + 1, kv_heads, D, device=DEV, dtype=DT)
    slots = (torch.arange(total, device=DEV) if contiguous else torch.randperm(n, device=DEV)[:total]) + 1
    r2t = torch.zeros(len(lens) + 3, max(lens) + 8, dtype=torch.int32, device=DEV)
    rows = torch.randperm(len(lens) + 3, device=DEV)[: len(lens)]
    off = 0
    for row, L in zip(rows.tolist(), lens):
        r2t[row, :L] = slots[off: off + L].int()
        off += L
    return k, v, r2t, rows


def check(name: str, got: torch.Tensor, want: torch.Tensor, tol: float = 1e-2) -> None:
    e = rel_err(got, want)
    emit(f"| {name} | {e:.2e} | {'ok' if e <= tol else 'FAIL'} |")
    if e > tol:
        FAILED.append(name)


FAILED: list[str] = []


# ---------------------------------------------------------------- correctness


def correctness() -> None:
    emit("## Correctness at real sizes (bf16 unless noted, relative error vs the torch reference)\n")
    emit("| case | rel err | |\n|---|---|---|")
    g = torch.Generator(device="cpu").manual_seed(0)
    for B, group, lens in [
        (64, 4, torch.randint(1000, 4097, (64,), generator=g).tolist()),
        (8, 1, [1, 2, 77, 4096, 1000, 129, 3000, 64]),
        (8, 8, [1, 2, 77, 4096, 1000, 129, 3000, 64]),
        (1, 4, [32768]),
    ]:
        k, v, r2t, rows = make_pool(lens)
        q = torch.randn(B, KH * group, D, device=DEV, dtype=DT)
        n = torch.tensor(lens, device=DEV)
        args = (q, k, v, r2t, rows, n, D**-0.5)
        want = decode_attention_ref(*args)
        check(f"decode B={B} GQA {group} lens {min(lens)}..{max(lens)}", decode_attention(*args), want)
        check(f"decode B={B} GQA {group}, num_kv_splits=1", decode_attention(*args, num_kv_splits=1), want)
    # captured once, replayed with other sequence lengths (what the runner's decode graphs do)
    lens = [2000, 1, 4096, 300] * 4
    k, v, r2t, rows = make_pool(lens)
    q = torch.randn(len(lens), H, D, device=DEV, dtype=DT)
    n = torch.tensor(lens, device=DEV)
    out = torch.empty_like(q)
    decode_attention(q, k, v, r2t, rows, n, D**-0.5, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attention(q, k, v, r2t, rows, n, D**-0.5, out=out)
    n.copy_(torch.tensor([17, 4000, 1, 2222] * 4, device=DEV))
    q.normal_()
    graph.replay()
    check("decode CUDA graph, seq_lens changed after capture", out, decode_attention_ref(q, k, v, r2t, rows, n, D**-0.5))
    for group, prefix, ext in [(4, [0, 3000, 4096, 17], [1000, 1, 4096, 700]), (1, [5, 0], [300, 64]),
                               (8, [2048, 0], [77, 513])]:
        k, v, r2t, rows = make_pool([p + e for p, e in zip(prefix, ext)])
        q = torch.randn(sum(ext), KH * group, D, device=DEV, dtype=DT)
        E = torch.tensor(ext, device=DEV)
        args = (q, k, v, r2t, rows, torch.tensor(prefix, device=DEV), E, E.cumsum(0) - E, D**-0.5)
        check(f"extend GQA {group} prefix {prefix} new {ext}", extend_attention(*args), extend_attention_ref(*args))
        del k, v
    torch.cuda.empty_cache()

    T = 4096
    x, r = (torch.randn(T, HIDDEN, device=DEV, dtype=DT) for _ in range(2))
    w = torch.rand(HIDDEN, device=DEV, dtype=DT) + 0.5
    check("rmsnorm [4096, 4096]", rmsnorm(x, w, 1e-5), rmsnorm_ref(x, w, 1e-5))
    y, nr = fused_add_rmsnorm(x, r, w, 1e-5)
    y_ref, nr_ref = fused_add_rmsnorm_ref(x, r, w, 1e-5)
    check("fused_add_rmsnorm y", y, y_ref)
    check("fused_add_rmsnorm residual (exact expected)", nr, nr_ref, tol=0.0)
    xx = torch.randn(T, 2 * INTER, device=DEV, dtype=DT) * 3
    check("silu_and_mul [4096, 28672]", silu_and_mul(xx), silu_and_mul_ref(xx))
    for cache_dtype in (torch.float32, DT):
        cache = compute_cos_sin_cache(D, 131072, 500000.0, LLAMA31, cache_dtype, device=DEV)
        pos = torch.randint(0, 131072, (T,), device=DEV)
        q, kk = torch.randn(T, H, D, device=DEV, dtype=DT), torch.randn(T, KH, D, device=DEV, dtype=DT)
        q2, k2 = apply_rotary(q.clone(), kk.clone(), pos, cache)
        q3, k3 = apply_rotary_ref(q.clone(), kk.clone(), pos, cache)
        check(f"rotary q (llama3, {str(cache_dtype)[6:]} cache)", q2, q3)
        check(f"rotary k (llama3, {str(cache_dtype)[6:]} cache)", k2, k3)
    k, v, _, _ = make_pool([T])
    loc = torch.randperm(T + 1000, device=DEV)[:T] + 1
    kn, vn = torch.randn(T, KH, D, device=DEV, dtype=DT), torch.randn(T, KH, D, device=DEV, dtype=DT)
    k2, v2 = k.clone(), v.clone()
    store_kv(k, v, loc, kn, vn)
    store_kv_ref(k2, v2, loc, kn, vn)
    check("store_kv (exact expected)", torch.cat([k, v]), torch.cat([k2, v2]), tol=0.0)
    logits = torch.randn(64, VOCAB, device=DEV)
    bm = torch.randint(-(2**31), 2**31, (64, (VOCAB + 31) // 32), device=DEV, dtype=torch.int64).int()
    a, b = logits.clone(), logits.clone()
    apply_token_bitmask_triton(a, bm)
    apply_token_bitmask_ref(b, bm)
    ok = torch.equal(a, b)
    emit(f"| bitmask [64, 128256] (exact) | {'equal' if ok else 'DIFFERENT'} | {'ok' if ok else 'FAIL'} |")
    if not ok:
        FAILED.append("bitmask")
    emit()


# ---------------------------------------------------------------- bandwidth


def copy_bandwidth() -> float:
    src = torch.empty(2 << 30, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    t = gpu_time_us(lambda: dst.copy_(src), reps=5, graph=False)
    bw = 2 * src.numel() / t / 1e6
    emit(f"Copy bandwidth (2 GiB device-to-device, read + write): **{bw:.2f} TB/s**\n")
    return bw


def decode_bench(copy_bw: float, quick: bool) -> None:
    emit("## Decode attention (one query token per request, KV through req_to_token)\n")
    emit("Effective bandwidth = K+V bytes of the attended tokens / time (8 kv heads x 128 x bf16 x 2 ="
         " 4 KiB per token per layer). SDPA reads the same KV stored contiguously as `[B, 8, L, 128]`"
         " (`enable_gqa=True`); 'SDPA rep' reads it repeated to 32 heads (4x the bytes, same work).\n")
    emit("| batch | context | splits | triton us | TB/s | % copy | SDPA gqa us | SDPA gqa TB/s | SDPA rep us | SDPA rep TB/s |")
    emit("|---|---|---|---|---|---|---|---|---|---|")
    cases = [(64, 1024), (64, 4096), (128, 1024), (256, 1024), (256, 4096), (1, 4096), (1, 32768), (8, 8192)]
    if quick:
        cases = cases[:2]
    for B, L in cases:
        k, v, r2t, rows = make_pool([L] * B, extra=0)
        q = torch.randn(B, H, D, device=DEV, dtype=DT)
        n = torch.full((B,), L, device=DEV)
        S = default_num_kv_splits(B, KH, q.device)
        t = gpu_time_us(lambda: decode_attention(q, k, v, r2t, rows, n, D**-0.5))
        nbytes = 2 * B * L * KH * D * 2
        del k, v
        torch.cuda.empty_cache()
        qs = q.view(B, H, 1, D)
        kc = torch.randn(B, KH, L, D, device=DEV, dtype=DT)
        vc = torch.randn(B, KH, L, D, device=DEV, dtype=DT)
        try:
            ts = gpu_time_us(lambda: F.scaled_dot_product_attention(qs, kc, vc, enable_gqa=True))
        except Exception as e:  # noqa: BLE001
            emit(f"<!-- SDPA gqa failed: {e!r} -->")
            ts = float("nan")
        kr, vr = kc.repeat_interleave(H // KH, 1), vc.repeat_interleave(H // KH, 1)
        del kc, vc
        tr = gpu_time_us(lambda: F.scaled_dot_product_attention(qs, kr, vr))
        del kr, vr
        torch.cuda.empty_cache()
        bw = nbytes / t / 1e6
        emit(f"| {B} | {L} | {S} | {t:.1f} | {bw:.2f} | {100 * bw / copy_bw:.0f}% | {ts:.1f} | "
             f"{nbytes / ts / 1e6:.2f} | {tr:.1f} | {nbytes / tr / 1e6:.2f} |")
    emit()


def decode_sweep() -> None:
    emit("### Decode tuning sweep (effective TB/s; batch 64, 8 kv heads; rows: block_n/warps/stages)\n")
    splits = [1, 2, 4, 8]
    configs = [(32, 4, 2), (32, 4, 3), (64, 4, 3), (64, 4, 4), (128, 4, 2), (128, 4, 3)]
    for L in (1024, 4096):
        B = 64
        k, v, r2t, rows = make_pool([L] * B, extra=0)
        q = torch.randn(B, H, D, device=DEV, dtype=DT)
        n = torch.full((B,), L, device=DEV)
        nbytes = 2 * B * L * KH * D * 2
        emit(f"context {L}:\n\n| config | " + " | ".join(f"S={s}" for s in splits) + " |")
        emit("|---|" + "---|" * len(splits))
        for bn, nw, ns in configs:
            cells = []
            for s in splits:
                try:
                    t = gpu_time_us(lambda: decode_attention(q, k, v, r2t, rows, n, D**-0.5, num_kv_splits=s,
                                                             block_n=bn, num_warps=nw, num_stages=ns), iters=3)
                    cells.append(f"{nbytes / t / 1e6:.2f}")
                except Exception as e:  # noqa: BLE001
                    cells.append(f"err {type(e).__name__}")
            emit(f"| {bn}/{nw}/{ns} | " + " | ".join(cells) + " |")
        emit()
        del k, v
        torch.cuda.empty_cache()
    emit("Batch 1 (default block_n/warps/stages), effective TB/s by splits:\n")
    bsplits = [8, 16, 32, 64, 128]
    emit("| context | " + " | ".join(f"S={s}" for s in bsplits) + " |\n|---|" + "---|" * len(bsplits))
    for L in (4096, 32768):
        k, v, r2t, rows = make_pool([L], extra=0)
        q = torch.randn(1, H, D, device=DEV, dtype=DT)
        n = torch.full((1,), L, device=DEV)
        cells = [f"{2 * L * KH * D * 2 / gpu_time_us(lambda: decode_attention(q, k, v, r2t, rows, n, D**-0.5, num_kv_splits=s), iters=3) / 1e6:.2f}"
                 for s in bsplits]
        emit(f"| {L} | " + " | ".join(cells) + " |")
    emit()


# ---------------------------------------------------------------- extend


def extend_bench(quick: bool) -> None:
    emit("## Extend attention: new tokens on a cached prefix (H=32, KH=8, D=128, bf16)\n")
    emit("TFLOP/s counts the useful work: 4 * D * H * (E * P + E * (E + 1) / 2). SDPA flash is "
         "`aten._scaled_dot_product_flash_attention` with bottom-right causal alignment on contiguous "
         "K/V repeated to 32 heads.\n")
    emit("| prefix | new | slots | triton ms | TFLOP/s | SDPA flash ms | TFLOP/s | triton / SDPA |")
    emit("|---|---|---|---|---|---|---|---|")
    cases = [(4096, 4096, False), (4096, 4096, True), (0, 4096, False), (0, 8192, False), (16384, 1024, False)]
    if quick:
        cases = cases[:1]
    for P, E, contiguous in cases:
        k, v, r2t, rows = make_pool([P + E], contiguous=contiguous, extra=0)
        q = torch.randn(E, H, D, device=DEV, dtype=DT)
        args = (q, k, v, r2t, rows, torch.tensor([P], device=DEV), torch.tensor([E], device=DEV),
                torch.tensor([0], device=DEV), D**-0.5)
        t = gpu_time_us(lambda: extend_attention(*args, max_extend_len=E), reps=3)
        slots = r2t[rows[0], : P + E].long()
        kc = k[slots].transpose(0, 1).repeat_interleave(H // KH, 0)[None].contiguous()
        vc = v[slots].transpose(0, 1).repeat_interleave(H // KH, 0)[None].contiguous()
        qc = q.transpose(0, 1)[None].contiguous()
        flash = torch.ops.aten._scaled_dot_product_flash_attention
        ts = gpu_time_us(lambda: flash(qc, kc, vc, 0.0, True, False, scale=D**-0.5), reps=3)
        ours = extend_attention(*args)
        theirs = flash(qc, kc, vc, 0.0, True, False, scale=D**-0.5)[0][0].transpose(0, 1)
        e = rel_err(ours, theirs)
        flops = 4 * D * H * (E * P + E * (E + 1) / 2)
        emit(f"| {P} | {E} | {'contiguous' if contiguous else 'scattered'} | {t / 1e3:.3f} | "
             f"{flops / t / 1e6:.0f} | {ts / 1e3:.3f} | {flops / ts / 1e6:.0f} | {t / ts:.2f}x (err {e:.1e}) |")
        del k, v, kc, vc
        torch.cuda.empty_cache()
    emit()


def extend_sweep() -> None:
    emit("### Extend tuning sweep (4096 new on 4096 prefix, scattered; ms)\n")
    P = E = 4096
    k, v, r2t, rows = make_pool([P + E], extra=0)
    q = torch.randn(E, H, D, device=DEV, dtype=DT)
    args = (q, k, v, r2t, rows, torch.tensor([P], device=DEV), torch.tensor([E], device=DEV),
            torch.tensor([0], device=DEV), D**-0.5)
    emit("| block_m/block_n/warps/stages | ms |\n|---|---|")
    for bm, bn, nw, ns in [(128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3),
                           (128, 32, 4, 3), (64, 128, 4, 2)]:
        try:
            t = gpu_time_us(lambda: extend_attention(*args, max_extend_len=E, block_m=bm, block_n=bn,
                                                     num_warps=nw, num_stages=ns), reps=3, iters=3)
            emit(f"| {bm}/{bn}/{nw}/{ns} | {t / 1e3:.3f} |")
        except Exception as e:  # noqa: BLE001
            emit(f"| {bm}/{bn}/{nw}/{ns} | error {type(e).__name__}: {str(e)[:80]} |")
    emit()


# ---------------------------------------------------------------- small ops


def small_ops(quick: bool) -> None:
    emit("## Small ops: GPU time per call (us), Triton vs torch eager vs torch.compile (default mode)\n")
    emit("| op | shape | triton | eager | compile | best |\n|---|---|---|---|---|---|")
    cache = compute_cos_sin_cache(D, 131072, 500000.0, LLAMA31, torch.float32, device=DEV)
    sizes = [64, 4096] if not quick else [64]
    for T in sizes:
        x, r = (torch.randn(T, HIDDEN, device=DEV, dtype=DT) for _ in range(2))
        w = torch.rand(HIDDEN, device=DEV, dtype=DT)
        gu = torch.randn(T, 2 * INTER, device=DEV, dtype=DT)
        q, k = torch.randn(T, H, D, device=DEV, dtype=DT), torch.randn(T, KH, D, device=DEV, dtype=DT)
        pos = torch.randint(0, 8192, (T,), device=DEV)
        kb, vb = (torch.zeros(T * 4 + 1, KH, D, device=DEV, dtype=DT) for _ in range(2))
        loc = torch.randperm(T * 4, device=DEV)[:T] + 1
        ops = {
            "rmsnorm": (lambda: rmsnorm(x, w, 1e-5), lambda: rmsnorm_ref(x, w, 1e-5), f"[{T}, 4096]"),
            "fused_add_rmsnorm": (lambda: fused_add_rmsnorm(x, r, w, 1e-5),
                                  lambda: fused_add_rmsnorm_ref(x, r, w, 1e-5), f"[{T}, 4096]"),
            "silu_and_mul": (lambda: silu_and_mul(gu), lambda: silu_and_mul_ref(gu), f"[{T}, 28672]"),
            "apply_rotary": (lambda: apply_rotary(q, k, pos, cache), lambda: apply_rotary_ref(q, k, pos, cache),
                             f"q [{T}, 32, 128], k [{T}, 8, 128]"),
            "store_kv": (lambda: store_kv(kb, vb, loc, k, k), lambda: store_kv_ref(kb, vb, loc, k, k),
                         f"[{T}, 8, 128] x2"),
        }
        for name, (tri, ref, shape) in ops.items():
            t_tri = gpu_time_us(tri)
            t_eager = gpu_time_us(ref)
            try:
                comp = torch.compile(ref, dynamic=False)
                t_comp = gpu_time_us(comp)
            except Exception as e:  # noqa: BLE001
                emit(f"<!-- compile {name} failed: {type(e).__name__}: {str(e)[:200]} -->")
                t_comp = float("nan")
            best = min([("triton", t_tri), ("eager", t_eager), ("compile", t_comp)],
                       key=lambda kv: kv[1] if not math.isnan(kv[1]) else 1e30)[0]
            emit(f"| {name} | {shape} | {t_tri:.1f} | {t_eager:.1f} | {t_comp:.1f} | {best} |")
    for B in ([1, 64] if not quick else [64]):
        logits = torch.randn(B, VOCAB, device=DEV)
        bm = torch.randint(-(2**31), 2**31, (B, (VOCAB + 31) // 32), device=DEV, dtype=torch.int64).int()
        t_tri = gpu_time_us(lambda: apply_token_bitmask_triton(logits, bm))
        t_eager = gpu_time_us(lambda: apply_token_bitmask_ref(logits, bm))
        try:
            comp = torch.compile(apply_token_bitmask_ref, dynamic=False)
            t_comp = gpu_time_us(lambda: comp(logits, bm))
        except Exception as e:  # noqa: BLE001
            emit(f"<!-- compile bitmask failed: {type(e).__name__}: {str(e)[:200]} -->")
            t_comp = float("nan")
        best = min([("triton", t_tri), ("eager", t_eager), ("compile", t_comp)],
                   key=lambda kv: kv[1] if not math.isnan(kv[1]) else 1e30)[0]
        emit(f"| apply_token_bitmask | [{B}, 128256] fp32 | {t_tri:.1f} | {t_eager:.1f} | {t_comp:.1f} | {best} |")
    emit()
    emit("Tuning: silu_and_mul [4096, 28672] and apply_token_bitmask [64, 128256], us by block/warps:\n")
    gu = torch.randn(4096, 2 * INTER, device=DEV, dtype=DT)
    logits = torch.randn(64, VOCAB, device=DEV)
    bm = torch.randint(-(2**31), 2**31, (64, (VOCAB + 31) // 32), device=DEV, dtype=torch.int64).int()
    cfgs = [(512, 4), (1024, 4), (2048, 4), (2048, 8), (4096, 8), (8192, 8)]
    emit("| op | " + " | ".join(f"{b}/{w}" for b, w in cfgs) + " |\n|---|" + "---|" * len(cfgs))
    emit("| silu_and_mul | " + " | ".join(
        f"{gpu_time_us(lambda: silu_and_mul(gu, block=b, num_warps=w)):.1f}" for b, w in cfgs) + " |")
    emit("| bitmask | " + " | ".join(
        f"{gpu_time_us(lambda: apply_token_bitmask_triton(logits, bm, block=b, num_warps=w)):.1f}"
        for b, w in cfgs) + " |")
    emit()


# ---------------------------------------------------------------- sliding window


def _attended(P: int, E: int, W: int) -> int:
    """Keys attended by E new tokens on a prefix of P (window W; 0 = full)."""
    return sum(min(P + i + 1, W) if W else P + i + 1 for i in range(E))


def window_bench(quick: bool) -> None:
    W = 4096
    emit(f"## Sliding window (Mistral-style, W={W}): the same kernels with and without the window\n")
    emit("The window bounds each query's keys to W; 'ideal' is the ratio of attended keys. The error "
         "column compares the windowed kernel with its torch reference.\n")
    emit("| op | shape | full ms | windowed ms | speed-up | ideal | rel err |")
    emit("|---|---|---|---|---|---|---|")
    for B, L in [(64, 16384), (1, 32768)][: 1 if quick else 2]:
        k, v, r2t, rows = make_pool([L] * B, extra=0)
        q = torch.randn(B, H, D, device=DEV, dtype=DT)
        n = torch.full((B,), L, device=DEV)
        args = (q, k, v, r2t, rows, n, D**-0.5)
        tf = gpu_time_us(lambda: decode_attention(*args))
        tw = gpu_time_us(lambda: decode_attention(*args, window=W))
        e = rel_err(decode_attention(*args, window=W), decode_attention_ref(*args, window=W))
        emit(f"| decode | B={B} context {L} | {tf / 1e3:.3f} | {tw / 1e3:.3f} | {tf / tw:.2f}x | {L / W:.2f}x | {e:.1e} |")
        if e > 1e-2:
            FAILED.append(f"window decode B={B} L={L}")
        del k, v
        torch.cuda.empty_cache()
    for P, E, check_ref in [(4096, 4096, True), (0, 16384, False)][: 1 if quick else 2]:
        k, v, r2t, rows = make_pool([P + E], extra=0)
        q = torch.randn(E, H, D, device=DEV, dtype=DT)
        args = (q, k, v, r2t, rows, torch.tensor([P], device=DEV), torch.tensor([E], device=DEV),
                torch.tensor([0], device=DEV), D**-0.5)
        tf = gpu_time_us(lambda: extend_attention(*args, max_extend_len=E), reps=3)
        tw = gpu_time_us(lambda: extend_attention(*args, max_extend_len=E, window=W), reps=3)
        e = float("nan")
        if check_ref:  # the reference materializes [H, E, P + E] scores: moderate sizes only
            e = rel_err(extend_attention(*args, window=W), extend_attention_ref(*args, window=W))
            if e > 1e-2:
                FAILED.append(f"window extend P={P} E={E}")
        ideal = _attended(P, E, 0) / _attended(P, E, W)
        emit(f"| extend | prefix {P} new {E} | {tf / 1e3:.3f} | {tw / 1e3:.3f} | {tf / tw:.2f}x | {ideal:.2f}x | {e:.1e} |")
        del k, v
        torch.cuda.empty_cache()
    emit()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/kernels_h200.md")
    ap.add_argument("--only", default="correctness,decode,decode_sweep,extend,extend_sweep,window,small",
                    help="comma-separated sections")
    ap.add_argument("--quick", action="store_true", help="fewer sizes")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA device"
    import triton

    torch.manual_seed(0)
    emit(f"# radixlm Triton kernels on {torch.cuda.get_device_name()}\n")
    emit(f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    emit(f"- command: `python {' '.join(sys.argv)}`")
    emit(f"- torch {torch.__version__}, triton {triton.__version__}, CUDA {torch.version.cuda}, "
         f"{torch.cuda.get_device_properties(0).multi_processor_count} SMs\n")
    sections = args.only.split(",")
    t0 = time.time()
    copy_bw = copy_bandwidth()
    steps = [("correctness", correctness), ("decode", lambda: decode_bench(copy_bw, args.quick)),
             ("decode_sweep", decode_sweep), ("extend", lambda: extend_bench(args.quick)),
             ("extend_sweep", extend_sweep), ("window", lambda: window_bench(args.quick)),
             ("small", lambda: small_ops(args.quick))]
    for name, fn in steps:
        if name not in sections:
            continue
        t = time.time()
        try:
            fn()
        except Exception:  # noqa: BLE001
            FAILED.append(name)
            emit(f"```\n{name} raised:\n{traceback.format_exc()[-3000:]}```\n")
        print(f"[{name}: {time.time() - t:.0f}s]", flush=True)
        torch.cuda.empty_cache()
    emit(f"Total {time.time() - t0:.0f}s. " + (f"FAILED: {', '.join(FAILED)}" if FAILED else "All checks passed."))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(LINES) + "\n")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
