"""The main job of `make run`: the product working on the default model (SmolLM2-135M-Instruct).

1. a chat answer (Engine, the tokenizer's chat template);
2. a JSON-schema-constrained extraction that parses (a ``@function`` program);
3. a program with ``select`` and ``fork``;
4. a batch of programs sharing a prefix: output throughput and the prefix-cache hit rate.

Usage: python examples/quickstart.py [--model-path PATH] [--device auto|cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import time

import radixlm as sgl

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0, "maximum": 130}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
PASSAGES = [
    "Alice is 31 years old and lives in Paris.",
    "Bob, aged 45, works as a carpenter in Leeds.",
    "Maria turned 27 last week and celebrated in Madrid.",
    "Kenji is a 52-year-old teacher from Osaka.",
]
REVIEWS = ["I loved this phone, the battery lasts for days!", "Terrible service, the food was cold and late."]


@sgl.function
def extract_person(s, passage):
    s += sgl.system("You extract facts from text and answer with JSON only.")
    s += sgl.user("Extract the person's name and age as JSON.\n\nText: " + passage)
    s += sgl.assistant(sgl.gen("person", max_tokens=40, json_schema=PERSON))


@sgl.function
def review_program(s, review):
    s += sgl.user("Is the sentiment of this review positive or negative?\n\nReview: " + review)
    s += sgl.assistant("The sentiment is " + sgl.select("sentiment", ["positive", "negative"]) + ".")
    aspects = s.fork(2)  # the conversation so far is committed to the cache once, then shared
    for f, aspect in zip(aspects, ["what the customer liked", "what the customer disliked"]):
        f += sgl.user(f"In one short sentence: {aspect}?")
        f += sgl.assistant(sgl.gen("aspect", max_tokens=24, stop="\n"))
    aspects.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", default=None, help="HF folder or .gguf (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    engine = sgl.Engine(args.model_path, device=args.device)
    backend = sgl.EngineBackend(engine)
    sgl.set_default_backend(backend)
    try:
        print(f"model: {engine.server_args.model_path}\n")
        prompt = engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True)
        out = engine.generate(prompt, {"max_new_tokens": 48, "temperature": 0})
        print("1. chat   Q: What is the capital of France?\n         A:", out["text"].strip(), "\n")

        st = extract_person.run(passage=PASSAGES[0], temperature=0)
        print(f"2. JSON   {PASSAGES[0]!r}\n         -> {json.loads(st['person'])}\n")

        for review in REVIEWS:
            st = review_program.run(review=review, temperature=0)
            print(f"3. program  {review!r}\n           sentiment: {st['sentiment']}; liked: {st['aspect'][0].strip()!r}; "
                  f"disliked: {st['aspect'][1].strip()!r}")

        t0 = time.perf_counter()
        states = extract_person.run_batch([{"passage": p} for p in PASSAGES * 4], temperature=0)
        elapsed = time.perf_counter() - t0
        metas = [s.get_meta_info("person") for s in states]
        gen = sum(m["completion_tokens"] for m in metas)
        prompt_toks, cached = sum(m["prompt_tokens"] for m in metas), sum(m["cached_tokens"] for m in metas)
        print(f"\n4. batch: {len(states)} extraction programs, {gen} output tokens in {elapsed:.2f} s "
              f"-> {gen / elapsed:.1f} output tok/s")
        for p, s in zip(PASSAGES, states):
            print(f"   {p[:28]:28s} -> {s['person']}")
        print(f"   prefix cache: {cached}/{prompt_toks} prompt tokens reused ({cached / prompt_toks:.0%}); "
              f"engine hit rate so far {engine.cache_hit_rate:.0%}")
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
