"""RuntimeEndpoint and the interpreter against a small native-protocol server (DESIGN.md §3.2).

The fixture server is an honest implementation of the protocol's /generate semantics over a toy
byte-level bigram language model (vocabulary = 256 bytes + EOS, a fixed random logit table): greedy
and seeded sampling, stop strings, prefill-only requests, prompt logprobs from
``logprob_start_len`` (entry 0 is ``None``), a prefix cache reporting ``cached_tokens``, SSE
streaming and list inputs.  Expected values in the tests are computed from the model's table
directly, never from the code under test.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

import radixlm as sgl

EOS = 256


class ToyLM:
    """Bigram LM over bytes: log p(next | ..., prev) = LOGP[prev, next]; prev of the first token
    is EOS (acting as BOS)."""

    def __init__(self, seed: int = 0) -> None:
        logits = np.random.default_rng(seed).normal(0.0, 2.0, size=(257, 257))
        printable = [10] + list(range(32, 127)) + [EOS]
        mask = np.full(257, -30.0)
        mask[printable] = 0.0
        logits = logits + mask  # NOTE: ASCII output keeps byte offsets == character offsets.
        self.logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        self.cache: list[list[int]] = []
        self.lock = threading.Lock()
        self.log: list[dict[str, Any]] = []

    @staticmethod
    def encode(text: str) -> list[int]:
        return list(text.encode("utf-8"))

    @staticmethod
    def tok_text(t: int) -> str:
        return "" if t == EOS else bytes([t]).decode("latin-1")

    def lp(self, prev: int | None, nxt: int) -> float:
        return float(self.logp[EOS if prev is None else prev, nxt])

    def cached_len(self, ids: list[int]) -> int:
        best = 0
        for seq in self.cache:
            n = 0
            while n < min(len(seq), len(ids)) and seq[n] == ids[n]:
                n += 1
            best = max(best, n)
        return min(best, max(len(ids) - 1, 0))

    def run(self, ids: list[int], sp: dict[str, Any], req: dict[str, Any]):
        """Yield (output_ids, finish_reason or None) after each generated token (once if none)."""
        max_new = sp.get("max_new_tokens", 128)
        temp = sp.get("temperature", 1.0)
        rng = np.random.default_rng(sp.get("seed", 0))
        stops = sp.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        out: list[int] = []
        if max_new == 0:
            yield out, {"type": "length", "length": 0}
            return
        while True:
            row = self.logp[(ids + out)[-1] if ids + out else EOS].copy()
            if sp.get("ignore_eos"):
                row[EOS] = -np.inf
            if temp < 1e-6:
                tok = int(np.argmax(row))
            else:
                p = np.exp(row / temp)
                tok = int(rng.choice(257, p=p / p.sum()))
            if tok == EOS:
                yield out, {"type": "stop", "matched": EOS}
                return
            out.append(tok)
            text = bytes(out).decode("latin-1")
            hit = next((s for s in stops if s in text), None)
            if hit is not None:
                yield out, {"type": "stop", "matched": hit}
                return
            if len(out) >= max_new:
                yield out, {"type": "length", "length": max_new}
                return
            yield out, None

    def respond(self, ids: list[int], req: dict[str, Any], out: list[int],
                finish: dict[str, Any] | None, cached: int) -> dict[str, Any]:
        sp = req.get("sampling_params") or {}
        text = bytes(out).decode("latin-1")
        if finish and finish["type"] == "stop" and isinstance(finish["matched"], str):
            text = text[: text.index(finish["matched"])]
        meta: dict[str, Any] = {"id": "toy", "finish_reason": finish, "prompt_tokens": len(ids),
                                "completion_tokens": len(out), "cached_tokens": cached,
                                "e2e_latency": 0.0}
        if req.get("return_logprob"):
            start = req.get("logprob_start_len")
            if start is None or start < 0:  # default: last prompt token; none if prefill-only
                start = len(ids) if sp.get("max_new_tokens", 128) == 0 else max(len(ids) - 1, 0)
            meta["input_token_logprobs"] = [
                [None if k == start else self.lp(ids[k - 1] if k else None, ids[k]), ids[k],
                 self.tok_text(ids[k])] for k in range(start, len(ids))]
            full = ids + out
            meta["output_token_logprobs"] = [
                [self.lp(full[len(ids) + j - 1] if len(ids) + j else None, t), t, self.tok_text(t)]
                for j, t in enumerate(out)]
        return {"text": text, "output_ids": out, "meta_info": meta}

    def generate_one(self, ids: list[int], req: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            cached = self.cached_len(ids)
        out, finish = [], None
        for out, finish in self.run(ids, req.get("sampling_params") or {}, req):
            pass
        with self.lock:
            self.cache.append(ids + out)
        return self.respond(ids, req, out, finish, cached)


def _inputs(req: dict[str, Any]) -> tuple[list[list[int]], bool]:
    if "text" in req and req["text"] is not None:
        t = req["text"]
        return ([ToyLM.encode(x) for x in t], True) if isinstance(t, list) else ([ToyLM.encode(t)], False)
    ids = req["input_ids"]
    return (ids, True) if ids and isinstance(ids[0], list) else ([ids], False)


def make_handler(lm: ToyLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, code: int, obj: Any) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path in ("/get_model_info", "/model_info"):
                self._send(200, {"model_path": "toy-bigram", "tokenizer_path": "toy-bigram",
                                 "is_generation": True})
            elif self.path in ("/get_server_info", "/server_info"):
                self._send(200, {"cached_sequences": len(lm.cache), "model_path": "toy-bigram"})
            else:
                self._send(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            if self.path == "/flush_cache":
                with lm.lock:
                    lm.cache.clear()
                return self._send(200, {})
            if self.path != "/generate":
                return self._send(404, {"error": {"message": "not found"}})
            with lm.lock:
                lm.log.append({**req, "auth": self.headers.get("Authorization")})
            try:
                batch, is_list = _inputs(req)
            except (KeyError, TypeError):
                return self._send(400, {"error": {"message": "need text or input_ids"}})
            if (req.get("sampling_params") or {}).get("max_new_tokens", 0) < 0:
                return self._send(400, {"error": {"message": "max_new_tokens must be >= 0"}})
            if not req.get("stream"):
                res = [lm.generate_one(ids, req) for ids in batch]
                return self._send(200, res if is_list else res[0])
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            ids = batch[0]
            for out, finish in lm.run(ids, req.get("sampling_params") or {}, req):
                chunk = lm.respond(ids, req, list(out), finish, 0)
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True

    return Handler


@pytest.fixture(scope="module")
def server():
    lm = ToyLM()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(lm))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield lm, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture()
def backend(server):
    lm, url = server
    lm.log.clear()
    return sgl.RuntimeEndpoint(url, api_key="secret")


def greedy_continuation(lm: ToyLM, prompt: str, n: int) -> str:
    ids = ToyLM.encode(prompt)
    out = []
    for _ in range(n):
        tok = int(np.argmax(lm.logp[(ids + out)[-1] if ids + out else EOS]))
        if tok == EOS:
            break
        out.append(tok)
    return bytes(out).decode("latin-1")


def mean_choice_logprob(lm: ToyLM, prompt: str, choice: str) -> float:
    ids = ToyLM.encode(prompt + choice)
    p = len(ToyLM.encode(prompt))
    vals = [lm.lp(ids[k - 1] if k else None, ids[k]) for k in range(p, len(ids))]
    return sum(vals) / len(vals)


pytestmark = pytest.mark.timeout(60)


def _reference_greedy_selection(lm: ToyLM, prompt: str, choices: list[str]) -> int:
    rows = []
    for c in choices:
        ids = ToyLM.encode(prompt + c)
        p = len(ToyLM.encode(prompt))
        rows.append([lm.lp(ids[k - 1], ids[k]) for k in range(p, len(ids))])
    width = max(len(r) for r in rows)
    padded = [r + [sum(r) / len(r)] * (width - len(r)) for r in rows]
    alive = list(range(len(choices)))
    for col in range(width):
        top = max(padded[i][col] for i in alive)
        alive = [i for i in alive if padded[i][col] == top]
        if len(alive) == 1:
            break
    return alive[0]


def _reference_unconditional(lm: ToyLM, prompt: str, choice: str) -> float:
    ids, p = ToyLM.encode(prompt + choice), len(ToyLM.encode(prompt))
    diffs = []
    for k in range(p, len(ids)):
        cond = lm.lp(ids[k - 1], ids[k])
        uncond = 0.0 if k == p else lm.lp(ids[k - 1], ids[k])  # choice tokens alone
        diffs.append(cond - uncond)
    return sum(diffs) / len(diffs)


def test_gen_is_the_models_greedy_continuation(server, backend):
    lm, _ = server

    @sgl.function
    def prog(s, topic):
        s += "Tell me about " + topic + ": "
        s += sgl.gen("a", max_tokens=6)

    st = prog.run(topic="tries", temperature=0, backend=backend)
    assert st["a"] == greedy_continuation(lm, "Tell me about tries: ", 6)
    meta = st.get_meta_info("a")
    assert meta["prompt_tokens"] == len("Tell me about tries: ")
    assert meta["completion_tokens"] == len(st["a"])
    assert st.text() == "Tell me about tries: " + st["a"]
    assert lm.log[-1]["auth"] == "Bearer secret"
    assert lm.log[-1]["sampling_params"]["temperature"] == 0


def test_stop_string_is_trimmed(server, backend):
    lm, _ = server
    full = greedy_continuation(lm, "Q: ", 12)
    stop = full[4]

    @sgl.function
    def prog(s):
        s += "Q: " + sgl.gen("a", max_tokens=12, stop=stop, temperature=0)

    st = prog.run(backend=backend)
    assert st["a"] == full[: full.index(stop)]
    assert st.get_meta_info("a")["finish_reason"] == {"type": "stop", "matched": stop}


PROMPTS = ["The answer is", "Colour: ", "x = ", "Pick one -> ", "zzz"]
CHOICES = [["yes", "no", "maybe"], ["red", "green", "blue", "re"], ["1", "22", "333"]]


@pytest.mark.parametrize("method", ["token_length_normalized", "greedy_token_selection",
                                    "unconditional_likelihood_normalized"])
def test_select_picks_the_reference_argmax(server, backend, method):
    lm, _ = server
    choices_method = getattr(sgl, method)

    @sgl.function
    def prog(s, prompt, choices):
        s += prompt
        s += sgl.select("c", choices=choices, choices_method=choices_method)

    for prompt in PROMPTS:
        for choices in CHOICES:
            st = prog.run(prompt=prompt, choices=choices, backend=backend)
            if method == "token_length_normalized":
                scores = [mean_choice_logprob(lm, prompt, c) for c in choices]
                want = choices[int(np.argmax(scores))]
                got = st.get_meta_info("c")["normalized_prompt_logprobs"]
                assert got == pytest.approx(scores, abs=1e-9)
            elif method == "greedy_token_selection":
                want = choices[_reference_greedy_selection(lm, prompt, choices)]
            else:
                scores = [_reference_unconditional(lm, prompt, c) for c in choices]
                want = choices[int(np.argmax(scores))]
            assert st["c"] == want, (prompt, choices)
            assert st.text() == prompt + want


def test_select_request_pattern_follows_sglang(server, backend):
    lm, _ = server

    @sgl.function
    def prog(s):
        s += "Is it sunny? " + sgl.select("c", ["yes", "no"])

    prog.run(backend=backend).sync()
    first, second = lm.log[-2], lm.log[-1]
    p = len("Is it sunny? ")
    assert first["text"] == "Is it sunny? " and first["sampling_params"]["max_new_tokens"] == 0
    assert second["text"] == ["Is it sunny? yes", "Is it sunny? no"]
    assert second["sampling_params"]["max_new_tokens"] == 0
    assert second["return_logprob"] and second["return_text_in_logprobs"]
    assert second["logprob_start_len"] == p - 2


def test_fork_sends_one_request_per_branch_over_http(server, backend):
    lm, _ = server
    assert backend.fork_commits_prefix is False  # SGLang's count: fork(3) + 3 gens = 3 requests

    @sgl.function
    def prog(s):
        s += "A shared preamble. " * 4
        forks = s.fork(3)
        forks += lambda i: f"Branch {i}: " + sgl.gen("idea", max_tokens=2, temperature=0)
        forks.join()

    assert len(prog.run(backend=backend)["idea"]) == 3
    assert len(lm.log) == 3 and all(r["sampling_params"]["max_new_tokens"] == 2 for r in lm.log)


def test_fork_commits_prefix_once_and_children_hit_it(server, backend):
    lm, _ = server
    backend.fork_commits_prefix = True  # the opt-in path (the Engine backend's default)
    backend.flush_cache()
    prefix = "A long shared preamble that every branch reuses. " * 3

    @sgl.function
    def prog(s):
        s += prefix
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f"Branch {i}: " + sgl.gen("idea", max_tokens=4, temperature=0)
        forks.join()

    st = prog.run(backend=backend)
    ideas = st["idea"]
    assert isinstance(ideas, list) and len(ideas) == 3
    for i, idea in enumerate(ideas):
        assert idea == greedy_continuation(lm, prefix + f"Branch {i}: ", 4)
    commits = [r for r in lm.log if r["sampling_params"].get("max_new_tokens") == 0]
    assert [r["text"] for r in commits] == [prefix]
    assert lm.log.index(commits[0]) == 0
    # every branch's request found the committed prefix in the cache
    assert len(lm.log) == 4


def test_fork_cached_tokens_cover_shared_prefix(server, backend):
    backend.fork_commits_prefix = True
    backend.flush_cache()
    prefix = "Shared context for the forks. " * 2

    @sgl.function
    def prog(s):
        s += prefix
        forks = s.fork(2)
        forks += sgl.gen("g", max_tokens=2, temperature=0)
        return [f.get_meta_info("g")["cached_tokens"] for f in forks]

    st = prog.run(backend=backend)
    assert all(c >= len(prefix) - 1 for c in st.ret_value)


def test_run_batch_keeps_order_and_precaches(server, backend):
    lm, _ = server
    backend.flush_cache()
    preamble = "You are a terse assistant. Examples follow, one question per line below.\n"

    @sgl.function
    def prog(s, q):
        s += preamble
        s += "Q: " + q + "\nA:"
        s += sgl.gen("a", max_tokens=3)

    qs = [f"question {i}" for i in range(6)]
    states = prog.run_batch([{"q": q} for q in qs], temperature=0, backend=backend, num_threads=3)
    assert [st["a"] for st in states] == [
        greedy_continuation(lm, preamble + "Q: " + q + "\nA:", 3) for q in qs]
    # the traced constant prefix (up to the first argument) was committed before any program ran
    assert lm.log[0]["text"] == preamble + "Q: "
    assert lm.log[0]["sampling_params"]["max_new_tokens"] == 0
    assert all(st.get_meta_info("a")["cached_tokens"] >= len(preamble + "Q: ") for st in states)
    assert prog.run_batch([], backend=backend) == []
    # positional tuples are accepted too
    assert prog.run_batch([("question 0",)], temperature=0, backend=backend)[0]["a"] == states[0]["a"]


def test_streaming_yields_increments_of_the_final_text(server, backend):
    @sgl.function
    def prog(s):
        s += "Stream this: "
        s += sgl.gen("a", max_tokens=8, temperature=0, ignore_eos=True)
        s += " (end)"

    st = prog.run(stream=True, backend=backend)
    pieces = list(st.text_iter("a"))
    assert len(pieces) >= 2 and "".join(pieces) == st["a"] and len(st["a"]) == 8
    st2 = prog.run(stream=True, backend=backend)
    all_pieces = list(st2.text_iter())
    assert "".join(all_pieces) == st2.text() == "Stream this: " + st["a"] + " (end)"


def test_stream_results_can_be_read_directly(server, backend):
    lm, _ = server

    @sgl.function
    def prog(s):
        s += "Direct: "
        s += sgl.gen("a", max_tokens=4, temperature=0)
        s += sgl.gen("b", max_tokens=4, temperature=0)

    for _ in range(5):  # the body thread may not have submitted anything yet
        st = prog.run(stream=True, backend=backend)
        assert st["b"] == greedy_continuation(lm, "Direct: " + st["a"], 4)
        assert st.text() == "Direct: " + st["a"] + st["b"]


def test_async_text_iter(server, backend):
    import asyncio

    @sgl.function
    def prog(s):
        s += "Async: " + sgl.gen("a", max_tokens=5, temperature=0, ignore_eos=True)

    async def collect(st):
        return [p async for p in st.text_async_iter("a")]

    st = prog.run(stream=True, backend=backend)
    pieces = asyncio.run(collect(st))
    assert "".join(pieces) == st["a"] and len(pieces) == 5


def test_roles_messages_var_scope_and_nested_functions(server, backend):
    @sgl.function
    def ask(s, q):
        s += sgl.user(q)

    @sgl.function
    def prog(s):
        s += sgl.system("Be brief.")
        ask(s, "Hi?")
        with s.assistant():
            with s.var_scope("reply"):
                s += "Hello " + sgl.gen("name", max_tokens=3, temperature=0)
        s["note"] = "set by host"

    st = prog.run(backend=backend)
    tmpl = backend.chat_template
    assert tmpl.name == "default"
    assert st["reply"] == "Hello " + st["name"]
    assert st.messages() == [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "Hi?"},
                             {"role": "assistant", "content": st["reply"]}]
    assert st.text() == tmpl.render(st.messages())
    assert st["note"] == "set by host"


def test_constraints_reach_the_server(server, backend):
    lm, _ = server
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    @sgl.function
    def prog(s):
        s += "n=" + sgl.gen_int("n", max_tokens=3)
        s += " p=" + sgl.gen("p", max_tokens=3, json_schema=Person)
        s += " r=" + sgl.gen("r", max_tokens=3, regex="[ab]+")

    prog.run(backend=backend).sync()
    sps = [r["sampling_params"] for r in lm.log]
    assert sps[0]["regex"] == sgl.lang.constraints.REGEX_INT
    assert json.loads(sps[1]["json_schema"]) == Person.model_json_schema()
    assert sps[2]["regex"] == "[ab]+"


def test_program_exception_sets_error_without_hanging(backend):
    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("a", max_tokens=2)
        raise ValueError("boom")

    st = prog.run(backend=backend)
    assert isinstance(st.error(), ValueError)
    with pytest.raises((sgl.ProgramError, KeyError)):
        st["never_made"]


def test_failed_request_in_one_fork_wakes_everyone(server, backend):
    @sgl.function
    def prog(s):
        s += "Fork errors: "
        forks = s.fork(2)
        forks[0] += sgl.gen("x", max_tokens=3, temperature=0)
        forks[1] += sgl.gen("x", max_tokens=-1)  # server answers 400
        forks.join()
        s += sgl.gen("after", max_tokens=2)

    st = prog.run(backend=backend)
    err = st.error()
    assert isinstance(err, RuntimeError) and "max_new_tokens" in str(err)
    with pytest.raises(sgl.ProgramError):
        st["after"]


def test_backend_errors_and_info(server, backend):
    with pytest.raises(RuntimeError):
        sgl.RuntimeEndpoint("http://127.0.0.1:9")
    assert backend.get_model_name() == "toy-bigram"
    assert "cached_sequences" in sgl.get_server_info(backend)
    sgl.flush_cache(backend)
    assert sgl.get_server_info(backend)["cached_sequences"] == 0
    with pytest.raises(RuntimeError):
        backend.request({"sampling_params": {}})


def test_default_backend(server, backend):
    @sgl.function
    def prog(s):
        s += "d" + sgl.gen("a", max_tokens=2, temperature=0)

    old = sgl.get_default_backend()
    sgl.set_default_backend(backend)
    try:
        assert prog.run()["a"] == greedy_continuation(server[0], "d", 2)
    finally:
        sgl.global_config.default_backend = old


@pytest.mark.parametrize("name", ["json_extraction", "agent_tool_use", "tree_of_thought",
                                  "few_shot", "chat_multi_turn"])
def test_examples_run_against_a_server(server, monkeypatch, capsys, name):
    import importlib

    _, url = server
    module = importlib.import_module(f"radixlm.examples.{name}")
    monkeypatch.setattr("sys.argv", [name, "--url", url])
    old = sgl.get_default_backend()
    try:
        module.main()
    finally:
        sgl.global_config.default_backend = old
    out = capsys.readouterr().out
    assert "prompt tokens from the prefix cache" in out


def test_select_meta_info_keeps_sglangs_boundary_tokens(server, backend):
    lm, _ = server

    @sgl.function
    def prog(s, prompt):
        s += prompt + sgl.select("c", ["yes", "no"])

    prompt = "Is it sunny? "
    meta = prog.run(prompt=prompt, backend=backend).get_meta_info("c")
    ids = ToyLM.encode(prompt + "yes")
    p = len(prompt)
    # SGLang: entries from logprob_start_len = P - 2, the first one [None, id, text]
    want = [[None, ids[p - 2], "?"]] + [[lm.lp(ids[k - 1], ids[k]), ids[k], chr(ids[k])]
                                         for k in range(p - 1, len(ids))]
    got = meta["input_token_logprobs"][0]
    assert [e[1:] for e in got] == [e[1:] for e in want]
    assert got[0][0] is None and [e[0] for e in got[1:]] == pytest.approx([e[0] for e in want[1:]])
    assert [e[2] for e in meta["choice_token_logprobs"][0]] == ["y", "e", "s"]
    # when the prompt ends with the first scored token's text, SGLang drops that entry
    meta = prog.run(prompt="zz", backend=backend).get_meta_info("c")
    assert [e[2] for e in meta["input_token_logprobs"][1]] == ["z", "n", "o"]
    assert meta["input_token_logprobs"][1][0][0] is not None
