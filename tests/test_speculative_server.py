"""Speculative decoding through the HTTP server (tiny default test model): ``--speculative-algorithm
NGRAM`` on the CLI, greedy outputs equal to the plain in-process engine's, the speculation figures
in ``meta_info``, ``/get_server_info`` and ``/metrics``."""

from __future__ import annotations

import pytest
import requests

from radixlm.runtime.server.testing import ServerProcess

PROMPTS = [[5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6], [40, 41, 42, 40, 41, 42, 40], [100, 200, 300, 400]]
PARAMS = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}


@pytest.fixture(scope="module")
def server():
    from radixlm.runtime.tiny_model import tiny_model_path

    srv = ServerProcess(["--model-path", tiny_model_path(), "--speculative-algorithm", "NGRAM",
                         "--speculative-num-draft-tokens", "3"])
    yield srv
    srv.stop()


def test_server_speculation_keeps_outputs_and_reports(server):
    from radixlm import Engine
    from radixlm.runtime.tiny_model import tiny_model_path

    with Engine(tiny_model_path(), device="cpu") as e:
        want = [o["output_ids"] for o in e.generate(input_ids=PROMPTS, sampling_params=PARAMS)]
    res = requests.post(server.url + "/generate", json={"input_ids": PROMPTS, "sampling_params": PARAMS}, timeout=120)
    assert res.status_code == 200, res.text
    got = res.json()
    assert [g["output_ids"] for g in got] == want
    metas = [g["meta_info"] for g in got]
    assert any(m.get("spec_accepted_tokens", 0) > 0 for m in metas)  # repeated patterns: drafts hit
    for m in metas:
        if "spec_verify_ct" in m:
            assert 0 <= m["spec_accept_rate"] <= 1 and m["spec_draft_tokens"] >= m["spec_accepted_tokens"]
    info = requests.get(server.url + "/get_server_info", timeout=30).json()
    assert info["speculative_algorithm"] == "ngram" and info["spec_accepted_tokens"] > 0
    metrics = requests.get(server.url + "/metrics", timeout=30).text
    line = next(x for x in metrics.splitlines() if x.startswith("radixlm_spec_accepted_tokens_total"))
    assert float(line.split()[-1]) == info["spec_accepted_tokens"]
