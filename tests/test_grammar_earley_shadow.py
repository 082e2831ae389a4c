"""Earley crossings on shadow columns (issue 12): columns unfolded a few origin levels deep
(``grammar/earley_shadow.py``) give exactly the masks of a fresh engine computing on the real
chart, token by token, on recursive grammars; and a deeper nesting level finds its crossings in
the cache of a shallower one (no new chart column, no new shadow node).

Vocabularies: a small synthetic one (always), the default model's (where radixlm is installed).
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from radixlm.grammar import GrammarCompiler, GrammarMatcher, allocate_token_bitmask
from radixlm.grammar import earley_crossings
from radixlm.grammar.bitmask import unpack_bitmask
from radixlm.grammar.earley_engine import EarleyEngine
from radixlm.grammar.earley_shadow import OPAQUE, Opaque, ShadowChart
from radixlm.grammar.maskbench import DEFAULT_TOKENIZER, encode_exact, load_tokenizer, tokenizer_available
from radixlm.grammar.tokenizer_info import TokenizerInfo

TREE = {"$defs": {"n": {"type": "object", "properties": {
    "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "required": ["v"]}},
    "$ref": "#/$defs/n"}
NESTED_EBNF = 'root: list\nlist: "[" [item ("," item)*] "]"\nitem: list | /[0-9]+/'
PIECES = ['{"', '":', '": ', '",', '", "', '"}', '},', '}]', '}]}', '}]}]', '[{', '[{"', ', "', '"v": ',
          '"kids": [', '[]', '[[', ']]', ']]]', '],', ', ', '12', '[1', '1]', '],[']


def _tree(depth: int) -> dict:
    return {"v": depth, "kids": [_tree(depth - 1), {"v": 0}]} if depth else {"v": 0, "kids": []}


def _synthetic() -> TokenizerInfo:
    pieces = [bytes([b]) for b in range(0x20, 0x7F)] + [p.encode() for p in PIECES]
    return TokenizerInfo(list(pieces) + [None], len(pieces) + 3, (len(pieces),), frozenset({len(pieces)}))


def _encode(info: TokenizerInfo, text: str) -> list[int]:
    """Greedy longest match over the synthetic vocabulary."""
    by_bytes = {b: t for t, b in enumerate(info.token_bytes) if b is not None}
    data, out, i = text.encode(), [], 0
    while i < len(data):
        n = next(n for n in range(min(8, len(data) - i), 0, -1) if data[i : i + n] in by_bytes)
        out.append(by_bytes[data[i : i + n]])
        i += n
    return out


def _compile(info_or_tok, kind: str, source: str):
    comp = GrammarCompiler(info_or_tok)  # NOTE: a fresh compiler each time: nothing cached is shared
    compiled = comp.compile_json_schema(source) if kind == "json" else comp.compile_ebnf(source)
    assert isinstance(compiled.engine, EarleyEngine)
    return compiled


def _bits(matcher: GrammarMatcher, vocab: int) -> np.ndarray:
    bm = allocate_token_bitmask(1, vocab)
    matcher.fill_next_token_bitmask(bm, 0)
    return unpack_bitmask(bm, vocab)[0].numpy()


def _walk_pair(shadowed, fresh, tokens: list[int] | None, rng: random.Random, steps: int) -> int:
    """Walk a matcher of ``shadowed`` (shadow chart on) and one of ``fresh`` (real chart only, its
    own compile) side by side; every mask must be equal. Returns the steps checked."""
    vocab = shadowed.tokenizer_info.vocab_size
    stops = set(shadowed.tokenizer_info.stop_token_ids)
    a, b = GrammarMatcher(shadowed), GrammarMatcher(fresh)
    n = len(tokens) + 1 if tokens is not None else steps
    for i in range(n):
        got, want = _bits(a, vocab), _bits(b, vocab)
        diff = np.nonzero(got != want)[0]
        assert diff.size == 0, (i, diff[:8].tolist())
        if tokens is not None and i == len(tokens):
            break
        if tokens is not None:
            tid = tokens[i]
        else:
            allowed = [t for t in np.nonzero(got)[0].tolist() if t not in stops]
            if not allowed:
                break
            tid = rng.choice(allowed)
        assert a.accept_token(tid) and b.accept_token(tid)
    return i + 1


@pytest.mark.parametrize("depth", [1, 2, 3, 6])
@pytest.mark.parametrize("kind,source,doc", [
    ("json", json.dumps(TREE), json.dumps(_tree(4))),
    ("ebnf", NESTED_EBNF, "[[1,[2,[3,[]]]],[4],[[[[12]]]],[5,6]]"),
], ids=["tree", "nested"])
def test_shadow_masks_equal_fresh_real_chart_synthetic(monkeypatch, depth: int, kind: str, source: str,
                                                       doc: str) -> None:
    info = _synthetic()
    monkeypatch.setattr(earley_crossings, "SHADOW_DEPTH", 0)
    fresh = _compile(info, kind, source)
    monkeypatch.setattr(earley_crossings, "SHADOW_DEPTH", depth)
    shadowed = _compile(info, kind, source)
    assert _walk_pair(shadowed, fresh, _encode(info, doc), random.Random(0), 0) > 20
    for seed in range(3):
        _walk_pair(shadowed, fresh, None, random.Random(seed), 40)
    looked_up, _, _ = shadowed.engine.shadow_stats
    assert looked_up > 0  # NOTE: the shadow path ran (not only its fallback)


@pytest.mark.skipif(not tokenizer_available(DEFAULT_TOKENIZER), reason="default model tokenizer absent")
def test_shadow_masks_equal_fresh_real_chart_default_vocab(monkeypatch) -> None:
    tok = load_tokenizer(DEFAULT_TOKENIZER)
    monkeypatch.setattr(earley_crossings, "SHADOW_DEPTH", 0)
    fresh = _compile(tok, "json", json.dumps(TREE))
    monkeypatch.setattr(earley_crossings, "SHADOW_DEPTH", 3)
    shadowed = _compile(tok, "json", json.dumps(TREE))
    ids = encode_exact(tok, shadowed.tokenizer_info, json.dumps(_tree(4)))
    assert _walk_pair(shadowed, fresh, ids, random.Random(0), 0) == len(ids) + 1
    _walk_pair(shadowed, fresh, None, random.Random(1), 30)


def test_deeper_level_reuses_shallower_crossings(monkeypatch) -> None:
    """``[[[[[[[``: the state after the k-th ``[`` (a new column at each level) is a new matcher
    state at every level, but with columns unfolded 2 origin levels deep, from level 4 on (the
    levels below the unfolding look alike from there) its crossings on shadow nodes all come
    from the cache filled at shallower levels: no chart column, no shadow node and no crossing
    walk is added. The real chart gets no column for these masks at any level."""
    monkeypatch.setattr(earley_crossings, "SHADOW_DEPTH", 2)
    info = _synthetic()
    compiled = _compile(info, "ebnf", NESTED_EBNF)
    eng = compiled.engine
    matcher = GrammarMatcher(compiled)
    bracket = info.token_bytes.index(b"[")
    grown = []
    for level in range(1, 8):
        assert matcher.accept_token(bracket)
        state = matcher.mask_state()
        assert state not in compiled.masks._row_of  # a first visit at every level
        cols, nodes, paths = eng.chart.n_columns, len(eng._shadow_chart.waiting), len(eng._paths)
        before = list(eng.shadow_stats)
        _bits(matcher, info.vocab_size)
        grown.append((eng.chart.n_columns - cols, len(eng._shadow_chart.waiting) - nodes, len(eng._paths) - paths))
        if level >= 4:
            looked_up, hits, opaque = (x - y for x, y in zip(eng.shadow_stats, before))
            assert opaque == 0 and looked_up > 0 and hits == looked_up, (level, looked_up, hits, opaque)
    assert grown[0] != (0, 0, 0)  # the first level did compute
    assert all(g == (0, 0, 0) for g in grown[3:]), grown
    assert all(g[0] == 0 for g in grown), grown


def test_opaque_origin_raises_and_falls_back() -> None:
    """Depth 1 leaves every origin opaque: closing a list pops into one, which raises Opaque on
    the shadow chart; the engine then computes on the real chart (same masks, see above)."""
    info = _synthetic()
    compiled = _compile(info, "ebnf", NESTED_EBNF)
    chart = compiled.engine.chart
    shadow = ShadowChart(chart, 1)
    m = GrammarMatcher(compiled)
    for tid in _encode(info, "[[1"):
        assert m.accept_token(tid)
    cols = sorted({c for c, _, _ in m.mask_state().threads})
    node = shadow.node_of(cols[-1])
    assert node != OPAQUE
    close = next(t for t in shadow.scan_terms[node] if compiled.engine.terms[t].trans[compiled.engine.terms[t].start,
                                                                                      ord("]")])
    with pytest.raises(Opaque):
        shadow.advance(node, close)
    with pytest.raises(ValueError):
        ShadowChart(chart, 0)
