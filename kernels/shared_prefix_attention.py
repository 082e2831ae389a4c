"""Shared-prefix ("cascade") decode attention: the KV of a prefix that several requests share in
the pool (same slots, e.g. a system prompt matched by the radix cache) is read once per chunk of
requests instead of once per request.

Sources: Hydragen (Juravsky et al. 2024, "Hydragen: High-Throughput LLM Inference with Shared
Prefixes"): attention over a shared prefix is batched across the sequences that share it and
merged with each sequence's own suffix by softmax denominators; FlashInfer's "cascade inference"
(a shared-prefix level and a unique-suffix level merged by log-sum-exp); and the log-sum-exp merge
of split-KV flash-decoding (Dao et al. 2023), which the merge stage of
:mod:`radixlm.kernels.decode_attention` already does.

The math. Softmax attention over a key set split into disjoint parts ``A`` (the shared prefix)
and ``B`` (the request's own keys) is ``o = w_A o_A + w_B o_B`` where ``o_X`` is attention over
part ``X`` alone, ``lse_X = log sum_{k in X} exp(q.k * scale)`` and ``w_X = exp(lse_X - lse)``,
``lse = log(exp(lse_A) + exp(lse_B))``. A part with no keys has ``lse = -inf`` (weight 0).

This file holds :class:`SharedPrefix` (the device-side description of the chunks), the Triton
stage that computes ``(o_A, lse_A)`` for every member of a chunk with one pass over the shared
K/V, a host-side packing helper, and the torch reference in the cascade form.
:func:`radixlm.kernels.decode_attention.decode_attention` (``shared=``) launches the stage beside
its own-suffix stage 1 and merges both in its stage 2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from radixlm.kernels._triton import dot, device_sms, next_pow2, tl, triton

MAX_SHARED_SPLITS = 16


@dataclass(frozen=True)
class SharedPrefix:
    """Which batch rows share which prefix of KV slots, for one decode step (all on the device).

    Shapes are fixed by the caller (``NC`` chunks of at most ``C`` members; CUDA graphs capture
    them), values change every step. Integer tensors, int64 (int32 accepted), on ``q``'s device.

    Attributes:
        start: ``[B]``: row ``b``'s own keys are positions ``[start[b], seq_lens[b])``; the shared
            part is ``[0, start[b])``. 0 for a row in no chunk.
        chunk_rows: ``[NC, C]``: batch rows (indices into ``q`` / ``seq_lens``) of chunk ``c``'s
            members, ``-1`` = empty place (anywhere in the row, not only at the end).
        chunk_req: ``[NC]``: the ``req_to_token`` row the chunk's shared slots are read from.
        chunk_len: ``[NC]``: the shared positions are ``[0, chunk_len[c])``; 0 = unused chunk.

    Contract (checked by the torch reference, not by the kernel, which never reads values on the
    host): every member ``b`` of chunk ``c`` has ``start[b] == chunk_len[c] <= seq_lens[b]`` and
    its ``req_to_token`` row holds the same slots as row ``chunk_req[c]`` over ``[0, chunk_len[c])``;
    a row is in at most one chunk; rows in no chunk have ``start == 0``. A member may have
    ``seq_lens[b] == start[b]`` (no own keys; in decode the current token is always an own key).
    """

    start: torch.Tensor
    chunk_rows: torch.Tensor
    chunk_req: torch.Tensor
    chunk_len: torch.Tensor

    @property
    def num_chunks(self) -> int:
        return self.chunk_rows.shape[0]

    @property
    def chunk_size(self) -> int:
        return self.chunk_rows.shape[1]


def pack_shared_prefix(
    groups: Sequence[tuple[Sequence[int], int, int]],
    batch_size: int,
    num_chunks: int,
    chunk_size: int,
    device: torch.device | str = "cpu",
) -> SharedPrefix:
    """Host helper: fixed-shape :class:`SharedPrefix` from ``groups`` of ``(member batch rows,
    shared length, req_to_token row)``; a group larger than ``chunk_size`` fills several chunks.

    Raises:
        ValueError: more chunks needed than ``num_chunks``, or a row in two groups.
    """
    start = torch.zeros(batch_size, dtype=torch.int64)
    rows = torch.full((num_chunks, chunk_size), -1, dtype=torch.int64)
    req = torch.zeros(num_chunks, dtype=torch.int64)
    length = torch.zeros(num_chunks, dtype=torch.int64)
    c = 0
    seen: set[int] = set()
    for members, shared_len, req_row in groups:
        members = [int(m) for m in members]
        if seen.intersection(members):
            raise ValueError(f"rows {sorted(seen.intersection(members))} are in two groups")
        seen.update(members)
        for i in range(0, len(members), chunk_size):
            if c == num_chunks:
                raise ValueError(f"the groups need more than num_chunks={num_chunks} chunks of {chunk_size}")
            part = members[i : i + chunk_size]
            rows[c, : len(part)] = torch.tensor(part)
            req[c], length[c] = req_row, shared_len
            start[part] = shared_len
            c += 1
    return SharedPrefix(*(t.to(device) for t in (start, rows, req, length)))


def default_num_shared_splits(num_chunks: int, kv_heads: int, device: torch.device) -> int:
    """Splits of each shared prefix so that ``num_chunks * kv_heads * splits`` covers the GPU about
    twice: a power of two in ``[1, MAX_SHARED_SPLITS]``, from shapes only (CUDA-graph safe)."""
    target = 2 * device_sms(device)
    return min(MAX_SHARED_SPLITS, next_pow2(max(1, math.ceil(target / max(1, num_chunks * kv_heads)))))


def check_shared_shapes(shared: SharedPrefix, batch: int, device: torch.device) -> None:
    """Shapes, dtypes and device of ``shared`` (no value reads). Raises ValueError."""
    if not isinstance(shared, SharedPrefix):
        raise ValueError(f"shared must be a SharedPrefix, got {type(shared).__name__}")
    nc = shared.chunk_rows.shape[0] if shared.chunk_rows.dim() == 2 else -1
    want = {"start": (batch,), "chunk_req": (nc,), "chunk_len": (nc,)}
    for name, t in (("start", shared.start), ("chunk_rows", shared.chunk_rows),
                    ("chunk_req", shared.chunk_req), ("chunk_len", shared.chunk_len)):
        if t.dtype not in (torch.int32, torch.int64) or t.device != device:
            raise ValueError(f"shared.{name} must be an int32/int64 tensor on {device}, got {t.dtype} on {t.device}")
        if name == "chunk_rows":
            if t.dim() != 2 or t.stride(1) != 1:
                raise ValueError(f"shared.chunk_rows must be [NC, C] with a contiguous last dim, got {tuple(t.shape)}")
        elif tuple(t.shape) != want[name] or (t.dim() == 1 and t.stride(0) != 1 and t.numel() > 1):
            raise ValueError(f"shared.{name} must be a contiguous {want[name]}, got {tuple(t.shape)}")


def check_shared_values(
    shared: SharedPrefix, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
) -> None:
    """The :class:`SharedPrefix` contract on the values (host reads; the reference's check).

    Raises:
        ValueError: a member row out of range or in two chunks, ``start`` not equal to its chunk's
            length (or nonzero outside chunks, or past ``seq_lens``), or a member whose slots over
            the shared positions differ from the ``chunk_req`` row's.
    """
    B = seq_lens.shape[0]
    check_shared_shapes(shared, B, seq_lens.device)
    start, lens = shared.start.tolist(), seq_lens.tolist()
    pool_rows = req_pool_indices.tolist()
    owner: dict[int, int] = {}
    for c, (members, req, n) in enumerate(zip(shared.chunk_rows.tolist(), shared.chunk_req.tolist(),
                                              shared.chunk_len.tolist())):
        if not 0 <= n <= req_to_token.shape[1]:
            raise ValueError(f"chunk {c}: chunk_len {n} outside [0, {req_to_token.shape[1]}]")
        for b in members:
            if b == -1:
                continue
            if not 0 <= b < B:
                raise ValueError(f"chunk {c}: member row {b} outside [0, {B}) (use -1 for empty places)")
            if b in owner:
                raise ValueError(f"row {b} is in chunks {owner[b]} and {c}")
            owner[b] = c
            if start[b] != n:
                raise ValueError(f"row {b} of chunk {c}: start {start[b]} != chunk_len {n}")
            if n and not torch.equal(req_to_token[pool_rows[b], :n], req_to_token[req, :n]):
                raise ValueError(f"row {b} of chunk {c}: its slots over [0, {n}) differ from req_to_token row {req}'s")
    for b in range(B):
        if b not in owner and start[b] != 0:
            raise ValueError(f"row {b} is in no chunk but has start {start[b]} (must be 0)")
        if start[b] > lens[b]:
            raise ValueError(f"row {b}: start {start[b]} > seq_len {lens[b]}")


def _partial_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float):
    """Attention over one part of the keys: q ``[R, KH, G, D]``, k/v ``[L, KH, D]`` (fp32) ->
    ``(o [R, KH, G, D], lse [R, KH, G])``, natural log; ``L == 0`` gives zeros and ``-inf``."""
    s = torch.einsum("rkgd,lkd->rkgl", q, k) * sm_scale
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    return torch.einsum("rkgl,lkd->rkgd", p, v), lse


def shared_prefix_attention_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    shared: SharedPrefix,
    out: torch.Tensor,
) -> torch.Tensor:
    """Torch reference of ``decode_attention(..., shared=...)`` in the cascade form (fp32): per
    chunk, one attention of all members' queries over the shared K/V (read once); per row, its own
    keys ``[start, seq_len)``; the two partials merged by log-sum-exp. Checks the contract first
    (:func:`check_shared_values`, ValueError). Equals plain attention over ``[0, seq_len)``."""
    check_shared_values(shared, req_to_token, req_pool_indices, seq_lens)
    B, H, D = q.shape
    KH = k_buffer.shape[1]
    qf = q.float().view(B, KH, H // KH, D)
    o_sh = torch.zeros_like(qf)
    lse_sh = torch.full(qf.shape[:3], float("-inf"), device=q.device)
    for members, req, n in zip(shared.chunk_rows.tolist(), shared.chunk_req.tolist(), shared.chunk_len.tolist()):
        members = [b for b in members if b >= 0]
        if n and members:
            slots = req_to_token[req, :n].long()
            o_sh[members], lse_sh[members] = _partial_ref(qf[members], k_buffer[slots].float(),
                                                          v_buffer[slots].float(), sm_scale)
    rows, start, lens = req_pool_indices.tolist(), shared.start.tolist(), seq_lens.tolist()
    for b in range(B):
        slots = req_to_token[rows[b], start[b] : lens[b]].long()
        o_own, lse_own = _partial_ref(qf[b : b + 1], k_buffer[slots].float(), v_buffer[slots].float(), sm_scale)
        lse = torch.logaddexp(lse_sh[b], lse_own[0])
        finite = torch.isfinite(lse)  # both parts empty (seq_len 0): zeros
        w_sh = torch.where(finite, torch.exp(lse_sh[b] - lse), 0.0)
        w_own = torch.where(finite, torch.exp(lse_own[0] - lse), 0.0)
        o = w_sh[..., None] * o_sh[b] + w_own[..., None] * o_own[0]
        out[b] = o.reshape(H, D).to(out.dtype)
    return out


@triton.jit
def _split_len(n, num_splits, BLOCK_N: tl.constexpr):
    """Positions per split of ``n`` positions: whole BLOCK_N tiles (stage 1's rule)."""
    return tl.cdiv(tl.cdiv(n, num_splits), BLOCK_N) * BLOCK_N


@triton.jit(do_not_specialize=["num_shared_splits", "split_base", "stride_mlb", "stride_mlh"])  # NOTE: as _decode_stage2's
def _shared_prefix_stage(
    q_ptr, k_ptr, v_ptr, req_to_token_ptr,
    chunk_rows_ptr, chunk_req_ptr, chunk_len_ptr,
    mid_o_ptr, mid_lse_ptr,
    qk_scale, num_shared_splits, split_base,
    stride_qb, stride_qh,
    stride_ks, stride_kh,
    stride_vs, stride_vh,
    stride_rt, stride_cr,
    stride_mob, stride_moh, stride_mos,
    stride_mlb, stride_mlh,
    C: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
):
    # One program per (chunk, kv head, split). Tile row r is member r // GROUP, query head
    # kvh * GROUP + r % GROUP: every K/V tile of the shared prefix is loaded once for the
    # C * GROUP queries. Writes split slot split_base + split of mid_o / mid_lse (log2 domain);
    # an empty split writes nothing (stage 2 recomputes which splits ran, from start[b]).
    c = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    n = tl.load(chunk_len_ptr + c).to(tl.int32)
    split_len = _split_len(n, num_shared_splits, BLOCK_N)
    lo = split * split_len
    hi = tl.minimum(lo + split_len, n)
    if hi > lo:
        offs_r = tl.arange(0, BLOCK_R)
        offs_d = tl.arange(0, BLOCK_D)
        offs_n = tl.arange(0, BLOCK_N)
        mask_d = offs_d < HEAD_DIM
        rows = tl.load(chunk_rows_ptr + c * stride_cr + offs_r // GROUP, mask=offs_r < C * GROUP, other=-1)
        mask_r = rows >= 0
        rows = tl.where(mask_r, rows, 0).to(tl.int64)
        heads = kvh * GROUP + offs_r % GROUP
        mask_q = mask_r[:, None] & mask_d[None, :]
        q = tl.load(q_ptr + rows[:, None] * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=mask_q, other=0.0)
        req = tl.load(chunk_req_ptr + c).to(tl.int64)
        row_ptr = req_to_token_ptr + req * stride_rt
        m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
        acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
        for n0 in range(lo, hi, BLOCK_N):
            pos = n0 + offs_n
            mask_n = pos < hi
            slots = tl.load(row_ptr + pos, mask=mask_n, other=0).to(tl.int64)
            k = tl.load(k_ptr + slots[None, :] * stride_ks + kvh * stride_kh + offs_d[:, None],
                        mask=mask_n[None, :] & mask_d[:, None], other=0.0).to(q.dtype)  # [BLOCK_D, BLOCK_N]
            s = dot(q, k, IEEE) * qk_scale  # log2 domain
            s = tl.where(mask_n[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            v = tl.load(v_ptr + slots[:, None] * stride_vs + kvh * stride_vh + offs_d[None, :],
                        mask=mask_n[:, None] & mask_d[None, :], other=0.0).to(q.dtype)  # [BLOCK_N, BLOCK_D]
            acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, IEEE)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
        slot = split_base + split
        tl.store(mid_o_ptr + rows[:, None] * stride_mob + heads[:, None] * stride_moh + slot * stride_mos
                 + offs_d[None, :], acc / l_i[:, None], mask=mask_q)
        tl.store(mid_lse_ptr + rows * stride_mlb + heads * stride_mlh + slot, m_i + tl.log2(l_i), mask=mask_r)


def launch_shared_prefix_stage(
    q, k_buffer, v_buffer, req_to_token, shared: SharedPrefix, mid_o, mid_lse, qk_scale: float,
    num_shared_splits: int, split_base: int, block_n: int, num_warps: int | None, num_stages: int,
) -> None:
    """Launch :func:`_shared_prefix_stage` on grid ``(NC, KH, num_shared_splits)``; ``mid_o``
    ``[B, H, S_total, D]`` fp32 and ``mid_lse`` ``[B, H, S_total]`` get the shared partials in
    split slots ``[split_base, split_base + num_shared_splits)``. ``num_warps`` None: 4 (H200 sweep
    in benchmarks/results/shared_prefix_h200.md: 4 beat 8 for every chunk size at 8B and 135M
    dims, e.g. 8B C=16 244 vs 312 us, although ptxas reports spills at 4)."""
    H, D = q.shape[1], q.shape[2]
    NC, C = shared.chunk_rows.shape
    KH = k_buffer.shape[1]
    if NC == 0 or C == 0:
        return
    G = H // KH
    BLOCK_R, BLOCK_D = max(16, next_pow2(C * G)), next_pow2(D)
    if num_warps is None:
        num_warps = 4
    _shared_prefix_stage[(NC, KH, num_shared_splits)](
        q, k_buffer, v_buffer, req_to_token,
        shared.chunk_rows, shared.chunk_req, shared.chunk_len,
        mid_o, mid_lse,
        qk_scale, num_shared_splits, split_base,
        q.stride(0), q.stride(1),
        k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1),
        req_to_token.stride(0), shared.chunk_rows.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        C=C, GROUP=G, HEAD_DIM=D, BLOCK_R=BLOCK_R, BLOCK_D=BLOCK_D, BLOCK_N=block_n,
        IEEE=q.dtype == torch.float32, num_warps=num_warps, num_stages=num_stages,
    )
