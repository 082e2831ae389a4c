"""The example programs on the real default model (SmolLM2-135M-Instruct, CPU): they must get right
what a 135M instruct model gets right — names and ages extracted from simple passages, the
obvious sentiment chosen by ``select``, key years — not only produce values of the right type."""

from __future__ import annotations

import json

import pytest

import radixlm as sgl
from radixlm.examples import few_shot, json_extraction, quickstart

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def backend():
    engine = sgl.Engine(device="cpu", max_total_tokens=8192)
    yield sgl.EngineBackend(engine)
    engine.shutdown()


def test_extraction_gets_names_and_ages(backend):
    states = quickstart.extract_person.run_batch([{"passage": p} for p in quickstart.PASSAGES], temperature=0,
                                                 backend=backend)
    got = [json.loads(st["person"]) for st in states]
    assert got == [{"name": "Alice", "age": 31}, {"name": "Bob", "age": 45}, {"name": "Maria", "age": 27},
                   {"name": "Kenji", "age": 52}]


def test_select_and_fork_program(backend):
    for review, want in zip(quickstart.REVIEWS, ["positive", "negative"]):
        st = quickstart.review_program.run(review=review, temperature=0, backend=backend)
        assert st.error() is None
        assert st["sentiment"] == want
        liked, disliked = st["aspect"]  # the two fork branches answered different questions
        assert liked.strip() and disliked.strip() and liked != disliked


def test_json_extraction_example(backend):
    states = json_extraction.extract.run_batch([{"passage": p} for p in json_extraction.PASSAGES], temperature=0,
                                               backend=backend)
    got = [json.loads(st["json"]) for st in states]
    for fields, name in zip(got, ["Eiffel Tower", "Everest", "Golden Gate Bridge", "Python"]):
        assert set(fields) == {"name", "location", "year"} and name in fields["name"]
    assert got[0]["year"] == 1889 and got[2]["year"] == 1937


def test_few_shot_classification(backend):
    states = few_shot.classify.run_batch([{"review": r} for r in few_shot.REVIEWS], backend=backend,
                                         progress_bar=False)
    labels = [st["label"] for st in states]
    assert labels == ["positive", "negative"] * (len(few_shot.REVIEWS) // 2)
