"""Speculative decoding building blocks: the n-gram (prompt-lookup) proposer, grammar-cut and
grammar-forced drafts, greedy verification and the rejection-sampling rule (the output
distribution must equal step-by-step sampling's, checked by chi-square on a tiny vocabulary)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from radixlm.runtime import speculative
from radixlm.runtime.sampler import BAD_TOKEN
from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.speculative import NgramIndex, grammar_cut, propose
from radixlm.runtime.speculative_verify import draft_offsets, verify_drafts
from radixlm.runtime.testing import SeqMatcher


def index_of(tokens, lo=1, hi=12) -> NgramIndex:
    idx = NgramIndex(lo, hi)
    idx.extend(tokens)
    return idx


# ------------------------------------------------------------------------------------ proposer
@pytest.mark.parametrize("tokens, lo, hi, k, expected", [
    ([1, 2, 3, 4, 5, 9, 1, 2, 3], 1, 12, 3, [4, 5, 9]),          # copy the span after the match
    ([7, 1, 2, 3, 8, 8, 5, 2, 3, 6, 1, 2, 3], 1, 12, 3, [8, 8, 5]),  # longest match wins...
    ([7, 1, 2, 3, 8, 8, 5, 2, 3, 6, 1, 2, 3], 1, 1, 3, [6, 1, 2]),   # ...newest when windows tie
    ([5, 3, 9, 9, 1, 3], 2, 4, 3, []),                             # only a 1-gram matches: below min
    ([1, 2, 3, 4], 1, 12, 3, []),                                  # no earlier occurrence
    ([4, 1, 2, 4, 1], 1, 12, 5, [2, 4, 1]),                        # continuation runs into the suffix
    ([1, 2, 1, 2, 1, 2], 2, 3, 0, []),                             # k = 0
])
def test_ngram_proposals(tokens, lo, hi, k, expected):
    assert index_of(tokens, lo, hi).propose(k) == expected


def brute_force(tokens, lo, hi, k):
    """Reference prompt lookup: the largest n in [lo, hi] whose suffix occurred before; newest one."""
    n_tok = len(tokens)
    for n in range(min(hi, n_tok - 1), lo - 1, -1):
        suffix = tokens[n_tok - n:]
        for end in range(n_tok - 2, n - 2, -1):
            if tokens[end - n + 1 : end + 1] == suffix:
                return tokens[end + 1 : end + 1 + k]
    return []


@pytest.mark.parametrize("lo, hi", [(1, 12), (2, 4), (3, 3)])
def test_incremental_index_matches_brute_force(monkeypatch, lo, hi):
    monkeypatch.setattr(speculative, "MAX_CANDIDATES", 10**9)
    rng = random.Random(lo * 100 + hi)
    for _ in range(20):
        seq = [rng.randrange(4) for _ in range(rng.randrange(1, 60))]
        idx = NgramIndex(lo, hi)
        for i, t in enumerate(seq):  # one token at a time, as decoding appends them
            idx.extend([t])
            assert idx.propose(4) == brute_force(seq[: i + 1], lo, hi, 4), (seq[: i + 1], lo, hi)


def walk_every_candidate(idx):
    """``NgramIndex.match`` without its first-token rejection: the full comparison per candidate."""
    toks, m, n = idx.tokens, idx.min_window, len(idx.tokens)
    if n <= m:
        return -1, 0
    end, best_end, best_len, seen = idx._head.get(tuple(toks[n - m :]), -1), -1, 0, 0
    while end >= 0 and seen < speculative.MAX_CANDIDATES:
        length, limit = m, min(idx.max_window, end + 1)
        while length < limit and toks[end - length] == toks[n - 1 - length]:
            length += 1
        if length > best_len:
            best_end, best_len = end, length
            if length == idx.max_window:
                break
        end, seen = idx._prev[end], seen + 1
    return (best_end + 1, best_len) if best_end >= 0 else (-1, 0)


@pytest.mark.parametrize("lo, hi, cap", [(1, 12, 32), (1, 12, 3), (2, 5, 8)])
def test_candidate_rejection_keeps_the_bounded_walk(monkeypatch, lo, hi, cap):
    monkeypatch.setattr(speculative, "MAX_CANDIDATES", cap)
    rng = random.Random(cap)
    for _ in range(10):
        idx = NgramIndex(lo, hi)
        for t in [rng.randrange(3) for _ in range(300)]:
            idx.extend([t])
            assert idx.match() == walk_every_candidate(idx)


def test_sync_appends_tail_and_rebuilds_when_shorter():
    prompt, out = [1, 2, 3, 4, 5], [1, 2]
    idx = NgramIndex(1, 4)
    idx.sync(prompt, [])
    assert len(idx) == 5
    idx.sync(prompt, out)
    assert idx.tokens == prompt + out and idx.propose(2) == [3, 4]
    idx.sync(prompt, out)  # nothing new
    assert len(idx) == 7
    idx.sync([9, 9], [])  # shorter: rebuilt from scratch
    assert idx.tokens == [9, 9] and idx.propose(3) == [9]


def test_candidate_walk_is_bounded(monkeypatch):
    monkeypatch.setattr(speculative, "MAX_CANDIDATES", 3)
    seq = [9, 1, 2, 8] + [3, 2] * 10 + [1, 2]  # the newest '2's follow 3; the '1 2' match is far back
    assert index_of(seq, 1, 4).propose(2) == [1, 2]  # capped walk: the newest 1-token match
    monkeypatch.setattr(speculative, "MAX_CANDIDATES", 100)
    assert index_of(seq, 1, 4).propose(2) == [8, 3]


def test_window_validation():
    with pytest.raises(ValueError):
        NgramIndex(0, 3)
    with pytest.raises(ValueError):
        NgramIndex(4, 3)


class CharTokenizer:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def test_grammar_cut_and_forced_drafts():
    m = SeqMatcher([1, 2, 3, 4])
    assert grammar_cut(m, [1, 2, 9, 4]) == [1, 2] and m.pos == 0  # cut at the forbidden token
    idx = index_of([1, 2, 7, 1])
    assert propose(idx, 3, m, None) == []  # the n-gram draft [2, 7, 1] starts with a forbidden token
    m2 = SeqMatcher([2, 7, 5])
    assert propose(idx, 3, m2, None) == [2, 7]
    forced = SeqMatcher([ord(c) for c in '{"name": "'], forced='{"name": "')
    assert propose(idx, 4, forced, CharTokenizer()) == [ord(c) for c in '{"na']  # longer: forced wins
    assert forced.pos == 0


# -------------------------------------------------------------------------------- verification
def req(temperature=0.0, seed=None, **kw):
    sp = SamplingParams(temperature=temperature, **kw)
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    return SimpleNamespace(sampling_params=sp, generator=gen)


def onehot_logits(rows, vocab=16):
    x = torch.full((len(rows), vocab), -5.0)
    for i, t in enumerate(rows):
        x[i, t] = 5.0
    return x


def test_greedy_verification_accepts_longest_agreeing_prefix():
    # request 0: argmax 5 7 2 9, drafts 5 7 3 -> 5 7 then argmax of row 2
    # request 1: all drafts agree -> bonus token from the last row
    # request 2: no drafts -> plain decode; request 3: first draft wrong
    drafts = [[5, 7, 3], [1, 1], [], [4]]
    rows = [5, 7, 2, 9] + [1, 1, 8] + [6] + [3, 4]
    assert draft_offsets(drafts) == [0, 4, 7, 8]
    out = verify_drafts(onehot_logits(rows), [req() for _ in drafts], drafts)
    assert out == [[5, 7, 2], [1, 1, 8], [6], [3]]


def test_unusable_row_yields_bad_token():
    logits = onehot_logits([5, 7, 2])
    logits[1] = float("nan")
    assert verify_drafts(logits, [req()], [[5, 7]]) == [[5, BAD_TOKEN]]


CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52}  # chi-square quantile 0.999 by df


def chi_square_ok(tokens: torch.Tensor, expected: torch.Tensor) -> None:
    counts = torch.bincount(tokens, minlength=expected.numel()).double()
    assert counts[expected == 0].sum() == 0, (counts, expected)
    e = expected[expected > 0].double() * counts.sum()
    stat = float(((counts[expected > 0] - e) ** 2 / e).sum())
    assert stat < CHI2_999[int((expected > 0).sum()) - 1], (stat, counts.tolist(), e.tolist())


def reference_probs(logits, temperature, top_k):
    p = torch.softmax(logits / temperature, -1)
    if top_k > 0:
        keep = p.topk(top_k).indices
        p = torch.zeros_like(p).index_fill_(0, keep, 1.0) * p
    return p / p.sum()


@pytest.mark.parametrize("temperature, top_k, seeded", [(1.0, -1, False), (0.7, 3, False), (1.3, -1, True)])
def test_rejection_sampling_keeps_the_distribution(temperature, top_k, seeded):
    torch.manual_seed(0)
    base = torch.tensor([[1.0, 0.2, -0.5, 0.7, -1.0], [0.1, 0.9, 0.3, -0.2, 0.0], [-0.3, 0.4, 1.2, 0.0, 0.5]])
    drafts_one = [3, 1]  # d0 = 3 has moderate probability, d1 = 1 the largest at row 1
    n = 4000 if seeded else 20000
    reqs = [req(temperature, seed=i if seeded else None, top_k=top_k) for i in range(n)]
    logits = base.repeat(n, 1)
    out = verify_drafts(logits, reqs, [drafts_one] * n, torch.Generator().manual_seed(1))
    expected = [reference_probs(base[j], temperature, top_k) for j in range(3)]
    t0 = torch.tensor([o[0] for o in out])
    chi_square_ok(t0, expected[0])
    after_d0 = [o for o in out if o[0] == drafts_one[0]]
    assert all(len(o) >= 2 for o in after_d0)  # an accepted draft always brings the next token
    chi_square_ok(torch.tensor([o[1] for o in after_d0]), expected[1])
    after_d1 = [o for o in after_d0 if o[1] == drafts_one[1]]
    chi_square_ok(torch.tensor([o[2] for o in after_d1]), expected[2])
    # the draft is accepted exactly when emitted: acceptance rate ~ p0(d0)
    rate = len(after_d0) / n
    assert abs(rate - float(expected[0][drafts_one[0]])) < 4 * (0.25 / n) ** 0.5


def test_seeded_requests_use_their_own_generator():
    base = torch.randn(3, 8, generator=torch.Generator().manual_seed(3))
    shared = torch.Generator().manual_seed(7)
    state = shared.get_state()
    a = verify_drafts(base.clone(), [req(1.0, seed=11)], [[2, 5]], shared)
    assert torch.equal(shared.get_state(), state)  # only the request's generator advanced
    b = verify_drafts(base.clone(), [req(1.0, seed=11)], [[2, 5]], shared)
    assert a == b


def test_greedy_and_sampled_rows_mix():
    drafts = [[5, 7], [2]]
    logits = onehot_logits([5, 7, 9, 2, 4])
    logits[3:] = onehot_logits([2, 4])[:] * 100  # near one-hot: sampling picks the argmax
    out = verify_drafts(logits, [req(), req(1.0)], drafts, torch.Generator().manual_seed(0))
    assert out == [[5, 7, 9], [2, 4]]


# ------------------------------------------------------------------------ runtime glue
class MaskMatcher(SeqMatcher):
    """SeqMatcher that also writes its mask: only the next allowed token."""

    def fill_next_token_bitmask(self, bitmask, index):
        bitmask[index].zero_()
        if self.pos < len(self.allowed):
            t = self.allowed[self.pos]
            bitmask[index, t // 32] = 1 << (t % 32)


def test_draft_rows_get_the_mask_of_their_prefix():
    from radixlm.runtime.speculative_worker import run_verify

    m = MaskMatcher([3, 9, 4, 2])
    r0 = SimpleNamespace(sampling_params=SamplingParams(temperature=0.0), generator=None, grammar_matcher=m,
                         output_ids=[])
    r1 = SimpleNamespace(sampling_params=SamplingParams(temperature=0.0, min_new_tokens=2), generator=None,
                         grammar_matcher=None, output_ids=[])
    logits = torch.zeros(6, 40)
    logits[:, 0] = 10.0  # token 0 (EOS here) is everyone's argmax unless masked
    out = run_verify(logits, [r0, r1], [[3, 9], [5, 5]], eos_ids=[0], generator=None)
    assert out[0] == [3, 9, 4]  # each row only allows the grammar's next token: all accepted + bonus
    assert m.pos == 0  # matcher rolled back
    assert torch.isinf(logits[3:5, 0]).all() and logits[5, 0] == 10.0  # EOS blocked for 2 rows only
    assert out[1] == [1]  # row 0 of r1: EOS blocked, argmax of the rest (ties -> first), draft 5 rejected


def test_drafter_respects_room_and_pool():
    from radixlm.runtime.speculative_worker import NgramDrafter, kept_kv_len

    d = NgramDrafter(4, 1, 8)
    mk = lambda out, max_new: SimpleNamespace(  # noqa: E731
        sampling_params=SamplingParams(temperature=0.0, max_new_tokens=max_new), origin_input_ids=[1, 2, 3, 4, 5, 6, 1],
        output_ids=list(out), max_total=7 + max_new, num_tokens=7 + len(out), spec_index=None, grammar_matcher=None,
        finished=False)
    assert d.draft(mk([], 10)) == [2, 3, 4, 5]
    assert d.draft(mk([2], 3)) == [3]  # 2 tokens left: one draft + the step's own token
    assert d.draft(mk([2, 3], 3)) == []
    pen = mk([], 10)
    pen.sampling_params.repetition_penalty = 1.2
    assert d.draft(pen) == []
    biased = mk([], 10)
    biased.sampling_params.logit_bias = {2: -100.0}  # the verify step reads unbiased logits: no drafts
    assert d.draft(biased) == []
    assert d.drafts([mk([], 10), mk([], 10)], free_slots=5) == [[2, 3, 4], []]
    assert kept_kv_len(10, 2, 20) == 13 and kept_kv_len(10, 3, 12) == 12
