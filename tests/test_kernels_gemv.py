"""Skinny GEMM (``kernels/gemv.py``): the Triton GEMV under TRITON_INTERPRET=1 on CPU (compiled on
CUDA when a GPU is present) against its torch reference, both inner products (broadcast, dot),
split-K, odd sizes; the ``radixlm.kernels.linear`` dispatcher's fallback to ``F.linear``; and the
kernels compiling to sm_90 (vectorized weight loads, no shared-memory round trip per K step in the
M == 1 path).
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch

if not torch.cuda.is_available():
    # NOTE: before anything imports triton (see radixlm/kernels/_triton.py).
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import radixlm.kernels as K  # noqa: E402
from radixlm.kernels.gemv import GemvConfig, default_config, skinny_linear, skinny_linear_ref, tune_configs  # noqa: E402

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}



def _inputs(m, n, k, dtype, dev, bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dev, dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dev, dtype)
    b = torch.randn(n, generator=g).to(dev, dtype) if bias else None
    return x, w, b


def _check(got, x, w, b):
    want = skinny_linear_ref(x, w, b)
    assert got.shape == want.shape and got.dtype == x.dtype
    tol = TOL[x.dtype]  # bf16: one rounding of outputs of magnitude ~1 (1/128 ulp) plus order noise
    assert torch.allclose(got.float().cpu(), want.float().cpu(), rtol=tol, atol=tol), (
        (got.float() - want.float()).abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("n,k", [(64, 128), (200, 300)])
def test_default_path(dev, dtype, m, n, k):
    """Default configs (broadcast at M == 1, dot above), bias on the odd shape only."""
    x, w, b = _inputs(m, n, k, dtype, dev, bias=n == 200)
    _check(skinny_linear(x, w, b), x, w, b)


@pytest.mark.parametrize("cfg", [
    GemvConfig(16, 64, 4, 1, split_k=1, use_dot=False),   # 3-D broadcast (M = 3), K tail
    GemvConfig(16, 64, 4, 1, split_k=3, use_dot=False),   # split-K + reduce kernel
    GemvConfig(32, 64, 4, 2, split_k=2, use_dot=True),    # dot + split-K, N tail
    GemvConfig(16, 128, 4, 1, split_k=0, use_dot=True),   # dot, automatic split
])
@pytest.mark.parametrize("m", [1, 3])
def test_configs_and_split_k(dev, cfg, m):
    for dtype in (torch.float32, torch.bfloat16):
        for bias in (False, True):
            x, w, b = _inputs(m, 200, 300, dtype, dev, bias, seed=m)
            _check(skinny_linear(x, w, b, config=cfg), x, w, b)


def test_strided_rows_and_empty(dev):
    """Row strides of ``x``/``weight`` are free (views of wider tensors); M == 0 returns ``[0, N]``."""
    x, w, b = _inputs(3, 72, 160, torch.float32, dev, bias=True)
    xs = torch.cat([x, x], dim=1)[:, :96]
    ws = torch.cat([w, w], dim=1)[:, :96]
    _check(skinny_linear(xs, ws, b), xs, ws, b)
    assert skinny_linear(x[:0], w).shape == (0, 72)


def test_config_table():
    """Every (M, N, K) resolves to a config; tune_configs is non-empty with valid dot tiles."""
    for m in (1, 2, 8, 16):
        for n, k in ((960, 576), (6144, 4096), (28672, 4096), (4096, 14336), (128256, 4096)):
            cfg = default_config(m, n, k)
            assert cfg.use_dot == (m > 1)
    assert tune_configs() and all(c.block_n >= 16 for c in tune_configs() if c.use_dot)


def test_dispatcher_falls_back_on_cpu():
    """``linear`` is ``F.linear`` on CPU (flag off or on, without the force flag), incl. bias and
    3-D inputs."""
    x, w, b = _inputs(3, 64, 128, torch.float32, "cpu", bias=True)
    prev = K.set_skinny_gemm(True)
    try:
        assert torch.equal(K.linear(x, w, b), F.linear(x, w, b))
        x3 = x.view(1, 3, 128)
        assert torch.equal(K.linear(x3, w), F.linear(x3, w))
        K.set_skinny_gemm(False)
        assert torch.equal(K.linear(x, w), F.linear(x, w))
    finally:
        K.set_skinny_gemm(prev)


def test_dispatcher_routes_to_kernel(dev, monkeypatch):
    """With the flag on and a Triton device, one-row inputs take the kernel; more rows and
    LM-head shapes (very wide N over a short K) go to F.linear."""
    if dev == "cpu":
        monkeypatch.setenv("RADIXLM_FORCE_TRITON_OPS", "1")
    calls = []
    real = K._gemv.skinny_linear
    monkeypatch.setattr(K._gemv, "skinny_linear", lambda *a: calls.append(1) or real(*a))
    prev = K.set_skinny_gemm(True)
    try:
        x, w, b = _inputs(K.SKINNY_GEMM_MAX_M + 1, 64, 128, torch.float32, dev, bias=True)
        _check(K.linear(x[:1], w, b), x[:1], w, b)
        assert len(calls) == 1
        assert torch.allclose(K.linear(x, w, b), F.linear(x, w, b))
        wide = torch.zeros(K.SKINNY_GEMM_WIDE[0] + 1, 8, device=dev)
        assert torch.equal(K.linear(x[:1, :8], wide), F.linear(x[:1, :8], wide))
        assert len(calls) == 1
    finally:
        K.set_skinny_gemm(prev)


_COMPILE = r"""
import re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from radixlm.kernels.gemv import _gemv_kernel, _splitk_reduce_kernel

DIV16 = ("N", "K", "K_PER_SPLIT", "stride_xm", "stride_wn", "stride_ym", "stride_ys", "stride_ps", "stride_pm")


def build(fn, types, consts, warps, stages):
    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in fn.arg_names
             if n not in consts and (n.endswith("_ptr") or n in DIV16)}  # as a real launch specializes
    src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()},
                    attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})


bf = {n: "*bf16" for n in ("x_ptr", "w_ptr", "b_ptr", "y_ptr")}
for dot, bm, bn, bk, st in ((False, 1, 16, 512, 1), (False, 4, 16, 128, 1), (True, 16, 32, 256, 3)):
    c = build(_gemv_kernel, bf, dict(HAS_BIAS=True, USE_DOT=dot, IEEE=False, DOT_UPCAST=False, EVEN_K=True,
                                     BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk), 4, st)
    ptx = c.asm["ptx"]
    assert ".local" not in ptx, "register spills"
    if not dot:
        assert "evict_first.L2::cache_hint.v4" in ptx, "weight loads are not 16-byte vectors"
    if bm == 1:
        body = re.split(r"\$L__BB0_\d+:", ptx)
        assert not any("ld.global.L1::evict_first" in b and "bar.sync" in b for b in body), "layout conversion per K step"
build(_gemv_kernel, {n: "*fp32" for n in bf}, dict(HAS_BIAS=False, USE_DOT=True, IEEE=True, DOT_UPCAST=False,
      EVEN_K=False, BLOCK_M=16, BLOCK_N=32, BLOCK_K=64), 4, 2)
build(_splitk_reduce_kernel, {"p_ptr": "*fp32", "b_ptr": "*bf16", "y_ptr": "*bf16"}, dict(HAS_BIAS=True, BLOCK=1024), 4, 1)
print("compiled")
"""


def test_kernels_compile_for_sm90():
    """Full Triton pipeline + ptxas for sm_90 in a subprocess (this one interprets)."""
    pytest.importorskip("triton")
    import triton

    if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")):
        pytest.skip("triton's bundled ptxas is not present")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]
