"""Helpers for tests and benchmarks that drive a :class:`Scheduler` step by step (no Engine thread)."""

from __future__ import annotations

from radixlm.runtime.model_runner import ModelRunner
from radixlm.runtime.request import Req
from radixlm.runtime.scheduler import Scheduler
from radixlm.runtime.server_args import ServerArgs
from radixlm.runtime.tokenizer import load_tokenizer

# Chat questions for real-model tests (their greedy answers vary: many distinct tokens).
CHAT_QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Give me three tips for staying healthy.",
    "Explain what a binary search does.",
    "What is 12 times 7?",
    "Name a famous painting by Leonardo da Vinci.",
    "How do plants make their food?",
    "Translate 'good morning' into Spanish.",
]


def spy_cascade_plans(planner) -> list[bool]:
    """Wrap ``planner.plan`` (a ``runtime.cascade.CascadePlanner``) so that every call appends
    whether it returned a plan to the returned list."""
    used: list[bool] = []
    build = planner.plan

    def spy(*args, **kwargs):
        plan = build(*args, **kwargs)
        used.append(plan is not None)
        return plan

    planner.plan = spy
    return used


def make_scheduler(path: str, **server_args) -> Scheduler:
    """A CPU scheduler over the model at ``path``; ``max_total_tokens`` defaults to 4096."""
    server_args.setdefault("max_total_tokens", 4096)
    args = ServerArgs(model_path=path, device="cpu", **server_args)
    tok, eos = load_tokenizer(path, path)
    return Scheduler.create(args, ModelRunner(args, path, eos), tok)


def run_to_completion(sched: Scheduler, reqs: list[Req], arrivals: list[int] | None = None,
                      max_steps: int = 10_000) -> list[list[int]]:
    """Add each request at its arrival step (default: all at step 0), step until all finished and
    return their output ids. Raises ``RuntimeError`` after ``max_steps`` steps."""
    pending = sorted(zip(arrivals or [0] * len(reqs), range(len(reqs))))
    step = 0
    while pending or sched.has_work():
        while pending and pending[0][0] <= step:
            sched.add_request(reqs[pending.pop(0)[1]])
        sched.step()
        step += 1
        if step > max_steps:
            raise RuntimeError(f"requests unfinished after {max_steps} scheduler steps")
    if not all(r.finished for r in reqs):
        raise RuntimeError("the scheduler went idle with unfinished requests")
    return [r.output_ids for r in reqs]


class SeqMatcher:
    """A stand-in grammar matcher (the ``GrammarMatcher`` methods speculative decoding uses) that
    accepts exactly the token sequence ``allowed`` and forces the text ``forced``."""

    def __init__(self, allowed, forced=""):
        self.allowed, self.pos, self.forced = list(allowed), 0, forced

    def accept_token(self, t):
        if self.pos < len(self.allowed) and self.allowed[self.pos] == t:
            self.pos += 1
            return True
        return False

    def rollback(self, n):
        self.pos -= n

    def is_terminated(self):
        return False

    def find_jump_forward_string(self):
        return self.forced
