"""A multi-turn chat: roles follow the model's own chat template; later turns reuse the cache.

Run: ``python -m radixlm.examples.chat_multi_turn [--url URL]``.
"""

from __future__ import annotations

import radixlm as sgl
from radixlm.examples.common import cache_summary, make_backend, parse_args


@sgl.function
def chat(s, questions):
    s += sgl.system("You are a helpful assistant. Answer in one or two sentences.")
    for i, q in enumerate(questions):
        s += sgl.user(q)
        s += sgl.assistant(sgl.gen(f"answer{i}", max_tokens=24))


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    make_backend(args)
    questions = ["What is the capital of Portugal?",
                 "What language do people speak there?",
                 "Name a famous dish from Portugal."]
    st = chat.run(questions=questions, temperature=0)
    if st.error() is not None:
        raise SystemExit(f"chat failed: {st.error()}")
    for m in st.messages():
        print(f"{m['role']:>9}: {m['content']!r}")
    print("cache:", cache_summary([st.get_meta_info(f"answer{i}") for i in range(len(questions))]))


if __name__ == "__main__":
    main()
