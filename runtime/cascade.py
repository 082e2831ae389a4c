"""Cascade attention plans: which decode rows read a shared cached prefix once, together.

With the radix cache, requests that matched the same cached prefix (a system prompt, few-shot
examples) hold the very same KV slots for it. Plain decode attention reads those slots once per
request; cascade attention (Hydragen, Juravsky et al. 2024; FlashInfer's cascade inference;
vLLM's cascade attention) reads them once per *chunk* of requests and merges that partial result
with each request's own part by log-sum-exp (:class:`radixlm.kernels.decode_attention.SharedPrefix`).

A plan is built on the host from the cache bookkeeping, without reading device memory: a request
whose ``last_node`` is cache node ``n`` owns the slots of ``n``'s root path in its req_to_token row
(``runtime/request.py``), and ``n`` stays locked while the request runs, so two rows whose
requests lie under one node share that node's ``end`` leading slots. A row joins the deepest node
it shares with another row of the batch, found by climbing a few levels from its ``last_node``
(after prefill that is the request's own prompt leaf; its siblings hang below the branch point),
else its *anchor*: the topmost ancestor at least ``min_shared`` tokens deep (memoized per request).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from radixlm.kernels.decode_attention import SharedPrefix

# Shared prefixes shorter than this many tokens are read per request as before.
CASCADE_MIN_SHARED = 256
# Levels a row climbs from its last_node looking for a node shared with another row, before it
# falls back to its anchor (the topmost node at least CASCADE_MIN_SHARED deep).
CASCADE_LEVELS = 4
# Most rows of one chunk: the shared stage holds CHUNK x (query heads per KV head) query rows.
CASCADE_CHUNK = 16
# A plan is used only when it saves at least this many KV bytes per layer, which pays for the two
# extra kernels per layer (~3 us each, ~16 MiB of HBM reads at H200 bandwidth).
CASCADE_MIN_SAVED_BYTES_PER_LAYER = 16 << 20


@dataclass
class CascadePlan:
    """Host lists of a :class:`~radixlm.kernels.decode_attention.SharedPrefix` for ``n`` rows.

    Attributes:
        start: ``[n]`` first own position of each row (the chunk's shared length; 0 = no chunk).
        chunk_rows: ``[chunks][<= chunk]`` batch rows of each chunk's members.
        chunk_req: ``[chunks]`` req_to_token row the chunk's shared slots are read from.
        chunk_len: ``[chunks]`` shared positions ``[0, len)`` of each chunk.
    """

    start: list[int]
    chunk_rows: list[list[int]]
    chunk_req: list[int]
    chunk_len: list[int]

    def flat(self, rows: int, chunk: int) -> list[int]:
        """The plan as one int list for a buffer of ``rows`` rows and ``chunk`` rows per chunk
        (:func:`cascade_shape`): ``start[rows, padded to even] | chunk_rows[chunks * chunk] |
        chunk_req[chunks] | chunk_len[chunks]`` (padding: start 0, member -1, req 0, len 0), the
        layout :func:`shared_views` reads."""
        chunks = cascade_shape(rows, chunk)[0]
        n = len(self.start)
        out = self.start + [0] * (_even(rows) - n)
        for members in self.chunk_rows:
            out += members + [-1] * (chunk - len(members))
        pad = chunks - len(self.chunk_rows)
        assert pad >= 0, f"{len(self.chunk_rows)} chunks do not fit a buffer of {rows} rows"
        out += [-1] * (pad * chunk)
        out += self.chunk_req + [0] * pad
        out += self.chunk_len + [0] * pad
        return out


def cascade_shape(rows: int, chunk: int) -> tuple[int, int]:
    """``(chunks, flat length)`` of a plan buffer for ``rows`` rows: at most ``rows // 2`` chunks
    (each has two rows at least), rounded up to even; the buffer holds :meth:`CascadePlan.flat`."""
    chunks = -(-(rows // 2) // 2) * 2
    return chunks, _even(rows) + chunks * chunk + 2 * chunks


def _even(n: int) -> int:
    return n + (n & 1)


def shared_views(buf: torch.Tensor, rows: int, chunk: int) -> SharedPrefix:
    """The :class:`SharedPrefix` views of an int64 plan buffer laid out by :meth:`CascadePlan.flat`.

    NOTE: every view starts at a multiple of 16 bytes (the start region is padded to an even
    length, the chunk count is even): Triton specializes pointer arguments on 16-byte alignment,
    so unaligned views would compile more kernel variants while serving."""
    nc, _ = cascade_shape(rows, chunk)
    r = _even(rows)
    c0 = r + nc * chunk
    return SharedPrefix(start=buf[:rows], chunk_rows=buf[r:c0].view(nc, chunk),
                        chunk_req=buf[c0 : c0 + nc], chunk_len=buf[c0 + nc :])


def _anchor(req: Any, min_shared: int) -> Any:
    """The topmost ancestor-or-self of ``req.last_node`` at least ``min_shared`` tokens deep, or
    None. Memoized on the request per ``last_node`` (a walk of the path happens once)."""
    node = req.last_node
    if node is None or node.end < min_shared:
        return None
    memo = req.cascade_anchor
    if memo is not None and memo[0] is node:
        return memo[1]
    a = node
    while a.parent is not None and a.parent.end >= min_shared:
        a = a.parent
    req.cascade_anchor = (node, a)
    return a


class CascadePlanner:
    """Builds cascade plans for decode rows (one model runner owns one).

    Args:
        kv_bytes_per_token_layer: KV bytes of one token in one layer (K and V, all local KV heads).
        min_shared: shortest shared prefix worth a chunk (tokens, default :data:`CASCADE_MIN_SHARED`).
        chunk: most rows per chunk (default :data:`CASCADE_CHUNK`).
        min_saved_bytes: least KV bytes per layer a plan must save (default
            :data:`CASCADE_MIN_SAVED_BYTES_PER_LAYER`).
    """

    def __init__(self, kv_bytes_per_token_layer: int, min_shared: int = CASCADE_MIN_SHARED,
                 chunk: int = CASCADE_CHUNK, min_saved_bytes: int = CASCADE_MIN_SAVED_BYTES_PER_LAYER) -> None:
        self.min_shared = min_shared
        self.chunk = chunk
        self.min_saved_tokens = -(-min_saved_bytes // max(1, kv_bytes_per_token_layer))
        self._memo: tuple = (None, None)  # ((reqs, rows, last nodes), plan) of the previous call

    def plan(self, reqs: Sequence[Any], rows: Sequence[int], seq_lens: Sequence[int],
             max_chunks: int) -> CascadePlan | None:
        """The plan for batch rows whose requests are ``reqs`` (a request may own several rows,
        e.g. verify rows), in req_to_token ``rows``, attending to ``seq_lens`` keys, with at most
        ``max_chunks`` chunks; None when no prefix is shared by two rows or the plan saves too
        little.

        Consecutive decode steps of an unchanged batch reuse the previous plan (same request
        objects in the same req_to_token rows with the same ``last_node``: the plan depends only
        on those, as long as every row keeps an own key)."""
        nodes = [r.last_node for r in reqs]
        prev_key, prev_plan = self._memo
        key = (list(reqs), list(rows), nodes)
        if prev_key == key and (prev_plan is None or all(s > b for s, b in zip(seq_lens, prev_plan.start))):
            return prev_plan
        plan = self._build(reqs, rows, nodes, seq_lens, max_chunks)
        self._memo = (key, plan)
        return plan

    def _build(self, reqs, rows, nodes, seq_lens, max_chunks) -> CascadePlan | None:
        groups = self._group(reqs, nodes)
        if not groups:
            return None
        start = [0] * len(reqs)
        chunk_rows, chunk_req, chunk_len = [], [], []
        saved = 0
        for node, group in groups.values():
            members_ok = [b for b in group if seq_lens[b] > node.end]  # NOTE: a row keeps its new token's key
            for lo in range(0, len(members_ok), self.chunk):
                members = members_ok[lo : lo + self.chunk]
                if len(members) < 2 or len(chunk_rows) == max_chunks:
                    continue
                chunk_rows.append(members)
                chunk_req.append(rows[members[0]])
                chunk_len.append(node.end)
                saved += (len(members) - 1) * node.end
                for b in members:
                    start[b] = node.end
        if saved < self.min_saved_tokens:
            return None
        return CascadePlan(start, chunk_rows, chunk_req, chunk_len)

    def _group(self, reqs, nodes) -> dict[int, tuple[Any, list[int]]]:
        """Rows by the deepest cache node they share with another row: each row starts at its
        ``last_node`` and, while no other pending row is at the same node, moves to the parent
        (at most :data:`CASCADE_LEVELS` times, then to its anchor); nodes shallower than
        ``min_shared`` end the walk. Returns node id -> (node, rows)."""
        m = self.min_shared
        pending = [(i, n) for i, n in enumerate(nodes) if n is not None and n.end >= m]
        groups: dict[int, tuple[Any, list[int]]] = {}
        for _ in range(CASCADE_LEVELS):
            if not pending:
                return groups
            count: dict[int, int] = {}
            for _, n in pending:
                count[id(n)] = count.get(id(n), 0) + 1
            nxt = []
            for i, n in pending:
                if count[id(n)] > 1:
                    groups.setdefault(id(n), (n, []))[1].append(i)
                elif n.parent is not None and n.parent.end >= m:
                    nxt.append((i, n.parent))
            pending = nxt
        for i, _ in pending:
            a = _anchor(reqs[i], m)
            groups.setdefault(id(a), (a, []))[1].append(i)
        return groups
