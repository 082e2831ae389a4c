"""``select`` in one round trip (``/generate`` with ``choices``) on the real default model.

The one-trip request must give the same decision and the same scores (within 1e-4) as SGLang's
multi-request pattern (prefill-only request, batched scoring request, and the unconditional
request), for all three choice methods, through the in-process Engine and over HTTP; over HTTP a
counting proxy counts the ``/generate`` requests reaching the server: one per select. A proxy that
drops the ``choices`` field plays a server without it (SGLang's): the frontend then falls back to
the multi-request pattern, the first request doubling as the prefill-only one. The same server also
checks the HTTP side of cache leases (``cache_lease``, ``/release_cache_lease``).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

import radixlm as sgl
from radixlm.interpreter.engine_backend import EngineBackend
from radixlm.interpreter.runtime_endpoint import RuntimeEndpoint
from radixlm.interpreter.select import score_choices, score_choices_multi_request
from radixlm.lang.choices import CHOICES_METHODS

pytestmark = pytest.mark.timeout(900)

CASES = [
    # (prompt, choices): a plain boundary, a prompt ending in a space (token healing merges it
    # with the choice's first token), a chat turn with multi-token choices, a long shared prompt.
    ("Q: What is the capital of France?\nA: The capital is", [" Paris", " London", " Berlin and more"]),
    ("Is the sky blue on a clear day? Answer: ", ["yes", "no", "maybe not"]),
    ("<|im_start|>user\nPick a primary color.<|im_end|>\n<|im_start|>assistant\nI pick ",
     ["red", "green", "deep blue"]),
    ("The following is a list of facts about the solar system. " * 6 + "The largest planet is",
     [" Jupiter", " Saturn", " Mars", " the Sun"]),
]
METHODS = sorted(CHOICES_METHODS)


class Counting(EngineBackend):
    """EngineBackend that counts native requests."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.count = 0

    def request(self, payload):
        self.count += 1
        return super().request(payload)


def assert_same(a, b, tol: float = 1e-4) -> None:
    """Same decision; same scores and token entries within ``tol``."""
    assert a.decision == b.decision
    ma, mb = a.meta_info, b.meta_info
    keys = ["normalized_prompt_logprobs", "unnormalized_prompt_logprobs"]
    keys += [k for k in ("normalized_unconditional_prompt_logprobs",) if k in mb]
    for key in keys:
        assert ma[key] == pytest.approx(mb[key], abs=tol), key
    for key in ("choice_token_logprobs", "input_token_logprobs", "unconditional_token_logprobs"):
        if key not in mb:
            assert key not in ma
            continue
        for ra, rb in zip(ma[key], mb[key], strict=True):
            assert [e[1:] for e in ra] == [e[1:] for e in rb], key  # ids and texts
            assert [e[0] for e in ra] == pytest.approx([e[0] for e in rb], abs=tol), key
    for key in ("prompt_tokens", "logprob_start_len"):
        assert ma[key] == mb[key]


@pytest.fixture(scope="module")
def engine():
    eng = sgl.Engine()
    yield eng
    eng.shutdown()


@pytest.mark.parametrize("method", METHODS)
def test_engine_one_trip_matches_multi_request(engine, method):
    m = CHOICES_METHODS[method]
    decisions = set()
    for prompt, choices in CASES:
        be = Counting(engine)
        engine.flush_cache()
        one = score_choices(be, prompt, choices, m)
        assert be.count == 1
        engine.flush_cache()
        be.count = 0
        multi = score_choices_multi_request(be, prompt, choices, m)
        assert be.count == (3 if m.requires_unconditional_logprobs else 2)
        assert_same(one, multi)
        if prompt.endswith(" "):  # token healing: the prompt's space is the choice's first token's
            assert all(row[0][2].startswith(" ") for row in one.meta_info["choice_token_logprobs"])
        decisions.add(choices.index(one.decision))
    assert len(decisions) > 1  # NOTE: the cases do not all pick the same position


def test_engine_response_shape_and_prefix_sharing(engine):
    prompt, choices = CASES[3]
    engine.flush_cache()
    out = engine.score_choices(prompt, choices, "unconditional_likelihood_normalized")
    meta = out["meta_info"]
    assert out["text"] == meta["decision"] == choices[meta["decision_index"]]
    assert meta["choices_method"] == "unconditional_likelihood_normalized"
    c = len(choices)
    for key in ("normalized_prompt_logprobs", "unnormalized_prompt_logprobs",
                "normalized_unconditional_prompt_logprobs", "choice_token_logprobs",
                "unconditional_token_logprobs", "input_token_logprobs"):
        assert len(meta[key]) == c, key
    for own, total, mean in zip(meta["choice_token_logprobs"], meta["unnormalized_prompt_logprobs"],
                                meta["normalized_prompt_logprobs"]):
        assert total == pytest.approx(sum(e[0] for e in own))
        assert mean == pytest.approx(total / len(own))
    assert all(row[0][0] is None for row in meta["input_token_logprobs"])
    # the choices share the prompt through the radix cache: all but one reuse it
    assert meta["cached_tokens"] >= (c - 1) * (meta["logprob_start_len"] - 1)
    with pytest.raises(ValueError, match="choices_method"):
        engine.score_choices(prompt, choices, "most_likely")


def test_program_select_is_one_engine_request(engine):
    be = Counting(engine)

    @sgl.function
    def prog(s):
        s += "Answer with one word. Is water wet? Answer: " + sgl.select("a", ["yes", "no"])
        s += "\nIs fire cold? Answer: " + sgl.select(
            "b", ["yes", "no"], choices_method=sgl.unconditional_likelihood_normalized)

    st = prog.run(backend=be)
    assert st["a"] in ("yes", "no") and st["b"] in ("yes", "no")
    assert be.count == 2
    assert "normalized_unconditional_prompt_logprobs" in st.get_meta_info("b")


# ---------------------------------------------------------------------------------------- HTTP

class CountingProxy:
    """HTTP proxy to ``upstream`` counting ``/generate`` requests; ``strip_choices`` drops the
    ``choices`` fields from bodies (a server that does not know them, like SGLang's)."""

    def __init__(self, upstream: str) -> None:
        self.upstream, self.count, self.strip_choices = upstream, 0, False
        self.bodies: list[tuple[str, dict]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _forward(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if method == "POST":
                    proxy.bodies.append((self.path, json.loads(body or b"{}")))
                if self.path == "/generate":
                    proxy.count += 1
                    if proxy.strip_choices:
                        obj = json.loads(body)
                        obj.pop("choices", None)
                        obj.pop("choices_method", None)
                        body = json.dumps(obj).encode()
                res = requests.request(method, proxy.upstream + self.path, data=body or None,
                                       headers={"Content-Type": "application/json"}, timeout=600)
                self.send_response(res.status_code)
                self.send_header("Content-Type", res.headers.get("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(res.content)))
                self.end_headers()
                self.wfile.write(res.content)

            def do_GET(self):
                self._forward("GET")

            def do_POST(self):
                self._forward("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def server():
    from radixlm.runtime.server.testing import ServerProcess

    srv = ServerProcess([], ready_timeout=600)
    proxy = CountingProxy(srv.url)
    try:
        yield srv, proxy
    finally:
        proxy.close()
        assert srv.stop() == 0


@pytest.mark.parametrize("method", METHODS)
def test_http_one_request_per_select_same_scores(server, method):
    srv, proxy = server
    be = RuntimeEndpoint(proxy.url)
    m = CHOICES_METHODS[method]
    prompt, choices = CASES[1]  # NOTE: the token-healing case; the Engine tests cover the others
    be.flush_cache()
    proxy.count = 0
    one = score_choices(be, prompt, choices, m)
    assert proxy.count == 1
    be.flush_cache()
    proxy.count = 0
    multi = score_choices_multi_request(be, prompt, choices, m)
    assert proxy.count == (3 if m.requires_unconditional_logprobs else 2)
    assert_same(one, multi)
    proxy.strip_choices = True  # a server without `choices`: the frontend falls back
    try:
        be.flush_cache()
        proxy.count = 0
        fallback = score_choices(be, prompt, choices, m)
        assert proxy.count == (3 if m.requires_unconditional_logprobs else 2)
    finally:
        proxy.strip_choices = False
    assert_same(fallback, multi)


def test_http_program_counts_and_features(server):
    srv, proxy = server
    info = requests.get(srv.url + "/get_model_info", timeout=30).json()
    assert "choices" in info["radixlm_features"]

    @sgl.function
    def prog(s):
        s += "Is the sea salty? Answer: " + sgl.select("a", ["yes", "no"])
        s += "\nIs sugar salty? Answer: " + sgl.select(
            "b", ["yes", "no"], choices_method=sgl.greedy_token_selection)

    proxy.count = 0
    st = prog.run(backend=RuntimeEndpoint(proxy.url))
    assert st["a"] in ("yes", "no") and st["b"] in ("yes", "no")
    assert proxy.count == 2


@pytest.mark.parametrize("body, field", [
    ({"text": ["a", "b"], "choices": ["x"]}, "choices"),
    ({"text": "a", "choices": []}, "choices"),
    ({"text": "a", "choices": ["x"], "choices_method": "most_likely"}, "choices_method"),
    ({"text": "a", "choices": ["x"], "stream": True}, "stream"),
    ({"input_ids": [1, 2], "choices": ["x"]}, "choices"),
])
def test_http_bad_choices_requests_are_400(server, body, field):
    srv, _ = server
    res = requests.post(srv.url + "/generate", json=body, timeout=60)
    assert res.status_code == 400
    assert field in res.json()["error"]["message"]


def test_http_cache_lease_and_release(server):
    srv, proxy = server
    body = {"text": "Keep this prefix.", "sampling_params": {"max_new_tokens": 2, "temperature": 0},
            "cache_lease": {"id": "prog-1", "ttl_s": 30}}
    assert requests.post(srv.url + "/generate", json=body, timeout=60).status_code == 200
    release = srv.url + "/release_cache_lease"
    assert requests.post(release, json={"ids": ["prog-1", "other"]}, timeout=60).json() == {"released": 1}
    assert requests.post(release, json={"ids": ["prog-1"]}, timeout=60).json() == {"released": 0}
    bad = requests.post(srv.url + "/generate", json={**body, "cache_lease": {"id": "x", "ttl_s": -1}}, timeout=60)
    assert bad.status_code == 400 and "cache_lease" in bad.json()["error"]["message"]

    @sgl.function
    def prog(s):
        s += "Say hi: " + sgl.gen("a", max_tokens=2, temperature=0)
        s += " Again: " + sgl.gen("b", max_tokens=2, temperature=0)

    be = RuntimeEndpoint(proxy.url)
    assert be.supports_cache_lease
    proxy.bodies.clear()
    prog.run(backend=be).sync()
    assert be._releaser.flush(60)
    gens = [b for path, b in proxy.bodies if path == "/generate"]
    ids = {b["cache_lease"]["id"] for b in gens}
    assert len(gens) == 2 and len(ids) == 1  # both calls renew the state's one lease
    releases = [b for path, b in proxy.bodies if path == "/release_cache_lease"]
    assert releases == [{"ids": list(ids)}]  # released once, at the program's end
