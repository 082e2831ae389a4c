"""DFA masks computed by running every token through the DFA (issue 12, grammar/device_masks.py):
the kernel's torch reference and the Triton kernel equal the host's trie-walk masks, and a batched
fill through the device cache equals the host fill, also across the cache's clear when full and
for tables that hold some states already. The device here is the CPU (the path serves CUDA)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

import radixlm.grammar.dfa_engine as dfa_engine
from radixlm.grammar import GrammarCompiler, GrammarMatcher, allocate_token_bitmask
from radixlm.grammar.device_masks import DeviceDfaMasks, device_masks, token_bytes
from radixlm.grammar.maskbench import load_tokenizer, shared_data
from radixlm.grammar.matcher import fill_batch_bitmask
from radixlm.kernels.dfa_mask import dfa_token_mask_ref, dfa_token_mask_triton

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 10}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-zé]{1,6}$"}, "maxItems": 3},
    "ok": {"type": "boolean"}}, "required": ["name", "age"]}
REGEX = r"(\+|-)?[0-9]{1,4}(\.[0-9]{2})? (apples|pears|日本)\n"
CPU = torch.device("cpu")


def _vocabs() -> list[str]:
    names = ["smollm2"]
    if (shared_data() / "tokenizers" / "deepseek-llm").is_dir():
        names.append("deepseek-llm")
    return names


_COMPILERS: dict[str, GrammarCompiler] = {}


def _compiler(name: str) -> GrammarCompiler:
    if name not in _COMPILERS:
        _COMPILERS[name] = GrammarCompiler(load_tokenizer(name))
    return _COMPILERS[name]


def _lazy(comp: GrammarCompiler, kind: str, source: str, monkeypatch):
    """Compile with no compile-time masks (as a DFA past EAGER_STATES is served)."""
    monkeypatch.setattr(dfa_engine, "EAGER_STATES", 0)
    g = comp.compile_json_schema(source) if kind == "json_schema" else comp.compile_regex(source)
    assert type(g.engine).__name__ == "DfaEngine" and not g.masks.complete
    return g


def _trans(g) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(g.engine.dfa.trans, dtype=np.int32))


@pytest.mark.parametrize("vocab", _vocabs())
@pytest.mark.parametrize("kind,source", [("json_schema", json.dumps(SCHEMA) + " "), ("regex", REGEX)])
def test_reference_equals_trie_walk(vocab, kind, source, monkeypatch) -> None:
    comp = _compiler(vocab)
    g = _lazy(comp, kind, source, monkeypatch)
    info = comp.tokenizer_info
    states = np.arange(1, g.engine.dfa.n_states, dtype=np.int64)
    if states.size > 120:
        states = np.random.default_rng(0).choice(states, 120, replace=False)
    got = dfa_token_mask_ref(_trans(g), torch.from_numpy(states), token_bytes(info, CPU), info.mask_words)
    for i, s in enumerate(states.tolist()):
        assert np.array_equal(got[i].numpy(), g.engine.mask(s)), s


@pytest.mark.parametrize("vocab", _vocabs())
def test_triton_kernel_equals_reference(vocab, dev, monkeypatch) -> None:
    comp = _compiler(vocab)
    info = comp.tokenizer_info
    g = _lazy(comp, "regex", REGEX, monkeypatch)
    states = np.asarray([g.engine.initial(), *range(2, min(g.engine.dfa.n_states, 5))], dtype=np.int64)
    tb = token_bytes(info, torch.device(dev))
    want = dfa_token_mask_ref(_trans(g), torch.from_numpy(states), token_bytes(info, CPU), info.mask_words)
    got = dfa_token_mask_triton(_trans(g).to(dev), torch.from_numpy(states).to(dev), tb, info.mask_words)
    assert torch.equal(got.cpu(), want)


def _random_matchers(g, n: int, rng: random.Random) -> list[GrammarMatcher | None]:
    """``n`` matchers at random depths of random valid paths (some None rows, one terminated)."""
    info = g.tokenizer_info
    out: list[GrammarMatcher | None] = []
    for i in range(n):
        if i % 7 == 6:
            out.append(None)
            continue
        m = GrammarMatcher(g)
        for _ in range(rng.randrange(12)):
            bm = allocate_token_bitmask(1, info.vocab_size)
            fill_batch_bitmask([m], bm, device_masks=False)
            bits = np.unpackbits(bm.numpy().view(np.uint8), bitorder="little")[: info.tokenizer_size]
            allowed = [t for t in np.flatnonzero(bits).tolist() if t not in info.stop_token_ids]
            if not allowed:
                break
            assert m.accept_token(rng.choice(allowed))
        out.append(m)
    return out


# NOTE: states reached by text, not by sampled walks: the host table has no row for them (random
# walks mostly end in string bodies whose rows earlier walks computed on the host)
PREFIXES = ['{"name": "ab', '{"name": "x", "age": 1', '{"name": "x", "age": 7, "tags": ["a', '{"ok": true, "age": 3']


def _prefix_matchers(g) -> list[GrammarMatcher]:
    out = []
    for text in PREFIXES:
        m = GrammarMatcher(g)
        assert m.accept_string(text), text
        out.append(m)
    return out


def _fill(matchers, words: int, on_device: bool) -> torch.Tensor:
    bm = torch.full((len(matchers), words), 7, dtype=torch.int32)
    fill_batch_bitmask(matchers, bm, device_masks=on_device)
    return bm


def test_batched_fill_through_device_cache_equals_host(monkeypatch) -> None:
    comp = _compiler("smollm2")
    words = comp.tokenizer_info.mask_words
    g = _lazy(comp, "json_schema", json.dumps(SCHEMA) + "  ", monkeypatch)
    h = comp.compile_regex(REGEX + "?")  # a second grammar in the batch
    rng = random.Random(3)
    cache = device_masks(g, CPU)
    assert cache is not None
    for i in range(3):
        matchers = _random_matchers(g, 9, rng) + _random_matchers(h, 4, rng) + (_prefix_matchers(g) if i == 0 else [])
        got = _fill(matchers, words, True)  # NOTE: first: the walks gave the host rows of earlier states only
        assert torch.equal(got, _fill(matchers, words, False))
    assert cache._slot  # the device path computed rows
    cache.max_rows = 3  # full: cleared at the start of a call, then every state recomputed
    matchers = _random_matchers(g, 9, rng)
    got = _fill(matchers, words, True)
    assert len(cache._slot) <= 9 and torch.equal(got, _fill(matchers, words, False))


def test_known_rows_come_from_the_host_table(monkeypatch) -> None:
    """States with a host row are gathered from it; only the others are computed on the device."""
    comp = _compiler("smollm2")
    g = _lazy(comp, "regex", REGEX + "x", monkeypatch)
    m = GrammarMatcher(g)
    g.masks.row_ids([m.mask_state()])  # the host now has the start state's row
    assert m.accept_string("-12")
    pair = [GrammarMatcher(g), m]
    words = comp.tokenizer_info.mask_words
    got = _fill(pair, words, True)
    cache = device_masks(g, CPU)
    assert set(cache._slot) == {m.mask_state()}
    assert torch.equal(got, _fill(pair, words, False))


def test_device_path_skips_complete_and_earley_grammars() -> None:
    comp = _compiler("smollm2")
    assert device_masks(comp.compile_regex("[a-c]{2}"), CPU) is None  # precomputed at compile time
    tree = {"$ref": "#/$defs/n", "$defs": {"n": {"type": "object", "properties": {
        "k": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}}}
    earley = comp.compile_json_schema(json.dumps(tree))
    assert not DeviceDfaMasks.fits(earley) and device_masks(earley, CPU) is None
