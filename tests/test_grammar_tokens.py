"""Token-level behaviour on the real vocabularies: byte decoding, masks against a brute-force
reference, bitmask layout and application, rollback, jump-forward, EBNF and choices (issue 4)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from radixlm.grammar import (GrammarError, GrammarMatcher, allocate_token_bitmask,
                             apply_token_bitmask_inplace)
from radixlm.grammar.bitmask import unpack_bitmask
from radixlm.grammar.maskbench import (DEFAULT_TOKENIZER, TOKENIZERS, encode_exact, load_compiler, load_tokenizer,
                                       shared_data, tokenizer_available)
from radixlm.grammar.testing import ARITH_EBNF, JSON_EBNF


def tokenizers(*names: str) -> list:
    """``names`` as pytest params; shared tokenizers skip where ``$RADIXLM_SHARED_DATA`` lacks them,
    the default model's vocabulary (``smollm2``) runs everywhere."""
    return [pytest.param(n, marks=pytest.mark.skipif(not tokenizer_available(n),
                                                     reason=f"{n} not under {shared_data()}")) for n in names]


BPE = tokenizers(DEFAULT_TOKENIZER, "gpt-2")  # byte-level BPE: the default model's and GPT-2's

TEXT = '{"naïve": "日本語 😀\\n\\t", "x": [1.5e-3, -0], "q": "\\"quoted\\""}\n  ok'


def _bits(compiled_or_matcher: GrammarMatcher, vocab_size: int) -> np.ndarray:
    bm = allocate_token_bitmask(1, vocab_size)
    compiled_or_matcher.fill_next_token_bitmask(bm)
    return unpack_bitmask(bm, vocab_size)[0].numpy()


def _brute(matcher: GrammarMatcher, token_ids: list[int]) -> np.ndarray:
    """Reference mask: try every token on a fresh copy of the state."""
    out = np.zeros(matcher.compiled.tokenizer_info.vocab_size, dtype=bool)
    for t in token_ids:
        if matcher.accept_token(t):
            out[t] = True
            matcher.rollback(1)
    return out


@pytest.mark.parametrize("name", tokenizers(DEFAULT_TOKENIZER, *TOKENIZERS))
def test_token_bytes_roundtrip(name: str) -> None:
    tok, comp = load_tokenizer(name), load_compiler(name)
    info = comp.tokenizer_info
    ids = encode_exact(tok, info, TEXT)
    assert b"".join(info.token_bytes[i] for i in ids) == TEXT.encode()
    for sid in tok.all_special_ids:
        assert info.token_bytes[sid] is None
    assert tok.eos_token_id in info.stop_token_ids
    assert info.mask_words == (info.vocab_size + 31) // 32


@pytest.mark.parametrize("name", tokenizers(DEFAULT_TOKENIZER, "gpt-2", "phi-3"))
def test_masks_match_brute_force(name: str) -> None:
    """Along real tokenizations, the filled bitmask equals trying every token (regex, JSON
    Schema via both engines, EBNF), incl. tokens ending inside multi-byte characters."""
    tok, comp = load_tokenizer(name), load_compiler(name)
    info = comp.tokenizer_info
    rng = random.Random(0)
    sample = sorted(set(rng.sample(range(info.tokenizer_size), 3000)) | set(info.stop_token_ids))
    cases = [
        (comp.compile_regex(r"[a-zé]{1,6}( [0-9]+)?"), "abé 42"),
        (comp.compile_json_schema({"type": "object", "properties": {"s": {"type": "string"}, "n": {"type": "number"}}}),
         '{"s": "日本 é", "n": -1.5}'),
        (comp.compile_json_schema({"type": "array", "items": {}}), '[{"a": ["é", null]}, 2]'),
        (comp.compile_ebnf('root: "(" root ")" | NUM\nNUM: /[0-9]+/'), "((12))"),
    ]
    for compiled, text in cases:
        matcher = GrammarMatcher(compiled)
        ids = encode_exact(tok, info, text)
        for step, tid in enumerate(ids + [None]):
            got = _bits(matcher, info.vocab_size)
            want = _brute(matcher, sample + ([tid] if tid is not None else []))
            idx = np.asarray(sample)
            assert (got[idx] == want[idx]).all(), (compiled, text, step, np.nonzero(got[idx] != want[idx]))
            if tid is not None:
                assert got[tid] and matcher.accept_token(tid)
        assert matcher.accept_token(info.stop_token_ids[0]) and matcher.is_terminated()


@pytest.mark.parametrize("name", BPE)
def test_vocab_padding_and_special_tokens(name: str) -> None:
    tok = load_tokenizer(name)
    from radixlm.grammar import GrammarCompiler

    size, eos = len(tok), tok.eos_token_id
    padded = (size + 127) // 128 * 128 + 64  # the model pads its logits
    comp = GrammarCompiler(tok, vocab_size=padded)
    m = GrammarMatcher(comp.compile_regex(".*"))
    bits = _bits(m, padded)
    specials = set(tok.all_special_ids)
    assert bits[[i for i in range(size) if i not in specials]].sum() > 0.99 * (size - len(specials))
    assert not bits[size:].any()  # padding rows are never allowed
    assert not any(bits[i] for i in specials if i != eos)  # special tokens are not text
    assert bits[eos]  # EOS: ".*" accepts the empty output
    assert not m.accept_token(padded - 1)
    m2 = GrammarMatcher(comp.compile_regex("a+"))
    assert not _bits(m2, padded)[eos]  # EOS only where the grammar accepts


def test_apply_bitmask_against_dense_reference() -> None:
    gen = torch.Generator().manual_seed(0)
    for vocab, width in [(100, 100), (1000, 1003), (64, 70)]:
        logits = torch.randn(4, width, generator=gen)
        allowed = torch.rand(4, vocab, generator=gen) < 0.3
        words = (vocab + 31) // 32
        bitmask = torch.zeros(4, words, dtype=torch.int32)
        for b in range(4):
            for t in torch.nonzero(allowed[b]).flatten().tolist():
                bitmask[b, t // 32] |= (1 << (t % 32)) if t % 32 != 31 else -(1 << 31)
        covered = min(width, 32 * words)
        pad = torch.zeros(4, 32 * words, dtype=torch.bool)
        pad[:, :vocab] = allowed

        def masked(row: torch.Tensor, b: int) -> torch.Tensor:
            out = row.clone()
            out[:covered] = torch.where(pad[b, :covered], out[:covered], torch.tensor(float("-inf")))
            return out

        out = logits.clone()
        apply_token_bitmask_inplace(out, bitmask)
        assert all(torch.equal(out[b], masked(logits[b], b)) for b in range(4))
        sub = logits.clone()
        apply_token_bitmask_inplace(sub, bitmask[:2], indices=[3, 1])  # bitmask row i -> logits row indices[i]
        assert torch.equal(sub[3], masked(logits[3], 0)) and torch.equal(sub[1], masked(logits[1], 1))
        assert torch.equal(sub[0], logits[0]) and torch.equal(sub[2], logits[2])


@pytest.mark.parametrize("name", BPE)
def test_fill_rows_and_full_mask_allocation(name: str) -> None:
    comp = load_compiler(name)
    vocab = comp.tokenizer_info.vocab_size
    bm = allocate_token_bitmask(3, vocab)
    assert bm.dtype == torch.int32 and bm.shape == (3, (vocab + 31) // 32) and (bm == -1).all()
    m = GrammarMatcher(comp.compile_choices(["yes", "no"]))
    m.fill_next_token_bitmask(bm, index=1)
    assert (bm[0] == -1).all() and (bm[2] == -1).all()
    allowed = torch.nonzero(unpack_bitmask(bm[1:2], vocab)[0]).flatten().tolist()
    info = comp.tokenizer_info
    assert allowed and all(b"yes".startswith(info.token_bytes[t]) or b"no".startswith(info.token_bytes[t]) for t in allowed)


@pytest.mark.skipif(not tokenizer_available("deepseek-llm"), reason="deepseek-llm not in the shared data")
def test_rollback_and_reset() -> None:
    comp, tok = load_compiler("deepseek-llm"), load_tokenizer("deepseek-llm")
    info = comp.tokenizer_info
    compiled = comp.compile_json_schema({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}})
    m = GrammarMatcher(compiled)
    ids = encode_exact(tok, info, '{"a": 12, "b": "xy"}')
    masks = []
    for t in ids:
        masks.append(m.next_token_mask())
        assert m.accept_token(t)
    assert not m.accept_token(tok.encode("}", add_special_tokens=False)[0])  # rejected: unchanged
    for k in range(len(ids), 0, -1):
        m.rollback(1)
        assert (m.next_token_mask() == masks[k - 1]).all()
    with pytest.raises(ValueError):
        m.rollback(1)
    for t in ids:
        assert m.accept_token(t)
    assert m.accept_token(info.stop_token_ids[0]) and m.is_terminated()
    assert not m.accept_token(ids[0])
    m.rollback(1)
    assert not m.is_terminated() and m.can_terminate()
    m.reset()
    assert (m.next_token_mask() == masks[0]).all()


@pytest.mark.parametrize("name", BPE)
def test_jump_forward(name: str) -> None:
    comp = load_compiler(name)
    m = GrammarMatcher(comp.compile_regex(r"abc(d|e)fg"))
    assert m.find_jump_forward_string() == "abc"
    assert m.accept_string("abcd")
    assert m.find_jump_forward_string() == "fg"
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "kind": {"enum": ["élan"]}},
              "required": ["name", "kind"]}
    # NOTE: open, an undeclared key may come first (not one starting as a declared key does)
    m = GrammarMatcher(comp.compile_json_schema(schema))
    assert m.find_jump_forward_string() == '{"' and m.accept_string('{"x": 1, "n')
    assert m.find_jump_forward_string() == 'ame":'
    # NOTE: closed objects (serving's default)
    closed = {"disable_additional_properties": True}
    for compiled, after in ((comp.compile_json_schema(schema, **closed), '"kind":'),
                            (comp.compile_json_schema({**schema, "properties": {**schema["properties"], "x": {}}},
                                                      **closed), '"')):
        m = GrammarMatcher(compiled)
        assert m.find_jump_forward_string() == '{"'  # properties in any order: the first key is a choice
        assert m.accept_string('{"n')
        assert m.find_jump_forward_string() == 'ame":'
        assert m.accept_string('ame": "Bo"')
        assert m.find_jump_forward_string() == ","  # then " " or not: a choice
        assert m.accept_string(", ")
        assert m.find_jump_forward_string() == after  # "kind" is left (and "x" in the second)
    m = GrammarMatcher(comp.compile_regex("é€|é£"))
    assert m.find_jump_forward_string() == "é"  # stops before the undecided character
    m = GrammarMatcher(comp.compile_ebnf('root: "let " NAME " = 1"\nNAME: /[a-z]+/'))
    assert m.find_jump_forward_string() == "let "
    assert m.accept_string("let x")
    assert m.find_jump_forward_string() == ""  # the name may go on
    assert m.accept_string(" ")
    assert m.find_jump_forward_string() == "= 1"


@pytest.mark.parametrize("name", tokenizers(DEFAULT_TOKENIZER, "llama-spm"))
def test_jump_forward_keeps_output_valid(name: str) -> None:
    """Appending the forced strings and re-tokenizing gives tokens the matcher accepts."""
    comp, tok = load_compiler(name), load_tokenizer(name)
    info = comp.tokenizer_info
    compiled = comp.compile_json_schema({"type": "object", "properties": {"id": {"type": "integer"}, "tag": {"const": "v1"}},
                                         "required": ["id", "tag"]}, disable_additional_properties=True)
    m = GrammarMatcher(compiled)

    def jump() -> str:
        """All forced text from here on (a jump may stop early, e.g. at a string's end)."""
        out = ""
        while forced := m.find_jump_forward_string():
            assert m.accept_string(forced)
            out += forced
        return out

    text = jump()
    assert text == '{"' and m.accept_string("i")  # properties in any order: a choice
    text += "i" + jump()
    assert text == '{"id":' and m.accept_string(" 7, ")
    text += " 7, " + jump()
    assert text == '{"id": 7, "tag":' and m.accept_string(" ")
    text += " " + jump()
    assert text == '{"id": 7, "tag": "v1"}'  # closed: no undeclared key may follow
    assert m.can_terminate()
    m2 = GrammarMatcher(compiled)
    for t in encode_exact(tok, info, text):
        assert m2.accept_token(t)
    assert m2.can_terminate()


EBNF_CASES = [
    ("arith", ARITH_EBNF, ["1+2*3", "(1 + 2) * -3.5", " 4 "], ["1+", "(1", "1 2"]),
    ("json", JSON_EBNF, ['{"a": [1, {"b": null}], "c": "x"}', "[]", ' [ true ] '], ['{"a" 1}', "[1,]", "nul"]),
    ("case-insensitive keyword", 'root: "select"i " " NAME\nNAME: /[a-z_]+/', ["SeLeCt a_b"], ["select", "selec a"]),
]


@pytest.mark.parametrize("name,grammar,good,bad", EBNF_CASES, ids=[c[0] for c in EBNF_CASES])
@pytest.mark.parametrize("tok_name", BPE)
def test_ebnf(tok_name: str, name: str, grammar: str, good: list[str], bad: list[str]) -> None:
    comp, tok = load_compiler(tok_name), load_tokenizer(tok_name)
    compiled = comp.compile_ebnf(grammar)
    for text in good:
        m = GrammarMatcher(compiled)
        for t in encode_exact(tok, comp.tokenizer_info, text):
            assert _bits(m, comp.tokenizer_info.vocab_size)[t], (text, t)
            assert m.accept_token(t), (text, t)
        assert m.can_terminate(), text
    for text in bad:
        m = GrammarMatcher(compiled)
        assert not (m.accept_string(text) and m.can_terminate()), text


@pytest.mark.parametrize("name", BPE)
def test_ebnf_errors_and_root(name: str) -> None:
    comp = load_compiler(name)
    with pytest.raises(GrammarError):
        comp.compile_ebnf("root: (")
    with pytest.raises(GrammarError, match="root"):
        comp.compile_ebnf('start: "a"')
    m = GrammarMatcher(comp.compile_ebnf('start: "a" | "b"', root="start"))
    assert m.accept_string("b") and m.can_terminate()


@pytest.mark.skipif(not tokenizer_available("phi-3"), reason="phi-3 not in the shared data")
def test_choices_and_cache() -> None:
    comp, tok = load_compiler("phi-3"), load_tokenizer("phi-3")
    compiled = comp.compile_choices(["New York", "New Delhi", "Paris"])
    assert comp.compile_choices(["New York", "New Delhi", "Paris"]) is compiled
    for text in ["New York", "Paris"]:
        m = GrammarMatcher(compiled)
        assert all(m.accept_token(t) for t in encode_exact(tok, comp.tokenizer_info, text)) and m.can_terminate()
    m = GrammarMatcher(compiled)
    assert m.find_jump_forward_string() == ""
    assert m.accept_string("New ") and not m.accept_string("Paris")
    assert comp.compile_json_schema(json.dumps({"type": "integer"})) is comp.compile_json_schema('{"type": "integer"}')
