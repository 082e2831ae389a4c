"""Few-shot classification with ``run_batch`` over a shared few-shot prefix.

Run: ``python -m radixlm.examples.few_shot [--url URL]``.  The examples block is identical for
every program, so ``run_batch`` commits it once before the batch starts and every program reads it
from the radix cache; the printed hit rate shows how much of the prompt work was skipped.
"""

from __future__ import annotations

import radixlm as sgl
from radixlm.examples.common import cache_summary, make_backend, parse_args

SHOTS = [
    ("The battery lasts all day and charges fast.", "positive"),
    ("It stopped working after a week.", "negative"),
    ("Shipping was quick and the fit is perfect.", "positive"),
    ("The screen scratches far too easily.", "negative"),
    ("Setup took two minutes and it just works.", "positive"),
    ("Customer support never answered my emails.", "negative"),
]
REVIEWS = [
    "Great sound quality for the price.",
    "The zipper broke on the first day.",
    "Comfortable, light and well made.",
    "Arrived late and the box was damaged.",
    "Does exactly what it promises.",
    "Too loud and the app keeps crashing.",
    "My kids love it.",
    "Would not buy again.",
]


@sgl.function
def classify(s, review):
    s += "Classify the sentiment of each product review.\n\n"
    for text, label in SHOTS:
        s += f"Review: {text}\nSentiment: {label}\n\n"
    s += "Review: " + review + "\nSentiment: "
    s += sgl.select("label", ["positive", "negative"])


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    backend = make_backend(args)
    backend.flush_cache()
    states = classify.run_batch([{"review": r} for r in REVIEWS], progress_bar=False)
    for review, st in zip(REVIEWS, states):
        print(f"{st['label']:>8}  {review}")
    prefix = classify.trace().constant_prefix(backend.chat_template)
    print(f"shared prefix: {len(prefix)} characters")
    info = sgl.get_server_info(backend)
    if "cache_hit_rate" in info:
        print(f"server cache hit rate: {info['cache_hit_rate']:.0%}")
    print("prompts of the programs:", cache_summary([st.get_meta_info("label") for st in states]))


if __name__ == "__main__":
    main()
