"""Closed JSON objects on the real default model (SmolLM2-135M-Instruct): with undeclared keys
allowed where the schema is silent (JSON Schema's semantics) the model invents keys; with
``disable_additional_properties`` (serving's default) every extraction is the schema's object."""

from __future__ import annotations

import json

import jsonschema
import pytest

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}}, "required": ["name", "age"]}
TEXTS = ["Maria Lopez is 34 and lives in Madrid.", "Tom, aged 71, retired to Brighton.",
         "Our new intern Li Wei (19) is from Chengdu."]


@pytest.fixture(scope="module")
def engine():
    from radixlm.runtime.default_model import default_model_path
    from radixlm.runtime.engine import Engine

    eng = Engine(model_path=default_model_path())
    yield eng
    eng.shutdown()


def _extract(engine, closed: bool) -> list[dict]:
    tok = engine.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Extract the person as JSON: {t}"}],
                                       tokenize=False, add_generation_prompt=True) for t in TEXTS]
    return engine.generate(prompts, {"max_new_tokens": 60, "temperature": 0, "json_schema": json.dumps(SCHEMA),
                                     "disable_additional_properties": closed})


def test_closed_objects_end_with_declared_keys_on_the_real_model(engine):
    closed = _extract(engine, True)
    for out in closed:
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out["text"]
        obj = json.loads(out["text"])
        jsonschema.validate(obj, SCHEMA)
        assert set(obj) <= set(SCHEMA["properties"])
    objs = [json.loads(o["text"]) for o in closed]
    assert [o["name"].split()[0] for o in objs] == ["Maria", "Tom", "Li"] and [o["age"] for o in objs[:2]] == [34, 71]
    opened = _extract(engine, False)
    # NOTE: the same greedy decoding with JSON Schema's semantics writes keys of its own
    assert any(o["meta_info"]["finish_reason"]["type"] == "length" or set(json.loads(o["text"])) - set(SCHEMA["properties"])
               for o in opened), [o["text"] for o in opened]
