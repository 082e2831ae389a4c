"""Verification of draft tokens from the logits of all their positions, in one pass for the batch.

Request ``i`` with drafts ``d_0..d_{k-1}`` owns ``k + 1`` consecutive logits rows: row ``j`` scores
the token after the request's tokens followed by ``d_0..d_{j-1}`` (row 0 is the ordinary decode
position). Rows must already carry everything the sampler would apply (grammar masks for the state
after ``d_0..d_{j-1}``, ``min_new_tokens`` blocking).

* Greedy rows accept the longest prefix of drafts equal to the row-wise argmax; the token after it
  is the argmax of the first disagreeing row (or of the last row: the "bonus" token). The output is
  exactly what step-by-step greedy decoding gives.
* Sampled rows use speculative rejection sampling (Leviathan et al. 2023, Chen et al. 2023) for a
  deterministic draft (``q = one-hot(d_j)``): ``d_j`` is accepted with probability ``p_j(d_j)``,
  where ``p_j`` is the request's processed distribution (temperature, top-k, top-p, min-p exactly as
  :func:`radixlm.runtime.sampler.sample` applies them); at the first rejection the token is drawn
  from ``p_j`` with ``d_j`` zeroed and renormalized (``norm(max(0, p - q))``); when all drafts are
  accepted the bonus token is drawn from ``p_k``. Each emitted token then has exactly the
  distribution step-by-step sampling would give it.

Seeded requests draw from their own generator (``req.generator``), the others from the shared one.
Rows whose distribution is unusable (NaN, all ``-inf``) reject their draft, and yield
:data:`~radixlm.runtime.sampler.BAD_TOKEN` when they must produce a token.
"""

from __future__ import annotations

from typing import Sequence

import torch

from radixlm.runtime.memory import to_device
from radixlm.runtime.sampler import BAD_TOKEN, filter_probs


def draft_offsets(drafts: Sequence[Sequence[int]]) -> list[int]:
    """First logits row of each request: request ``i`` owns rows ``[off[i], off[i] + len(drafts[i]) + 1)``."""
    offs, row = [], 0
    for d in drafts:
        offs.append(row)
        row += len(d) + 1
    return offs


def processed_probs(logits: torch.Tensor, reqs: Sequence, rows_per_req: Sequence[int]) -> torch.Tensor:
    """The sampling distribution of every row: fp32 ``[N, V]`` probabilities (unnormalized after
    the top-k/top-p/min-p filters, like the sampler's) with request ``i``'s parameters repeated over
    its ``rows_per_req[i]`` rows. Greedy requests get a placeholder temperature (their rows are
    decided by argmax)."""
    dev = logits.device
    sp = [r.sampling_params for r in reqs]
    vocab = logits.shape[1]
    reps = to_device(list(rows_per_req), dev)

    def per_row(values, dtype):
        return to_device(values, dev, dtype).repeat_interleave(reps)

    temp = per_row([min(max(float(p.temperature), 1e-6), 1e30) for p in sp], logits.dtype)
    top_k = per_row([min(p.top_k, vocab) if p.top_k > 0 else vocab for p in sp], torch.int64)
    top_p = per_row([float(p.top_p) for p in sp], logits.dtype)
    min_p = per_row([float(p.min_p) for p in sp], logits.dtype)
    return filter_probs(torch.softmax(logits / temp[:, None], dim=-1), top_k, top_p, min_p)


def verify_drafts(
    logits: torch.Tensor,
    reqs: Sequence,
    drafts: Sequence[Sequence[int]],
    generator: torch.Generator | None = None,
) -> list[list[int]]:
    """Accept or reject every request's drafts and pick the token after the accepted ones.

    Args:
        logits: fp32 ``[sum(len(d) + 1), V]``, rows laid out per :func:`draft_offsets`, already
            masked/penalized.
        reqs: one per request, with ``sampling_params`` and ``generator`` (a ``torch.Generator``
            or None).
        drafts: token ids proposed per request (may be empty: a plain decode row).
        generator: shared generator for unseeded sampled requests.
    Returns: per request the accepted drafts followed by one new token (length ``accepted + 1``);
    the last entry is ``BAD_TOKEN`` when that row's distribution was unusable.
    """
    n = len(reqs)
    if n == 0:
        return []
    dev = logits.device
    offs = draft_offsets(drafts)
    lens = [len(d) + 1 for d in drafts]
    greedy = [r.sampling_params.is_greedy for r in reqs]
    top, argmax = logits.max(dim=-1)  # NOTE: max propagates NaN
    usable = top > float("-inf")  # False for NaN anywhere in the row, or nothing allowed
    if all(greedy):  # NOTE: three kernels and one device-to-host copy per step
        return _verify_greedy(torch.where(usable, argmax, BAD_TOKEN).tolist(), offs, drafts)
    bad = ~usable
    # target[r]: the draft token row r checks (-1 on each request's last row)
    target = to_device([t for d in drafts for t in (*d, -1)], dev)
    has_draft = target >= 0
    safe_target = target.clamp_min(0)
    sampled_rows = to_device([not g for g, m in zip(greedy, lens) for _ in range(m)], dev, torch.bool)
    probs = processed_probs(logits, reqs, lens)
    probs = probs / probs.sum(-1, keepdim=True)
    bad = bad | (sampled_rows & (~torch.isfinite(probs).all(-1) | ~(probs.sum(-1) > 0)))
    probs = torch.where(bad[:, None], 1.0 / logits.shape[1], probs)
    u = _uniforms(reqs, lens, greedy, generator, dev)
    p_draft = probs.gather(1, safe_target[:, None]).squeeze(1)
    accept = torch.where(sampled_rows, u < p_draft, argmax == target)
    accept_host = (accept & has_draft & ~bad).tolist()
    num_acc = [_accepted_prefix(accept_host, off, d) for off, d in zip(offs, drafts)]
    final_rows = [off + a for off, a in zip(offs, num_acc)]
    last = _final_tokens(argmax, probs, target, bad, final_rows, num_acc, drafts, reqs, greedy, generator)
    return [list(d[:a]) + [t] for d, a, t in zip(drafts, num_acc, last)]


def _accepted_prefix(accept: Sequence[bool], off: int, draft: Sequence[int]) -> int:
    """Length of the run of accepted rows starting at ``off`` (at most ``len(draft)``)."""
    a = 0
    while a < len(draft) and accept[off + a]:
        a += 1
    return a


def _verify_greedy(best: Sequence[int], offs: Sequence[int], drafts: Sequence[Sequence[int]]) -> list[list[int]]:
    """All-greedy batch from the host copy of every row's argmax (``BAD_TOKEN`` on unusable rows):
    one device-to-host transfer per step and no host-to-device copy. A draft is accepted while it
    equals its row's argmax; the token after the accepted drafts is the argmax of the next row."""
    out = []
    for off, d in zip(offs, drafts):
        a = 0
        while a < len(d) and best[off + a] == d[a]:
            a += 1
        out.append(list(d[:a]) + [best[off + a]])
    return out


def _uniforms(reqs, lens, greedy, generator, dev) -> torch.Tensor:
    """One U(0,1) per row: unseeded rows in one draw from ``generator``, seeded requests from theirs."""
    total = sum(lens)
    u = torch.ones(total, device=dev)
    shared = [i for i, r in enumerate(reqs) if not greedy[i] and r.generator is None]
    offs = draft_offsets([[0] * (m - 1) for m in lens])
    if shared:
        idx = to_device([offs[i] + j for i in shared for j in range(lens[i])], dev)
        u[idx] = torch.rand(len(idx), generator=generator, device=dev)
    for i, r in enumerate(reqs):
        if not greedy[i] and r.generator is not None:
            u[offs[i] : offs[i] + lens[i]] = torch.rand(lens[i], generator=r.generator, device=dev)
    return u


def _final_tokens(argmax, probs, target, bad, rows, num_acc, drafts, reqs, greedy, generator) -> list[int]:
    """The token after the accepted drafts: argmax (greedy), else a draw from ``p`` at the final
    row, with the rejected draft zeroed when the row rejected one."""
    dev = argmax.device
    rows_t = to_device(rows, dev)
    out = argmax[rows_t].clone()
    if probs is not None:
        dist = probs[rows_t].clone()
        rejected = [i for i, (a, d) in enumerate(zip(num_acc, drafts)) if a < len(d) and not greedy[i]]
        if rejected:
            ri = to_device(rejected, dev)
            dist[ri, target[rows_t[ri]]] = 0.0
            # NOTE: p(d) == 1 leaves nothing; only reachable through float round-off (u < 1 == p)
            empty = ~(dist[ri].sum(-1) > 0)
            dist[ri] = torch.where(empty[:, None], probs[rows_t[ri]], dist[ri])
        shared = [i for i, r in enumerate(reqs) if not greedy[i] and r.generator is None]
        if shared:
            si = to_device(shared, dev)
            out[si] = torch.multinomial(dist[si], 1, generator=generator).squeeze(1)
        for i, r in enumerate(reqs):
            if not greedy[i] and r.generator is not None:
                out[i] = torch.multinomial(dist[i], 1, generator=r.generator)[0]
    out = torch.where(bad[rows_t], BAD_TOKEN, out)
    return out.tolist()
