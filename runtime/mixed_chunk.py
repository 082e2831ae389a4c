"""Prefill tokens of a mixed batch, from a cost model of the decode step they delay.

A mixed batch runs a prefill chunk in the same forward as one decode token of every running
request, so each of those tokens waits for the chunk. Sarathi-Serve (Agrawal et al., OSDI 2024)
sizes the chunk by a token budget so that a step's prefill stays within a bound on the
time-between-tokens; this module picks that budget from arithmetic instead of a fixed number:

- a decode step is memory-bound: it reads the weights once and the KV of every decoding row,
  ``weight_bytes + kv_bytes_per_token * decode_kv_tokens`` bytes;
- a prefill token is compute-bound: ``2 * params`` FLOPs;
- at ``balance`` sustained FLOPs per HBM byte, one decode step costs as much time as
  ``decode_bytes * balance / (2 * params)`` prefill tokens, and the chunk may cost ``ratio`` of
  those (a mixed step then takes about ``1 + ratio`` decode steps).

KV-heavy decode batches (long unshared contexts) get the full chunk; light ones (short or shared
contexts, where decode steps are cheap) get smaller chunks, so their ITL p99 stays near p50.
``decode_kv_tokens`` should describe the batch the queue is heading to, not the current one: while
requests ramp up few rows decode, and sizing chunks by them starves admission.
"""

from __future__ import annotations

# Sustained dense bf16 FLOP/s over sustained HBM bytes/s of a GPU (H100 / H200: ~700 TFLOP/s over
# ~4 TB/s). Devices without an entry keep the fixed chunk.
MACHINE_BALANCE = {"cuda": 175.0}
MIXED_PREFILL_RATIO = 2.0  # a chunk may cost this many decode steps (ITL of a mixed step ~3x)
MIN_MIXED_CHUNK = 512  # below this, prefill GEMMs lose efficiency and admission slows


def mixed_chunk_budget(
    params: int,
    weight_bytes: int,
    kv_bytes_per_token: int,
    decode_kv_tokens: float,
    cap: int,
    balance: float,
    ratio: float = MIXED_PREFILL_RATIO,
    floor: int = MIN_MIXED_CHUNK,
) -> int:
    """Prefill tokens a mixed step may carry.

    Args:
        params: model parameters on this rank.
        weight_bytes: bytes of those parameters.
        kv_bytes_per_token: KV bytes of one token over all layers (K and V).
        decode_kv_tokens: KV tokens the decode rows of the step read (shared prefixes once).
        cap: the largest chunk (the configured or default mixed chunk).
        balance: sustained FLOPs per HBM byte of the device (``MACHINE_BALANCE``).
        ratio: prefill time allowed per decode-step time (default ``MIXED_PREFILL_RATIO``).
        floor: the smallest chunk returned, unless ``cap`` is smaller.

    Returns:
        An int in ``[min(floor, cap), cap]``.
    """
    decode_bytes = weight_bytes + kv_bytes_per_token * max(decode_kv_tokens, 0.0)
    tokens = ratio * decode_bytes * balance / (2.0 * max(params, 1))
    return int(min(max(tokens, floor), cap))
