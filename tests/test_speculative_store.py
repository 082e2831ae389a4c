"""The global n-gram store of speculative decoding (drafts from other requests,
``runtime/speculative_store.py``): matching against brute force, the size bound, the drafter's
feeding and which draft wins over the request's own."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.speculative import NgramIndex, propose
from radixlm.runtime.testing import SeqMatcher


def index_of(tokens) -> NgramIndex:
    idx = NgramIndex(1, 12)
    idx.extend(tokens)
    return idx


# ------------------------------------------------------------------ global store (other requests)
def store_of(seqs, capacity=1000, gram=1, window=12):
    from radixlm.runtime.speculative_store import NgramStore

    s = NgramStore(capacity, gram, window)
    for q in seqs:
        s.add(q)
    s.feed()
    return s


def test_store_longest_match_then_majority_continuation():
    s = store_of([[1, 2, 3, 4, 5, 6, 7], [9, 2, 3, 4, 8, 8], [10, 2, 3, 4, 8, 7]])
    assert s.propose([7, 2, 3], 8) == ([4, 8, 7], 2)  # all 3 agree on 4; 2 of 3 on 8; then the newest
    assert s.propose([1, 2, 3], 8) == ([4, 5, 6, 7], 3)  # the longer match alone decides
    assert s.propose([6, 7], 4) == ([], 0)  # 7 ends sequences: nothing follows it in the same sequence
    assert s.propose([5], 0) == ([], 0)
    assert store_of([[1, 2, 3, 4], [5, 2, 3, 6]], gram=2).propose([0, 2, 3], 2) == ([6], 2)  # newest on ties
    assert store_of([[1, 2, 3, 4]], gram=3).propose([9, 2, 3], 2) == ([], 0)  # 2 tokens < gram


def test_store_matches_brute_force(monkeypatch):
    """With an unbounded candidate walk, the draft's first token is the majority continuation of
    the longest matches anywhere in the store (newest on ties), over random small-vocab data."""
    from radixlm.runtime import speculative_store

    monkeypatch.setattr(speculative_store, "MAX_CANDIDATES", 10**9)
    monkeypatch.setattr(speculative_store, "MAX_VOTERS", 10**9)
    rng = random.Random(3)
    for trial in range(40):
        seqs = [[rng.randrange(5) for _ in range(rng.randrange(2, 30))] for _ in range(rng.randrange(1, 6))]
        gram, window = rng.choice([(1, 4), (2, 5), (1, 12)])
        s = store_of(seqs, gram=gram, window=window)
        ctx = [rng.randrange(5) for _ in range(rng.randrange(1, 9))]
        best, follow = 0, []  # (match length, continuation tokens newest first)
        for q in reversed(seqs):
            for e in reversed(range(len(q) - 1)):
                n = 0
                while n < min(len(ctx), window, e + 1) and q[e - n] == ctx[-1 - n]:
                    n += 1
                if n >= gram and n > best:
                    best, follow = n, [q[e + 1]]
                elif n >= gram and n == best:
                    follow.append(q[e + 1])
        draft, length = s.propose(ctx, 3)
        assert length == best
        if follow:
            assert draft[0] == max(follow, key=follow.count)
        else:
            assert draft == []


def test_store_bounded_and_forgets_the_oldest():
    s = store_of([], capacity=40, gram=2)
    rng = random.Random(0)
    for i in range(30):
        s.add([100 + i] + [rng.randrange(50) for _ in range(rng.randrange(3, 25))])
        s.feed()
        assert len(s) <= 40 and len(s._head) <= 40
        lo = s._end - s.capacity
        assert all(p >= lo for p in s._head.values())  # no key points at an overwritten position
    assert s.propose([29, 129], 3) == ([], 0) or s.propose([100], 3) == ([], 0)
    assert s.propose([0, 100], 3) == ([], 0)  # the first sequence is long gone
    s.clear()
    assert len(s) == 0 and not s._head
    with pytest.raises(ValueError):
        store_of([], capacity=0)


def test_store_feed_budget_and_long_sequences():
    s = store_of([], capacity=16)
    s.add(list(range(1, 41)))  # longer than the store: only its tail is kept
    assert s.pending_tokens == 15
    assert s.feed(10) == 10 and s.pending_tokens == 5
    s.add([7, 8, 9])
    assert s.feed() == 8 and s.pending_tokens == 0
    assert s.propose([38], 4) == ([39, 40], 1)  # the tail of the long sequence, not its head
    assert s.propose([7], 4) == ([8, 9], 1)
    assert s.propose([3], 4) == ([], 0)


def test_drafter_drafts_from_finished_requests():
    from radixlm.runtime.speculative_worker import NgramDrafter

    def req(prompt, out):
        return SimpleNamespace(sampling_params=SamplingParams(temperature=0.0, max_new_tokens=20),
                               origin_input_ids=list(prompt), output_ids=list(out), max_total=len(prompt) + 20,
                               num_tokens=len(prompt) + len(out), spec_index=None, grammar_matcher=None,
                               finished=False, spec_verify_ct=0, spec_draft_tokens=0, spec_accepted_tokens=0)

    for capacity in (0, 1000):
        d = NgramDrafter(4, 1, 8, capacity=capacity)
        a = req([50, 51, 1], [60, 61, 62, 63, 64])
        assert d.drafts([a], free_slots=10) == [[]]  # 1 never occurred before in a
        a.finished = True
        b = req([70, 71, 1], [])
        assert d.drafts([b], free_slots=10) == ([[]] if capacity == 0 else [[60, 61, 62, 63]])
        d.record(4, 3, b)
        assert (d.store_draft_ct, d.store_draft_tokens, d.store_accepted_tokens) == ((0, 0, 0) if capacity == 0
                                                                                    else (1, 4, 3))
        assert not d._seen.get(id(a))  # a left the drafter once in the store
        d.clear_store()
        b.spec_index = None
        assert d.drafts([b], free_slots=10) == [[]]
    with pytest.raises(ValueError):
        NgramDrafter(4, 1, 8, capacity=-1)
    # capacity from the server args (at the first verify batch): finished requests seen before wait for it
    d = NgramDrafter(4, 1, 8)
    a = req([50, 51, 1], [60, 61, 62, 63, 64])
    d.drafts([a], free_slots=10)
    a.finished = True
    assert d.store is None and d.store_capacity is None
    d.configure(SimpleNamespace(speculative_ngram_capacity=100))
    d.configure(SimpleNamespace(speculative_ngram_capacity=0))  # NOTE: configured once
    assert d.drafts([req([70, 71, 1], [])], free_slots=10) == [[60, 61, 62, 63]]
    d = NgramDrafter(4, 1, 8)
    d.configure(SimpleNamespace(speculative_ngram_capacity=0))
    assert d.store is None and d.store_capacity == 0


def test_capacity_argument():
    from radixlm.runtime.server_args import ServerArgs

    assert ServerArgs(device="cpu").speculative_ngram_capacity == 1_000_000
    assert ServerArgs(device="cpu", speculative_ngram_capacity=0).speculative_ngram_capacity == 0
    with pytest.raises(ValueError):
        ServerArgs(device="cpu", speculative_ngram_capacity=-1)


def test_store_draft_replaces_own_only_after_a_longer_match():
    from radixlm.runtime.speculative import propose_with_source

    store = store_of([[5, 6, 7, 8, 9, 1, 2, 3]])
    idx = index_of([7, 40, 41, 42, 6, 7])  # own: 1-token match of 7 -> 40 41; store: 6 7 -> 8 9 1
    assert propose_with_source(idx, 3, store=store) == ([8, 9, 1], "store")
    idx = index_of([6, 7, 40, 41, 5, 6, 7])  # own: 2-token match; store: 3 tokens (5 6 7)
    assert propose_with_source(idx, 3, store=store) == ([8, 9, 1], "store")
    idx = index_of([5, 6, 7, 40, 41, 5, 6, 7])  # equal match lengths: own
    assert propose_with_source(idx, 3, store=store) == ([40, 41, 5], "own")
    assert propose_with_source(index_of([1, 2]), 2, store=store) == ([3], "store")  # own has none
    assert propose_with_source(index_of([11, 12]), 2, store=store) == ([], "")
    assert propose(index_of([7, 40, 41, 42, 6, 7]), 3) == [40, 41, 42]  # no store: as before
    m = SeqMatcher([8, 9, 4])  # the grammar cuts the store's draft; still the longer match
    assert propose_with_source(index_of([7, 40, 41, 42, 6, 7]), 3, m, store=store) == ([8, 9], "store")
    m = SeqMatcher([40, 41])  # the store's draft is cut to nothing: own
    assert propose_with_source(index_of([7, 40, 41, 42, 6, 7]), 3, m, store=store) == ([40, 41], "own")


def test_store_queue_is_bounded():
    s = store_of([], capacity=20)
    for i in range(10):
        s.add([100 + i] * 8)
    assert s.pending_tokens <= 20 + 8
    s.feed()
    assert s.pending_tokens == 0 and len(s) <= 20
    assert s.propose([109], 2) == ([109, 109], 1)  # the newest survived
    assert s.propose([100], 2) == ([], 0)
