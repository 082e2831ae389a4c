"""A ReAct-style agent: the model picks a real Python tool with ``select`` and writes its input.

Run: ``python -m radixlm.examples.agent_tool_use [--url URL]``.  Each step appends
Thought / Action (a ``select`` over tool names) / Action Input (regex-constrained ``gen``) and the
tool's real Observation; the loop ends at ``finish`` or after ``MAX_STEPS``.
"""

from __future__ import annotations

import ast
import operator

import radixlm as sgl
from radixlm.examples.common import cache_summary, make_backend, parse_args

MAX_STEPS = 3
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.USub: operator.neg}


def calculator(expr: str) -> str:
    """Evaluate + - * / arithmetic on numbers (no names, no calls)."""
    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError("unsupported expression")

    try:
        return str(ev(ast.parse(expr.strip(), mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"error: {exc}"


def word_count(text: str) -> str:
    """Number of whitespace-separated words."""
    return str(len(text.split()))


TOOLS = {"calculator": calculator, "word_count": word_count}
INPUT_REGEX = {"calculator": r"[0-9]{1,4}( [-+*/] [0-9]{1,4}){0,3}",
               "word_count": r"[A-Za-z ]{1,40}"}


# One worked example (a shared, cached prefix) shows a small model the format and the tools.
EXAMPLE = (
    "Answer the question using tools. Tools: calculator (arithmetic), word_count (counts words), "
    "finish (give the answer).\n\n"
    "Question: What is 6 * 7 - 2?\n"
    "Thought: I need to compute 6 * 7 - 2.\nAction: calculator\nAction Input: 6 * 7 - 2\nObservation: 40\n"
    "Thought: The result is 40.\nAction: finish\nFinal Answer: 40\n\n"
)


@sgl.function
def agent(s, question):
    s += EXAMPLE + "Question: " + question + "\n"
    for step in range(MAX_STEPS):
        s += "Thought: " + sgl.gen(f"thought{step}", max_tokens=16, stop="\n") + "\n"
        s += "Action: " + sgl.select(f"action{step}", ["calculator", "word_count", "finish"]) + "\n"
        action = s[f"action{step}"]
        if action == "finish":
            s += "Final Answer: " + sgl.gen("answer", max_tokens=16, stop="\n")
            return step
        s += "Action Input: " + sgl.gen(f"input{step}", max_tokens=16, stop="\n",
                                        regex=INPUT_REGEX[action]) + "\n"
        s += "Observation: " + TOOLS[action](s[f"input{step}"]) + "\n"
    s += "Final Answer: " + sgl.gen("answer", max_tokens=16, stop="\n")
    return MAX_STEPS


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    make_backend(args)
    st = agent.run(question="What is 17 * 23 + 4?", temperature=0)
    if st.error() is not None:
        raise SystemExit(f"agent failed: {st.error()}")
    print(st.text())
    print(f"\nsteps: {st.ret_value}; check: calculator('17 * 23 + 4') = {calculator('17 * 23 + 4')}")
    names = [k for k in st.executor.variables if k.startswith(("thought", "input", "answer"))]
    print("cache:", cache_summary([st.get_meta_info(k) for k in names]))


if __name__ == "__main__":
    main()
