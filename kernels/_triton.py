"""Optional Triton import shared by the kernel files.

Every op file imports ``triton``/``tl`` from here so that the torch references stay importable on
machines without Triton (macOS, CPU-only installs). Without Triton, ``triton.jit`` is a no-op
decorator and the wrappers raise if called; the dispatcher in ``radixlm.kernels`` never calls them
then.

NOTE: ``triton.jit`` decides between compiled and interpreted kernels when the decorator runs, for
triton's own ``tl.max``/``tl.sum``/... when triton is imported. To run the kernels on CPU tensors,
``TRITON_INTERPRET=1`` must be set before anything in the process imports triton.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

import torch

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is absent
    HAS_TRITON = False

    class _Stub:
        """Stand-in for ``triton`` and ``triton.language`` so kernel definitions still parse."""

        constexpr = Any

        @staticmethod
        def jit(fn: Any = None, **_: Any) -> Any:
            return fn if fn is not None else (lambda f: f)

    triton = _Stub()  # type: ignore[assignment]
    tl = _Stub()  # type: ignore[assignment]


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def interpreter_ready() -> bool:
    """True when kernels run interpreted on CPU tensors: TRITON_INTERPRET=1 was set before import."""
    if not (HAS_TRITON and interpreting()):
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.max, InterpretedFunction)


@triton.jit
def dot(a, b, IEEE: tl.constexpr):
    """``tl.dot`` with exact fp32 products for fp32 inputs (no TF32), the default otherwise."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


FP8_KV = (torch.float8_e4m3fn, torch.float8_e5m2)  # KV pool dtypes read into a wider q dtype


@triton.jit
def to_kv(x, buf_ptr):
    """``x`` cast to the KV pool's element type (``buf_ptr``'s). An fp8 e4m3 pool saturates at
    +-448 first, as torch's cast does (:func:`radixlm.kernels.store_kv.store_kv_ref`): without
    scales, a key past the range keeps its sign and the largest magnitude instead of NaN."""
    if buf_ptr.dtype.element_ty == tl.float8e4nv:
        y = tl.minimum(tl.maximum(x.to(tl.float32), -448.0), 448.0)
        return y.to(buf_ptr.dtype.element_ty)
    else:
        return x.to(buf_ptr.dtype.element_ty)


def check_triton(*tensors: torch.Tensor) -> None:
    """Raise unless Triton can run on these tensors (CUDA, or CPU under the interpreter)."""
    if not HAS_TRITON:
        raise RuntimeError("triton is not installed; use the *_ref torch functions")
    dev = tensors[0].device
    for t in tensors:
        assert t.device == dev, f"all tensors must be on one device, got {t.device} and {dev}"
    if dev.type != "cuda" and not interpreting():
        raise RuntimeError(f"Triton kernels need CUDA tensors (or TRITON_INTERPRET=1), got {dev}")


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


@lru_cache(maxsize=None)
def num_sms(device_index: int) -> int:
    """Streaming multiprocessors of a CUDA device (132 on an H100/H200)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 16  # interpreter: any small number
    return num_sms(device.index if device.index is not None else torch.cuda.current_device())
