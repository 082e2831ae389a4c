"""The SGLang-native HTTP API (DESIGN.md §3.2) of a live server subprocess on the tiny default
model. Expected values come from the model itself (HF transformers on the same weights) or from
invariants (batch == single, stream == non-stream, cache reuse), never from the code under test."""

from __future__ import annotations

import json
import os
import time

import pytest
import requests
import torch

from radixlm.runtime.server.testing import ServerProcess

MAX_QUEUED = 8
GREEDY = {"temperature": 0, "max_new_tokens": 8}


@pytest.fixture(scope="module")
def server():
    from radixlm.runtime.tiny_model import tiny_model_path

    srv = ServerProcess(["--model-path", tiny_model_path(), "--max-queued-requests", str(MAX_QUEUED)])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def hf(server):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = requests.get(server.url + "/get_model_info").json()["model_path"]
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def gen(server, **body):
    res = requests.post(server.url + "/generate", json=body, timeout=60)
    assert res.status_code == 200, res.text
    return res.json()


def info(server):
    return requests.get(server.url + "/get_server_info", timeout=30).json()


def test_generate_greedy_matches_hf(server, hf):
    model, tok = hf
    out = gen(server, text="def parse(self, data):", sampling_params={**GREEDY, "ignore_eos": True})
    ids = tok.encode("def parse(self, data):")
    ref = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids):].tolist()
    assert out["output_ids"] == ref
    assert out["text"] == tok.decode(ref)
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 8}
    assert meta["prompt_tokens"] == len(ids) and meta["completion_tokens"] == 8


def test_batch_and_n_match_single(server):
    prompts = ["import os\n", "class Foo:", "    return"]
    single = [gen(server, text=p, sampling_params=GREEDY)["text"] for p in prompts]
    batch = gen(server, text=prompts, sampling_params=GREEDY)
    assert [b["text"] for b in batch] == single
    ids_batch = gen(server, input_ids=[b["output_ids"] for b in batch], sampling_params=GREEDY)
    assert [x["output_ids"] for x in ids_batch] == [
        gen(server, input_ids=b["output_ids"], sampling_params=GREEDY)["output_ids"] for b in batch]
    n = gen(server, text=prompts[0], sampling_params={**GREEDY, "n": 3})
    assert [x["text"] for x in n] == [single[0]] * 3


def test_stream_sse_cumulative(server):
    body = {"text": "for i in range(", "sampling_params": GREEDY, "stream": True}
    res = requests.post(server.url + "/generate", json=body, stream=True, timeout=60)
    assert res.headers["content-type"].startswith("text/event-stream")
    lines = [line for line in res.iter_lines() if line]
    assert lines[-1] == b"data: [DONE]"
    chunks = [json.loads(line[5:]) for line in lines[:-1]]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert texts[-1] == gen(server, text="for i in range(", sampling_params=GREEDY)["text"]


def test_logprob_positions_match_hf(server, hf):
    model, tok = hf
    prompt = "while True:\n    x = y"
    ids = tok.encode(prompt)
    start = 2
    out = gen(server, text=prompt, sampling_params={**GREEDY, "max_new_tokens": 3}, return_logprob=True,
              logprob_start_len=start, top_logprobs_num=2, return_text_in_logprobs=True)
    meta = out["meta_info"]
    inp = meta["input_token_logprobs"]
    assert [e[1] for e in inp] == ids[start:]
    assert inp[0][0] is None and inp[0][2] == tok.decode([ids[start]])
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids + out["output_ids"]])).logits[0].float(), -1)
    for k in range(1, len(inp)):
        pos = start + k
        assert inp[k][0] == pytest.approx(logp[pos - 1, ids[pos]].item(), abs=1e-3)
    outs = meta["output_token_logprobs"]
    assert [e[1] for e in outs] == out["output_ids"]
    for j, e in enumerate(outs):
        assert e[0] == pytest.approx(logp[len(ids) - 1 + j, e[1]].item(), abs=1e-3)
    assert len(meta["output_top_logprobs"]) == 3 and len(meta["output_top_logprobs"][0]) == 2
    default = gen(server, text=prompt, sampling_params=GREEDY, return_logprob=True)["meta_info"]
    assert [e[1] for e in default["input_token_logprobs"]] == ids[-1:]


def test_prefill_only_then_cached(server):
    prompt = "def prefill_only_example(argument_one, argument_two):"
    out = gen(server, text=prompt, sampling_params={"max_new_tokens": 0})
    assert out["text"] == "" and out["output_ids"] == []
    assert out["meta_info"]["completion_tokens"] == 0
    assert "input_token_logprobs" not in out["meta_info"]
    n = out["meta_info"]["prompt_tokens"]
    again = gen(server, text=prompt, sampling_params=GREEDY)
    assert again["meta_info"]["cached_tokens"] == n - 1
    lp = gen(server, text=prompt, sampling_params={"max_new_tokens": 0}, return_logprob=True)
    assert lp["meta_info"]["input_token_logprobs"] == []


def test_stop_string_trimmed(server):
    base = gen(server, text="x = [", sampling_params={**GREEDY, "max_new_tokens": 12, "ignore_eos": True})
    text = base["text"]
    stop = text[len(text) // 2: len(text) // 2 + 2]
    assert stop
    out = gen(server, text="x = [", sampling_params={**GREEDY, "max_new_tokens": 12, "stop": [stop]})
    assert out["text"] == text[: text.index(stop)]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_abort_request_stops_running(server):
    body = {"text": "abort me", "rid": "abort-me", "stream": True,
            "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    res = requests.post(server.url + "/generate", json=body, stream=True, timeout=60)
    lines = res.iter_lines()
    next(line for line in lines if line)  # running
    assert requests.post(server.url + "/abort_request", json={"rid": "abort-me"}).status_code == 200
    last = None
    for line in lines:
        if line and line != b"data: [DONE]":
            last = json.loads(line[5:])
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert last["meta_info"]["completion_tokens"] < 3000


def test_client_disconnect_frees_kv(server):
    body = {"text": "disconnect", "stream": True, "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    res = requests.post(server.url + "/generate", json=body, stream=True, timeout=60)
    lines = res.iter_lines()  # NOTE: keep a reference; closing this generator closes the connection
    next(line for line in lines if line)
    assert info(server)["num_running"] == 1
    res.close()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        st = info(server)
        if st["num_running"] == 0 and st["kv_used_tokens"] == 0:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"request still holds KV after disconnect: {st}")
    assert st["generated_tokens"] < 3000 * 2


def _wait_idle(server, seconds: float = 15) -> dict:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        st = info(server)
        if st["num_running"] == 0 and st["kv_used_tokens"] == 0:
            return st
        time.sleep(0.2)
    pytest.fail(f"request still holds KV after disconnect: {st}")


def test_non_streaming_client_disconnect_aborts(server):
    """A non-streaming request has no stream write to fail: the server's disconnect watcher must
    notice the closed connection and abort the request."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(server.url)
    before = info(server)["generated_tokens"]
    body = json.dumps({"text": "disconnect quietly", "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}})
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall((f"POST /generate HTTP/1.1\r\nHost: {url.hostname}\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
        deadline = time.monotonic() + 30
        while info(server)["num_running"] == 0:
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.05)
    st = _wait_idle(server)
    assert st["generated_tokens"] - before < 3000  # NOTE: aborted, not run to its end


def test_flush_cache(server):
    prompt = "flush the cache please, flush it now"
    gen(server, text=prompt, sampling_params=GREEDY)
    assert gen(server, text=prompt, sampling_params=GREEDY)["meta_info"]["cached_tokens"] > 0
    assert requests.post(server.url + "/flush_cache").status_code == 200
    assert requests.get(server.url + "/flush_cache").status_code == 200
    assert gen(server, text=prompt, sampling_params=GREEDY)["meta_info"]["cached_tokens"] == 0


def test_tokenize_detokenize_and_info(server, hf):
    _, tok = hf
    t = requests.post(server.url + "/tokenize", json={"prompt": "hello world"}).json()
    assert t["tokens"] == tok.encode("hello world") and t["count"] == len(t["tokens"])
    assert requests.post(server.url + "/detokenize", json={"tokens": t["tokens"]}).json()["text"] == "hello world"
    assert requests.get(server.url + "/health").status_code == 200
    assert requests.get(server.url + "/health_generate").status_code == 200
    mi = requests.get(server.url + "/model_info").json()
    assert mi["is_generation"] is True and mi["model_path"]
    si = requests.get(server.url + "/server_info").json()
    assert si["max_total_num_tokens"] > 0 and 0 <= si["cache_hit_rate"] <= 1
    assert requests.post(server.url + "/concate_and_append_request", json={}).status_code == 404  # removed
    metrics = requests.get(server.url + "/metrics").text
    for name in ("radixlm_num_running_reqs", "radixlm_token_usage", "radixlm_cache_hit_rate",
                 "radixlm_prompt_tokens_total", "radixlm_time_to_first_token_seconds_bucket",
                 "radixlm_inter_token_latency_seconds_bucket", "radixlm_e2e_request_latency_seconds_bucket"):
        assert name in metrics


BAD = [
    ("not json", "malformed JSON"),
    ({"sampling_params": GREEDY}, "text"),
    ({"text": "x", "input_ids": [1]}, "text"),
    ({"text": 5}, "text"),
    ({"text": "x", "sampling_params": {"max_new_tokens": "many"}}, "max_new_tokens"),
    ({"text": "x", "sampling_params": {"temperature": -1}}, "temperature"),
    ({"text": "x", "sampling_params": {"top_p": 1.5}}, "top_p"),
    ({"text": "x", "sampling_params": {"top_k": 0}}, "top_k"),
    ({"input_ids": []}, "empty"),
    ({"input_ids": [10**9]}, "input_ids"),
    ({"input_ids": [5, -1]}, "input_ids"),
    ({"text": "word " * 5000}, "context length"),
    ({"text": "x", "return_logprob": True, "logprob_start_len": 999}, "logprob_start_len"),
    ({"text": ["a", "b"], "sampling_params": [GREEDY]}, "sampling_params"),
    ({"text": ["x"] * (MAX_QUEUED + 1)}, "max_queued_requests"),
    ({"text": "x", "image_data": "http://x/a.png"}, "image_data"),
    ({"text": ["x", "y"], "image_data": [None, "data:image/png;base64,AAAA"]}, "image_data"),
    ({"text": "x", "lora_path": "my-adapter"}, "lora_path"),
    ({"text": "x", "sampling_params": {"logit_bias": {"10": 500}}}, "logit_bias"),
]


@pytest.mark.parametrize("body,needle", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_requests_get_4xx_then_serving_continues(server, body, needle):
    data = body if isinstance(body, str) else json.dumps(body)
    res = requests.post(server.url + "/generate", data=data, timeout=30)
    assert res.status_code == (503 if needle == "max_queued_requests" else 400), res.text
    assert needle in res.json()["error"]["message"]
    assert gen(server, text="ok", sampling_params={"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2


def test_unset_multimodal_fields_are_accepted(server):
    """Batching clients send ``image_data: [None, ...]`` for text prompts: that is not an image."""
    res = requests.post(server.url + "/generate", json={"text": ["a", "b"], "image_data": [None, None],
                                                        "lora_path": None, "sampling_params": {"max_new_tokens": 2}})
    assert res.status_code == 200 and len(res.json()) == 2


def test_radixlm_runtime_endpoint_programs(server):
    import radixlm as sgl

    @sgl.function
    def prog(s, q):
        s += sgl.system("You answer.")
        s += sgl.user(q)
        s += sgl.assistant(sgl.gen("a", max_tokens=6, temperature=0))
        s += "Pick: " + sgl.select("c", choices=["red", "green", "blue"])
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f += f"Branch {i}: " + sgl.gen("b", max_tokens=4, temperature=0)
        forks.join()

    backend = sgl.RuntimeEndpoint(server.url)
    state = prog.run(q="Why?", backend=backend)
    assert state.error() is None
    assert state["c"] in ("red", "green", "blue")
    assert state["a"] in state.text() and state["a"] == prog.run(q="Why?", backend=backend)["a"]

    @sgl.function
    def single(s):
        s += "def main():" + sgl.gen("x", max_tokens=6, temperature=0)

    stream = single.run(backend=backend, stream=True)
    pieces = list(stream.text_iter("x"))
    assert "".join(pieces) == single.run(backend=backend)["x"]


def test_sigterm_shuts_down_without_orphans(server):
    """Last in this module: stops the shared server."""
    from radixlm.runtime.server.testing import child_pids

    kids = child_pids(server.proc.pid)
    assert len(kids) >= 2  # scheduler + detokenizer
    assert server.stop() == 0
    time.sleep(0.5)
    alive = [pid for pid in kids if os.path.exists(f"/proc/{pid}") and _state(pid) != "Z"]
    assert alive == [], f"orphans left: {alive}"


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"
