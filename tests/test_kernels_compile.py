"""The attention kernels (and the fused rotary + KV store) compile to sm_90 cubins without a GPU
(Triton's full pipeline and ptxas), catching errors the CPU interpreter lets through (types across
branches, loop-carried values).

Runs in a subprocess because this process has ``TRITON_INTERPRET=1`` (kernels are interpreted
functions here, which cannot be compiled)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _compile_all() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from radixlm.kernels.decode_attention import _decode_stage1, _decode_stage2
    from radixlm.kernels.shared_prefix_attention import _shared_prefix_stage
    from radixlm.kernels.extend_attention import _extend_kernel
    from radixlm.kernels.rotary_store_kv import _rotary_store_kv_kernel
    from radixlm.kernels.store_kv import _store_kv_kernel

    target = GPUTarget("cuda", 90, 32)

    def build(fn, types: dict[str, str], consts: dict) -> None:
        sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}
        src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
        assert triton.compile(src, target=target, options={"num_warps": 4, "num_stages": 3}).asm["cubin"]

    for dt, ieee in (("bf16", False), ("fp32", True)):
        common = {"req_to_token_ptr": "*i32", "req_idx_ptr": "*i64", "qk_scale": "fp32", "window": "i32"}
        ext = {**{n: f"*{dt}" for n in ("q_ptr", "k_ptr", "v_ptr", "o_ptr")}, **common,
               **{n: "*i64" for n in ("prefix_lens_ptr", "extend_lens_ptr", "extend_start_ptr")}}
        build(_extend_kernel, ext, dict(GROUP=4, HEAD_DIM=128, BLOCK_D=128, BLOCK_M=64, BLOCK_N=64, IEEE=ieee))
        d1 = {**{n: f"*{dt}" for n in ("q_ptr", "k_ptr", "v_ptr")}, **common, "seq_lens_ptr": "*i64",
              "start_ptr": "*i64", "mid_o_ptr": "*fp32", "mid_lse_ptr": "*fp32", "num_kv_splits": "i32",
              "o_ptr": f"*{dt}", "counter_ptr": "*i32", "pos_ptr": "*i64", "cache_ptr": "*fp32", "loc_ptr": "*i64",
              "kn_ptr": f"*{dt}", "vn_ptr": f"*{dt}"}
        consts = dict(GROUP=4, HEAD_DIM=128, BLOCK_H=16, BLOCK_D=128, BLOCK_N=64, IEEE=ieee, ROTARY=False,
                      HEADS_FASTEST=True)
        for shared in (False, True):
            build(_decode_stage1, d1,
                  {**consts, "ONE_SPLIT": False, "HAS_SHARED": shared, "MERGE": False, "BLOCK_S": 1})
        # one launch: the last split merges (arrival counters); ROTARY: rotary + KV store inside
        for G, D, rotary in ((4, 128, False), (3, 64, False), (3, 64, True), (8, 128, True)):
            build(_decode_stage1, d1, {**consts, "GROUP": G, "HEAD_DIM": D, "BLOCK_D": D, "ONE_SPLIT": False,
                                       "HAS_SHARED": False, "MERGE": True, "BLOCK_S": 32, "ROTARY": rotary})
        for rotary in (False, True):
            build(_decode_stage1, {**d1, "mid_o_ptr": f"*{dt}"},
                  {**consts, "ONE_SPLIT": True, "HAS_SHARED": False, "MERGE": False, "BLOCK_S": 1, "ROTARY": rotary})
        if dt == "bf16":  # an fp8 KV pool (kv_cache_dtype): widened reads, saturating stores; grid (B, KH, S)
            for pool in ("fp8e4nv", "fp8e5"):
                f8 = {"k_ptr": f"*{pool}", "v_ptr": f"*{pool}"}
                build(_decode_stage1, {**d1, **f8}, {**consts, "ONE_SPLIT": False, "HAS_SHARED": False, "MERGE": False,
                                                     "BLOCK_S": 1, "ROTARY": True, "HEADS_FASTEST": False})
                build(_extend_kernel, {**ext, **f8},
                      dict(GROUP=4, HEAD_DIM=128, BLOCK_D=128, BLOCK_M=64, BLOCK_N=64, IEEE=False))
                build(_store_kv_kernel, {"k_buf_ptr": f"*{pool}", "v_buf_ptr": f"*{pool}", "loc_ptr": "*i64",
                                         "k_ptr": "*bf16", "v_ptr": "*bf16"}, dict(NUMEL=1024, BLOCK=1024))
        d2 = {"mid_o_ptr": "*fp32", "mid_lse_ptr": "*fp32", "o_ptr": f"*{dt}", "seq_lens_ptr": "*i64",
              "start_ptr": "*i64", "num_kv_splits": "i32", "num_shared_splits": "i32", "window": "i32"}
        for shared in (False, True):
            build(_decode_stage2, d2, dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_N=64, HAS_SHARED=shared, SHARED_BLOCK_N=64))
        ds = {**{n: f"*{dt}" for n in ("q_ptr", "k_ptr", "v_ptr")}, "req_to_token_ptr": "*i32", "qk_scale": "fp32",
              **{n: "*i64" for n in ("chunk_rows_ptr", "chunk_req_ptr", "chunk_len_ptr")},
              "mid_o_ptr": "*fp32", "mid_lse_ptr": "*fp32"}
        for C, G, D in ((16, 4, 128), (5, 3, 64)):  # 64 rows (8B, chunks of 16); 15 -> 16 rows, GQA 3
            rows = max(16, triton.next_power_of_2(C * G))
            build(_shared_prefix_stage, ds,
                  dict(C=C, GROUP=G, HEAD_DIM=D, BLOCK_R=rows, BLOCK_D=D, BLOCK_N=64, IEEE=ieee))
        rs = {**{n: f"*{dt}" for n in ("q_ptr", "k_ptr", "v_ptr", "k_buf_ptr", "v_buf_ptr")},
              "pos_ptr": "*i64", "loc_ptr": "*i64", "cache_ptr": "*fp32"}
        for HQ, HK, D in ((9, 3, 64), (32, 8, 128)):
            build(_rotary_store_kv_kernel, rs, dict(HALF=D // 2, BLOCK_HQ=triton.next_power_of_2(HQ),
                                                    BLOCK_HK=triton.next_power_of_2(HK), BLOCK_HALF=D // 2))
    print("compiled")


def test_attention_kernels_compile_for_sm90():
    pytest.importorskip("triton")
    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        pytest.skip("triton's bundled ptxas is not present")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]


if __name__ == "__main__":
    _compile_all()
