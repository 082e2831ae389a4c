"""The scheduler -> detokenizer message: plain outputs as columns, the others as objects, one
msgpack round trip."""

from __future__ import annotations

import pytest

from radixlm.runtime.server.io_struct import (
    BatchTokenIDOut, DetokInit, MalformedMessage, SchedulerSnapshot, TokenIDOut, decode, encode,
)


def test_batch_with_plain_columns_round_trips():
    first = TokenIDOut("a", [5], None, 7, 0, 1, detok=DetokInit(prompt_tail=[1, 2], stop=["\n"]))
    done = TokenIDOut("b", [9, 10], {"type": "length", "length": 4}, 3, 2, 4, new_output_logprobs=[[-0.5, 9, None]])
    batch = BatchTokenIDOut([first, done], SchedulerSnapshot(num_running=2, num_waiting=0, kv_used_tokens=10,
                                                             kv_total_tokens=100, cache_hit_rate=0.0, num_retracted=0))
    batch.plain_rids += ["c", "d"]
    batch.plain_new_ids += [[1], [2, 3]]
    batch.plain_prompt_tokens += [4, 5]
    batch.plain_cached_tokens += [0, 1]
    batch.plain_completion_tokens += [6, 7]
    got = decode(encode(batch))
    assert isinstance(got, BatchTokenIDOut) and got.outputs == [first, done] and got.snapshot == batch.snapshot
    assert got.plain() == [TokenIDOut("c", [1], None, 4, 0, 6), TokenIDOut("d", [2, 3], None, 5, 1, 7)]


def test_unknown_or_broken_frames_are_malformed():
    with pytest.raises(MalformedMessage):
        decode(b"\xc1")
    with pytest.raises(MalformedMessage):
        decode(encode({"__msg__": "NoSuchMessage"}))
