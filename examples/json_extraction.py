"""Extract structured fields from text passages with JSON-schema constrained generation.

Run: ``python -m radixlm.examples.json_extraction`` (in-process Engine, the default SmolLM2-135M-Instruct)
or ``python -m radixlm.examples.json_extraction --url http://127.0.0.1:30000`` (a server).
All passages share the instruction prefix, which ``run_batch`` pre-caches once.
"""

from __future__ import annotations

import json

import radixlm as sgl
from radixlm.examples.common import cache_summary, make_backend, parse_args

PASSAGES = [
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It "
    "was designed by the company of engineer Gustave Eiffel and completed in 1889 as the entrance "
    "arch to the World's Fair. It is 330 metres tall.",
    "Mount Everest, in the Mahalangur Himal range of the Himalayas, is Earth's highest mountain "
    "above sea level at 8,849 metres. Tenzing Norgay and Edmund Hillary made the first confirmed "
    "ascent in 1953.",
    "The Golden Gate Bridge spans the one-mile-wide strait connecting San Francisco Bay and the "
    "Pacific Ocean. It opened in 1937 and its main span of 1,280 metres was then the longest of "
    "any suspension bridge in the world.",
    "Python is a high-level programming language created by Guido van Rossum and first released "
    "in 1991. Its design emphasizes code readability with significant indentation.",
]

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "location": {"type": "string", "maxLength": 40},
        "year": {"type": "integer", "minimum": 0, "maximum": 2100},
    },
    "required": ["name", "location", "year"],
    "additionalProperties": False,
}


@sgl.function
def extract(s, passage):
    s += sgl.system("You extract facts from text and answer with JSON only.")
    s += sgl.user("Extract the subject's name, its location and the key year as JSON.\n\n"
                  "Text: " + passage)
    s += sgl.assistant(sgl.gen("json", max_tokens=64, json_schema=SCHEMA))


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    backend = make_backend(args)
    backend.flush_cache()
    states = extract.run_batch([{"passage": p} for p in PASSAGES], temperature=0)
    for passage, st in zip(PASSAGES, states):
        if st.error() is not None:
            print(f"- {passage[:40]}...: error: {st.error()}")
            continue
        raw = st["json"]
        try:
            fields = json.loads(raw)
        except ValueError:
            fields = f"(not valid JSON: {raw[:60]!r})"
        print(f"- {passage[:40]}...\n    -> {fields}")
    metas = [st.get_meta_info("json") for st in states if st.error() is None]
    print("cache:", cache_summary(metas))


if __name__ == "__main__":
    main()
