"""One scheduler loop (issue 16, runtime/scheduler_loop.py) for the Engine and the scheduler
process: arrivals, one step per turn, a failing step aborts only what is in flight, delivery of
every touched request, idle waits, TP sync."""

from __future__ import annotations

import pytest

from radixlm.runtime.scheduler_loop import GRAMMAR_WAIT_S, run_scheduler_loop


class FakeScheduler:
    """Steps pop scripted results; ``"fail"`` raises."""

    def __init__(self, script):
        self.script, self.in_flight, self.ran_batch, self.aborted = list(script), [], True, []

    def has_work(self):
        return bool(self.script)

    def step(self):
        if not self.script:
            return []
        out = self.script.pop(0)
        if out == "fail":
            raise RuntimeError("kernel exploded")
        self.ran_batch = out != "compiling"
        return [] if out == "compiling" else list(out)

    def abort_all(self, message):
        self.aborted.append(message)
        return ["in-flight"]


def _run(sched, turns, arrivals=None, **kw):
    waits, delivered = [], []
    arrivals = list(arrivals or [])

    def receive(wait_s):
        waits.append(wait_s)
        return [arrivals.pop(0)] if arrivals else []

    run_scheduler_loop(sched, receive, delivered.append, should_stop=lambda: len(waits) >= turns, **kw)
    return waits, delivered


def test_a_failing_step_aborts_in_flight_and_the_loop_goes_on():
    sched = FakeScheduler([["a"], "fail", ["b"]])
    waits, delivered = _run(sched, 4, idle_wait_s=0.5)
    assert delivered == [["a"], ["in-flight"], ["b"], []]
    assert sched.aborted == ["internal error: RuntimeError: kernel exploded"]
    assert waits == [0.0, 0.0, 0.0, 0.5]  # busy: no wait; idle: the long wait


def test_arrivals_finished_outside_a_step_are_delivered_with_the_step():
    sched = FakeScheduler([["a"]])
    _, delivered = _run(sched, 2, arrivals=["rejected"])
    assert delivered[0] == ["rejected", "a"]


def test_only_grammar_compiles_pending_waits_briefly():
    sched = FakeScheduler(["compiling", ["a"]])
    waits, _ = _run(sched, 3)
    assert waits[1] == GRAMMAR_WAIT_S


def test_follower_never_waits_and_failed_sync_stops():
    waits, _ = _run(FakeScheduler([]), 3, follower=True)
    assert waits == [0.0, 0.0, 0.0]
    syncs = []
    waits, delivered = _run(FakeScheduler([["a"]]), 5, sync=lambda: syncs.append(1) or len(syncs) < 2)
    assert len(waits) == 2 and delivered == [["a"]]


def test_engine_contains_a_failing_step(tiny_llama):
    from radixlm.runtime.engine import Engine

    with Engine(tiny_llama, device="cpu", max_total_tokens=1024) as e:
        sp = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
        want = e.generate("hello", sp)["output_ids"]
        real, calls = e.scheduler.step, []

        def flaky():
            if e.scheduler.has_work():  # NOTE: idle steps (self-checks) may run in between
                calls.append(1)
                if len(calls) == 1:
                    raise RuntimeError("kernel exploded")
            return real()

        e.scheduler.step = flaky
        out = e.generate("hello", sp)
        assert out["meta_info"]["finish_reason"]["type"] == "abort"
        assert "kernel exploded" in out["meta_info"]["finish_reason"]["message"]
        assert e.generate("hello", sp)["output_ids"] == want
        with pytest.raises(ValueError, match="temperature"):
            e.generate("hello", {"temperature": -1})
