"""Kernels of the runtime's hot path, each op in its own file beside its torch reference.

The functions here dispatch: Triton on CUDA tensors (when triton is installed), the torch
reference otherwise. ``RADIXLM_FORCE_TORCH_OPS=1`` forces the references everywhere;
``RADIXLM_FORCE_TRITON_OPS=1`` runs the Triton kernels on CPU tensors too when Triton's interpreter
is active (``TRITON_INTERPRET=1`` set before triton's import; tests use it to run whole models
through the kernels). Both are read at each call. The op files hold the contracts (shapes, dtypes, strides) in their docstrings:

========================  ====================================================================
op                        file
========================  ====================================================================
decode_attention          ``decode_attention.py`` (split-KV over ``req_to_token``, GQA)
extend_attention          ``extend_attention.py`` (ragged new tokens over cached prefix)
store_kv                  ``store_kv.py``
rmsnorm, fused_add_...    ``rmsnorm.py``
compute_cos_sin_cache,    ``rotary.py`` (HF neox convention, linear / llama3 scaling)
apply_rotary
rotary_store_kv           ``rotary_store_kv.py`` (apply_rotary + store_kv in one launch; its
                          ``NewTokens`` lets decode_attention do both itself)
silu_and_mul              ``activation.py``
apply_token_bitmask       ``bitmask.py`` (in place; ``indices`` picks logits rows)
dfa_token_mask            ``dfa_mask.py`` (token bitmasks of byte-DFA states, no trie)
linear                    ``gemv.py`` (skinny GEMM for decode, behind ``RADIXLM_SKINNY_GEMM``)
========================  ====================================================================
"""

from __future__ import annotations

import importlib
import os

import torch
import torch.nn.functional as F

from radixlm.kernels._triton import HAS_TRITON, interpreter_ready

# NOTE: the dispatching functions below shadow the submodules of the same name as attributes of
# this package, so submodules are fetched with import_module (which reads sys.modules), never with
# ``from radixlm.kernels import decode_attention``. Import a file's contents with
# ``from radixlm.kernels.decode_attention import decode_attention_ref``.
_act = importlib.import_module("radixlm.kernels.activation")
_bitmask = importlib.import_module("radixlm.kernels.bitmask")
_decode = importlib.import_module("radixlm.kernels.decode_attention")
_dfa_mask = importlib.import_module("radixlm.kernels.dfa_mask")
_extend = importlib.import_module("radixlm.kernels.extend_attention")
_gemv = importlib.import_module("radixlm.kernels.gemv")
_norm = importlib.import_module("radixlm.kernels.rmsnorm")
_rotary = importlib.import_module("radixlm.kernels.rotary")
_rotary_store = importlib.import_module("radixlm.kernels.rotary_store_kv")
_store = importlib.import_module("radixlm.kernels.store_kv")
from radixlm.kernels.rotary import compute_cos_sin_cache, rope_inv_freq

__all__ = [
    "use_triton",
    "decode_attention",
    "extend_attention",
    "store_kv",
    "rmsnorm",
    "fused_add_rmsnorm",
    "compute_cos_sin_cache",
    "rope_inv_freq",
    "apply_rotary",
    "rotary_store_kv",
    "silu_and_mul",
    "apply_token_bitmask",
    "dfa_token_mask",
    "linear",
    "set_skinny_gemm",
]


def use_triton(x: torch.Tensor) -> bool:
    """Whether ops on ``x`` go to the Triton kernels: CUDA tensor (or a CPU tensor with
    ``RADIXLM_FORCE_TRITON_OPS=1`` under the interpreter), triton present, not forced off."""
    if not HAS_TRITON or os.environ.get("RADIXLM_FORCE_TORCH_OPS", "0") == "1":
        return False
    if x.is_cuda:
        return True
    return os.environ.get("RADIXLM_FORCE_TRITON_OPS", "0") == "1" and interpreter_ready()


def decode_attention(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, sm_scale,
                     num_kv_splits=None, out=None):
    fn = _decode.decode_attention if use_triton(q) else _decode.decode_attention_ref
    return fn(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, sm_scale,
              num_kv_splits=num_kv_splits, out=out)


def extend_attention(q, k_buffer, v_buffer, req_to_token, req_pool_indices, prefix_lens, extend_lens,
                     extend_start_loc, sm_scale, max_extend_len=None, out=None):
    fn = _extend.extend_attention if use_triton(q) else _extend.extend_attention_ref
    return fn(q, k_buffer, v_buffer, req_to_token, req_pool_indices, prefix_lens, extend_lens,
              extend_start_loc, sm_scale, max_extend_len=max_extend_len, out=out)


def store_kv(k_buffer, v_buffer, loc, k, v) -> None:
    fn = _store.store_kv if use_triton(k_buffer) else _store.store_kv_ref
    fn(k_buffer, v_buffer, loc, k, v)


def rmsnorm(x, weight, eps):
    return (_norm.rmsnorm if use_triton(x) else _norm.rmsnorm_ref)(x, weight, eps)


def fused_add_rmsnorm(x, residual, weight, eps):
    return (_norm.fused_add_rmsnorm if use_triton(x) else _norm.fused_add_rmsnorm_ref)(x, residual, weight, eps)


def apply_rotary(q, k, positions, cos_sin_cache):
    return (_rotary.apply_rotary if use_triton(q) else _rotary.apply_rotary_ref)(q, k, positions, cos_sin_cache)


def rotary_store_kv(q, k, v, positions, cos_sin_cache, k_buffer, v_buffer, loc):
    fn = _rotary_store.rotary_store_kv if use_triton(q) else _rotary_store.rotary_store_kv_ref
    return fn(q, k, v, positions, cos_sin_cache, k_buffer, v_buffer, loc)


def silu_and_mul(x):
    return (_act.silu_and_mul if use_triton(x) else _act.silu_and_mul_ref)(x)


def apply_token_bitmask(logits, bitmask, indices=None) -> None:
    fn = _bitmask.apply_token_bitmask_triton if use_triton(logits) else _bitmask.apply_token_bitmask_ref
    fn(logits, bitmask, indices)


def dfa_token_mask(trans, states, tokens, words):
    """int32 ``[k, words]`` token masks of byte-DFA ``states`` (see ``dfa_mask.py``)."""
    fn = _dfa_mask.dfa_token_mask_triton if use_triton(trans) else _dfa_mask.dfa_token_mask_ref
    return fn(trans, states, tokens, words)


SKINNY_GEMM_MAX_M = 1  # NOTE: bench_gemv.py on an H200: the Triton GEMV wins at M == 1 only
SKINNY_GEMM_WIDE = (32768, 2048)  # ... and loses on LM-head shapes (N above, K at most): cuBLAS there
# Read once at import (the dispatch sits on the decode hot path); tests flip it with set_skinny_gemm.
# Opt-in (H200, bs-1 ITL, same call: Llama-3.1-8B dims 4.81-4.84 -> 4.47 ms). Off by default: its
# one-row results round differently from cuBLAS at M > 1, so a request's greedy output would depend
# on its batch size and on speculation being on (verify rows run M > 1). CPU never uses it.
SKINNY_GEMM_DEFAULT = os.environ.get("RADIXLM_SKINNY_GEMM", "0") == "1"
_SKINNY_GEMM = SKINNY_GEMM_DEFAULT


def set_skinny_gemm(enabled: bool) -> bool:
    """Turn the skinny-GEMM path of :func:`linear` on or off; returns the previous setting."""
    global _SKINNY_GEMM
    prev, _SKINNY_GEMM = _SKINNY_GEMM, bool(enabled)
    return prev


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Drop-in for ``F.linear(x, weight, bias)``: ``x`` ``[M, K]``, ``weight`` ``[N, K]``.

    With ``RADIXLM_SKINNY_GEMM=1`` (read once at import; default off) a 2-D ``x`` of at most
    ``SKINNY_GEMM_MAX_M`` rows on a Triton device (see :func:`use_triton`), with ``weight`` (and
    ``bias``) of ``x``'s dtype and contiguous last dims, and not an LM-head shape
    (``SKINNY_GEMM_WIDE``), goes to the Triton GEMV ``gemv.skinny_linear`` (fp32 accumulation,
    CUDA-graph capturable); everything else to ``F.linear``.
    """
    if (_SKINNY_GEMM and x.dim() == 2 and x.shape[0] <= SKINNY_GEMM_MAX_M and weight.dtype == x.dtype
            and not (weight.shape[0] > SKINNY_GEMM_WIDE[0] and weight.shape[1] <= SKINNY_GEMM_WIDE[1])
            and x.stride(1) == 1 and weight.stride(1) == 1
            and (bias is None or (bias.dtype == x.dtype and bias.stride(0) == 1)) and use_triton(x)):
        return _gemv.skinny_linear(x, weight, bias)
    return F.linear(x, weight, bias)


for _f, _src in [
    (decode_attention, _decode.decode_attention),
    (extend_attention, _extend.extend_attention),
    (store_kv, _store.store_kv),
    (rmsnorm, _norm.rmsnorm),
    (fused_add_rmsnorm, _norm.fused_add_rmsnorm),
    (apply_rotary, _rotary.apply_rotary),
    (rotary_store_kv, _rotary_store.rotary_store_kv),
    (silu_and_mul, _act.silu_and_mul),
    (apply_token_bitmask, _bitmask.apply_token_bitmask_triton),
]:
    _f.__doc__ = f"Dispatching entry point (Triton on CUDA, torch reference elsewhere).\n\n{_src.__doc__}"
