"""Split-KV decode attention merged in its own launch (``one_launch``, ``kernels/decode_merge.py``)
against the torch reference and the two-launch path: GQA 1/3/8, D 64 and 128, ragged lengths with
seq_len 0, windows, more splits than tiles, repeated calls on one counter buffer (left all zero
after each call, as a CUDA-graph replay needs), and the shared-prefix path unchanged by it.
Triton runs under TRITON_INTERPRET=1 on CPU (compiled on CUDA when a GPU is present).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # NOTE: before anything imports triton (see radixlm/kernels/_triton.py).
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from radixlm.kernels.decode_attention import decode_attention, decode_attention_ref  # noqa: E402
from radixlm.kernels.decode_merge import split_counters  # noqa: E402
from radixlm.kernels.shared_prefix_attention import pack_shared_prefix  # noqa: E402


def make_batch(dev, lens, KH, G, D, dtype=torch.float32, seed=0):
    """(q, k_buffer, v_buffer, req_to_token, rows, seq_lens) with scattered page-size-1 slots."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(lens)
    k = torch.randn(total + 4, KH, D, generator=gen).to(dtype)
    v = torch.randn(total + 4, KH, D, generator=gen).to(dtype)
    r2t = torch.zeros(len(lens) + 3, max(lens) + 4, dtype=torch.int32)
    slots = torch.randperm(total + 3, generator=gen)[:total] + 1
    rows = torch.randperm(len(lens) + 3, generator=gen)[: len(lens)]
    off = 0
    for row, n in zip(rows.tolist(), lens):
        r2t[row, :n] = slots[off : off + n].int()
        off += n
    q = torch.randn(len(lens), KH * G, D, generator=gen).to(dtype)
    return [t.to(dev) for t in (q, k, v, r2t, rows, torch.tensor(lens))]


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


@pytest.mark.parametrize("lens,KH,G,D,splits,window", [
    ([1, 37, 70, 5], 2, 1, 64, None, 0),
    ([0, 3, 21, 90], 3, 3, 64, 8, 0),  # SmolLM2-135M heads; seq_len 0; more splits than tiles
    ([50, 17], 2, 8, 128, 32, 0),  # the bs-1 default split count
    ([80, 9, 33], 1, 4, 128, 4, 20),  # sliding window
])
def test_one_launch_matches_reference_and_two_launch(dev, lens, KH, G, D, splits, window):
    args = make_batch(dev, lens, KH, G, D, seed=sum(lens) + G)
    counters = torch.zeros(64, dtype=torch.int32, device=dev)
    want = decode_attention_ref(*args, D**-0.5, window=window)
    two = decode_attention(*args, D**-0.5, num_kv_splits=splits, block_n=16, window=window, one_launch=False)
    for _ in range(3):  # repeated calls on one counter buffer, as layers and graph replays do
        got = decode_attention(*args, D**-0.5, num_kv_splits=splits, block_n=16, window=window, counters=counters,
                               one_launch=True)
        assert rel_err(got, want) < 2e-5 and rel_err(got, two) < 2e-5, (rel_err(got, want), rel_err(got, two))
        assert torch.count_nonzero(counters) == 0
        zero = torch.tensor(lens) == 0
        assert torch.equal(got[zero.to(dev)], torch.zeros_like(got[zero.to(dev)]))


def test_one_launch_device_counters_left_zero(dev):
    args = make_batch(dev, [12, 40], 2, 4, 64, seed=3)
    out = torch.full_like(args[0], float("nan"))  # a static output buffer, fully overwritten
    for _ in range(2):
        decode_attention(*args, 0.125, num_kv_splits=16, block_n=16, out=out, one_launch=True)
        assert torch.count_nonzero(split_counters(args[0].device, 4)) == 0
    assert rel_err(out, decode_attention_ref(*args, 0.125)) < 2e-5


def test_one_launch_fp16(dev):
    args = make_batch(dev, [33, 7, 64], 2, 4, 64, dtype=torch.float16, seed=5)
    got = decode_attention(*args, 0.125, num_kv_splits=4, block_n=16, one_launch=True)
    assert got.dtype == torch.float16 and rel_err(got, decode_attention_ref(*args, 0.125)) < 2e-3


def test_shared_prefix_path_unaffected_by_one_launch(dev):
    """``shared=`` keeps the two-stage merge: identical results whatever ``one_launch`` says."""
    gen = torch.Generator().manual_seed(11)
    KH, G, D, P = 2, 2, 64, 40
    lens = [P + 3, P + 9, 17]
    k = torch.randn(120, KH, D, generator=gen)
    v = torch.randn(120, KH, D, generator=gen)
    r2t = torch.zeros(4, 64, dtype=torch.int32)
    prefix = torch.arange(1, P + 1, dtype=torch.int32)
    r2t[0, :P], r2t[1, :P] = prefix, prefix
    r2t[0, P : P + 3] = torch.arange(60, 63, dtype=torch.int32)
    r2t[1, P : P + 9] = torch.arange(70, 79, dtype=torch.int32)
    r2t[2, :17] = torch.arange(90, 107, dtype=torch.int32)
    q = torch.randn(3, KH * G, D, generator=gen)
    rows = torch.tensor([0, 1, 2])
    args = [t.to(dev) for t in (q, k, v, r2t, rows, torch.tensor(lens))]
    shared = pack_shared_prefix([([0, 1], P, 0)], 3, 2, 2, device=dev)
    a = decode_attention(*args, 0.125, num_kv_splits=4, block_n=16, shared=shared, num_shared_splits=2)
    b = decode_attention(*args, 0.125, num_kv_splits=4, block_n=16, shared=shared, num_shared_splits=2,
                         one_launch=False)
    assert torch.equal(a, b)
    assert rel_err(a, decode_attention_ref(*args, 0.125)) < 2e-5
