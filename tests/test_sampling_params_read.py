"""One sampling-parameter definition (issue 16): ``runtime/sampling_params.py``. Every field it
defines is read by the runtime (static check: the third copy of the parameters is how
``stop_regex`` came to be silently ignored), and every entry point (the native and OpenAI HTTP
models, the DSL, the in-process Engine) carries every field it accepts into that one dataclass."""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import pytest

import radixlm
from radixlm.runtime.sampling_params import SamplingParams

ROOT = pathlib.Path(radixlm.__file__).parent
GRAMMAR_FIELDS = {"regex", "json_schema", "ebnf"}  # exclusive; read via SamplingParams.grammar
VIA_GRAMMAR = GRAMMAR_FIELDS | {"disable_additional_properties"}  # also read there
FIELDS = [f.name for f in dataclasses.fields(SamplingParams)]
# A valid non-default value of every field (the constraint fields are exclusive: one at a time).
NON_DEFAULT = {
    "max_new_tokens": 7, "min_new_tokens": 2, "n": 3, "stop": ["\n\n"], "stop_token_ids": [5],
    "stop_regex": ["[0-9]{3}"], "temperature": 0.5, "top_p": 0.9, "top_k": 4, "min_p": 0.1,
    "frequency_penalty": 0.25, "presence_penalty": -0.5, "repetition_penalty": 1.5, "ignore_eos": True,
    "skip_special_tokens": False, "spaces_between_special_tokens": False, "regex": "[a-z]+",
    "json_schema": '{"type": "object"}', "ebnf": 'root ::= "a"', "seed": 11,
    "logit_bias": {5: -100.0, 7: 2.5}, "disable_additional_properties": False,
}
CASES = [{k: v for k, v in NON_DEFAULT.items() if k not in GRAMMAR_FIELDS - {g}} for g in sorted(GRAMMAR_FIELDS)]


def _attribute_reads(paths) -> set[str]:
    names = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                names.add(node.attr)
    return names


def _set_fields(sp: SamplingParams, case: dict) -> dict:
    return {k: getattr(sp, k) for k in case}


def test_every_sampling_field_is_read_by_the_runtime():
    runtime = [p for p in (ROOT / "runtime").rglob("*.py") if p.name != "sampling_params.py"
               and "server" not in p.parts]
    reads = _attribute_reads(runtime)
    unread = sorted(f for f in set(FIELDS) - VIA_GRAMMAR if f not in reads)
    assert not unread, f"sampling parameters accepted but never read by the runtime: {unread}"
    assert "grammar" in reads  # the constraint fields' reader
    source = (ROOT / "runtime" / "sampling_params.py").read_text()
    assert all(f"self.{f}" in source for f in VIA_GRAMMAR)


def test_non_default_table_covers_every_field():
    assert set(NON_DEFAULT) == set(FIELDS)
    default = SamplingParams()
    assert all(getattr(default, k) != v for k, v in NON_DEFAULT.items())


def test_edge_sampling_fields_are_the_runtime_fields():
    from radixlm.runtime.server.protocol import NativeSamplingParams

    assert set(NativeSamplingParams.model_fields) == set(FIELDS)


@pytest.mark.parametrize("case", CASES, ids=sorted(GRAMMAR_FIELDS))
def test_native_edge_carries_every_field(case):
    from radixlm.runtime.server.protocol import GenerateReqInput

    body = GenerateReqInput.model_validate({"text": "hi", "sampling_params": case})
    assert _set_fields(body.sampling_params.to_runtime(), case) == case


@pytest.mark.parametrize("case", CASES, ids=sorted(GRAMMAR_FIELDS))
def test_openai_edge_carries_every_field_it_accepts(case):
    from radixlm.runtime.server.http_openai import _sampling
    from radixlm.runtime.server.protocol import ChatCompletionRequest

    renamed = {"min_new_tokens": "min_tokens"}
    fields = ChatCompletionRequest.model_fields
    body = {renamed.get(k, k): v for k, v in case.items() if renamed.get(k, k) in fields}
    req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}], **body})
    sp = _sampling(req, case["max_new_tokens"], None)
    carried = {k: v for k, v in case.items() if renamed.get(k, k) in fields or k == "max_new_tokens"}
    assert _set_fields(sp, carried) == carried
    # NOTE: the OpenAI API has no spaces_between_special_tokens; everything else is accepted
    assert set(case) - set(carried) <= {"spaces_between_special_tokens"}


@pytest.mark.parametrize("case", CASES, ids=sorted(GRAMMAR_FIELDS))
def test_dsl_carries_every_field_without_a_dict_round_trip(case):
    from radixlm.interpreter.backend import _payload
    from radixlm.lang.ir import SamplingParams as DslSamplingParams

    request_level = {"dtype", "logprob_start_len", "return_logprob", "return_text_in_logprobs", "top_logprobs_num"}
    assert {f.name for f in dataclasses.fields(DslSamplingParams)} - request_level == set(FIELDS)
    dsl = DslSamplingParams(**case)
    sp = _payload("p", dsl, typed=True)["sampling_params"]
    assert isinstance(sp, SamplingParams)
    expected = {k: v for k, v in case.items() if k != "n"}  # NOTE: the interpreter expands n itself
    assert _set_fields(sp, expected) == expected
    assert _payload("p", dsl)["sampling_params"] == expected


def test_engine_takes_the_typed_params_as_is():
    from radixlm.interpreter.engine_backend import EngineBackend
    from radixlm.lang.ir import SamplingParams as DslSamplingParams

    seen = []

    class FakeEngine:
        tokenizer = None

        def generate(self, prompt=None, input_ids=None, sampling_params=None, stream=False, **kw):
            seen.append(sampling_params)
            return {"text": "", "output_ids": [], "meta_info": {}}

    EngineBackend(FakeEngine()).generate("p", DslSamplingParams(temperature=0.0, stop_regex="x"))
    assert isinstance(seen[0], SamplingParams) and seen[0].stop_regex == ["x"]
    assert SamplingParams.from_dict(seen[0]) is seen[0]


def test_validation_names_the_field():
    with pytest.raises(ValueError, match="stop_regex"):
        SamplingParams.from_dict({"stop_regex": "("})
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams.validated(top_k=0)


def test_json_schema_verdict_is_cached_per_text() -> None:
    """Meta-validation runs once per schema text; a cached verdict still rejects every time."""
    from radixlm.runtime.sampling_params import _schema_problem, check_json_schema

    good = {"type": "object", "properties": {"cached-verdict": {"type": "integer", "minimum": 0}}}
    bad = '{"type": "array", "minItems": -5, "x-cached-verdict": 1}'
    before = _schema_problem.cache_info()
    assert check_json_schema(good) == check_json_schema(good) == check_json_schema(__import__("json").dumps(good))
    for _ in range(2):
        with pytest.raises(ValueError, match="invalid json_schema"):
            check_json_schema(bad)
    with pytest.raises(ValueError, match="not valid JSON"):
        check_json_schema('{"type": ')
    with pytest.raises(ValueError, match="must be a JSON object"):
        check_json_schema("[1]")
    with pytest.raises(ValueError, match="not JSON-serializable"):
        check_json_schema({"type": "object", "default": object()})
    after = _schema_problem.cache_info()
    assert after.misses - before.misses == 4 and after.hits - before.hits >= 3
