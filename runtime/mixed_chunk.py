"""Prefill tokens of a mixed batch, from a cost model of the decode step they delay.

A mixed batch runs a prefill chunk in the same forward as one decode token of every running
request, so each of those tokens waits for the chunk. Sarathi-Serve (Agrawal et al., OSDI 2024)
sizes the chunk by a token budget so that a step's prefill stays within a bound on the
time-between-tokens; this module picks that budget from arithmetic instead of a fixed number:

- a decode step is memory-bound: it reads the weights once and the KV of every decoding row,
  ``weight_bytes + kv_bytes_per_token * decode_kv_tokens`` bytes, and it pays a fixed time per
  layer (kernel launches, norms, small kernels: ~25 µs per layer on the H200, from a bs-1 step of
  SmolLM2-135M dims, 0.93 ms for 30 layers of 9 MB each), counted as the bytes that time would
  read at ``MACHINE_BANDWIDTH``;
- a prefill token is compute-bound: ``2 * params`` FLOPs;
- at ``balance`` sustained FLOPs per HBM byte, one decode step costs as much time as
  ``decode_bytes * balance / (2 * params)`` prefill tokens, and the chunk may cost ``ratio`` of
  those (a mixed step then takes about ``1 + ratio`` decode steps).

KV-heavy decode batches (long unshared contexts) get the full chunk; light ones (short or shared
contexts, where decode steps are cheap) get smaller chunks, so their ITL p99 stays near p50.
``decode_kv_tokens`` should describe the batch the queue is heading to, not the current one: while
requests ramp up few rows decode, and sizing chunks by them starves admission.

The arithmetic underestimates both sides by about the same factor (H200, Llama-3.1-8B dims, 512
rows under 8 shared 2,048-token prompts: a decode step 22 ms vs 8 ms of bytes, 650 prefill tokens
40 ms vs 15 ms of FLOPs; ``benchmarks/mixed_steps.py``), so ``ratio`` is close to the measured one:
2.0 gave a decode-token-weighted step time p99 / p50 of 2.6 there (3.8 with the fixed 2,048) at
~20% more time for that load; 2.5 keeps unshared 1,024-token contexts at the full chunk. A small
model's decode step is mostly per-step work that bytes do not count (SmolLM2-135M dims, 2,048 x
256/256: ~15% less throughput with bytes alone): the per-layer fixed time is that work.
"""

from __future__ import annotations

# Sustained dense bf16 FLOP/s over sustained HBM bytes/s of a GPU (H100 / H200: ~700 TFLOP/s over
# ~4 TB/s). Devices without an entry keep the fixed chunk.
MACHINE_BALANCE = {"cuda": 175.0}
MACHINE_BANDWIDTH = {"cuda": 4.0e12}  # sustained HBM bytes/s (H200 ~4.2, H100 ~3.0)
LAYER_STEP_S = 25e-6  # fixed time of one decoder layer in a decode step (see the module docstring)
MIXED_PREFILL_RATIO = 2.5  # a chunk may cost this many decode steps (see the module docstring)
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
    fixed_bytes: float = 0.0,
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
        fixed_bytes: a decode step's fixed time as bytes (``num_layers * LAYER_STEP_S *
            MACHINE_BANDWIDTH[device]``: :func:`step_fixed_bytes`); 0 counts bytes only.

    Returns:
        An int in ``[min(floor, cap), cap]``.
    """
    decode_bytes = weight_bytes + kv_bytes_per_token * max(decode_kv_tokens, 0.0) + fixed_bytes
    tokens = ratio * decode_bytes * balance / (2.0 * max(params, 1))
    return int(min(max(tokens, floor), cap))


def step_fixed_bytes(num_layers: int, device_type: str) -> float:
    """A decode step's fixed time (``num_layers * LAYER_STEP_S``) as the HBM bytes device
    ``device_type`` reads in that time; 0.0 for a device without a bandwidth entry."""
    return num_layers * LAYER_STEP_S * MACHINE_BANDWIDTH.get(device_type, 0.0)
