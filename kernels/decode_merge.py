"""Split-KV decode attention without a separate merge launch: the last split to finish merges.
(Also the split count, :func:`default_num_kv_splits`.)

Split-KV ("flash-decoding", Dao et al. 2023) decode attention runs one program per (request, kv
head, split) that writes a partial output and its log-sum-exp, and a second kernel that merges the
splits. At small batch the second launch costs as much as the work it does (issue 16: a bs-1
decode step of a 135M model is bound by its kernel count). Here each split program, after writing
its partial, increments a per-(request, kv head) arrival counter; the program that arrives last
(it sees ``num_splits - 1``) merges all splits of its group of query heads and resets the counter
to 0. The same "last block done" pattern as CUB's single-pass reductions and the CUDA
programming guide's ``threadFenceReduction`` sample (release before the count, acquire after it).

Counter contract (:func:`split_counters`):
    * int32, at least ``B * KH`` entries, all 0 before a launch; every launch leaves them all 0
      again (each counter is reset by its last arrival), so CUDA-graph replays start clean.
    * A launch owns its counters while it runs: launches that may run at the same time (other
      streams) need distinct buffers (``counters=`` of ``decode_attention``). Launches on one
      stream (the layers of a step, graph replays) share one.
    * The default buffer is module-level, one per device, allocated zeroed on first use and grown
      (never freed: captured graphs keep pointing at older ones) outside CUDA-graph capture only.

Memory ordering: a CTA barrier orders all threads' partial stores before the one thread's
``acq_rel`` GPU-scope atomic (release); the merging program reads the partials after its acquire,
with ``.cg`` loads (L2, not a possibly stale L1).
"""

from __future__ import annotations

import math

import torch

from radixlm.kernels._triton import device_sms, next_pow2, tl, triton

COUNTERS_MIN = 4096  # entries of a new default buffer (16 KiB), grown on demand
_COUNTERS: dict[tuple[str, int], torch.Tensor] = {}
_RETIRED: list[torch.Tensor] = []  # NOTE: outgrown buffers stay alive: captured graphs use them


def split_counters(device: torch.device, n: int) -> torch.Tensor:
    """The module-level arrival-counter buffer of ``device``: int32 ``[>= n]``, all zeros between
    launches (see the module docstring for the contract).

    Raises:
        RuntimeError: when the buffer must grow during CUDA-graph capture (its zero fill would be
            captured instead of run); run the same shapes once eagerly first (graph warm-up does).
    """
    index = device.index if device.index is not None else (torch.cuda.current_device() if device.type == "cuda" else 0)
    key = (device.type, index)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"split counters of {device} must grow to {n} during CUDA-graph capture; "
                               "run decode_attention with this batch once before capturing")
        if buf is not None:
            _RETIRED.append(buf)
        buf = _COUNTERS[key] = torch.zeros(max(n, COUNTERS_MIN), dtype=torch.int32, device=torch.device(*key))
    return buf


def default_num_kv_splits(batch: int, kv_heads: int, device: torch.device) -> int:
    """Splits per request so that ``batch * kv_heads * splits`` covers the GPU about twice.

    Depends only on the batch shape (not on ``seq_lens``), so a CUDA graph captured for a batch size
    stays valid for every sequence length. Power of two in ``[1, 32]``; 1 once ``batch * kv_heads >=
    2 * SMs`` (64 requests of 8 kv heads on an H200), which also skips the reduction kernel. Chosen
    from the H200 sweeps in benchmarks/results/kernels_h200.md (more splits lose bandwidth at batch
    64; 32 beats 64 at batch 1).
    """
    target = 2 * device_sms(device)
    return min(32, next_pow2(max(1, math.ceil(target / (batch * kv_heads)))))


@triton.jit
def _merge_split(acc, l_i, m_i, lse_ptr, part_ptr, mask_d):
    """Fold one split's partial output (``part_ptr``, normalized) and log2-sum-exp (``lse_ptr``)
    into the running ``(acc, l_i, m_i)`` of stage 2 (flash-decoding's merge)."""
    lse = tl.load(lse_ptr)
    part = tl.load(part_ptr, mask=mask_d, other=0.0)
    m_new = tl.maximum(m_i, lse)
    alpha = tl.exp2(m_i - m_new)
    w = tl.exp2(lse - m_new)
    return acc * alpha + w * part, l_i * alpha + w, m_new


@triton.jit
def _merge_group(
    mid_o_ptr, mid_lse_ptr, o_ptr, b, kvh, n_keys, split_len, num_kv_splits,
    stride_mob, stride_moh, stride_mos, stride_mlb, stride_mlh, stride_ob, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """Merge the splits of the ``GROUP`` query heads of kv head ``kvh`` of request ``b`` into
    ``o`` (split ``s`` ran iff ``s * split_len < n_keys``; none ran: zeros)."""
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = (offs_s < num_kv_splits) & (offs_s * split_len < n_keys)
    mask_d = offs_d < HEAD_DIM
    for g in tl.static_range(GROUP):
        h = kvh * GROUP + g
        lse = tl.load(mid_lse_ptr + b * stride_mlb + h * stride_mlh + offs_s, mask=mask_s,
                      other=float("-inf"), cache_modifier=".cg")
        m = tl.max(lse, 0)
        m = tl.where(m == float("-inf"), 0.0, m)
        w = tl.exp2(lse - m)  # 0 where no split ran
        l_sum = tl.sum(w, 0)
        part = tl.load(mid_o_ptr + b * stride_mob + h * stride_moh + offs_s[:, None] * stride_mos + offs_d[None, :],
                       mask=mask_s[:, None] & mask_d[None, :], other=0.0, cache_modifier=".cg")
        out = tl.sum(w[:, None] * part, 0) / tl.where(l_sum > 0.0, l_sum, 1.0)
        tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_d, out.to(o_ptr.dtype.element_ty), mask=mask_d)


@triton.jit
def _arrive_and_merge(
    counter_ptr, mid_o_ptr, mid_lse_ptr, o_ptr, b, kvh, num_kv_heads, n_keys, split_len, num_kv_splits,
    stride_mob, stride_moh, stride_mos, stride_mlb, stride_mlh, stride_ob, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """Count this split program in; the last of the ``num_programs(2)`` splits merges and resets."""
    tl.debug_barrier()  # every thread's partial stores precede the release below
    ctr = counter_ptr + b * num_kv_heads + kvh
    arrived = tl.atomic_add(ctr, 1, sem="acq_rel", scope="gpu")
    if arrived == tl.num_programs(2) - 1:
        _merge_group(mid_o_ptr, mid_lse_ptr, o_ptr, b, kvh, n_keys, split_len, num_kv_splits,
                     stride_mob, stride_moh, stride_mos, stride_mlb, stride_mlh, stride_ob, stride_oh,
                     GROUP, HEAD_DIM, BLOCK_D, BLOCK_S)
        tl.atomic_xchg(ctr, 0, sem="relaxed", scope="gpu")
