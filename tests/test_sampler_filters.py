"""top-k / top-p / min-p filtering of ``runtime/sampler.py`` against an independent reference.

The reference (plain Python, float64) states the semantics the sampler must have:

* the filters are judged jointly on the same tempered distribution ``p = softmax(logits / T)``
  (SGLang's convention: no renormalization between top-k and top-p), and the kept tokens are
  renormalized once;
* top-k (``k >= 1``; -1 off): keep ``p_t >= `` the k-th largest probability (tokens tied with the
  k-th are kept too, as in HF's and vLLM's top-k);
* top-p (``< 1``; 1 off): keep ``t`` when the mass of tokens *strictly more probable* than ``t``
  is ``< top_p`` (HF/vLLM's boundary; a tie group is kept or dropped whole, so the result never
  depends on how a sort orders equal values);
* min-p: keep ``p_t >= min_p * max(p)``;
* tokens with logit ``-inf`` (grammar masks) have ``p = 0`` and are never kept.
"""

from __future__ import annotations

import math

import pytest
import torch

from radixlm.runtime.request import Req
from radixlm.runtime.sampler import filter_probs, make_generator, sample
from radixlm.runtime.sampling_params import SamplingParams

NEG = float("-inf")


def reference(logits: list[float], temperature: float, top_k: int, top_p: float, min_p: float) -> list[float]:
    """Filtered, renormalized distribution (float64, one row). Asserts the row is not within 1e-6
    of a top-p boundary (float32 rounding could then decide either way)."""
    scaled = [x / temperature for x in logits]
    m = max(scaled)
    e = [math.exp(x - m) if x != NEG else 0.0 for x in scaled]
    total = sum(e)
    p = [x / total for x in e]
    keep = [x > 0 for x in p]
    ranked = sorted(p, reverse=True)
    if 1 <= top_k < len(p):
        keep = [k and x >= ranked[top_k - 1] for k, x in zip(keep, p)]
    if top_p < 1:
        above = [sum(y for y in p if y > x) for x in p]
        assert all(abs(a - top_p) > 1e-6 for a in above), "test row sits on a top-p boundary"
        keep = [k and a < top_p for k, a in zip(keep, above)]
    keep = [k and x >= min_p * ranked[0] for k, x in zip(keep, p)]
    kept = sum(x for k, x in zip(keep, p) if k)
    return [x / kept if k else 0.0 for k, x in zip(keep, p)]


def filtered(logits: list[float], temperature: float, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """The sampler's filtered distribution for one row, renormalized (float64 for comparison)."""
    x = torch.tensor([logits], dtype=torch.float32)
    probs = torch.softmax(x / temperature, dim=-1)
    k = torch.tensor([top_k if top_k >= 1 else x.shape[1]])
    f = filter_probs(probs, k, torch.tensor([top_p]), torch.tensor([min_p]))[0].double()
    return f / f.sum()


L1 = [math.log(v) for v in (0.5, 0.2, 0.15, 0.1, 0.05)]

# (logits, temperature, top_k, top_p, min_p, expected kept ids or None = only check vs reference)
CASES = [
    (L1, 1.0, -1, 1.0, 0.0, {0, 1, 2, 3, 4}),
    (L1, 1.0, 1, 1.0, 0.0, {0}),
    (L1, 1.0, 3, 1.0, 0.0, {0, 1, 2}),
    (L1, 1.0, 100, 1.0, 0.0, {0, 1, 2, 3, 4}),
    (L1, 1.0, -1, 0.6, 0.0, {0, 1}),
    (L1, 1.0, -1, 0.45, 0.0, {0}),
    (L1, 1.0, -1, 0.01, 0.0, {0}),
    (L1, 1.0, -1, 0.99, 0.0, {0, 1, 2, 3, 4}),
    (L1, 1.0, -1, 1.0, 0.25, {0, 1, 2}),
    (L1, 1.0, -1, 1.0, 1.0, {0}),
    (L1, 1.0, 3, 0.6, 0.0, {0, 1}),
    (L1, 1.0, 4, 1.0, 0.25, {0, 1, 2}),
    (L1, 1.0, 2, 0.9, 0.3, {0, 1}),
    (L1, 1.0, -1, 0.9, 0.0, {0, 1, 2, 3}),
    (L1, 0.5, -1, 0.85, 0.0, {0, 1}),
    (L1, 2.0, -1, 0.8, 0.0, None),
    (L1, 0.7, 4, 0.95, 0.05, None),
    # ties: kept or dropped together
    ([2.0, 2.0, 1.0, 0.0], 1.0, 1, 1.0, 0.0, {0, 1}),
    ([2.0, 2.0, 1.0, 0.0], 1.0, 2, 1.0, 0.0, {0, 1}),
    ([2.0, 2.0, 1.0, 0.0], 1.0, 3, 1.0, 0.0, {0, 1, 2}),
    ([0.0, 3.0, 1.0, 1.0, 1.0], 1.0, 2, 1.0, 0.0, {1, 2, 3, 4}),
    ([1.0, 1.0, 1.0, 1.0], 1.0, -1, 0.3, 0.0, {0, 1, 2, 3}),
    ([math.log(v) for v in (0.2, 0.4, 0.2, 0.2)], 1.0, -1, 0.5, 0.0, {0, 1, 2, 3}),
    ([math.log(v) for v in (0.2, 0.4, 0.2, 0.2)], 1.0, -1, 0.35, 0.0, {1}),
    ([0.0, 0.0, 5.0, 5.0, NEG], 1.0, -1, 1.0, 0.5, {2, 3}),
    # masked tokens (-inf) are never kept, whatever the filters
    ([NEG, 1.0, NEG, 0.5], 1.0, 1, 1.0, 0.0, {1}),
    ([NEG, 1.0, NEG, 0.5], 1.0, -1, 1.0, 0.0, {1, 3}),
    ([NEG, 1.0, NEG, 0.5], 1.0, 4, 1.0, 0.0, {1, 3}),
    ([NEG, 1.0, NEG, 0.5], 1.0, -1, 0.999, 0.0, {1, 3}),
]


@pytest.mark.parametrize("logits,temperature,top_k,top_p,min_p,expected", CASES)
def test_filtered_distribution_matches_reference(logits, temperature, top_k, top_p, min_p, expected):
    want = reference(logits, temperature, top_k, top_p, min_p)
    if expected is not None:  # the reference itself, against hand-computed sets
        assert {i for i, x in enumerate(want) if x > 0} == expected
    got = filtered(logits, temperature, top_k, top_p, min_p)
    assert {i for i, x in enumerate(got.tolist()) if x > 0} == {i for i, x in enumerate(want) if x > 0}
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("top_k,top_p,min_p", [(-1, 1.0, 0.0), (50, 1.0, 0.0), (-1, 0.9, 0.0),
                                               (-1, 1.0, 0.05), (20, 0.8, 0.02), (1, 0.5, 0.5)])
def test_large_random_rows_match_reference(seed, top_k, top_p, min_p):
    """Vocabulary 1000, logits ~ N(0, 2): top_p=1 and min_p=0 keep every token exactly."""
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(1000, generator=gen) * 2).tolist()
    want = torch.tensor(reference(logits, 0.8, top_k, top_p, min_p), dtype=torch.float64)
    got = filtered(logits, 0.8, top_k, top_p, min_p)
    assert torch.equal(got > 0, want > 0)
    assert torch.allclose(got, want, atol=1e-6)


def test_batch_rows_are_filtered_independently():
    """One batched call equals the rows filtered alone (per-row parameters)."""
    rows = [(L1, 1.0, 2, 1.0, 0.0), ([2.0, 2.0, 1.0, 0.0, -1.0], 1.0, -1, 0.3, 0.0), (L1, 1.0, -1, 1.0, 0.25)]
    x = torch.tensor([r[0] for r in rows], dtype=torch.float32)
    probs = torch.softmax(x, dim=-1)
    f = filter_probs(probs, torch.tensor([2, 5, 5]), torch.tensor([1.0, 0.3, 1.0]), torch.tensor([0.0, 0.0, 0.25]))
    for i, r in enumerate(rows):
        want = torch.tensor(reference(*r), dtype=torch.float64)
        assert torch.allclose(f[i].double() / f[i].sum(), want, atol=1e-6), i


# ---------------------------------------------------------------- sampling frequencies

SMALL = [1.0, 0.5, 0.2, 0.0, -0.5, -3.0]
STAT_CASES = [
    (1.0, -1, 1.0, 0.0),
    (0.7, 4, 0.9, 0.05),
    (1.3, -1, 0.75, 0.0),
    (1.0, 3, 1.0, 0.0),
    (1.0, -1, 1.0, 0.3),
]


def _req(temperature, top_k, top_p, min_p, seed=None) -> Req:
    r = Req("r", [1, 2], SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p))
    if seed is not None:
        r.generator = make_generator(seed, torch.device("cpu"))
    return r


def _check_frequencies(ids: torch.Tensor, want: list[float]) -> None:
    n = ids.numel()
    counts = torch.bincount(ids, minlength=len(want)).double()
    for t, p in enumerate(want):
        if p == 0:
            assert counts[t] == 0, f"token {t} is filtered out but was sampled {int(counts[t])} times"
        else:  # 5 standard deviations of a binomial proportion
            assert abs(counts[t] / n - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-12, (t, counts[t] / n, p)


@pytest.mark.parametrize("temperature,top_k,top_p,min_p", STAT_CASES)
def test_sampling_frequencies_match_filtered_softmax(temperature, top_k, top_p, min_p):
    """20000 draws (unseeded rows share the runner's generator) follow the reference."""
    n = 20000
    want = reference(SMALL, temperature, top_k, top_p, min_p)
    reqs = [_req(temperature, top_k, top_p, min_p)] * n
    logits = torch.tensor([SMALL], dtype=torch.float32).expand(n, -1).contiguous()
    ids = sample(logits, reqs, torch.Generator().manual_seed(1234))
    _check_frequencies(ids, want)


def test_seeded_sampling_frequencies_and_reproducibility():
    """Rows with their own seeded generators: the draws follow the reference and repeat exactly."""
    n, params = 3000, (0.7, 4, 0.9, 0.05)
    want = reference(SMALL, *params)
    logits = torch.tensor([SMALL], dtype=torch.float32).expand(n, -1).contiguous()
    first = sample(logits, [_req(*params, seed=s) for s in range(n)])
    _check_frequencies(first, want)
    assert torch.equal(first, sample(logits, [_req(*params, seed=s) for s in range(n)]))
