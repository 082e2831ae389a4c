"""Decode attention over the token-granular KV pool (one new query token per request).

Layout (``runtime/memory.py``): ``k_buffer``/``v_buffer`` are ``[num_slots + 1, kv_heads, D]``;
``req_to_token[req_pool_indices[b], pos]`` is the slot of position ``pos`` of request ``b``.
Request ``b`` attends to positions ``[0, seq_lens[b])`` (its current token's KV already stored), or
with a sliding ``window`` W > 0 to the last W of them, ``[max(0, seq_lens[b] - W), seq_lens[b])``
(HF's convention: W keys including the query's own).

Kernel: split-KV ("flash-decoding"). Stage 1 runs one program per (kv head, request, split); it
holds the whole GQA group of query heads (padded to 16 rows for ``tl.dot``), walks its slice of
the sequence through ``req_to_token`` and writes a partial output and log-sum-exp. The
last split program of each (request, kv head) to finish merges the splits in the same launch
(``one_launch``, arrival counters: ``decode_merge.py``); else stage 2, a second kernel, merges them
per (request, head). With one split, stage 1 writes the output directly. With ``new_tokens``
(:class:`~radixlm.kernels.rotary_store_kv.NewTokens`) stage 1 also applies rotary to q and to the
new k and stores the new k, v (no separate rotary / store_kv launch). Splits are computed per
request from ``seq_lens`` (and the window) on the device, so ``num_kv_splits`` and ``window`` are
launch arguments that CUDA graphs can capture.

With ``shared=`` (:class:`SharedPrefix`, cascade attention; see ``shared_prefix_attention.py``),
a third kernel reads each shared prefix once per chunk of requests and writes extra split slots;
stage 1 then covers only each request's own keys ``[start, seq_len)`` and stage 2 merges both.
"""

from __future__ import annotations

import torch

from radixlm.kernels._triton import FP8_KV, check_triton, dot, next_pow2, tl, triton
from radixlm.kernels.decode_merge import _arrive_and_merge, _merge_split, default_num_kv_splits, split_counters
from radixlm.kernels.rotary_store_kv import NewTokens, _rope_q_store_kv, new_token_args, rotary_store_kv_ref
from radixlm.kernels.shared_prefix_attention import (
    SharedPrefix,
    _split_len,
    check_shared_shapes,
    default_num_shared_splits,
    launch_shared_prefix_stage,
    shared_prefix_attention_ref,
)

_LOG2E = 1.4426950408889634


def decode_attention_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    num_kv_splits: int | None = None,
    out: torch.Tensor | None = None,
    window: int = 0,
    shared: SharedPrefix | None = None,
    num_shared_splits: int | None = None,
    one_launch: bool = False,
    counters: torch.Tensor | None = None,
    new_tokens: NewTokens | None = None,
) -> torch.Tensor:
    """Torch reference (fp32 math, one request at a time). Same contract as :func:`decode_attention`.

    A request with ``seq_len == 0`` gets a zero output. ``num_kv_splits``, ``num_shared_splits``,
    ``one_launch`` and ``counters`` are ignored. With ``shared``, checks the :class:`SharedPrefix`
    contract (ValueError) and computes the cascade form (:func:`shared_prefix_attention_ref`),
    equal to the plain result. ``new_tokens`` runs :func:`rotary_store_kv_ref` first (q rotated in
    place here, unlike the kernel; ``k``/``v`` of ``new_tokens`` too).
    """
    if new_tokens is not None:
        if shared is not None:
            raise ValueError("new_tokens cannot be combined with shared")
        nt = new_tokens
        rotary_store_kv_ref(q, nt.k, nt.v, nt.positions, nt.cos_sin_cache, k_buffer, v_buffer, nt.loc)
    B, H, D = q.shape
    KH = k_buffer.shape[1]
    G = H // KH
    o = torch.zeros((B, H, D), dtype=q.dtype, device=q.device) if out is None else out
    if shared is not None:
        if window > 0:
            raise ValueError("shared-prefix attention does not support a sliding window")
        return shared_prefix_attention_ref(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens,
                                           sm_scale, shared, o)
    rows = req_pool_indices.tolist()
    lens = seq_lens.tolist()
    for b in range(B):
        L = int(lens[b])
        if L == 0:
            o[b].zero_()
            continue
        lo = max(0, L - window) if window > 0 else 0
        slots = req_to_token[int(rows[b]), lo:L].long()
        k = k_buffer[slots].float()  # [L - lo, KH, D]
        v = v_buffer[slots].float()
        qb = q[b].float().view(KH, G, D)
        s = torch.einsum("kgd,lkd->kgl", qb, k) * sm_scale
        p = torch.softmax(s, dim=-1)
        o[b] = torch.einsum("kgl,lkd->kgd", p, v).reshape(H, D).to(o.dtype)
    return o


@triton.jit
def _kv_range(seq_lens_ptr, start_ptr, b, window, HAS_SHARED: tl.constexpr):
    """``(lo, hi)``: the positions request ``b`` attends to (the last ``window`` when ``window > 0``);
    with ``HAS_SHARED``, its own positions ``[start[b], seq_len)`` (the shared ones go elsewhere)."""
    hi = tl.load(seq_lens_ptr + b).to(tl.int32)
    if HAS_SHARED:
        lo = tl.load(start_ptr + b).to(tl.int32)
    else:
        lo = tl.where(window > 0, tl.maximum(hi - window, 0), 0)
    return lo, hi


# NOTE: H200 (bench_decode_attention.py): from 128 rows up, 128-key tiles run 1.05-1.3x faster than
# 64-key ones (8B dims, 512 x 1,280 keys: 794 -> 667 us with heads-fastest launches); below, mixed
LARGE_BATCH = 128
# NOTE: not specialized: serving varies them per step (a decode tail at an odd row offset, splits
# following the batch), and each variant compiled mid-serving (~1 s, benchmarks/mixed_steps.py).
_ROW_PTRS = ["req_idx_ptr", "seq_lens_ptr", "start_ptr", "pos_ptr", "loc_ptr"]
_SPLIT_INTS = ["window", "num_kv_splits", "stride_mlb", "stride_mlh"]


@triton.jit(do_not_specialize=_SPLIT_INTS, do_not_specialize_on_alignment=_ROW_PTRS)
def _decode_stage1(
    q_ptr, k_ptr, v_ptr, req_to_token_ptr, req_idx_ptr, seq_lens_ptr, start_ptr,
    mid_o_ptr, mid_lse_ptr, o_ptr, counter_ptr,
    pos_ptr, cache_ptr, loc_ptr, kn_ptr, vn_ptr,
    qk_scale, num_kv_splits, window,
    stride_qb, stride_qh,
    stride_ks, stride_kh,
    stride_vs, stride_vh,
    stride_rt,
    stride_mob, stride_moh, stride_mos,
    stride_mlb, stride_mlh,
    stride_ob, stride_oh,
    stride_c, stride_knb, stride_knh, stride_vnb, stride_vnh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
    ONE_SPLIT: tl.constexpr, HAS_SHARED: tl.constexpr, MERGE: tl.constexpr, BLOCK_S: tl.constexpr,
    ROTARY: tl.constexpr, HEADS_FASTEST: tl.constexpr,
):
    # NOTE: with ONE_SPLIT, mid_o_ptr is the final output (q.dtype) and there is no stage 2. With
    # MERGE, the last split of (b, kvh) to arrive merges into o_ptr and there is no stage 2 either.
    if HEADS_FASTEST:
        kvh = tl.program_id(0)
        b = tl.program_id(1)
    else:
        b = tl.program_id(0)
        kvh = tl.program_id(1)
    split = tl.program_id(2)

    lo, hi = _kv_range(seq_lens_ptr, start_ptr, b, window, HAS_SHARED)
    # Splits are whole BLOCK_N tiles, so a short sequence occupies few splits (the rest exit).
    split_len = tl.cdiv(tl.cdiv(hi - lo, num_kv_splits), BLOCK_N) * BLOCK_N
    start = lo + split * split_len
    end = tl.minimum(start + split_len, hi)
    offs_g = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask_g = offs_g < GROUP
    mask_d = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_g
    mo = mid_o_ptr + b * stride_mob + heads[:, None] * stride_moh + split * stride_mos + offs_d[None, :]
    if end > start:
        req = tl.load(req_idx_ptr + b).to(tl.int64)
        offs_n = tl.arange(0, BLOCK_N)
        q_rows = q_ptr + b * stride_qb + heads[:, None] * stride_qh
        if ROTARY:  # NewTokens: rotate q here; the split holding position hi - 1 stores its k, v
            q = _rope_q_store_kv(q_rows, mask_g[:, None] & mask_d[None, :], offs_d, b, kvh, end == hi,
                                 pos_ptr, cache_ptr, stride_c, loc_ptr, kn_ptr, vn_ptr, stride_knb, stride_knh,
                                 stride_vnb, stride_vnh, k_ptr, v_ptr, stride_ks, stride_kh, stride_vs, stride_vh,
                                 HEAD_DIM)
        else:
            q = tl.load(q_rows + offs_d[None, :], mask=mask_g[:, None] & mask_d[None, :], other=0.0)
        m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
        row_ptr = req_to_token_ptr + req * stride_rt
        for n0 in range(start, end, BLOCK_N):
            pos = n0 + offs_n
            mask_n = pos < end
            slots = tl.load(row_ptr + pos, mask=mask_n, other=0).to(tl.int64)
            k = tl.load(
                k_ptr + slots[None, :] * stride_ks + kvh * stride_kh + offs_d[:, None],
                mask=mask_n[None, :] & mask_d[:, None], other=0.0,
            ).to(q.dtype)  # [BLOCK_D, BLOCK_N]; an fp8 pool's keys widened to q's dtype
            s = dot(q, k, IEEE) * qk_scale  # log2 domain
            s = tl.where(mask_n[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            v = tl.load(
                v_ptr + slots[:, None] * stride_vs + kvh * stride_vh + offs_d[None, :],
                mask=mask_n[:, None] & mask_d[None, :], other=0.0,
            ).to(q.dtype)  # [BLOCK_N, BLOCK_D]
            acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, IEEE)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new

        out = acc / l_i[:, None]
        tl.store(mo, out.to(mid_o_ptr.dtype.element_ty), mask=mask_g[:, None] & mask_d[None, :])
        if not ONE_SPLIT:
            tl.store(mid_lse_ptr + b * stride_mlb + heads * stride_mlh + split, m_i + tl.log2(l_i), mask=mask_g)
    else:
        if ONE_SPLIT:  # seq_len == 0
            zero = tl.zeros([BLOCK_H, BLOCK_D], dtype=mid_o_ptr.dtype.element_ty)
            tl.store(mo, zero, mask=mask_g[:, None] & mask_d[None, :])
    if MERGE:  # every program arrives, empty splits included
        _arrive_and_merge(counter_ptr, mid_o_ptr, mid_lse_ptr, o_ptr, b, kvh, tl.num_programs(1), hi - lo, split_len,
                          num_kv_splits, stride_mob, stride_moh, stride_mos, stride_mlb, stride_mlh, stride_ob,
                          stride_oh, GROUP, HEAD_DIM, BLOCK_D, BLOCK_S)


# NOTE: num_shared_splits is not specialized either (as _decode_stage1's arguments above).
@triton.jit(do_not_specialize=[*_SPLIT_INTS, "num_shared_splits"], do_not_specialize_on_alignment=_ROW_PTRS)
def _decode_stage2(
    mid_o_ptr, mid_lse_ptr, o_ptr, seq_lens_ptr, start_ptr,
    num_kv_splits, num_shared_splits, window,
    stride_mob, stride_moh, stride_mos,
    stride_mlb, stride_mlh,
    stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_SHARED: tl.constexpr, SHARED_BLOCK_N: tl.constexpr,
):
    # With HAS_SHARED, split slots [num_kv_splits, num_kv_splits + num_shared_splits) hold the
    # shared-prefix partials of [0, start[b]) (start 0: row in no chunk, none ran).
    b = tl.program_id(0)
    h = tl.program_id(1)
    lo, hi = _kv_range(seq_lens_ptr, start_ptr, b, window, HAS_SHARED)
    split_len = tl.cdiv(tl.cdiv(hi - lo, num_kv_splits), BLOCK_N) * BLOCK_N  # as in stage 1
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM

    m_i = float("-inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    mo = mid_o_ptr + b * stride_mob + h * stride_moh
    ml = mid_lse_ptr + b * stride_mlb + h * stride_mlh
    for split in range(0, num_kv_splits):
        if split * split_len < hi - lo:
            acc, l_i, m_i = _merge_split(acc, l_i, m_i, ml + split, mo + split * stride_mos + offs_d, mask_d)
    if HAS_SHARED:
        shared_split_len = _split_len(lo, num_shared_splits, SHARED_BLOCK_N)  # as in the shared stage
        for split in range(0, num_shared_splits):
            if split * shared_split_len < lo:
                s = num_kv_splits + split
                acc, l_i, m_i = _merge_split(acc, l_i, m_i, ml + s, mo + s * stride_mos + offs_d, mask_d)
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)  # no split ran (seq_len 0): zeros
    tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_d, out.to(o_ptr.dtype.element_ty), mask=mask_d)


def decode_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    num_kv_splits: int | None = None,
    out: torch.Tensor | None = None,
    window: int = 0,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int = 3,
    shared: SharedPrefix | None = None,
    num_shared_splits: int | None = None,
    shared_block_n: int = 64,
    shared_num_warps: int | None = None,
    shared_num_stages: int = 2,
    one_launch: bool = False,
    counters: torch.Tensor | None = None,
    new_tokens: NewTokens | None = None,
    heads_fastest: bool = True,
) -> torch.Tensor:
    """Attention of one query token per request over its KV in the pool (Triton).

    Args:
        q: ``[B, H, D]``, last dim contiguous (a strided view of a fused qkv is fine).
        k_buffer, v_buffer: ``[num_slots + 1, KH, D]`` with ``H % KH == 0``, ``q``'s dtype or fp8
            (e4m3 / e5m2: widened to ``q``'s dtype as they are read).
        req_to_token: int32 ``[max_reqs, max_context_len]``, last dim contiguous.
        req_pool_indices: int ``[B]`` rows of ``req_to_token``.
        seq_lens: int ``[B]``; request ``b`` attends to positions ``[0, seq_lens[b])``.
        sm_scale: softmax scale (usually ``D ** -0.5``).
        num_kv_splits: splits of each sequence (of its own keys with ``shared``; default
            :func:`default_num_kv_splits`).
        out: optional ``[B, H, D]`` output buffer (e.g. a CUDA-graph static tensor).
        window: sliding window in keys (the query's own included); ``<= 0`` attends to all.
        block_n, num_warps, num_stages: tuning knobs of stage 1 (``block_n`` None: 128 keys per tile
            from ``LARGE_BATCH`` rows up, else 64).
        shared: prefixes shared by chunks of rows (:class:`SharedPrefix`, its contract is not
            checked here: no host reads). Each shared K/V tile is read once per chunk (Hydragen /
            FlashInfer cascade attention); the result equals plain attention over ``[0, seq_len)``.
        num_shared_splits: splits of each shared prefix (default :func:`default_num_shared_splits`
            of ``NC``; where ``NC`` is a capacity that most steps fill only partly, pass a count
            sized for the chunks usually filled, so that a long prefix is still read in parallel).
        shared_block_n, shared_num_warps, shared_num_stages: tuning knobs of the shared stage
            (``shared_num_warps`` None: 4).
        one_launch: with several splits and no ``shared``, merge them in the stage-1 launch (the
            last split of each (request, kv head) merges) instead of a second launch (default).
            Results differ by fp32 rounding only. Off by default: on the H200 at batch 1 the
            arrival counters cost more than the launch they save (runtime/attention.py).
        counters: int32 arrival counters of ``one_launch``, ``>= B * KH`` entries, all zero, left
            zero (default: :func:`~radixlm.kernels.decode_merge.split_counters` of the device;
            launches that may run concurrently on other streams need their own).
        new_tokens: each row's current token, not yet rotated nor stored (:class:`NewTokens`): the
            kernel rotates q (in registers; ``q`` is not modified) and k, and stores k, v into the
            pool before reading it (rotary + store_kv + attention in one launch; not with ``shared``).
        heads_fastest: launch stage 1 as ``(KH, B, S)`` (default) instead of ``(B, KH, S)``: the
            programs of a request's KV heads run together and read each token's adjacent head rows
            at once (same result).

    Returns:
        ``[B, H, D]`` in ``q.dtype``; zeros for a request with ``seq_len == 0``.

    Raises:
        ValueError: ``shared`` with ``window > 0`` or with ``new_tokens``, or ``shared`` /
            ``new_tokens`` of the wrong shapes / dtypes / device.
    """
    B, H, D = q.shape
    assert k_buffer.dim() == 3 and k_buffer.shape == v_buffer.shape, (k_buffer.shape, v_buffer.shape)
    KH = k_buffer.shape[1]
    assert k_buffer.shape[2] == D and H % KH == 0, (q.shape, k_buffer.shape)
    assert k_buffer.dtype == v_buffer.dtype in (q.dtype, *FP8_KV), (q.dtype, k_buffer.dtype, v_buffer.dtype)
    assert q.stride(2) == 1 and k_buffer.stride(2) == 1 and v_buffer.stride(2) == 1
    assert req_to_token.dtype == torch.int32 and req_to_token.dim() == 2 and req_to_token.stride(1) == 1
    assert req_pool_indices.shape == (B,) and seq_lens.shape == (B,), (req_pool_indices.shape, seq_lens.shape)
    assert req_pool_indices.dtype in (torch.int32, torch.int64) and seq_lens.dtype in (torch.int32, torch.int64)
    assert isinstance(window, int), f"window must be an int, got {type(window).__name__}"
    if shared is not None:
        if window > 0:
            raise ValueError("shared-prefix attention does not support a sliding window")
        check_shared_shapes(shared, B, q.device)
        if new_tokens is not None:
            raise ValueError("new_tokens cannot be combined with shared")
    rope_ptrs, rope_strides = new_token_args(new_tokens, q, k_buffer)
    check_triton(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens)
    if out is None:
        out = torch.empty((B, H, D), dtype=q.dtype, device=q.device)
    assert out.shape == (B, H, D) and out.dtype == q.dtype and out.stride(2) == 1
    if B == 0:
        return out
    G = H // KH
    block_n = block_n or (128 if B >= LARGE_BATCH else 64)
    S = num_kv_splits or default_num_kv_splits(B, KH, q.device)
    SS = 0
    if shared is not None:
        SS = num_shared_splits or default_num_shared_splits(shared.num_chunks, KH, q.device)
    BLOCK_D = next_pow2(D)
    common = dict(GROUP=G, HEAD_DIM=D, BLOCK_H=max(16, next_pow2(G)), BLOCK_D=BLOCK_D, BLOCK_N=block_n,
                  IEEE=q.dtype == torch.float32, num_warps=num_warps, num_stages=num_stages,
                  HAS_SHARED=shared is not None, ROTARY=new_tokens is not None, HEADS_FASTEST=heads_fastest)
    grid = (lambda s: (KH, B, s)) if heads_fastest else (lambda s: (B, KH, s))
    start = seq_lens if shared is None else shared.start  # (unread without shared)
    head = (q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, start)
    strides = (
        q.stride(0), q.stride(1),
        k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1),
        req_to_token.stride(0),
    )
    if S == 1 and shared is None:
        _decode_stage1[grid(1)](
            *head, out, out, out, out, *rope_ptrs, sm_scale * _LOG2E, 1, max(window, 0), *strides,
            out.stride(0), out.stride(1), 0, 0, 0, 0, 0, *rope_strides,
            ONE_SPLIT=True, MERGE=False, BLOCK_S=1, **common,
        )
        return out
    merge = one_launch and shared is None
    if merge:
        counters = split_counters(q.device, B * KH) if counters is None else counters
        assert counters.dtype == torch.int32 and counters.numel() >= B * KH and counters.is_contiguous()
    mid_o = torch.empty((B, H, S + SS, D), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((B, H, S + SS), dtype=torch.float32, device=q.device)
    # NOTE: BLOCK_S at least 32 (the default split cap), so serving compiles one merging variant
    _decode_stage1[grid(S)](
        *head, mid_o, mid_lse, out, counters if merge else mid_lse, *rope_ptrs, sm_scale * _LOG2E, S,
        max(window, 0), *strides, mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1), out.stride(0), out.stride(1), *rope_strides,
        ONE_SPLIT=False, MERGE=merge, BLOCK_S=max(32, next_pow2(S)) if merge else 1, **common,
    )
    if merge:
        return out
    if shared is not None:
        launch_shared_prefix_stage(q, k_buffer, v_buffer, req_to_token, shared, mid_o, mid_lse, sm_scale * _LOG2E,
                                   SS, S, shared_block_n, shared_num_warps, shared_num_stages)
    _decode_stage2[(B, H)](
        mid_o, mid_lse, out, seq_lens, start,
        S, SS, max(window, 0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=D, BLOCK_D=BLOCK_D, BLOCK_N=block_n,
        HAS_SHARED=shared is not None, SHARED_BLOCK_N=shared_block_n,
        num_warps=2 if BLOCK_D <= 128 else 4,
    )
    return out
