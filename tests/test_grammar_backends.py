"""``--grammar-backend radixlm|xgrammar|llguidance`` (issue 12): every backend behind the same
matcher interface, on the default model's vocabulary; peers skip when not installed."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from radixlm.grammar.backends import BACKENDS, make_backend
from radixlm.grammar.bitmask import unpack_bitmask
from radixlm.runtime.server_args import ServerArgs

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["id", "ok"], "additionalProperties": False}
CASES = [
    ("regex", r"ab(c|d)[0-9]{2}", "abd42"),
    ("json_schema", json.dumps(SCHEMA), '{"id": 7, "ok": true}'),
]


def _installed(name: str) -> bool:
    return name == "radixlm" or importlib.util.find_spec(name) is not None


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from radixlm.runtime.default_model import default_model_path

    return AutoTokenizer.from_pretrained(default_model_path())


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request, tokenizer):
    if not _installed(request.param):
        pytest.skip(f"{request.param} is not installed (pip install 'radixlm[{request.param}]')")
    return make_backend(request.param, tokenizer, len(tokenizer))


def _allowed(backend, matcher, vocab: int) -> torch.Tensor:
    bm = torch.zeros((1, backend.words), dtype=torch.int32)
    matcher.fill_next_token_bitmask(bm, 0)
    return unpack_bitmask(bm, vocab)[0]


@pytest.mark.parametrize("kind,source,text", CASES, ids=[c[0] for c in CASES])
def test_matcher_interface(backend, tokenizer, kind: str, source: str, text: str) -> None:
    vocab = len(tokenizer)
    eos = tokenizer.eos_token_id
    m = backend.matcher(backend.compile(kind, source))
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert not _allowed(backend, m, vocab)[eos]  # nothing generated yet: cannot stop
    for t in ids:
        allowed = _allowed(backend, m, vocab)
        assert allowed[t] and allowed.sum() < vocab // 2
        assert m.accept_token(t)
    assert _allowed(backend, m, vocab)[eos]
    m.rollback(1)
    assert m.accept_token(ids[-1])
    assert m.accept_token(eos) and m.is_terminated()
    m.reset()
    assert not m.is_terminated()
    assert m.find_jump_forward_string().startswith("ab" if kind == "regex" else "{")
    # the batched fill equals per-matcher fills
    other = backend.matcher(backend.compile(kind, source))
    assert other.accept_token(ids[0])
    batch = torch.zeros((2, backend.words), dtype=torch.int32)
    backend.fill_batch([m, other], batch)
    assert torch.equal(unpack_bitmask(batch, vocab)[0], _allowed(backend, m, vocab))
    assert torch.equal(unpack_bitmask(batch, vocab)[1], _allowed(backend, other, vocab))


def test_unknown_backend_is_rejected(tokenizer) -> None:
    with pytest.raises(ValueError, match="grammar_backend"):
        ServerArgs(grammar_backend="outlines")
    with pytest.raises(ValueError, match="grammar backend"):
        make_backend("outlines", tokenizer, len(tokenizer))
    assert ServerArgs().grammar_backend == "radixlm"
