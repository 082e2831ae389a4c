"""Skinny GEMM (decode GEMV): ``y = x W^T + b`` for a few rows ``x`` ``[M, K]`` (M <= 16) and a
weight ``W`` ``[N, K]``, memory-bound (the whole weight is read once, ``x`` stays in L2).

Kernel: program ``(n, s)`` computes outputs ``[:, n*BLOCK_N, (n+1)*BLOCK_N)`` for every row of
``x`` over the ``s``-th K range (split-K), looping over K in ``BLOCK_K`` chunks. Each chunk loads
a ``[BLOCK_N, BLOCK_K]`` weight tile (contiguous along K: coalesced, ``evict_first``) and the
``[BLOCK_M, BLOCK_K]`` rows of ``x`` (``evict_last``). Two inner products:

* broadcast (default for M == 1): ``acc2[BLOCK_N, BLOCK_K] += w * x_row`` with one ``tl.sum``
  over K after the loop (no cross-thread reduction inside the loop). ``x``'s row is loaded as a
  broadcast ``[BLOCK_N, BLOCK_K]`` tile (L1 hits) so that it gets the weight tile's register
  layout: no layout conversion through shared memory per K step (checked in the sm_90 PTX).
  For 1 < M <= 4 it is ``acc3[BLOCK_M, BLOCK_N, BLOCK_K] += x[:, None, :] * w[None]``
  (``BLOCK_M = next_pow2(M)``; this one converts layouts per step: a tuning candidate only);
* dot (default for M > 1): ``acc[BLOCK_M, BLOCK_N] += dot(x, w^T)`` with ``BLOCK_M = 16`` (the
  padding rows cost no memory traffic: they reload row 0 and are never stored); ``num_stages``
  pipelines the loads through ``cp.async``.

Rows past ``N``/``M`` are read modulo ``N``/``M`` (valid addresses, unmasked loads) and dropped at
the store. With split-K > 1 each split writes fp32 partials ``[S, M, N]`` and a second small
kernel sums them, adds the bias and rounds. Accumulation is fp32; the result is rounded once to
``x.dtype`` (the reference: ``F.linear`` in fp32, rounded).

Launch parameters come from :func:`default_config` (a table keyed by ``(N, K)`` ranges and M);
:func:`tune_configs` lists candidates for ``benchmarks/bench_gemv.py``. Nothing here syncs with the
host: the calls are CUDA-graph capturable.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import torch
import torch.nn.functional as F

from radixlm.kernels._triton import check_triton, device_sms, dot, next_pow2, tl, triton

MAX_M = 64  # the kernels hold all rows in one tile; the dispatcher uses them up to 16 rows


def skinny_linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Torch reference: ``F.linear`` in fp32, rounded once to ``x.dtype``.

    ``x``: ``[M, K]``; ``weight``: ``[N, K]``; ``bias``: ``[N]`` or ``None``; output ``[M, N]``.
    """
    b = None if bias is None else bias.float()
    return F.linear(x.float(), weight.float(), b).to(x.dtype)


@dataclass(frozen=True)
class GemvConfig:
    """Launch parameters. ``split_k``: 0 picks it from the grid size (see :func:`_pick_split`);
    ``use_dot``: ``None`` picks by M (broadcast for M == 1, ``tl.dot`` above)."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int = 0
    use_dot: bool | None = None

    def short(self) -> str:
        kind = {None: "auto", True: "dot", False: "bcast"}[self.use_dot]
        split = "auto" if self.split_k == 0 else str(self.split_k)
        return f"{kind} n{self.block_n} k{self.block_k} w{self.num_warps} s{self.num_stages} sk{split}"


_BIG = 1 << 62
# (max N, max K) -> (config for M == 1 (broadcast), config for M > 1 (dot)); first match wins.
# M == 1 entries from benchmarks/bench_gemv.py on an H200 (cold weights, see results/gemv_h200.md):
# SmolLM2-135M QKV/O 1.30-1.43x and down 1.49x of cuBLAS, 8B QKV 1.09x, O 1.19x, gate_up 1.04x,
# down 1.07x. M > 1: no config beat cuBLAS by more than 5% (the dispatcher keeps F.linear there).
CONFIG_TABLE: tuple[tuple[int, int, GemvConfig, GemvConfig], ...] = (
    # small hidden (SmolLM2-135M: K 576 / 1536)
    (1024, 1024, GemvConfig(16, 1024, 8, 1), GemvConfig(16, 256, 4, 3)),
    (_BIG, 2048, GemvConfig(8, 512, 4, 1), GemvConfig(32, 128, 4, 4)),
    # N <= 8192 with K <= 4096 (8B QKV 6144x4096, O 4096x4096)
    (8192, 4096, GemvConfig(8, 512, 4, 1), GemvConfig(32, 256, 4, 3)),
    # long K (8B down 4096x14336)
    (8192, _BIG, GemvConfig(16, 1024, 8, 1), GemvConfig(32, 256, 4, 3)),
    # wide N (8B gate_up 28672x4096)
    (_BIG, _BIG, GemvConfig(16, 256, 4, 1), GemvConfig(128, 128, 8, 3)),
)


def default_config(m: int, n: int, k: int) -> GemvConfig:
    """The table entry for an ``[m, k] x [n, k]^T`` product (``use_dot`` resolved by ``m``)."""
    for max_n, max_k, small, large in CONFIG_TABLE:
        if n <= max_n and k <= max_k:
            return replace(small, use_dot=False) if m == 1 else replace(large, use_dot=True)
    raise AssertionError("unreachable: the last table entry matches everything")


def tune_configs() -> list[GemvConfig]:
    """Candidate configs for a benchmark to try on the GPU (broadcast ones are meant for M <= 4).

    ``use_dot`` is explicit in each; ``split_k`` 0 means automatic (see :func:`_pick_split`)."""
    out = [GemvConfig(bn, bk, w, 1, use_dot=False)
           for bn, bk, w in ((8, 512, 4), (16, 256, 4), (16, 512, 4), (16, 512, 8), (32, 256, 4),
                             (32, 512, 8), (64, 128, 4), (16, 1024, 8))]
    out += [GemvConfig(bn, bk, w, s, use_dot=True)
            for bn, bk, w, s in ((16, 256, 4, 3), (32, 128, 4, 4), (32, 256, 4, 3), (32, 512, 8, 3),
                                 (64, 128, 4, 3), (64, 256, 8, 3), (128, 128, 8, 3))]
    out += [GemvConfig(16, 256, 4, 1, split_k=2, use_dot=False), GemvConfig(64, 256, 8, 3, split_k=2, use_dot=True),
            GemvConfig(64, 128, 4, 3, split_k=4, use_dot=True)]
    return out


def _pick_split(programs: int, k: int, block_k: int, sms: int) -> int:
    """Split K only when the N tiles leave SMs idle and each split keeps >= 2048 of K."""
    if programs >= sms or k < 4096:
        return 1
    return max(1, min(-(-sms // programs), k // 2048, -(-k // block_k)))


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr,
    M, N, K, K_PER_SPLIT,
    stride_xm, stride_wn, stride_ym, stride_ys,
    HAS_BIAS: tl.constexpr, USE_DOT: tl.constexpr, IEEE: tl.constexpr, DOT_UPCAST: tl.constexpr,
    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rm = offs_m % M  # padding rows/columns reload valid ones; the store drops them
    rn = (offs_n % N).to(tl.int64)
    x_rows = x_ptr + rm[:, None] * stride_xm
    w_rows = w_ptr + rn[:, None] * stride_wn
    k_start = pid_s * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    if USE_DOT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    elif BLOCK_M == 1:
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    else:
        acc3 = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        kk = k0 + offs_k
        if BLOCK_M == 1 and not USE_DOT:
            # x's row loaded as a [BLOCK_N, BLOCK_K] tile (L1 hits): the same layout as w's tile, so
            # no per-step layout conversion through shared memory
            x_tile = tl.broadcast_to(x_rows + kk[None, :], (BLOCK_N, BLOCK_K))
        else:
            x_tile = x_rows + kk[None, :]
        if EVEN_K:
            w = tl.load(w_rows + kk[None, :], eviction_policy="evict_first")
            x = tl.load(x_tile, eviction_policy="evict_last")
        else:
            w = tl.load(w_rows + kk[None, :], mask=kk[None, :] < K, other=0.0, eviction_policy="evict_first")
            x = tl.load(x_tile, mask=kk[None, :] < K, other=0.0, eviction_policy="evict_last")
        if USE_DOT:
            if DOT_UPCAST:  # interpreter only: its tl.dot mishandles bf16 (triton 3.9); same products
                acc = acc + dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), True)
            else:
                acc = acc + dot(x, tl.trans(w), IEEE)
        elif BLOCK_M == 1:  # [1, BLOCK_K] row broadcast over the weight tile's layout
            acc2 += w.to(tl.float32) * x.to(tl.float32)
        else:
            acc3 += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    if not USE_DOT:
        if BLOCK_M == 1:
            acc = tl.sum(acc2, axis=1)[None, :]
        else:
            acc = tl.sum(acc3, axis=2)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn).to(tl.float32)[None, :]
    y = y_ptr + pid_s.to(tl.int64) * stride_ys + offs_m[:, None] * stride_ym + offs_n[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _splitk_reduce_kernel(p_ptr, b_ptr, y_ptr, N, SPLITS, stride_ps, stride_pm, stride_ym,
                          HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    m = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(0, SPLITS):
        acc += tl.load(p_ptr + s * stride_ps + m * stride_pm + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * stride_ym + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


@lru_cache(maxsize=4096)
def _plan(m: int, n: int, k: int, sms: int, cfg: GemvConfig | None) -> tuple:
    """Resolved launch: ``(use_dot, BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, splits, k_per_split)``."""
    cfg = cfg or default_config(m, n, k)
    use_dot = cfg.use_dot if cfg.use_dot is not None else m > 1
    assert not use_dot or cfg.block_n >= 16, "tl.dot needs BLOCK_N >= 16"
    block_m = max(16, next_pow2(m)) if use_dot else next_pow2(m)
    block_k = min(cfg.block_k, max(16, next_pow2(k)))
    if not use_dot:  # keep the [BLOCK_M, BLOCK_N, BLOCK_K] accumulator within ~64 fp32 registers/thread
        while block_m * cfg.block_n * block_k > 64 * 32 * cfg.num_warps and block_k > 32:
            block_k //= 2
    programs = -(-n // cfg.block_n)
    splits = cfg.split_k or _pick_split(programs, k, block_k, sms)
    k_per_split = -(-k // splits)
    k_per_split = -(-k_per_split // block_k) * block_k  # whole BLOCK_K steps per split
    splits = -(-k // k_per_split)
    return use_dot, block_m, cfg.block_n, block_k, cfg.num_warps, cfg.num_stages, splits, k_per_split


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  config: GemvConfig | None = None) -> torch.Tensor:
    """``y = x @ weight.T + bias`` for few rows (Triton GEMV, fp32 accumulation).

    ``x``: ``[M, K]`` with ``M <= 64`` (meant for M <= 16), last dim contiguous; ``weight``:
    ``[N, K]`` of ``x``'s dtype (fp32 / fp16 / bf16), last dim contiguous (row stride free);
    ``bias``: ``[N]`` contiguous or ``None``. Returns a new ``[M, N]`` tensor in ``x.dtype``, equal
    to :func:`skinny_linear_ref` up to fp32 summation order. ``config``: launch parameters
    (``None``: :func:`default_config`). No host syncs (CUDA-graph capturable).
    """
    assert x.dim() == 2 and weight.dim() == 2 and x.shape[1] == weight.shape[1], (x.shape, weight.shape)
    assert x.dtype == weight.dtype, (x.dtype, weight.dtype)
    assert x.stride(1) == 1 and weight.stride(1) == 1, (x.stride(), weight.stride())
    M, K = x.shape
    N = weight.shape[0]
    assert M <= MAX_M, f"skinny_linear handles at most {MAX_M} rows, got {M}"
    if bias is not None:
        assert bias.shape == (N,) and bias.stride(0) == 1, (bias.shape, N)
        check_triton(x, weight, bias)
    else:
        check_triton(x, weight)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y
    if K == 0:
        return y.zero_() if bias is None else y.copy_(bias.expand(M, N))
    use_dot, bm, bn, bk, warps, stages, splits, kps = _plan(M, N, K, device_sms(x.device), config)
    has_bias = bias is not None
    out = y if splits == 1 else torch.empty((splits, M, N), dtype=torch.float32, device=x.device)
    _gemv_kernel[(triton.cdiv(N, bn), splits)](
        x, weight, bias if has_bias and splits == 1 else x, out,
        M, N, K, kps,
        x.stride(0), weight.stride(0), out.stride(-2), out.stride(0) if splits > 1 else 0,
        HAS_BIAS=has_bias and splits == 1, USE_DOT=use_dot, IEEE=x.dtype == torch.float32,
        DOT_UPCAST=use_dot and x.dtype == torch.bfloat16 and not x.is_cuda,
        EVEN_K=K % bk == 0, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages,
    )
    if splits > 1:
        block = min(1024, max(16, next_pow2(N)))
        _splitk_reduce_kernel[(M, triton.cdiv(N, block))](
            out, bias if has_bias else out, y, N, splits, out.stride(0), out.stride(1), y.stride(0),
            HAS_BIAS=has_bias, BLOCK=block, num_warps=4,
        )
    return y
