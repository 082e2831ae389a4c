"""The tokenizer manager's per-sample state: the incremental streaming event equals the JSON of
the cumulative result, and the batched histogram update equals one observe per value."""

from __future__ import annotations

import asyncio
import json

from prometheus_client import CollectorRegistry, Histogram

from radixlm.runtime.server import req_state
from radixlm.runtime.server.req_state import ReqState, observe_many


def _sse(st: ReqState, index: int | None) -> str:
    out = st.result()
    if index is not None:
        out["index"] = index
    return f"data: {json.dumps(out, ensure_ascii=False)}\n\n"  # http_native.sse


def test_sse_chunk_equals_json_of_result(monkeypatch):
    monkeypatch.setattr(req_state.time, "perf_counter", lambda: 12.5)
    pieces = ['He said "hi"', "\\n is not \n", "\t\x00\x1f ctrl", " héllo 日本 🚀", "", "\u2028 end", "✓"]
    for index, logprob, spec in ((None, False, None), (3, False, {"spec_verify_ct": 2}), (0, True, None)):
        st = ReqState('r-"1"', 0, asyncio.Queue(), logprob, 2 if logprob else 0, t0=10.0)
        st.spec_info, st.prompt_tokens, st.cached_tokens = spec, 17, 4
        for k, piece in enumerate(pieces):
            st.text += piece
            st.output_ids += list(range(k * 3, k * 3 + k % 3))
            st.completion_tokens = len(st.output_ids)
            if logprob:
                st.output_lp.append([-0.25, k, "x"])
                st.output_top.append(None)
            assert st.sse_chunk(index) == _sse(st, index)
            assert st.sse_chunk(index) == _sse(st, index)  # unchanged state: same event
        st.text = st.text[:5]  # cut back (a stop string): the cumulative text was replaced
        st.finish_reason = {"type": "abort", "status_code": 500, "message": "x"}
        assert st.sse_chunk(index) == _sse(st, index)
        st.text += '"more"'
        assert st.sse_chunk(index) == _sse(st, index)


def test_observe_many_equals_observe():
    regs = [CollectorRegistry(), CollectorRegistry()]
    hists = [Histogram("h", "doc", ["m"], buckets=(0.001, 0.01, 0.1, 1.0), registry=r).labels("x") for r in regs]
    values = [0.0005, 0.001, 0.0011, 0.05, 0.05, 0.5, 2.0, 1.0, 0.0]
    for v in values:
        hists[0].observe(v)
    observe_many(hists[1], values)
    samples = [{(m.name, m.labels.get("le")): m.value for fam in r.collect() for m in fam.samples
                if not m.name.endswith("_created")} for r in regs]
    assert samples[0].keys() == samples[1].keys()
    for key, value in samples[0].items():  # counts exact; the sum up to float rounding (added in one go)
        assert samples[1][key] == value if key[0] != "h_sum" else abs(samples[1][key] - value) < 1e-12
