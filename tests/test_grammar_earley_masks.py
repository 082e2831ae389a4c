"""Earley engine masks (issue 12): the engine's cached masks, its shared chart columns and its
crossing caches give exactly the masks of a plain reference, along random walks and along valid
documents, for recursive JSON schemas and EBNF grammars.

References (both independent of the engine's chart and caches):
- a small synthetic vocabulary (always): brute force, every token's bytes run through a plain
  Earley recognizer (columns never shared, nothing cached);
- real tokenizers (when ``$RADIXLM_SHARED_DATA`` is present): the engine's former algorithm on the
  plain recognizer, uncached (per thread, the terminal's state mask plus a trie walk below its
  boundary nodes through the threads it spawns).
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from radixlm.grammar import GrammarCompiler, GrammarMatcher, allocate_token_bitmask
from radixlm.grammar.bitmask import unpack_bitmask
from radixlm.grammar.cfg import CFG
from radixlm.grammar.earley import Chart
from radixlm.grammar.earley_engine import EarleyEngine
from radixlm.grammar.maskbench import encode_exact, load_tokenizer, shared_data
from radixlm.grammar.testing import ARITH_EBNF, JSON_EBNF
from radixlm.grammar.token_index import walk_from
from radixlm.grammar.tokenizer_info import TokenizerInfo

TREE = {"$defs": {"n": {"type": "object", "properties": {
    "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "required": ["v"]}},
    "$ref": "#/$defs/n"}
FOREST = {"$defs": TREE["$defs"], "type": "array", "items": {"$ref": "#/$defs/n"}}
LINKED = {"$defs": {"l": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
    "h": {"type": "integer"}, "t": {"$ref": "#/$defs/l"}}, "required": ["h", "t"], "additionalProperties": False}]}},
    "$ref": "#/$defs/l"}
NESTED_EBNF = 'root: list\nlist: "[" [item ("," item)*] "]"\nitem: list | /[0-9]+/'


def _tree(depth: int, width: int, v: int = 0) -> dict:
    kids = [] if depth == 0 else [_tree(depth - 1, width, v * width + i + 1) for i in range(width)]
    return {"v": v, "kids": kids} if kids or v % 2 else {"v": v}


def _linked(n: int):
    out = None
    for i in range(n):
        out = {"h": i, "t": out}
    return out


# (name, kind, source, valid documents)
GRAMMARS = [
    ("tree", "json_schema", json.dumps(TREE), [json.dumps(_tree(3, 3))]),
    ("forest", "json_schema", json.dumps(FOREST), [json.dumps([_tree(1, 2)] * 7), "[]"]),
    ("linked", "json_schema", json.dumps(LINKED), [json.dumps(_linked(9))]),
    ("json", "ebnf", JSON_EBNF, [json.dumps({"a": [1, {"b": None}] * 5, "c": "x\u00e9", "d": [[], [True, -2.5e3]]})]),
    ("arith", "ebnf", ARITH_EBNF, ["((1+2)*3 - 4)/(5 + 6*(7-8)) + 9*9*9*9 - -1"]),
    ("nested", "ebnf", NESTED_EBNF, ["[[1,[2,[3,[]]]],[4],[5,6,7,8,9,10,11],[[[[12]]]]]"]),
]
IDS = [g[0] for g in GRAMMARS]


# --- the plain reference ---------------------------------------------------------------------

class _PlainChart:
    """Earley columns without sharing or content keys: one new column per completed terminal."""

    def __init__(self, cfg: CFG) -> None:
        self.cfg = cfg
        self.nullable = Chart(cfg).nullable
        self.columns: list[tuple[dict[int, list], frozenset[int], bool]] = []
        self.memo: dict[tuple[int, int], int | None] = {}
        self._column([(p, 0, 0) for p, (lhs, _) in enumerate(cfg.prods) if lhs == cfg.start])

    def _column(self, seeds: list) -> int:
        k = len(self.columns)
        waiting: dict[int, list] = {}
        seen: set = set()
        stack, accepting = list(seeds), False
        while stack:
            item = stack.pop()
            if item in seen:
                continue
            seen.add(item)
            p, d, o = item
            lhs, rhs = self.cfg.prods[p]
            if d == len(rhs):
                accepting |= lhs == self.cfg.start and o == 0
                src = waiting if o == k else self.columns[o][0]
                stack.extend((p2, d2 + 1, o2) for p2, d2, o2 in list(src.get(-(lhs + 1), ())))
                continue
            waiting.setdefault(rhs[d], []).append(item)
            if rhs[d] < 0:
                nt = -rhs[d] - 1
                stack.extend((p2, 0, k) for p2, (l2, _) in enumerate(self.cfg.prods) if l2 == nt)
                if self.nullable[nt]:
                    stack.append((p, d + 1, o))
        self.columns.append((waiting, frozenset(s for s in waiting if s >= 0), accepting))
        return k

    def advance(self, col: int, term: int) -> int | None:
        if (col, term) not in self.memo:
            items = self.columns[col][0].get(term)
            self.memo[col, term] = self._column([(p, d + 1, o) for p, d, o in items]) if items else None
        return self.memo[col, term]


class _Plain:
    """Thread sets ``{(column, terminal, dfa state)}`` over :class:`_PlainChart`."""

    def __init__(self, cfg: CFG) -> None:
        self.cfg = cfg
        self.chart = _PlainChart(cfg)

    def threads_at(self, col: int) -> set:
        terms = self.chart.columns[col][1] | set(self.cfg.ignore)
        return {(col, t, self.cfg.terminals[t].start) for t in terms}

    def spawn(self, col: int, t: int) -> tuple[set, bool]:
        nxt = col if t in self.cfg.ignore else self.chart.advance(col, t)
        return (set(), False) if nxt is None else (self.threads_at(nxt), self.chart.columns[nxt][2])

    def initial(self) -> tuple[frozenset, bool]:
        return frozenset(self.threads_at(0)), self.chart.columns[0][2]

    def advance(self, state: tuple[frozenset, bool], data: bytes) -> tuple[frozenset, bool] | None:
        threads, accepting = state
        for b in data:
            nxt, accepting = set(), False
            for col, t, q in threads:
                q2 = int(self.cfg.terminals[t].trans[q, b])
                if q2:
                    nxt.add((col, t, q2))
                    if self.cfg.terminals[t].accept[q2]:
                        more, acc = self.spawn(col, t)
                        nxt |= more
                        accepting |= acc
            if not nxt:
                return None
            threads = frozenset(nxt)
        return threads, accepting


def _brute_mask(plain: _Plain, state, info: TokenizerInfo) -> np.ndarray:
    """bool ``[vocab_size]``: every token's bytes through the plain recognizer, stops if accepting."""
    out = np.zeros(info.vocab_size, dtype=bool)
    for tid, data in enumerate(info.token_bytes):
        out[tid] = data is not None and plain.advance(state, data) is not None
    out[list(info.stop_token_ids)] = state[1]
    return out


def _former_mask(engine: EarleyEngine, plain: _Plain, state, info: TokenizerInfo) -> np.ndarray:
    """bool ``[vocab_size]``: the engine's former algorithm on the plain recognizer, uncached."""
    trie = engine.trie
    tokens: list[np.ndarray] = []
    inside = np.zeros(engine.words, dtype=np.int32)

    def below(threads: set, nodes: np.ndarray, depth: int) -> None:
        if depth > trie.max_depth:
            return
        for col, t, q in threads:
            term = engine.terms[t]
            _, found, states = walk_from(term.trans, trie, nodes, np.full(nodes.size, q))
            tok = trie.node_token[found]
            tokens.append(tok[tok >= 0])
            ends = np.unique(found[term.accept[states]])
            if ends.size:
                below(plain.spawn(col, t)[0], ends, depth + 1)

    for col, t, q in state[0]:
        inside |= engine.index[t].mask(q)
        nodes = engine.index[t].boundary(q)
        if nodes.size:
            below(plain.spawn(col, t)[0], nodes, 0)
    out = np.unpackbits(inside.view(np.uint8), bitorder="little").astype(bool)
    hit = np.concatenate(tokens) if tokens else np.zeros(0, np.int64)
    out[hit] = True
    if trie.dup_token.size:
        out[trie.dup_token] |= out[trie.dup_of]
    out = out[: info.vocab_size]
    out[list(info.stop_token_ids)] = state[1]
    return out


# --- vocabularies ----------------------------------------------------------------------------

SYNTHETIC_PIECES = [
    '{"', '":', '": ', '",', '", "', '"}', '},', '}, {', '}]', '}]}', '}]}]', '[{', '[{"', ', "', ',"',
    'true', 'false', 'null', 'nu', 'll', '12', '0.5', '-1', 'e3', '"v": ', '"kids": [', 'kids', '"h": ', '"t": ',
    ' {"', '[]', '[[', ']]', '],', ', ', '+1', '*(', ')+', ') ', '(-', '99', '\u00e9', '"x', '\\"', '\\u00',
]


def _synthetic_info() -> TokenizerInfo:
    """Printable ASCII bytes, a few UTF-8 and whitespace bytes, multi-byte JSON/arith pieces, one
    byte-duplicate token, and a stop token."""
    pieces = [bytes([b]) for b in range(0x20, 0x7F)] + [b"\n", b"\t", b"\xc3", b"\xa9"]
    pieces += [p.encode() for p in SYNTHETIC_PIECES] + [b'":']  # NOTE: a byte-duplicate token
    token_bytes: list[bytes | None] = list(pieces) + [None]
    return TokenizerInfo(token_bytes, len(token_bytes) + 5, (len(pieces),), frozenset({len(pieces)}))


def _synthetic_encode(info: TokenizerInfo, text: str) -> list[int]:
    """Greedy longest-match tokenization over the synthetic vocabulary."""
    data, out, i = text.encode(), [], 0
    by_bytes = {b: t for t, b in enumerate(info.token_bytes) if b is not None}
    longest = max(len(b) for b in by_bytes)
    while i < len(data):
        n = next(n for n in range(min(longest, len(data) - i), 0, -1) if data[i : i + n] in by_bytes)
        out.append(by_bytes[data[i : i + n]])
        i += n
    return out


def _real_vocabs() -> list[str]:
    return [n for n in ("gpt-2", "deepseek-llm") if (shared_data() / "tokenizers" / n).is_dir()]


_COMPILERS: dict[str, GrammarCompiler] = {}


def _compiler(vocab: str) -> GrammarCompiler:
    if vocab not in _COMPILERS:
        _COMPILERS[vocab] = GrammarCompiler(_synthetic_info() if vocab == "synthetic" else load_tokenizer(vocab))
    return _COMPILERS[vocab]


def _compile(comp: GrammarCompiler, kind: str, source: str):
    compiled = comp.compile_json_schema(source) if kind == "json_schema" else comp.compile_ebnf(source)
    assert isinstance(compiled.engine, EarleyEngine)
    return compiled


# --- walks -----------------------------------------------------------------------------------

def _bits(matcher: GrammarMatcher, vocab: int) -> np.ndarray:
    bm = allocate_token_bitmask(1, vocab)
    matcher.fill_next_token_bitmask(bm, 0)
    return unpack_bitmask(bm, vocab)[0].numpy()


def _check_walk(compiled, reference, tokens: list[int] | None, rng: random.Random, steps: int) -> int:
    """Walk a matcher (along ``tokens``, or by random allowed tokens) and the plain recognizer side
    by side; every mask must equal ``reference(plain, state)``. Returns the steps checked."""
    info = compiled.tokenizer_info
    plain = _Plain(compiled.engine.cfg)
    state = plain.initial()
    matcher = GrammarMatcher(compiled)
    stops = set(info.stop_token_ids)
    for i in range(len(tokens) + 1 if tokens is not None else steps):
        got = _bits(matcher, info.vocab_size)
        want = reference(plain, state)
        diff = np.nonzero(got != want)[0]
        assert diff.size == 0, (i, [(int(t), info.token_bytes[t], bool(got[t])) for t in diff[:8]])
        if tokens is not None:
            if i == len(tokens):
                assert matcher.can_terminate() and state[1]
                return i + 1
            tid = tokens[i]
        else:
            allowed = [t for t in np.nonzero(got)[0].tolist() if t not in stops]
            if not allowed:
                return i + 1
            tid = rng.choice(allowed)
        assert matcher.accept_token(tid)
        state = plain.advance(state, info.token_bytes[tid])
        assert state is not None
    return steps


@pytest.mark.parametrize("name,kind,source,docs", GRAMMARS, ids=IDS)
def test_masks_equal_brute_force_synthetic_vocab(name: str, kind: str, source: str, docs: list[str]) -> None:
    comp = _compiler("synthetic")
    info = comp.tokenizer_info
    compiled = _compile(comp, kind, source)
    ref = lambda plain, state: _brute_mask(plain, state, info)  # noqa: E731
    for doc in docs:
        _check_walk(compiled, ref, _synthetic_encode(info, doc), random.Random(0), 0)
    for seed in range(3):
        _check_walk(compiled, ref, None, random.Random(seed), 40)


@pytest.mark.parametrize("settings", [
    {"STACK_STATES": 40},  # most terminals walked alone, a few stacked
    {"STACK_TERMINAL_STATES": 0},  # no terminal stacked
    {"EAGER_TERMINAL_STATES": 0},  # narrow state masks only at compile time
    {"EAGER_TERMINAL_STATES": 0, "EAGER_NARROW_STATES": 0},  # every mask on first visit
], ids=["few-stacked", "none-stacked", "narrow-eager", "all-lazy"])
@pytest.mark.parametrize("name,kind,source,docs", [g for g in GRAMMARS if g[0] in ("forest", "json", "arith")],
                         ids=["forest", "json", "arith"])
def test_masks_equal_brute_force_engine_settings(monkeypatch, settings: dict, name: str, kind: str, source: str,
                                                 docs: list[str]) -> None:
    from radixlm.grammar import earley_engine

    for key, value in settings.items():
        monkeypatch.setattr(earley_engine, key, value)
    comp = GrammarCompiler(_synthetic_info())  # NOTE: a fresh compiler: no grammar cached under other settings
    info = comp.tokenizer_info
    compiled = _compile(comp, kind, source)
    ref = lambda plain, state: _brute_mask(plain, state, info)  # noqa: E731
    for doc in docs:
        _check_walk(compiled, ref, _synthetic_encode(info, doc), random.Random(0), 0)
    _check_walk(compiled, ref, None, random.Random(5), 30)


@pytest.mark.parametrize("vocab", _real_vocabs())
@pytest.mark.parametrize("name,kind,source,docs", GRAMMARS, ids=IDS)
def test_masks_equal_former_algorithm_real_vocab(vocab: str, name: str, kind: str, source: str, docs: list[str]) -> None:
    comp = _compiler(vocab)
    info = comp.tokenizer_info
    compiled = _compile(comp, kind, source)
    ref = lambda plain, state: _former_mask(compiled.engine, plain, state, info)  # noqa: E731
    tok = load_tokenizer(vocab)
    for doc in docs:
        _check_walk(compiled, ref, encode_exact(tok, info, doc), random.Random(0), 0)
    _check_walk(compiled, ref, None, random.Random(1), 25)


def test_chart_columns_are_shared_by_content() -> None:
    """A long list reuses the columns of its earlier elements: the chart stops growing (it grew by
    ~17 columns per element before columns were shared by content)."""
    info = _synthetic_info()
    sizes = []
    for n in (5, 60):
        compiled = _compile(GrammarCompiler(info), "json_schema", json.dumps(FOREST))
        m = GrammarMatcher(compiled)
        for tid in _synthetic_encode(info, json.dumps([_tree(1, 2)] * n)):
            assert m.accept_token(tid)
        assert m.can_terminate()
        sizes.append(compiled.engine.chart.n_columns)
    assert sizes[0] == sizes[1] < 60, sizes


def test_eager_masks_stop_within_their_budget_share(monkeypatch) -> None:
    """Under a tight compile budget the eager narrow masks stop early (their share spent), the
    compile still succeeds, and the masks left for first visits are still exact."""
    from radixlm.grammar import earley_engine
    from radixlm.grammar.budget import budget_spent, compile_budget

    monkeypatch.setattr(earley_engine, "EAGER_TERMINAL_STATES", 0)
    monkeypatch.setattr(earley_engine, "EAGER_NARROW_STATES", 0)
    _compile(GrammarCompiler(_synthetic_info()), "ebnf", JSON_EBNF)  # NOTE: terminal DFAs memoized
    with compile_budget(units=10**9):
        _compile(GrammarCompiler(_synthetic_info()), "ebnf", JSON_EBNF)
        base = budget_spent()  # the compile without eager masks
    monkeypatch.setattr(earley_engine, "EAGER_NARROW_STATES", 10**6)
    comp = GrammarCompiler(_synthetic_info())
    info = comp.tokenizer_info
    with compile_budget(units=base + 40):
        compiled = _compile(comp, "ebnf", JSON_EBNF)
    assert any(len(idx.masks) < idx.trans.shape[0] - 1 for idx in compiled.engine.index)
    ref = lambda plain, state: _brute_mask(plain, state, info)  # noqa: E731
    _check_walk(compiled, ref, _synthetic_encode(info, GRAMMARS[3][3][0]), random.Random(0), 0)


def test_grammar_matching_nothing_is_a_clean_compile_error():
    """A recursive grammar whose start matches nothing fails with GrammarError (was a TypeError
    from the lowering: MaskBench Github_easy---o46142 crashed the compiler)."""
    from radixlm.grammar.ast import NOTHING, lit
    from radixlm.grammar.cfg import lower
    from radixlm.grammar.errors import GrammarError

    with pytest.raises(GrammarError, match="matches no output"):
        lower(("cat", (("ref", "r"), NOTHING)), {"r": lit("a")})
    assert lower(("cat", (("ref", "r"), lit("b"))), {"r": lit("a")}).start is not None
