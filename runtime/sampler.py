"""Turn next-token logits into tokens: penalties, temperature, top-k/top-p/min-p, seeded sampling.

Runs on whatever device the logits live on. Greedy rows (temperature < 1e-6) take the argmax and
draw no random numbers, so their output never depends on the rest of the batch.

Failures stay in their row: a request whose penalties fail, or whose logits/probabilities are not
usable (NaN, all ``-inf``, +inf under sampling), gets :data:`BAD_TOKEN` instead of a token, and the
output processor ends that request with an error; the other rows sample normally.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from radixlm.runtime.memory import to_device
from radixlm.runtime.request import Req

BAD_TOKEN = -1  # sampled id of a row whose distribution was unusable


def apply_penalties(logits: torch.Tensor, reqs: Sequence[Req]) -> None:
    """In place on fp32 ``[B, V]``: OpenAI frequency/presence penalties over the generated tokens,
    the CTRL repetition penalty (Keskar et al. 2019, HF semantics) over prompt + generated, then
    OpenAI's ``logit_bias`` (added to the named tokens' logits; ids past ``V`` are skipped)."""
    for i, r in enumerate(reqs):
        try:
            _penalize_row(logits, i, r)
        except Exception:  # NOTE: poison the row only; sample() turns it into BAD_TOKEN
            logits[i] = float("nan")


def _penalize_row(logits: torch.Tensor, i: int, r: Req) -> None:
    vocab = logits.shape[1]
    sp = r.sampling_params
    if (sp.frequency_penalty or sp.presence_penalty) and r.output_ids:
        out = torch.tensor(r.output_ids, device=logits.device)
        counts = torch.bincount(out[out < vocab], minlength=vocab).to(logits.dtype)
        logits[i] -= sp.frequency_penalty * counts + sp.presence_penalty * (counts > 0).to(logits.dtype)
    if sp.repetition_penalty != 1.0:
        ids = torch.tensor(sorted(set(r.all_ids)), device=logits.device)
        ids = ids[ids < vocab]
        vals = logits[i, ids]
        logits[i, ids] = torch.where(vals > 0, vals / sp.repetition_penalty, vals * sp.repetition_penalty)
    if sp.logit_bias:
        pairs = [(t, b) for t, b in sp.logit_bias.items() if t < vocab]
        if pairs:
            ids = torch.tensor([t for t, _ in pairs], device=logits.device)
            logits[i, ids] += torch.tensor([b for _, b in pairs], device=logits.device, dtype=logits.dtype)


def block_tokens_before_min(logits: torch.Tensor, reqs: Sequence[Req], eos_ids: Sequence[int]) -> None:
    """Forbid EOS and ``stop_token_ids`` while fewer than ``min_new_tokens`` were generated."""
    for i, r in enumerate(reqs):
        sp = r.sampling_params
        if len(r.output_ids) < sp.min_new_tokens:
            banned = [t for t in list(eos_ids) + list(sp.stop_token_ids) if t < logits.shape[1]]
            if banned:
                logits[i, banned] = float("-inf")


def filter_probs(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Zero out probabilities outside top-k / top-p (nucleus, Holtzman et al. 2020) / min-p, all
    judged on the same ``probs`` (SGLang's joint convention). Each filter is a threshold on the
    probability, so tied tokens are kept or dropped together: top-k keeps ``p >=`` the k-th largest
    (``top_k`` int ``[B]`` in ``[1, V]``); top-p keeps tokens whose strictly more probable mass is
    ``< top_p`` (``top_p >= 1`` keeps all); min-p keeps ``p >= min_p * max(p)``. A row whose
    ``top_p``/``min_p`` is NaN (or ``top_p <= 0``) keeps nothing, so :func:`sample` marks it bad."""
    vocab = probs.shape[-1]
    sorted_p = probs.sort(dim=-1, descending=True).values
    before = sorted_p.cumsum(-1) - sorted_p
    n_p = torch.where(top_p >= 1, vocab, (before < top_p[:, None]).sum(-1))
    n = torch.minimum(top_k.clamp(1, vocab), n_p)[:, None]  # tokens kept by top-k and top-p
    thr = sorted_p.gather(-1, (n - 1).clamp_min(0)).masked_fill(n == 0, float("inf"))
    thr = torch.maximum(thr, min_p[:, None] * sorted_p[:, :1])
    return torch.where(probs >= thr, probs, 0.0)


@dataclass(slots=True)
class SamplingColumns:
    """The sampling settings of a batch's rows as tensors on the logits' device (row ``i`` is
    ``reqs[i]``), built once per batch by :meth:`of` and reusable while the rows do not change.

    greedy: per row, whether it takes the argmax. temperature, top_p, min_p: fp32 ``[B]``
    (temperature clamped to ``[1e-6, 1e30]``); top_k: int64 ``[B]`` in ``[1, V]``; sampled: bool
    ``[B]`` (not greedy); shared: int64 indices of the sampled rows without a generator of their
    own (one draw from the batch's generator), or None; seeded: the sampled rows with one.
    """

    greedy: list[bool]
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    sampled: torch.Tensor
    shared: torch.Tensor | None
    seeded: list[int]

    @classmethod
    def of(cls, reqs: Sequence[Req], vocab: int, device: torch.device, dtype: torch.dtype = torch.float32,
           greedy: list[bool] | None = None) -> "SamplingColumns | None":
        """The columns of ``reqs`` (``greedy``: their ``is_greedy``, when known), or None when
        some row's settings are not numbers (then rows are sampled one by one)."""
        sp = [r.sampling_params for r in reqs]
        greedy = greedy if greedy is not None else [p.is_greedy for p in sp]
        try:
            temp = to_device([min(max(float(p.temperature), 1e-6), 1e30) for p in sp], device, dtype)
            top_k = to_device([min(p.top_k, vocab) if p.top_k > 0 else vocab for p in sp], device)
            top_p = to_device([float(p.top_p) for p in sp], device, dtype)
            min_p = to_device([float(p.min_p) for p in sp], device, dtype)
        except (TypeError, ValueError, OverflowError, RuntimeError):  # a bad value in some row
            return None
        shared = [i for i, r in enumerate(reqs) if not greedy[i] and r.generator is None]
        seeded = [i for i, r in enumerate(reqs) if not greedy[i] and r.generator is not None]
        return cls(greedy, temp, top_k, top_p, min_p, ~to_device(greedy, device, torch.bool),
                   to_device(shared, device) if shared else None, seeded)


def sample(logits: torch.Tensor, reqs: Sequence[Req], generator: torch.Generator | None = None,
           all_greedy: bool = False, columns: SamplingColumns | None = None) -> torch.Tensor:
    """Pick one token per row of fp32 ``logits [B, V]`` (already penalized and masked).

    Seeded requests draw from their own ``torch.Generator`` kept in ``req.generator``;
    the others from ``generator``. ``all_greedy``: the caller knows that every request samples
    greedily (``DecodeFacts.greedy``), so the rows are not checked one by one; ``columns``: the
    rows' :class:`SamplingColumns` when the caller keeps them (else built here). Returns int64
    ``[B]`` on the logits' device.
    """
    b, vocab = logits.shape
    top, out = logits.max(dim=-1)
    # NOTE: one reduction for all rows (max propagates NaN; a row of -inf has max -inf): a row is
    # unusable when its max is not > -inf (NaN compares False); the per-row branch only runs when
    # something is wrong
    ok = top > float("-inf")
    if all_greedy:
        return torch.where(ok, out, BAD_TOKEN)  # NOTE: no host sync (overlap scheduling)
    if columns is None:
        greedy = [r.sampling_params.is_greedy for r in reqs]
        if all(greedy):
            return torch.where(ok, out, BAD_TOKEN)
        columns = SamplingColumns.of(reqs, vocab, logits.device, logits.dtype, greedy)
        if columns is None:
            return _sample_rows(logits, reqs, generator)
    c = columns
    probs = filter_probs(torch.softmax(logits / c.temperature[:, None], dim=-1), c.top_k, c.top_p, c.min_p)
    bad = ~ok | (c.sampled & (~torch.isfinite(probs).all(-1) | ~(probs.sum(-1) > 0)))
    probs = torch.where(bad[:, None], 1.0, probs)  # NOTE: placeholder so multinomial takes the batch
    # NOTE: unseeded rows share one draw; seeded rows draw from their own generator.
    if c.shared is not None:
        out[c.shared] = torch.multinomial(probs[c.shared], 1, generator=generator).squeeze(1)
    for i in c.seeded:
        out[i] = torch.multinomial(probs[i], 1, generator=reqs[i].generator)[0]
    return _mark_bad(out, bad)


def _mark_bad(out: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    return torch.where(bad, BAD_TOKEN, out)  # NOTE: no host sync (overlap scheduling)


def _sample_rows(logits: torch.Tensor, reqs: Sequence[Req], generator: torch.Generator | None) -> torch.Tensor:
    """Slow path: sample each row alone so a row whose parameters fail gets BAD_TOKEN."""
    out = torch.empty(len(reqs), dtype=torch.int64, device=logits.device)
    for i, r in enumerate(reqs):
        try:
            out[i] = sample(logits[i : i + 1], [r], generator)[0]
        except (TypeError, ValueError, OverflowError, RuntimeError):
            out[i] = BAD_TOKEN
    return out


def make_generator(seed: int, device: torch.device) -> torch.Generator:
    """A generator for one seeded request."""
    return torch.Generator(device=device).manual_seed(seed)
