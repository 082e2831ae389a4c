"""Tree of thought: fork at every level, score each branch with ``select``, expand the best.

Run: ``python -m radixlm.examples.tree_of_thought [--url URL]``.  Each ``fork`` commits the
current text once, so all branches of a level reuse it from the radix cache (see the cached
tokens printed per level).
"""

from __future__ import annotations

import radixlm as sgl
from radixlm.examples.common import cache_summary, make_backend, parse_args

DEPTH, WIDTH = 2, 3


@sgl.function
def tree_of_thought(s, problem):
    s += "Problem: " + problem + "\nLet's think in steps.\n"
    levels = []
    for depth in range(DEPTH):
        forks = s.fork(WIDTH)
        for i, f in enumerate(forks):
            f += f"Step {depth + 1} (idea {i + 1}): "
            f += sgl.gen("thought", max_tokens=20, stop="\n", temperature=0.8, seed=depth * 10 + i)
            f += "\nIs this step promising? " + sgl.select("verdict", ["yes", "no"])
        forks.join()
        scores = [f.get_meta_info("verdict")["normalized_prompt_logprobs"][0] for f in forks]
        best = max(range(WIDTH), key=scores.__getitem__)
        levels.append({"thoughts": s["thought"], "verdicts": s["verdict"], "best": best,
                       "metas": [f.get_meta_info("thought") for f in forks]})
        s += f"Step {depth + 1}: " + s["thought"][best] + "\n"
    s += "Answer: " + sgl.gen("answer", max_tokens=20, stop="\n", temperature=0)
    return levels


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    make_backend(args)
    st = tree_of_thought.run(problem="Plan a three-day trip to Kyoto on a small budget.")
    if st.error() is not None:
        raise SystemExit(f"failed: {st.error()}")
    for depth, level in enumerate(st.ret_value):
        print(f"level {depth + 1}:")
        for i, (t, v) in enumerate(zip(level["thoughts"], level["verdicts"])):
            mark = "*" if i == level["best"] else " "
            print(f"  {mark} [{v:>3}] {t!r}")
        print("    cache:", cache_summary(level["metas"]))
    print("answer:", repr(st["answer"]))


if __name__ == "__main__":
    main()
