"""The opt-in event timeline (RADIXLM_TRACE_DIR) against a real server: every process writes its
events at shutdown, they line up with the client's chunk times (same clock), and
benchmarks/itl_tail.py assigns the client's gaps from them."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time

import requests

from radixlm.runtime.server.testing import ServerProcess
from radixlm.runtime.tiny_model import tiny_model_path

BENCH = os.path.join(os.path.dirname(__file__), "..", "benchmarks")


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # NOTE: dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_trace_files_and_tail_analysis(tmp_path):
    trace_dir, chunks = tmp_path / "trace", tmp_path / "chunks.jsonl"
    env = {**os.environ, "RADIXLM_TRACE_DIR": str(trace_dir)}
    srv = ServerProcess(["--model-path", tiny_model_path()], env=env)
    try:
        summary = _module("bench_serving").main(
            ["--base-url", srv.url, "--num-prompts", "4", "--random-input-len", "16", "--random-output-len", "12",
             "--random-range-ratio", "1", "--chunk-log", str(chunks)])
        # NOTE: a multi-process load generator (spawned children import bench_serving by name)
        sys.path.insert(0, BENCH)
        t_before = time.perf_counter()
        multi = _module("bench_serving").main(
            ["--base-url", srv.url, "--num-prompts", "6", "--random-input-len", "8", "--random-output-len", "6",
             "--random-range-ratio", "1", "--client-processes", "2", "--chunk-log", str(tmp_path / "multi.jsonl")])
        t_after = time.perf_counter()
        sys.path.remove(BENCH)
        constrained = requests.post(srv.url + "/generate", timeout=120, json={
            "text": "Digits:", "sampling_params": {"regex": "[0-9]{6}", "max_new_tokens": 12}}).json()
    finally:
        assert srv.stop() == 0
    assert summary["completed"] == 4
    files = {f.split("-")[0]: f for f in os.listdir(trace_dir)}
    assert set(files) == {"scheduler", "detokenizer", "http"}
    events = {name: [json.loads(line) for line in open(trace_dir / f)] for name, f in files.items()}
    turns = [e for e in events["scheduler"] if e["ev"] == "turn"]
    batches = [e for e in events["http"] if e["ev"] == "batch"]
    assert turns and batches and any(e["ev"] == "detok" for e in events["detokenizer"])
    assert sum(e["n"] for e in turns) >= 4 * 12  # one output per request and token at least
    rows = [json.loads(line) for line in open(chunks)]
    assert len(rows) == 4 and all(r["ok"] and len(r["t"]) >= 2 for r in rows)
    # NOTE: one clock: every chunk reached the client after the HTTP process applied some step
    first_batch = min(e["t"] for e in batches)
    assert all(first_batch <= r["t"][0] for r in rows)
    assert multi["completed"] == 6 and multi["failed"] == 0
    multi_rows = [json.loads(line) for line in open(tmp_path / "multi.jsonl")]
    # NOTE: both processes' chunk times are on the parent's clock, inside the call, in order
    assert len(multi_rows) == 6 and all(t_before < r["t"][0] <= r["t"][-1] < t_after for r in multi_rows)
    # NOTE: the turn events carry the grammar mask time; the constrained request's steps add to it
    assert turns[0]["mask_s"] == 0.0 and turns[-1]["mask_s"] > 0.0 and len(constrained["text"]) == 6
    table = _module("turn_stats").summarize(turns, idle=0.5, slow_mask_ms=2.0)
    assert len(table) >= 3 and table[2].startswith("| 0 | ")
    result = _module("itl_tail").main(["--chunks", str(chunks), "--trace-dir", str(trace_dir), "--factor", "1"])
    kinds = sum(v for k, v in result.items() if k in ("scheduler", "http", "detokenizer", "client"))
    assert kinds == result["tail"] > 0  # every gap over the median got a stage
