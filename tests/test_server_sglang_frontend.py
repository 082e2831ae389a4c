"""The real SGLang frontend (``sglang.RuntimeEndpoint``, ``pip install --no-deps sglang==0.5.10``
plus pybase64/IPython) driving a live radixlm server unchanged: gen, select, fork, streaming,
regex and roles. Skipped when sglang is not importable."""

from __future__ import annotations

import re

import pytest

sgl = pytest.importorskip("sglang", reason="sglang frontend not installed (pip install --no-deps sglang==0.5.10)")

from radixlm.runtime.server.testing import ServerProcess  # noqa: E402


@pytest.fixture(scope="module")
def backend():
    from radixlm.runtime.tiny_model import tiny_model_path

    srv = ServerProcess(["--model-path", tiny_model_path()])
    try:
        yield sgl.RuntimeEndpoint(srv.url)
    finally:
        assert srv.stop() == 0


def test_gen_select_fork_regex_roles(backend):
    @sgl.function
    def prog(s):
        s += sgl.system("You are terse.")
        s += sgl.user("Pick a color and a number.")
        s += sgl.assistant_begin()
        s += "Color: " + sgl.select("color", choices=["red", "green", "blue"])
        s += "\nNumber: " + sgl.gen("num", max_tokens=8, regex=r"[0-9]{1,3}", temperature=0)
        s += "\nWords:" + sgl.gen("words", max_tokens=6, temperature=0)
        s += sgl.assistant_end()
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f += f"Branch {i}:" + sgl.gen("b", max_tokens=4, temperature=0)
        forks.join()

    state = prog.run(backend=backend)
    assert state["color"] in ("red", "green", "blue")
    assert re.fullmatch(r"[0-9]{1,3}", state["num"]), state["num"]
    assert "Words:" + state["words"] in state.text()
    assert prog.run(backend=backend)["words"] == state["words"]  # greedy: deterministic
    assert len(state.messages()) >= 3


def test_streaming_matches_non_streaming(backend):
    @sgl.function
    def one(s):
        s += "def main():" + sgl.gen("x", max_tokens=8, temperature=0)

    full = one.run(backend=backend)["x"]
    stream = one.run(backend=backend, stream=True)
    assert "".join(stream.text_iter("x")) == full
