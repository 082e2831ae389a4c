"""The detokenizer -> tokenizer manager message: plain outputs as columns with their appended
text, through the msgpack codec, give the tokenizer manager the same states after every step
(texts, ids, finish reasons, streamed increments) as the per-request path."""

from __future__ import annotations

import asyncio

import pytest

from radixlm.runtime.detokenizer import IncrementalDetokenizer, append_batch
from radixlm.runtime.server.detokenizer_process import DetokenizerManager
from radixlm.runtime.server.io_struct import (
    BatchStrOut, BatchTokenIDOut, DetokInit, SchedulerSnapshot, StrOut, TokenIDOut, decode, encode,
)
from radixlm.runtime.server.metrics import ServerMetrics
from radixlm.runtime.server.tokenizer_manager import ReqState, TokenizerManager

SNAP = SchedulerSnapshot(num_running=1, num_waiting=0, kv_used_tokens=1, kv_total_tokens=10, cache_hit_rate=0.0,
                         num_retracted=0)
TEXT = "héllo wörld ✓ 日本語 — done. Emoji 🚀🔥 and more text, then STOP here; END of it 🎉 ü"


@pytest.fixture(scope="module")
def tok(tiny_llama):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama)


def _tm(rids, stream):
    tm = TokenizerManager.__new__(TokenizerManager)
    tm.states, tm.groups, tm.snapshot, tm.metrics = {}, {}, None, ServerMetrics("test")
    queue = asyncio.Queue()
    for k, rid in enumerate(rids):
        tm.states[rid] = ReqState(rid, k, queue, False, 0)
        tm.states[rid].stream = stream
    return tm, queue, dict(tm.states)


def _old_step(dm, batch):
    """The per-request path (the detokenizer loop before columns): one StrOut per request."""
    outs = []
    for out in batch.outputs + batch.plain():
        try:
            outs.append(dm.process(out))
        except Exception as e:
            dm.states.pop(out.rid, None)
            outs.append(StrOut(out.rid, "", [], {"type": "abort", "status_code": 500, "message": f"detokenizer: {e}"},
                               out.prompt_tokens, out.cached_tokens, out.completion_tokens))
    return outs


def _requests(tok):
    """rid -> (prompt ids, output ids, step sizes, DetokInit, finish at the scheduler's stop?)."""
    ids = tok.encode(TEXT, add_special_tokens=False)
    prompt = tok.encode("Say:", add_special_tokens=False)
    ones = [1] * (len(ids) + 1)
    multi = [1, 2, 3] * len(ids)  # several ids in one step (speculation, jump-forward)
    return {
        "plain": (ids, ones, DetokInit(prompt, [])),
        "multi": (ids, multi, DetokInit(prompt, [])),
        "stop": (ids, ones, DetokInit(prompt, ["STOP"])),  # the scheduler finishes it at the match
        "stop_multi": (ids, multi, DetokInit(prompt, ["END of"])),
        "regex": (ids, ones, DetokInit(prompt, [], stop_regex=[r"t[e]xt,"])),
        "cutback": (ids, ones, DetokInit(prompt, ["STOP"])),  # the match does not finish it (text cut back)
        "logprobs": (ids, ones, DetokInit(prompt, [], text_in_logprobs=True)),
        "bad": ([*ids[:3], -1, *ids[3:]], ones, DetokInit(prompt, [])),  # a decode that raises
    }


def _batches(tok):
    """The scheduler's messages: first output and finished ones as objects, the rest as columns."""
    reqs, per_rid = _requests(tok), {}
    for rid, (ids, sizes, init) in reqs.items():
        sched = IncrementalDetokenizer(tok, init.prompt_tail, stop=init.stop, stop_regex=init.stop_regex)
        chunks, pos = [], 0
        for size in sizes:
            chunk = ids[pos:pos + size]
            if not chunk:
                break
            pos += len(chunk)
            reason = None
            if rid not in ("cutback", "bad"):
                for t in chunk:
                    sched.append(t)
                if sched.matched_stop is not None:
                    reason = {"type": "stop", "matched": sched.matched_stop}
            if pos >= len(ids):
                reason = reason or {"type": "length", "length": pos}
            chunks.append((chunk, reason, pos))
            if reason:
                break
        per_rid[rid] = (chunks, init)
    batches = []
    for step in range(max(len(c) for c, _ in per_rid.values())):
        b = BatchTokenIDOut([], SNAP)
        for rid, (chunks, init) in per_rid.items():
            if step >= len(chunks):
                continue
            chunk, reason, done = chunks[step]
            if step == 0 or reason or (rid == "logprobs" and step % 3 == 0):
                lps = [(-0.5, t, [(-0.5, t)]) for t in chunk] if rid == "logprobs" else []
                b.outputs.append(TokenIDOut(rid, chunk, reason, 4, 1, done, new_output_logprobs=lps,
                                            detok=init if step == 0 else None))
            else:
                b.plain_rids.append(rid)
                b.plain_new_ids.append(chunk)
                b.plain_prompt_tokens.append(4)
                b.plain_cached_tokens.append(1)
                b.plain_completion_tokens.append(done)
        batches.append(b)
    return batches


@pytest.mark.parametrize("stream", [True, False])
def test_columnar_path_matches_per_request_path(tok, stream):
    batches = _batches(tok)
    rids = list(_requests(tok))
    old_dm, new_dm = DetokenizerManager(tok), DetokenizerManager(tok)
    (old_tm, old_q, old_st), (new_tm, new_q, new_st) = _tm(rids, True), _tm(rids, stream)
    old_seen, new_seen = {r: [] for r in rids}, {r: [] for r in rids}
    plain_steps = 0
    for batch in batches:
        for out in _old_step(old_dm, decode(encode(batch))):
            old_tm._apply(out)
        msg = decode(encode(new_dm.process_batch(decode(encode(batch)))))
        assert isinstance(msg, BatchStrOut)
        plain_steps += len(msg.plain_rids)
        new_tm._on_batch(msg)
        for q, seen, states in ((old_q, old_seen, old_st), (new_q, new_seen, new_st)):
            while not q.empty():
                st = list(states.values())[q.get_nowait()]
                st.queued = False  # what TokenizerManager.updates does when it takes an index
                seen[st.rid].append((st.text, st.finish_reason))
    assert plain_steps > len(batches)  # the columns carried most outputs
    for rid in rids:
        o, n = old_st[rid], new_st[rid]
        assert (n.text, n.output_ids, n.finish_reason, n.completion_tokens, n.prompt_tokens, n.cached_tokens,
                n.output_lp, n.output_top) == (o.text, o.output_ids, o.finish_reason, o.completion_tokens,
                                               o.prompt_tokens, o.cached_tokens, o.output_lp, o.output_top), rid
        assert n.finished and "\ufffd" not in n.text
        # streaming: the same increments; otherwise woken once, when finished
        assert new_seen[rid] == (old_seen[rid] if stream else old_seen[rid][-1:]), rid
    assert old_st["stop"].finish_reason == {"type": "stop", "matched": "STOP"}
    assert old_st["stop"].text == TEXT[:TEXT.index("STOP")]
    assert old_st["cutback"].text == TEXT[:TEXT.index("STOP")]
    assert old_st["regex"].finish_reason == {"type": "stop", "matched": "t[e]xt,"}
    assert old_st["bad"].finish_reason["type"] == "abort" and old_st["plain"].text == TEXT
    assert old_st["logprobs"].output_lp[0][2] is not None and not old_dm.states and not new_dm.states


def test_append_batch_equals_append(tok):
    """Batched windows give the texts of ``append`` one by one (UTF-8 split across tokens)."""
    ids = tok.encode(TEXT, add_special_tokens=False)
    cache: dict = {}  # one-token window texts, shared (also by the eager `cached` ones)
    one = [IncrementalDetokenizer(tok, ids[:k], stop=["zzz"] if k == 1 else ()) for k in range(4)]
    cached = [IncrementalDetokenizer(tok, ids[:k], single_cache=cache) for k in range(4)]
    many = [IncrementalDetokenizer(tok, ids[:k], stop=["zzz"] if k == 1 else (), single_cache=cache)
            for k in range(4)]
    step = 0
    while step < len(ids):
        chunk = [ids[step:step + 1 + k % 3] for k in range(4)]
        for d, e, c in zip(one, cached, chunk):
            for t in c:
                d.append(t)
                e.append(t)
        assert append_batch(many, chunk) == {}
        assert [d.text for d in one] == [d.text for d in many] == [d.text for d in cached]
        step += 3
    assert all(d.flush() == m.flush() and d.text == m.text for d, m in zip(one, many))
    assert cache and all(v == tok.backend_tokenizer.decode([t]) for c in cache.values() for t, v in c.items())
    bad = [IncrementalDetokenizer(tok, []), IncrementalDetokenizer(tok, [])]
    failed = append_batch(bad, [[ids[0]], [-1]])
    assert list(failed) == [1] and isinstance(failed[1], OverflowError)


def test_str_batch_round_trips():
    b = BatchStrOut([StrOut("a", "hi", [1], {"type": "length", "length": 1}, 2, 0, 1)], SNAP)
    b.add_plain("b", "é", [3, 4], 5, 1, 6)
    got = decode(encode(b))
    assert got == b and got.plain_text == ["é"] and got.plain_new_ids == [[3, 4]]


def test_lagging_stream_consumer_gets_one_wakeup_per_state_and_the_latest_state():
    """Updates that arrive while a stream's consumer is behind do not queue more wake-ups: the
    queue holds each state's index at most once, and the consumer reads the latest state."""
    rids = ["a", "b", "c"]
    tm, queue, states = _tm(rids, True)
    got: list[tuple] = []

    async def consume():
        async for st in tm.updates(list(states.values()), queue):
            got.append((st.rid, st.text, st.completion_tokens, st.finished))

    async def main():
        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0)  # the consumer waits on the queue
        for step in range(5):  # five steps before it runs again
            b = BatchStrOut([], SNAP)
            for rid in rids:
                b.add_plain(rid, f"{rid}{step} ", [step], 3, 0, step + 1)
            tm._on_batch(decode(encode(b)))
            assert queue.qsize() == len(rids)
        for _ in range(10):
            await asyncio.sleep(0)
        assert got == [(r, "".join(f"{r}{k} " for k in range(5)), 5, False) for r in rids]
        tm._on_batch(BatchStrOut([StrOut(r, states[r].text + "end", [9], {"type": "length"}, 3, 0, 6)
                                  for r in rids], SNAP))
        await asyncio.wait_for(task, 5)

    asyncio.run(main())
    assert got[3:] == [(r, "".join(f"{r}{k} " for k in range(5)) + "end", 6, True) for r in rids]
    assert queue.empty() and not any(st.queued for st in states.values())
