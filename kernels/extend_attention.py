"""Extend (prefill) attention for a ragged batch over the token-granular KV pool.

Request ``b`` has ``prefix_lens[b]`` cached tokens and ``extend_lens[b]`` new tokens whose queries are
rows ``[extend_start_loc[b], extend_start_loc[b] + extend_lens[b])`` of ``q``. The KV of all
``prefix_len + extend_len`` positions (new tokens included) is already in the pool and is read
through ``req_to_token``. New token ``i`` (position ``prefix_len + i``) attends to positions
``[0, prefix_len + i]``: the whole prefix plus causally to the new tokens. This is what makes a
radix-cache hit cheap: only the new tokens are computed. With a sliding ``window`` W > 0 it attends
only to the last W of those, ``(prefix_len + i - W, prefix_len + i]`` (HF's convention: W keys
including its own).

Kernel: flash attention (online softmax) with one program per (query head, block of new tokens,
request); head is the fastest grid axis so the heads of a GQA group read the same K/V tiles
through L2. A block of queries walks three key ranges: the window's left edge (masked; empty
without a window), keys every query of the block sees (no mask), and the diagonal tail (masked).
Tiles before the window's left edge are skipped, so windowed layers cost O(new tokens * W).
"""

from __future__ import annotations

import torch

from radixlm.kernels._triton import FP8_KV, check_triton, dot, interpreting, next_pow2, tl, triton

_LOG2E = 1.4426950408889634


def extend_attention_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    sm_scale: float,
    max_extend_len: int | None = None,
    out: torch.Tensor | None = None,
    window: int = 0,
) -> torch.Tensor:
    """Torch reference (fp32 math, one request at a time). Same contract as :func:`extend_attention`."""
    T, H, D = q.shape
    KH = k_buffer.shape[1]
    G = H // KH
    o = torch.zeros((T, H, D), dtype=q.dtype, device=q.device) if out is None else out
    for row, P, E, s0 in zip(
        req_pool_indices.tolist(), prefix_lens.tolist(), extend_lens.tolist(), extend_start_loc.tolist()
    ):
        if E == 0:
            continue
        slots = req_to_token[row, : P + E].long()
        k = k_buffer[slots].float()  # [P+E, KH, D]
        v = v_buffer[slots].float()
        qb = q[s0 : s0 + E].float().view(E, KH, G, D)
        s = torch.einsum("ekgd,lkd->kgel", qb, k) * sm_scale  # [KH, G, E, P+E]
        key_pos = torch.arange(P + E, device=q.device)[None, :]
        q_pos = (P + torch.arange(E, device=q.device))[:, None]
        allowed = key_pos <= q_pos
        if window > 0:
            allowed &= key_pos > q_pos - window
        s = s.masked_fill(~allowed, float("-inf"))
        p = torch.softmax(s, dim=-1)
        ob = torch.einsum("kgel,lkd->ekgd", p, v).reshape(E, H, D)
        o[s0 : s0 + E] = ob.to(o.dtype)
    return o


@triton.jit
def _attend_tile(
    q, acc, m_i, l_i, n0, row_ptr, k_base, v_base, stride_ks, stride_vs, qk_scale,
    offs_m, offs_n, offs_d, mask_d, P, tail_end, window,
    MASKED: tl.constexpr, IEEE: tl.constexpr,
):
    """One key tile ``[n0, n0 + BLOCK_N)`` of the online softmax; returns ``(acc, m_i, l_i)``.

    MASKED: apply the causal and window masks (a row may then see no key of the tile, so the
    running max is guarded against ``-inf - -inf``); otherwise every key is valid for every row."""
    pos = n0 + offs_n
    mask_n = pos < tail_end
    if MASKED:
        slots = tl.load(row_ptr + pos, mask=mask_n, other=0).to(tl.int64)
        k = tl.load(k_base + slots[None, :] * stride_ks + offs_d[:, None], mask=mask_n[None, :] & mask_d[:, None],
                    other=0.0).to(q.dtype)  # NOTE: an fp8 pool's keys widened to q's dtype
        q_pos = P + offs_m[:, None]
        allowed = (pos[None, :] <= q_pos) & mask_n[None, :]
        allowed = allowed & ((window <= 0) | (pos[None, :] > q_pos - window))
        s = tl.where(allowed, dot(q, k, IEEE) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        slots = tl.load(row_ptr + pos).to(tl.int64)
        k = tl.load(k_base + slots[None, :] * stride_ks + offs_d[:, None], mask=mask_d[:, None], other=0.0).to(q.dtype)
        s = dot(q, k, IEEE) * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = m_new
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    if MASKED:
        v = tl.load(v_base + slots[:, None] * stride_vs + offs_d[None, :], mask=mask_n[:, None] & mask_d[None, :],
                    other=0.0).to(q.dtype)
    else:
        v = tl.load(v_base + slots[:, None] * stride_vs + offs_d[None, :], mask=mask_d[None, :], other=0.0).to(q.dtype)
    acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, IEEE)
    return acc, m_new, l_i * alpha + tl.sum(p, 1)


# NOTE: the per-row index arrays are often row views of one [k, rows] host-built tensor: their
# 16-byte alignment follows the batch size, and specializing on it compiled a new variant in the
# middle of serving (~1 s stalls, benchmarks/results/serving_h200.md, session 11)
@triton.jit(do_not_specialize=["window"],
            do_not_specialize_on_alignment=["req_idx_ptr", "prefix_lens_ptr", "extend_lens_ptr", "extend_start_ptr"])
def _extend_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, req_to_token_ptr,
    req_idx_ptr, prefix_lens_ptr, extend_lens_ptr, extend_start_ptr,
    qk_scale, window,
    stride_qt, stride_qh,
    stride_ks, stride_kh,
    stride_vs, stride_vh,
    stride_ot, stride_oh,
    stride_rt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
):
    h = tl.program_id(0)
    mblk = tl.program_id(1)
    b = tl.program_id(2)
    E = tl.load(extend_lens_ptr + b).to(tl.int32)
    m0 = mblk * BLOCK_M
    if m0 < E:
        P = tl.load(prefix_lens_ptr + b).to(tl.int32)
        q0 = tl.load(extend_start_ptr + b).to(tl.int64)
        req = tl.load(req_idx_ptr + b).to(tl.int64)
        kvh = h // GROUP
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        mask_m = offs_m < E
        mask_d = offs_d < HEAD_DIM

        q = tl.load(
            q_ptr + (q0 + offs_m[:, None]) * stride_qt + h * stride_qh + offs_d[None, :],
            mask=mask_m[:, None] & mask_d[None, :], other=0.0,
        )
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        row_ptr = req_to_token_ptr + req * stride_rt
        k_base = k_ptr + kvh * stride_kh
        v_base = v_ptr + kvh * stride_vh

        tail_end = P + tl.minimum(m0 + BLOCK_M, E)  # one past the block's last query position
        full_end = ((P + m0) // BLOCK_N) * BLOCK_N  # keys below: causally visible to every query
        # With a window: lo = first tile any query of the block sees; mid = first tile inside the
        # window of every query of the block. Without one both are 0.
        lo = tl.where(window > 0, (tl.maximum(P + m0 - window + 1, 0) // BLOCK_N) * BLOCK_N, 0)
        mid = tl.where(window > 0, tl.minimum(tl.cdiv(tl.maximum(tail_end - window, 0), BLOCK_N) * BLOCK_N, full_end), 0)
        for n0 in range(lo, mid, BLOCK_N):  # window's left edge
            acc, m_i, l_i = _attend_tile(
                q, acc, m_i, l_i, n0, row_ptr, k_base, v_base, stride_ks, stride_vs, qk_scale,
                offs_m, offs_n, offs_d, mask_d, P, tail_end, window, MASKED=True, IEEE=IEEE,
            )
        for n0 in range(mid, full_end, BLOCK_N):  # no mask, full tiles only
            acc, m_i, l_i = _attend_tile(
                q, acc, m_i, l_i, n0, row_ptr, k_base, v_base, stride_ks, stride_vs, qk_scale,
                offs_m, offs_n, offs_d, mask_d, P, tail_end, window, MASKED=False, IEEE=IEEE,
            )
        for n0 in range(full_end, tail_end, BLOCK_N):  # diagonal tail
            acc, m_i, l_i = _attend_tile(
                q, acc, m_i, l_i, n0, row_ptr, k_base, v_base, stride_ks, stride_vs, qk_scale,
                offs_m, offs_n, offs_d, mask_d, P, tail_end, window, MASKED=True, IEEE=IEEE,
            )

        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # rows past E (not stored) may see no key
        tl.store(
            o_ptr + (q0 + offs_m[:, None]) * stride_ot + h * stride_oh + offs_d[None, :],
            out.to(o_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :],
        )


def extend_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    sm_scale: float,
    max_extend_len: int | None = None,
    out: torch.Tensor | None = None,
    window: int = 0,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Attention of the new tokens of a ragged batch to their prefix and causally to themselves.

    Args:
        q: ``[T, H, D]`` queries of the new tokens of all requests, last dim contiguous.
        k_buffer, v_buffer: ``[num_slots + 1, KH, D]``, ``H % KH == 0``, ``q``'s dtype or fp8; the
            new tokens' K/V are already stored.
        req_to_token: int32 ``[max_reqs, max_context_len]``.
        req_pool_indices, prefix_lens, extend_lens, extend_start_loc: int ``[B]``; ``prefix_lens``
            may be 0; rows of ``q`` outside every request's range are left untouched in ``out``.
        sm_scale: softmax scale.
        max_extend_len: ``max(extend_lens)`` if the caller knows it (saves a device sync).
        out: optional ``[T, H, D]`` output buffer.
        window: sliding window in keys (the query's own included); ``<= 0`` attends to all.
        block_m, block_n, num_warps, num_stages: tuning knobs.

    Returns:
        ``[T, H, D]`` in ``q.dtype``.
    """
    T, H, D = q.shape
    B = req_pool_indices.shape[0]
    assert k_buffer.dim() == 3 and k_buffer.shape == v_buffer.shape, (k_buffer.shape, v_buffer.shape)
    KH = k_buffer.shape[1]
    assert k_buffer.shape[2] == D and H % KH == 0, (q.shape, k_buffer.shape)
    assert k_buffer.dtype == v_buffer.dtype in (q.dtype, *FP8_KV), (q.dtype, k_buffer.dtype, v_buffer.dtype)
    assert q.stride(2) == 1 and k_buffer.stride(2) == 1 and v_buffer.stride(2) == 1
    assert req_to_token.dtype == torch.int32 and req_to_token.dim() == 2 and req_to_token.stride(1) == 1
    for t in (prefix_lens, extend_lens, extend_start_loc):
        assert t.shape == (B,) and t.dtype in (torch.int32, torch.int64), (t.shape, t.dtype)
    assert req_pool_indices.dtype in (torch.int32, torch.int64)
    assert isinstance(window, int), f"window must be an int, got {type(window).__name__}"
    check_triton(q, k_buffer, v_buffer, req_to_token, req_pool_indices, prefix_lens, extend_lens)
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    assert out.shape == (T, H, D) and out.dtype == q.dtype and out.stride(2) == 1
    if B == 0 or T == 0:
        return out
    if max_extend_len is None:
        max_extend_len = int(extend_lens.max())
    if max_extend_len == 0:
        return out
    BLOCK_D = next_pow2(D)
    if interpreting():
        defaults = (16, 16, 4, 1)
    elif BLOCK_D <= 128:
        defaults = (64, 64, 4, 3)  # best of the H200 sweep (benchmarks/results/kernels_h200.md)
    else:
        defaults = (64, 32, 4, 2)
    BLOCK_M = block_m or defaults[0]
    BLOCK_N = block_n or defaults[1]
    grid = (H, triton.cdiv(max_extend_len, BLOCK_M), B)
    _extend_kernel[grid](
        q, k_buffer, v_buffer, out, req_to_token,
        req_pool_indices, prefix_lens, extend_lens, extend_start_loc,
        sm_scale * _LOG2E, max(window, 0),
        q.stride(0), q.stride(1),
        k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1),
        out.stride(0), out.stride(1),
        req_to_token.stride(0),
        GROUP=H // KH, HEAD_DIM=D, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
        IEEE=q.dtype == torch.float32,
        num_warps=num_warps or defaults[2], num_stages=num_stages or defaults[3],
    )
    return out
