"""``separators``: how a constrained JSON document writes ``,`` / ``:``. Accept/reject tables
walked token by token on real vocabularies (every step allowed by the bitmask), for a single-DFA
schema, a recursive (Earley) one and an array; and what jump-forward writes once the style is
fixed ("consistent", serving's default) against each separator left open ("either")."""

from __future__ import annotations

import json

import pytest

from radixlm.grammar import GrammarMatcher
from radixlm.grammar.bitmask import allocate_token_bitmask
from radixlm.grammar.backends import make_backend
from radixlm.grammar.maskbench import (
    DEFAULT_TOKENIZER, load_compiler, load_tokenizer, run_instance, schema_validator, table_vocabularies,
)

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age"]}
TREE = {"$ref": "#/$defs/n", "$defs": {"n": {"type": "object", "properties": {
    "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "required": ["v"]}}}
POINTS = {"type": "array", "items": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}}

VALUES = [("person", PERSON, {"name": "Ann", "age": 3, "tags": ["a", "b"]}),
          ("tree (Earley)", TREE, {"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 3}]}),
          ("array of pairs", POINTS, [[1, 2.5], [3, 4]])]


def _spellings(value) -> dict[str, str]:
    """The value written spaced, compact, and with the styles mixed (spaced after the first
    separator style, compact elsewhere: one way each way round)."""
    spaced, compact = json.dumps(value), json.dumps(value, separators=(",", ":"))
    head, tail = compact.split(",", 1)
    return {"spaced": spaced, "compact": compact, "mixed": head + ", " + tail,
            "mixed colon": json.dumps(value, separators=(",", ": "))}


# separators option -> the spellings it accepts (the others it refuses)
ACCEPTS = {"either": {"spaced", "compact", "mixed", "mixed colon"}, "consistent": {"spaced", "compact"},
           "compact": {"compact"}, "spaced": {"spaced"}}


@pytest.mark.parametrize("vocab", table_vocabularies())
def test_separator_styles_token_by_token(vocab: str) -> None:
    comp, tok = load_compiler(vocab), load_tokenizer(vocab)
    bitmask = allocate_token_bitmask(1, comp.tokenizer_info.vocab_size)
    failures = []
    for name, schema, value in VALUES:
        texts = _spellings(value)
        assert all(schema_validator(schema).is_valid(json.loads(t)) for t in texts.values())
        if name == "array of pairs":  # NOTE: its first separator is a comma: "mixed colon" has no colon
            texts.pop("mixed colon")
        for option, accepted in ACCEPTS.items():
            compiled = comp.compile_json_schema(schema, separators=option, disable_additional_properties=True)
            for style, text in texts.items():
                res = run_instance(compiled, tok, text, style in accepted, bitmask)
                assert res.mismatch is None, (name, option, style, res.mismatch)
                if res.accepted != (style in accepted):
                    failures.append((name, option, style, res.accepted))
    assert not failures, failures


def _forced_after(compiled, text: str) -> str:
    m = GrammarMatcher(compiled)
    assert m.accept_string(text), text
    return m.find_jump_forward_string()


def test_consistent_separators_let_jump_forward_write_them() -> None:
    comp = load_compiler(DEFAULT_TOKENIZER)
    pair = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"]}
    either = comp.compile_json_schema(pair, disable_additional_properties=True)
    consistent = comp.compile_json_schema(pair, disable_additional_properties=True, separators="consistent")
    # NOTE: after `{"a": 1,` the key is known, but not the space before it unless the style is fixed
    assert _forced_after(either, '{"a": 1,') == ""
    assert _forced_after(consistent, '{"a": 1,') == ' "b": '
    assert _forced_after(consistent, '{"a":1,') == '"b":'
    tree = comp.compile_json_schema(TREE, separators="consistent", disable_additional_properties=True)
    assert not GrammarMatcher(tree).accept_string('{"v": 1, "kids": [{"v":1')  # NOTE: mixed
    assert _forced_after(tree, '{"v": 1, "kids": [{"kids": [],') == ' "v": '


def test_options_checked_and_serving_default() -> None:
    comp = load_compiler(DEFAULT_TOKENIZER)
    with pytest.raises(ValueError, match="separators"):
        comp.compile_json_schema(PERSON, separators="tight")
    with pytest.raises(ValueError, match="separators"):
        comp.compile_json_schema(PERSON, any_whitespace=True, separators="consistent")
    backend = make_backend("radixlm", load_tokenizer(DEFAULT_TOKENIZER), comp.tokenizer_info.vocab_size)
    compiled = backend.compile("json_schema", json.dumps(TREE), disable_additional_properties=True)
    m = backend.matcher(compiled)
    assert m.accept_string('{"v": 1,') and m.find_jump_forward_string() == ' "kids": ['


def test_too_large_consistent_falls_back_to_either(monkeypatch) -> None:
    """A schema whose two copies exceed the budget compiles with either style at each separator
    instead of failing the request."""
    import radixlm.grammar.compiler as compiler_mod
    from radixlm.grammar import GrammarError

    real = compiler_mod.json_schema_to_ast

    def consistent_too_large(schema, any_whitespace=False, grammar=False, closed=False, separators="either"):
        if separators == "consistent":
            raise GrammarError("grammar too complex: compile budget of 1 work units exceeded while testing")
        return real(schema, any_whitespace, grammar=grammar, closed=closed, separators=separators)

    monkeypatch.setattr(compiler_mod, "json_schema_to_ast", consistent_too_large)
    comp = load_compiler(DEFAULT_TOKENIZER)
    schema = {"type": "object", "properties": {"fallback-separators": {"type": "integer"}}}
    compiled = comp.compile_json_schema(schema, separators="consistent", disable_additional_properties=True)
    assert GrammarMatcher(compiled).accept_string('{"fallback-separators":1}')
    assert GrammarMatcher(compiled).accept_string('{"fallback-separators": 1}')
