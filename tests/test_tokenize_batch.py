"""Tokenization at arrival (issue 16): off the event loop, and the texts of requests arriving
together go to the tokenizer in one call; a bad text fails only its own request."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

from radixlm.runtime.server.tokenize_batch import TokenizeBatcher
from radixlm.runtime.tokenizer import encode_batch


class FakeTokenizer:
    """Token ids are character codes; records each call's texts and thread; refuses "BAD"."""

    def __init__(self):
        self.calls = []

    def _ids(self, text):
        if text == "BAD":
            raise ValueError("refused")
        return [ord(c) for c in text]

    def encode(self, text, add_special_tokens=True):
        self.calls.append(([text], threading.current_thread(), add_special_tokens))
        return [1] * add_special_tokens + self._ids(text)

    def __call__(self, texts, add_special_tokens=True):
        self.calls.append((list(texts), threading.current_thread(), add_special_tokens))
        return {"input_ids": [[1] * add_special_tokens + self._ids(t) for t in texts]}


def _batcher(tok):
    pool = concurrent.futures.ThreadPoolExecutor(1)

    async def run_off_loop(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    return TokenizeBatcher(tok, run_off_loop)


def test_arrivals_together_are_one_call_off_the_loop():
    tok = FakeTokenizer()

    async def main():
        b = _batcher(tok)
        reqs = [["a"], ["bb", "ccc"], ["d"]] + [[f"x{i}"] for i in range(7)]
        outs = await asyncio.gather(*(b.encode(r) for r in reqs))
        return reqs, outs

    reqs, outs = asyncio.run(main())
    assert outs == [[[1] + [ord(c) for c in t] for t in r] for r in reqs]
    assert len(tok.calls) == 1 and len(tok.calls[0][0]) == 11
    assert tok.calls[0][1] is not threading.main_thread()


def test_a_bad_text_fails_only_its_request():
    tok = FakeTokenizer()

    async def main():
        b = _batcher(tok)
        return await asyncio.gather(b.encode(["ok"]), b.encode(["BAD", "x"]), b.encode(["fine"]),
                                    return_exceptions=True)

    good, bad, fine = asyncio.run(main())
    assert good == [[1, 111, 107]] and fine == [[1, 102, 105, 110, 101]]
    assert isinstance(bad, ValueError)


def test_later_arrivals_form_the_next_batch():
    tok = FakeTokenizer()

    async def main():
        b = _batcher(tok)
        first = asyncio.ensure_future(b.encode(["a"]))
        await asyncio.sleep(0)  # NOTE: the first batch is on its way
        rest = [asyncio.ensure_future(b.encode([t])) for t in "bcd"]
        return await first, await asyncio.gather(*rest)

    first, rest = asyncio.run(main())
    assert first == [[1, 97]] and rest == [[[1, 98]], [[1, 99]], [[1, 100]]]
    assert [c[0] for c in tok.calls] == [["a"], ["b", "c", "d"]]


def test_batch_encode_equals_encode(tiny_llama):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    texts = ["def f(x):", "", "hello world 🙂", "  spaces\n\ttabs"]
    assert encode_batch(tok, texts) == [tok.encode(t) for t in texts]
    assert encode_batch(tok, texts, False) == [tok.encode(t, add_special_tokens=False) for t in texts]


@pytest.mark.parametrize("texts", [["only"], []])
def test_small_batches(texts):
    tok = FakeTokenizer()
    assert asyncio.run(_batcher(tok).encode(texts)) == [[1] + [ord(c) for c in t] for t in texts]


def test_special_token_flags_are_separate_calls():
    tok = FakeTokenizer()

    async def main():
        b = _batcher(tok)
        return await asyncio.gather(b.encode(["a"]), b.encode(["b"], add_special_tokens=False), b.encode(["c"]))

    assert asyncio.run(main()) == [[[1, 97]], [[98]], [[1, 99]]]
    assert [(c[0], c[2]) for c in tok.calls] == [(["a", "c"], True), (["b"], False)]
