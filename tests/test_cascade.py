"""Cascade attention plans (runtime/cascade.py): which decode rows read a shared cached prefix
together, and greedy outputs of the real model unchanged when they do (CPU, torch reference, which
checks that every chunk's members really hold the same slots)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from radixlm.runtime.cascade import CascadePlanner, cascade_shape, shared_views
from radixlm.runtime.testing import CHAT_QUESTIONS, spy_cascade_plans


@dataclass(eq=False)
class Node:
    end: int
    parent: "Node | None" = None


@dataclass(eq=False)
class R:
    last_node: Node | None
    cascade_anchor: object = None


def tree():
    root = Node(0)
    sys_a = Node(300, root)  # a system prompt shared by three requests
    sys_b = Node(400, Node(120, root))  # another, below a short common preamble
    lone = Node(500, root)
    leaves = [Node(330, sys_a), Node(340, sys_a), Node(320, sys_a), Node(410, sys_b), Node(450, sys_b), Node(520, lone)]
    return root, sys_a, sys_b, leaves


def planner(**kw) -> CascadePlanner:
    kw.setdefault("min_shared", 256)
    kw.setdefault("min_saved_bytes", 0)
    return CascadePlanner(kv_bytes_per_token_layer=1, **kw)


def test_rows_grouped_by_the_deepest_shared_node():
    root, sys_a, sys_b, leaves = tree()
    reqs = [R(leaves[0]), R(root), R(leaves[3]), R(leaves[1]), R(None), R(leaves[4]), R(leaves[2]), R(leaves[5])]
    rows = [10, 11, 12, 13, 14, 15, 16, 17]
    seq = [340, 5, 420, 350, 7, 460, 330, 530]
    plan = planner().plan(reqs, rows, seq, max_chunks=4)
    assert plan is not None
    got = sorted(zip(plan.chunk_len, plan.chunk_rows, plan.chunk_req))
    assert got == [(300, [0, 3, 6], 10), (400, [2, 5], 12)]
    assert plan.start == [300, 0, 400, 300, 0, 400, 300, 0]


def test_chunks_split_capped_and_rows_keep_an_own_key():
    root, sys_a, _, _ = tree()
    leaves = [Node(300 + i + 1, sys_a) for i in range(7)]
    reqs = [R(n) for n in leaves]
    seq = [n.end + 1 for n in leaves]
    seq[6] = 300  # NOTE: a row with no key past the shared part stays out (it needs its own key)
    plan = planner(chunk=2).plan(reqs, list(range(7)), seq, max_chunks=2)
    assert plan.chunk_rows == [[0, 1], [2, 3]]  # chunks of 2; the third is over max_chunks
    assert plan.start == [300] * 4 + [0, 0, 0]
    single = planner(chunk=3).plan(reqs[:4], list(range(4)), seq[:4], max_chunks=8)
    assert single.chunk_rows == [[0, 1, 2]]  # a one-row remainder is no chunk


def test_rows_of_one_request_share_its_prefix():
    _, sys_a, _, leaves = tree()
    req = R(leaves[0])  # verify rows: one request, several positions
    plan = planner().plan([req] * 3, [9, 9, 9], [331, 332, 333], max_chunks=1)
    assert plan.chunk_rows == [[0, 1, 2]] and plan.chunk_len == [330] and plan.chunk_req == [9]


def test_too_little_saved_or_nothing_shared_gives_no_plan():
    root, _, _, leaves = tree()
    reqs = [R(leaves[0]), R(leaves[1])]
    assert planner(min_saved_bytes=301).plan(reqs, [1, 2], [340, 350], 4) is None
    assert planner(min_saved_bytes=300).plan(reqs, [1, 2], [340, 350], 4) is not None
    assert planner().plan([R(leaves[0]), R(leaves[5]), R(root)], [1, 2, 3], [340, 530, 4], 4) is None
    assert planner(min_shared=512).plan(reqs, [1, 2], [340, 350], 4) is None


def test_plan_reused_while_the_batch_is_unchanged():
    _, _, _, leaves = tree()
    reqs = [R(leaves[0]), R(leaves[1])]
    p = planner()
    first = p.plan(reqs, [1, 2], [340, 350], 4)
    assert p.plan(reqs, [1, 2], [341, 351], 4) is first
    moved = p.plan(reqs, [1, 3], [342, 352], 4)  # NOTE: a request in another req_to_token row
    assert moved is not first and moved.chunk_req == [1]
    reqs[1].last_node = leaves[2]
    assert p.plan(reqs, [1, 3], [343, 353], 4) is not moved


def test_flat_layout_matches_the_views():
    torch = pytest.importorskip("torch")
    _, _, _, leaves = tree()
    plan = planner().plan([R(leaves[0]), R(leaves[1]), R(leaves[3]), R(leaves[4])], [5, 6, 7, 8],
                          [340, 350, 420, 460], max_chunks=4)
    nc, length = cascade_shape(7, 3)  # NOTE: odd rows: the regions are padded to 16-byte starts
    assert nc == 4
    buf = torch.tensor(plan.flat(7, 3))
    assert buf.numel() == length
    v = shared_views(buf, 7, 3)
    assert v.start.tolist() == plan.start + [0, 0, 0]
    assert v.chunk_rows.tolist() == [[0, 1, -1], [2, 3, -1], [-1, -1, -1], [-1, -1, -1]]
    assert v.chunk_req.tolist() == [5, 7, 0, 0] and v.chunk_len.tolist() == [300, 400, 0, 0]
    assert all((t.data_ptr() - buf.data_ptr()) % 16 == 0 for t in (v.start, v.chunk_rows, v.chunk_req, v.chunk_len))




@pytest.fixture(scope="module")
def chat_prompts():
    from transformers import AutoTokenizer

    from radixlm.runtime.default_model import default_model_path

    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    msgs = [[{"role": "user", "content": q}] for q in CHAT_QUESTIONS[:6]]  # NOTE: one shared system prompt
    return path, [tok.apply_chat_template(m, tokenize=True, add_generation_prompt=True, return_dict=False) for m in msgs]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("kw", [{}, {"max_total_tokens": 150}], ids=["plain", "retraction"])
def test_cascade_keeps_greedy_outputs_on_the_real_model(chat_prompts, kw):
    """Requests arriving after the first share its cached system prompt; with cascade plans
    (thresholds lowered to this prompt's size, chunks of 3 rows) the outputs equal those without."""
    from radixlm.runtime.request import Req
    from radixlm.runtime.sampling_params import SamplingParams
    from radixlm.runtime.testing import make_scheduler, run_to_completion

    path, prompts = chat_prompts
    arrivals = [0] + [2 + i // 2 for i in range(len(prompts) - 1)]

    def run(cascade: bool):
        sched = make_scheduler(path, enable_cascade_attention=cascade, **kw)
        used = []
        if cascade:
            sched.runner.cascade = CascadePlanner(1, min_shared=16, chunk=3, min_saved_bytes=0)
            used = spy_cascade_plans(sched.runner.cascade)
        reqs = [Req(f"r{i}", list(p), SamplingParams(max_new_tokens=32, temperature=0, ignore_eos=True))
                for i, p in enumerate(prompts)]
        outs = run_to_completion(sched, reqs, arrivals)
        assert sched.flush_cache() and sched.allocator.available_size() == sched.allocator.size
        return outs, used, sched

    base, _, _ = run(False)
    got, used, sched = run(True)
    assert len({t for o in base for t in o}) >= 10
    assert got == base
    assert sum(used) >= 10  # decode steps ran with a plan
    if kw:
        assert sched.stats.num_retracted > 0
