"""First-visit masks of DFA states (issue 12): states of counting chains (``maxLength`` strings)
share masks through :mod:`radixlm.grammar.shift_classes`; every shared or computed mask must equal
a brute-force reference (each token stepped through the DFA) and the plain walk."""

from __future__ import annotations

import random

import numpy as np
import pytest

from radixlm.grammar import shift_classes, token_index
from radixlm.grammar.automaton import regex_to_dfa
from radixlm.grammar.maskbench import DEFAULT_TOKENIZER, load_compiler, shared_data, tokenizer_available
from radixlm.grammar.token_index import DfaIndex, RegionCache
from radixlm.grammar.trie import TokenTrie
from radixlm.grammar.testing import dfa_states_along

CHAIN = r'"([^"\\]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4}){0,%d}"'  # a JSON string of bounded length


class _Never:
    """A stand-in for ShiftClasses that never matches (the plain walk of every state)."""

    def match(self, s: int) -> int:
        return -1

    def match_depth(self, s: int) -> tuple[int, int]:
        return -1, 0

    def register(self, s: int) -> None:
        pass


def _vocab(seed: int = 0, n: int = 600) -> list[bytes]:
    """Synthetic tokens: short and long runs of string bytes, escapes, quotes and UTF-8."""
    rng = random.Random(seed)
    atoms = [b"a", b"b", b" ", b"\"", b"\\", b"n", b"u", b"0", b"F", b",", b":", "é".encode(), "語".encode()]
    out = {bytes([b]) for b in range(256)}
    while len(out) < n:
        k = rng.choice([1, 2, 3, 4, 6, 9, 17, 33])
        out.add(b"".join(rng.choice(atoms) for _ in range(k)))
    out.add(b" " * 40)
    return sorted(out)


def _brute(dfa, tokens: list[bytes | None], s: int, words: int) -> np.ndarray:
    """Packed mask of the tokens (with bytes) that ``dfa`` can read from ``s``."""
    allowed = np.zeros(words * 32, dtype=bool)
    for t, b in enumerate(tokens):
        allowed[t] = bool(b) and dfa.step(s, b) != 0
    return np.packbits(allowed, bitorder="little").view(np.int32)


def _chain_states(dfa, text: bytes) -> list[int]:
    """The states along ``text`` from the start (the states a decode of ``text`` visits)."""
    out, s = [], dfa.start
    for b in text:
        s = dfa.step(s, bytes([b]))
        assert s, text
        out.append(s)
    return out


@pytest.mark.parametrize("dense", [2_000, 10**9])
def test_shared_masks_equal_brute_force_synthetic(monkeypatch, dense: int) -> None:
    # NOTE: a small vocabulary makes every state narrow; the thresholds send them down the wide
    # paths (sparse or dense single walks, where chains are shared) as a real vocabulary would.
    monkeypatch.setattr(token_index, "WIDE_NODES", 1)
    monkeypatch.setattr(token_index, "DENSE_NODES", dense)
    dfa = regex_to_dfa(CHAIN % 150)
    tokens = _vocab()
    trie = TokenTrie(tokens)
    words = (len(tokens) + 31) // 32
    index = DfaIndex(dfa.trans, trie, words, RegionCache())
    text = ('"' + 'ab é\\n\\u00e9語' * 12).encode()
    states = _chain_states(dfa, text)
    order = states[:]
    random.Random(1).shuffle(order)
    for s in order + list(range(1, dfa.n_states)):
        assert np.array_equal(index.mask(s), _brute(dfa, tokens, s, words)), s
    assert index._shifts is not None and index._shifts.ahead > 0
    assert index._shifts.hits > 0  # the chain's copies did share masks


@pytest.mark.parametrize("name", [DEFAULT_TOKENIZER, pytest.param("deepseek-llm", marks=pytest.mark.skipif(
    not tokenizer_available("deepseek-llm"), reason=f"deepseek-llm not under {shared_data()}"))])
def test_shared_masks_equal_plain_walk_real_vocab(name: str) -> None:
    info = load_compiler(name).tokenizer_info
    dfa = regex_to_dfa(CHAIN % 1500)
    trie = info.walk_trie(dfa.trans)
    fast = DfaIndex(dfa.trans, trie, info.mask_words, RegionCache())
    plain = DfaIndex(dfa.trans, trie, info.mask_words, RegionCache())
    plain._shifts = _Never()
    text = ('"' + 'The quick brown fox, é\\"語\\u00e9 ' * 40).encode()
    states = _chain_states(dfa, text)[::7]
    for s in states:
        assert np.array_equal(fast.mask(s), plain.mask(s)), s
    assert fast._shifts.hits > 0
    for s in random.Random(2).sample(range(1, dfa.n_states), 6):  # against the brute force
        assert np.array_equal(fast.mask(s), _brute(dfa, info.token_bytes, s, info.mask_words)), s


def test_row_keys_exact_under_hash_collisions(monkeypatch) -> None:
    """Rows that collide in the hash still get distinct ids (checked exactly)."""
    dfa = regex_to_dfa(CHAIN % 60)
    index = DfaIndex(dfa.trans, TokenTrie(_vocab(n=300)), 10, RegionCache())
    index._neighbours()
    ptr, dst, col = index._runs
    off = dst.astype(np.int64) - np.repeat(np.arange(ptr.size - 1), np.diff(ptr))
    enc = np.where((dst != 0) & (np.abs(off) <= 20), off - 21, dst)
    good = shift_classes.row_keys(ptr, col, enc)
    monkeypatch.setattr(shift_classes, "_mix", lambda x: np.zeros(x.shape, np.uint64))
    bad = shift_classes.row_keys(ptr, col, enc)
    rows = [tuple(col[ptr[q] : ptr[q + 1]]) + tuple(enc[ptr[q] : ptr[q + 1]]) for q in range(ptr.size - 1)]
    for keys in (good, bad):
        for a in range(len(rows)):
            for b in range(a + 1, len(rows)):
                if keys[a] == keys[b]:
                    assert rows[a] == rows[b]
    assert len(set(good.tolist())) == len(set(rows))


def test_no_chain_no_classes() -> None:
    """A DFA without chains (or too small for a window) builds no classes and matches nothing."""
    dfa = regex_to_dfa(r"[a-z]+( [a-z]+)*")
    index = DfaIndex(dfa.trans, TokenTrie(_vocab(n=300)), 10, RegionCache())
    index._neighbours()
    ptr, dst, col = index._runs
    sc = shift_classes.ShiftClasses(ptr, col, dst, TokenTrie(_vocab(n=300)))
    assert sc.ahead == 0 and sc.match(1) == -1


SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                      "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
     "required": ["name"]},
    {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-f0-9]{8}$"},
                                      "note": {"type": "string", "minLength": 3, "maxLength": 300},
                                      "kind": {"enum": ["alpha", "beta", "gamma"]}},
     "additionalProperties": False},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_one_by_one_equals_batched(monkeypatch, schema: dict) -> None:
    """Every state's mask computed alone (Python walks of narrow states and of region exits,
    shift classes) equals the batched vectorized walk of all states at once."""
    import json

    comp = load_compiler(DEFAULT_TOKENIZER)
    info = comp.tokenizer_info
    dfa = comp.compile_json_schema(json.dumps(schema)).engine.dfa
    trie = info.walk_trie(dfa.trans)
    regions = getattr(trie, "regions", None) or RegionCache()
    alone = DfaIndex(dfa.trans, trie, info.mask_words, regions)
    order = list(range(1, dfa.n_states))
    random.Random(3).shuffle(order)
    for s in order:
        alone.compute([s])
    monkeypatch.setattr(token_index, "FEW_NARROW", 0)
    batched = DfaIndex(dfa.trans, trie, info.mask_words, RegionCache())
    batched._shifts = _Never()
    batched.compute(list(range(1, dfa.n_states)))
    for s in range(1, dfa.n_states):
        assert np.array_equal(alone.masks[s], batched.masks[s]), s
    assert alone._walker is not None  # the Python walks did run


def test_narrow_walker_equals_walk_from() -> None:
    """The Python walk finds exactly the live nodes' tokens of the vectorized sparse walk."""
    from radixlm.grammar.narrow_walk import NarrowWalker
    from radixlm.grammar.trie_walks import walk_from

    dfa = regex_to_dfa(r'\{"(name|nick|age)": ("[a-z]{0,6}"|[0-9]{1,4})\}')
    trie = TokenTrie(_vocab(n=2000))
    walker = NarrowWalker(dfa.trans, trie)
    for s in range(1, dfa.n_states):
        got = walker.tokens([(0, s)], budget=10**6)
        _, node, _ = walk_from(dfa.trans, trie, np.zeros(1, np.int64), np.asarray([s]))
        tok = trie.node_token[node]
        assert sorted(got) == sorted(tok[tok >= 0].tolist()), s
    assert NarrowWalker(dfa.trans, trie).tokens([(0, dfa.start)], budget=0) is None


def test_python_delta_equals_delta_mask() -> None:
    """The Python lockstep walk gives delta_mask's masks (the same array when nothing differs)."""
    from radixlm.grammar.mask_pack import pack_tokens
    from radixlm.grammar.token_delta import delta_mask

    dfa = regex_to_dfa(CHAIN % 20)
    tokens = _vocab(n=3000)
    trie = TokenTrie(tokens)
    words = (len(tokens) + 31) // 32
    index = DfaIndex(dfa.trans, trie, words, RegionCache())
    rng = random.Random(4)
    pairs = [(rng.randrange(1, dfa.n_states), rng.randrange(1, dfa.n_states)) for _ in range(60)]
    pairs += [(s, s) for s in range(1, 6)]
    for s, g in pairs:
        base = index.mask(g)
        want = delta_mask(dfa.trans, trie, words, s, g, base, pack_tokens)
        got = index._delta(s, g, base)
        assert np.array_equal(got, want), (s, g)
        assert (got is base) == (want is base), (s, g)
        assert np.array_equal(got, _brute(dfa, tokens, s, words)), (s, g)


@pytest.mark.parametrize("bounds", ["0,150", "30,150", "0,45"])
def test_depth_limited_masks_equal_brute_force_synthetic(monkeypatch, bounds: str) -> None:
    """States near a chain's end or its ``minLength`` boundary match earlier copies only for the
    short tokens (``ShiftClasses.match_depth``); their masks (short part shared, long tokens
    walked on the tall trie) equal the brute force, in any visiting order."""
    monkeypatch.setattr(token_index, "WIDE_NODES", 1)
    monkeypatch.setattr(token_index, "TALL_SHARE", 0)  # NOTE: take every depth match the vocabulary allows
    monkeypatch.setattr(shift_classes, "DEPTHS", (4, 6, 9, 12, 18, 24))
    dfa = regex_to_dfa(CHAIN.replace("{0,%d}", "{%s}") % bounds)
    tokens = _vocab(seed=3)
    trie = TokenTrie(tokens)
    words = (len(tokens) + 31) // 32
    index = DfaIndex(dfa.trans, trie, words, RegionCache())
    calls = []
    orig = index._by_depth
    monkeypatch.setattr(index, "_by_depth", lambda s: calls.append(orig(s)) or calls[-1])
    states = dfa_states_along(dfa, ('"' + 'ab é\\n\\u00e9語xyz' * 14).encode())
    for order in (states, list(range(1, dfa.n_states))):
        for s in order:
            assert np.array_equal(index.mask(s), _brute(dfa, tokens, s, words)), s
    assert any(calls)  # the depth-limited path served some states


def test_depth_limited_masks_equal_plain_walk_real_vocab() -> None:
    info = load_compiler(DEFAULT_TOKENIZER).tokenizer_info
    dfa = regex_to_dfa(CHAIN.replace("{0,%d}", "{%s}") % "20,90")
    trie = info.walk_trie(dfa.trans)
    fast = DfaIndex(dfa.trans, trie, info.mask_words, RegionCache())
    plain = DfaIndex(dfa.trans, trie, info.mask_words, RegionCache())
    plain._shifts = _Never()
    text = ('"' + 'The quick brown fox, é\\"語\\u00e9 ' * 4).encode()
    for s in dfa_states_along(dfa, text):
        assert np.array_equal(fast.mask(s), plain.mask(s)), s


def test_max_below_equals_scatter_max() -> None:
    from radixlm.grammar import tall_trie

    for trie in (TokenTrie(_vocab(3)), load_compiler(DEFAULT_TOKENIZER).tokenizer_info.trie):
        want = tall_trie.node_depths(trie).copy()
        for lo, hi, parent, _ in reversed(trie.levels()):
            np.maximum.at(want, parent, want[lo:hi])
        assert np.array_equal(tall_trie._max_below(trie), want)


@pytest.mark.parametrize("batch", [True, False])
def test_terminal_boundaries_from_a_reference_equal_plain_walk(monkeypatch, batch: bool) -> None:
    """An Earley terminal's states are derived from a reference state (``token_delta.delta_bounds``:
    the key prefixes of "any key but the declared ones" in an open object of a grammar, each a
    wide state off any cycle): their masks and boundary nodes, in one batch (references computed
    inside it) or one by one, equal a plain walk of the whole trie from each state."""
    from radixlm.grammar import token_delta
    from radixlm.grammar.mask_pack import pack_tokens
    from radixlm.grammar.trie_walks import walk_from

    calls = []
    real = token_index.delta_bounds
    monkeypatch.setattr(token_index, "delta_bounds", lambda *a: calls.append(a[3]) or real(*a))
    assert real is token_delta.delta_bounds
    props = {f"{w}_{i}": {"type": "integer"} for i, w in enumerate(["listeners", "listen", "api", "ui", "data"])}
    schema = {"type": "object", "properties": {**props, "child": {"$ref": "#"}}}
    engine = load_compiler(DEFAULT_TOKENIZER).compile_json_schema(schema).engine
    checked = 0
    for idx in engine.index:
        if idx.accept is None:
            continue
        fresh = DfaIndex(idx.trans, idx.trie, idx.words, RegionCache(), idx.accept)
        states = list(range(1, idx.trans.shape[0]))
        if batch:
            fresh.compute(states)
        for s in states:
            got_mask, got_bounds = fresh.mask(s), fresh.boundary(s)
            _, node, st = walk_from(idx.trans, idx.trie, np.zeros(1, np.int64), np.asarray([s]))
            tok = idx.trie.node_token[node]
            assert np.array_equal(got_mask, pack_tokens(tok[tok >= 0], idx.trie, idx.words)), s
            assert set(got_bounds.tolist()) == set(node[idx.accept[st]].tolist()), s
            checked += 1
    assert checked and calls  # NOTE: the derived path ran
