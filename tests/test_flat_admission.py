"""Mixed steps and the decode CUDA graphs (runtime/scheduler_admission.py ``_flat_rows``,
``ModelRunner.flat_decode_fits``), on CPU with a stand-in for the graphs' capacity: a few short
arrivals beside running decodes stop at the graphs' rows, a long queue keeps the token budget, and
every step admits at least one waiting request. Outputs through the graphs are compared with eager
steps on the GPU (tests/test_gpu_engine.py::test_burst_beside_decodes_replays_decode_graphs)."""

from __future__ import annotations

import dataclasses
import types

import pytest

from radixlm.runtime.model_runner import FLAT_DECODE_KV_BYTES
from radixlm.runtime.request import Req
from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.testing import make_scheduler

CAPACITY = 32


@pytest.fixture()
def sched(tiny_llama):
    s = make_scheduler(tiny_llama, max_total_tokens=8192, enable_overlap_schedule=False)
    for i in range(3):  # NOTE: three requests decoding, prefilled without graphs (CPU)
        s.add_request(Req(f"run{i}", list(range(10, 25)), SamplingParams(max_new_tokens=64, temperature=0)))
    s.step()
    s.step()
    assert len(s.running) == 3
    s.runner.cuda_graph = types.SimpleNamespace(max_bs=CAPACITY, can_run=lambda n: n <= CAPACITY)
    return s  # NOTE: only _get_prefill_batch runs from here (a fake graph cannot replay)


def _arrive(s, n: int, length: int) -> None:
    for i in range(n):
        s.add_request(Req(f"new{len(s.waiting)}-{i}", list(range(30 + i, 30 + i + length)),
                          SamplingParams(max_new_tokens=8, temperature=0)))


def _limit(runner, n: int) -> None:
    runner.args = dataclasses.replace(runner.args, cuda_graph_max_extend_tokens=n)


def _prefill_lengths(batch) -> list[int]:
    return [s.length for s in batch.slices if s.length > 1]


def test_few_short_arrivals_stop_at_the_graphs(sched):
    _arrive(sched, 3, 12)  # 3 decodes + 36 tokens: past 32 rows, within 64
    batch = sched._get_prefill_batch()
    assert _prefill_lengths(batch) == [12, 12] and batch.num_decode == 3
    assert batch.num_tokens <= CAPACITY and sched.runner._flat_decode_ok(batch)
    assert len(sched.waiting) == 1


def test_long_queue_keeps_the_token_budget(sched):
    _arrive(sched, 6, 12)  # 3 + 72 rows: more than twice the graphs' rows, an eager chunk
    batch = sched._get_prefill_batch()
    assert _prefill_lengths(batch) == [12] * 6 and not sched.waiting
    assert not sched.runner._flat_decode_ok(batch)


def test_one_waiting_request_is_always_admitted(sched):
    _arrive(sched, 2, 20)  # the first alone already fills the graphs: it is admitted anyway
    batch = sched._get_prefill_batch()
    assert _prefill_lengths(batch) == [20] and len(sched.waiting) == 1


def test_cuda_graph_max_extend_tokens_zero_keeps_eager_steps(sched):
    _limit(sched.runner, 0)
    _arrive(sched, 3, 12)
    batch = sched._get_prefill_batch()
    assert _prefill_lengths(batch) == [12] * 3 and not sched.runner._flat_decode_ok(batch)


def test_flat_decode_fits_counts_kv_reads(sched):
    runner = sched.runner
    _limit(runner, 4)
    per_token = runner.kv_bytes_per_token
    assert runner.flat_decode_fits(4, [(100, 104)])  # within the token limit: any reads
    assert not runner.flat_decode_fits(CAPACITY + 1, [(0, 2)])  # past the graphs
    # rows at positions p read p + 1 tokens: [b, e) reads (e(e+1) - b(b+1)) / 2
    most = FLAT_DECODE_KV_BYTES // per_token
    e = int(((8 * most + 1) ** 0.5 - 1) / 2)  # largest e with e(e+1)/2 <= most
    spans = [(0, e)]
    fits = runner.flat_decode_fits
    runner.cuda_graph = types.SimpleNamespace(max_bs=10**9, can_run=lambda n: True)
    assert fits(e, spans) and not fits(e + 1, [(0, e + 1)])
    assert fits(e + 5, spans + [(7, 8)] * 5)  # one-token rows (decodes) are not counted
