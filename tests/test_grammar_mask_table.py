"""Precomputed / cached mask tables (issue 12): rows equal a direct per-token check of the grammar,
a batched fill equals per-matcher fills, on the default model's vocabulary (always) and GPT-2's
(when the shared data is present)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from radixlm.grammar import GrammarCompiler, GrammarMatcher, allocate_token_bitmask
from radixlm.grammar.bitmask import unpack_bitmask
from radixlm.grammar.matcher import fill_batch_bitmask
from radixlm.grammar.maskbench import load_tokenizer, shared_data

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "bc"]}}},
          "required": ["name", "age"]}
TREE = {"$ref": "#/$defs/n", "$defs": {"n": {"type": "object", "properties": {
    "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "required": ["v"]}}}
GRAMMARS = [
    ("regex", r"(\+|-)?[0-9]{1,4}(\.[0-9]{2})? (apples|pears)"),
    ("regex", r"[A-Z][a-z]+ [A-Z]\. [a-zé]{2,8}"),
    ("json_schema", json.dumps(SCHEMA)),
    ("json_schema", json.dumps(TREE)),  # recursive: the Earley engine
    ("ebnf", 'root: "[" item ("," item)* "]"\nitem: NUMBER | "\\"" /[a-z]+/ "\\""\nNUMBER: /[0-9]+/'),
]


def _vocabs() -> list[str]:
    names = ["default"]
    if (shared_data() / "tokenizers" / "gpt-2").is_dir():
        names.append("gpt-2")
    return names


_COMPILERS: dict[str, GrammarCompiler] = {}


def _compiler(name: str) -> GrammarCompiler:
    if name not in _COMPILERS:
        if name == "default":
            from transformers import AutoTokenizer

            from radixlm.runtime.default_model import default_model_path

            tok = AutoTokenizer.from_pretrained(default_model_path())
        else:
            tok = load_tokenizer(name)
        _COMPILERS[name] = GrammarCompiler(tok)
    return _COMPILERS[name]


def _compile(comp: GrammarCompiler, kind: str, source: str):
    return {"regex": comp.compile_regex, "json_schema": comp.compile_json_schema, "ebnf": comp.compile_ebnf}[kind](source)


def _direct(matcher: GrammarMatcher, tokens: np.ndarray) -> np.ndarray:
    """Reference: the grammar engine advanced by each token's bytes, no table and no trie."""
    engine, info = matcher.compiled.engine, matcher.compiled.tokenizer_info
    state = matcher.mask_state()
    out = np.zeros(info.vocab_size, dtype=bool)
    for t in tokens.tolist():
        data = info.token_bytes[t]
        if data is not None and engine.advance(state, data) is not None:
            out[t] = True
    if engine.accepting(state):
        out[list(info.stop_token_ids)] = True
    return out


def _walk(matcher: GrammarMatcher, rng: random.Random, steps: int, sample: np.ndarray):
    """Yield the matcher at ``steps`` states along a random valid path."""
    vocab = matcher.compiled.tokenizer_info.vocab_size
    for _ in range(steps):
        yield matcher
        allowed = np.nonzero(_table_bits(matcher, vocab))[0]
        allowed = allowed[~np.isin(allowed, matcher.compiled.tokenizer_info.stop_token_ids)]
        if allowed.size == 0:
            return
        assert matcher.accept_token(int(rng.choice(allowed.tolist())))


def _table_bits(matcher: GrammarMatcher, vocab: int) -> np.ndarray:
    bm = allocate_token_bitmask(1, vocab)
    matcher.fill_next_token_bitmask(bm, 0)
    return unpack_bitmask(bm, vocab)[0].numpy()


@pytest.mark.parametrize("vocab", _vocabs())
@pytest.mark.parametrize("kind,source", GRAMMARS, ids=[f"{k}{i}" for i, (k, _) in enumerate(GRAMMARS)])
def test_table_rows_equal_direct_check(vocab: str, kind: str, source: str) -> None:
    comp = _compiler(vocab)
    info = comp.tokenizer_info
    compiled = _compile(comp, kind, source)
    if type(compiled.engine).__name__ == "DfaEngine":
        # precomputed at compile time (no walk on the decode path), but for cold states: those
        # reached only through undeclared properties / properties out of schema order
        hot = compiled.engine.dfa.hot
        assert compiled.masks.complete or (hot is not None and not hot.all())
        if hot is not None:
            dense = compiled.masks._dense
            assert (dense[1:][hot[1:]] >= 0).all() and (dense[1:][~hot[1:]] < 0).all()
    rng = random.Random(hash((vocab, source)) & 0xFFFF)
    earley = type(compiled.engine).__name__ != "DfaEngine"
    n = info.tokenizer_size
    sample = np.asarray(sorted(set(rng.sample(range(n), 2500 if earley else 8000)) | set(range(0, n, 997)) | set(range(256))), dtype=np.int64)
    checked = 0
    for m in _walk(GrammarMatcher(compiled), rng, 4 if earley else 10, sample):
        got = _table_bits(m, info.vocab_size)
        want = _direct(m, sample)
        assert (got[sample] == want[sample]).all(), np.nonzero(got[sample] != want[sample])[0][:10]
        assert got.any()
        checked += 1
    assert checked >= 3


def test_batched_fill_equals_per_matcher_fill() -> None:
    """Mixed grammars, unconstrained (None) rows, a terminated matcher, repeated states."""
    comp = _compiler("default")
    info = comp.tokenizer_info
    grammars = [_compile(comp, k, s) for k, s in GRAMMARS]
    rng = random.Random(1)
    matchers: list[GrammarMatcher | None] = []
    for i in range(12):
        if i % 5 == 4:
            matchers.append(None)
            continue
        m = GrammarMatcher(grammars[i % len(grammars)])
        for _ in range(rng.randrange(4)):
            allowed = np.nonzero(_table_bits(m, info.vocab_size))[0]
            allowed = allowed[~np.isin(allowed, info.stop_token_ids)]
            if allowed.size:
                m.accept_token(int(rng.choice(allowed.tolist())))
        matchers.append(m)
    done = GrammarMatcher(comp.compile_regex("ab"))
    assert done.accept_string("ab") and done.accept_token(info.stop_token_ids[0]) and done.is_terminated()
    matchers.append(done)
    batched = torch.full((len(matchers), info.mask_words), 7, dtype=torch.int32)
    fill_batch_bitmask(matchers, batched)
    for i, m in enumerate(matchers):
        if m is None:
            assert (batched[i] == 7).all()  # untouched
            continue
        one = allocate_token_bitmask(1, info.vocab_size)
        m.fill_next_token_bitmask(one, 0)
        assert torch.equal(batched[i], one[0])
    stop_only = unpack_bitmask(batched[-1:], info.vocab_size)[0]
    assert stop_only.sum().item() == len(info.stop_token_ids)


def test_lazy_table_is_bounded_and_refills() -> None:
    """Past its row budget the lazy table starts over; rows stay correct."""
    comp = _compiler("default")
    tree = dict(TREE, title="bounded")  # NOTE: a grammar of its own (the compiler caches)
    compiled = comp.compile_json_schema(json.dumps(tree))
    table = compiled.masks
    assert not table.complete
    table.max_rows = 4
    m = GrammarMatcher(compiled)
    rows = []
    for text in ['{"v"', ': 1', ', "kids": [', '{"v": 2}', "]"]:
        rows.append(m.next_token_mask())
        assert m.accept_string(text)
        assert table.n_rows <= 4 + 1
    fresh = GrammarMatcher(comp.compile_json_schema(json.dumps(tree)))
    assert (fresh.next_token_mask() == rows[0]).all()


def test_device_copies_are_incremental_and_bounded(monkeypatch) -> None:
    """Device-side tables (exercised with the CPU as the 'device'): only new rows are uploaded,
    and least recently used grammars lose their copies past the byte budget."""
    from radixlm.grammar import mask_table as mt

    monkeypatch.setattr(mt, "DEVICE_TABLE_BYTES", 40_000)
    stop = np.zeros(100, np.int32)
    a = mt.MaskTable.from_dense(np.arange(500, dtype=np.int32).reshape(5, 100), stop)
    lazy = mt.MaskTable(100, stop, lambda states: [np.full(100, s, np.int32) for s in states])
    dev = torch.device("cpu")
    assert torch.equal(a.device_rows(dev)[: a.n_rows], a.rows_cpu())
    ids = lazy.row_ids([3, None, 4])
    first = lazy.device_rows(dev)
    assert torch.equal(first[ids[0]], torch.full((100,), 3, dtype=torch.int32)) and ids[1] == 0
    lazy.row_ids([5])  # one new row: same device buffer, row appended
    assert lazy.device_rows(dev) is first and (first[lazy.row_ids([5])[0]] == 5).all()
    b = mt.MaskTable.from_dense(np.ones((200, 100), np.int32) * np.arange(200, dtype=np.int32)[:, None], stop)
    b.device_rows(dev)
    assert b.device_bytes() > 0 and a.device_bytes() == 0  # a was least recently used


def test_cold_dfa_rows_match_precomputed_by_identity() -> None:
    """A cold DFA state whose mask is a precomputed state's array shares its row; an equal copy
    or an accepting state gets a correct row of its own (rows are never wrong, only duplicated)."""
    from radixlm.grammar import mask_table as mt

    words = 4
    stop = np.array([0, 0, 0, 1 << 3], dtype=np.int32)
    a, b = np.array([1, 2, 3, 0], np.int32), np.array([4, 0, 0, 0], np.int32)
    cold = {3: a, 4: a.copy(), 5: b, 6: np.zeros(words, np.int32)}
    accept = np.array([False, False, False, False, False, True, False])
    table = mt.MaskTable.from_states(7, {1: a, 2: b}, accept, stop,
                                     lambda states: [cold[s] | stop if accept[s] else cold[s] for s in states])
    assert not table.complete
    rows = table.row_ids([1, 2, 3, 4, 5, 6, 0])
    assert rows[2] == rows[0] and rows[3] != rows[0]
    for s, r in zip([1, 2, 3, 4, 5, 6, 0], rows.tolist()):
        want = {1: a, 2: b, 0: np.zeros(words, np.int32)}.get(s, cold.get(s))
        assert np.array_equal(table.row_np(r), want | stop if accept[s] else want), s
    assert table.complete
