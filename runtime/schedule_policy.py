"""Waiting-queue ordering policies (SGLang paper, §4 "cache-aware scheduling").

* ``lpm``: longest cached prefix first (falls back to ``fcfs`` when the queue is long, where the
  matching would cost more than it saves).
* ``dfs-weight``: depth-first order over the radix tree, heavier subtrees (more waiting requests)
  first; requests are placed at the node their match ends at, after that node's subtree.
* ``fcfs`` (arrival order), ``lof`` (longest ``max_new_tokens`` first), ``random``.

In-batch prefix sharing (``lpm`` and ``dfs-weight``): when waiting requests share at least
``in_batch_prefix_threshold`` tokens with each other beyond what the cache holds, only the first of
them (in priority order) stays eligible; the others get ``req.deprioritized = True`` and
move to the back, so the scheduler admits one and the rest hit the cache next step.

The policy never locks the cache; its only effects on it are those of ``match_prefix`` (access
times and edge splits).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import torch

from radixlm.radix.cache import RadixCache

if TYPE_CHECKING:
    from radixlm.radix.base import PrefixCache
    from radixlm.runtime.request import Req

POLICIES = ("lpm", "dfs-weight", "fcfs", "lof", "random")
CACHE_AWARE = ("lpm", "dfs-weight")


class SchedulePolicy:
    """Orders the waiting queue before admission.

    Args:
        policy: one of ``POLICIES``.
        tree_cache: the prefix cache (a disabled cache turns ``lpm``/``dfs-weight`` into ``fcfs``).
        lpm_fallback_queue_len: ``lpm`` uses ``fcfs`` when more requests than this are waiting.
        in_batch_prefix_threshold: shared uncached tokens that make a request wait a round.
        seed: seed of the ``random`` policy.

    Raises:
        ValueError: unknown policy.
    """

    def __init__(
        self,
        policy: str,
        tree_cache: PrefixCache,
        lpm_fallback_queue_len: int = 128,
        in_batch_prefix_threshold: int = 32,
        seed: int | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown schedule policy {policy!r}; choose from {POLICIES}")
        self.policy = policy
        self.tree_cache = tree_cache
        self.lpm_fallback_queue_len = lpm_fallback_queue_len
        self.in_batch_prefix_threshold = in_batch_prefix_threshold
        self._rng = random.Random(seed)

    def effective_policy(self, queue_len: int) -> str:
        """The policy actually applied to a queue of ``queue_len`` requests."""
        if self.policy in CACHE_AWARE and self.tree_cache.disabled:
            return "fcfs"
        if self.policy == "lpm" and queue_len > self.lpm_fallback_queue_len:
            return "fcfs"
        return self.policy

    def calc_priority(self, waiting: list[Req]) -> None:
        """Reorder ``waiting`` in place; sets ``req.deprioritized`` on every request and,
        for ``lpm``/``dfs-weight``, ``req.match_len`` (cached prefix length now)."""
        policy = self.effective_policy(len(waiting))
        for req in waiting:
            req.deprioritized = False
        if policy == "fcfs":
            waiting.sort(key=lambda r: r.arrival)
        elif policy == "lof":
            waiting.sort(key=lambda r: -r.sampling_params.max_new_tokens)
        elif policy == "random":
            self._rng.shuffle(waiting)
        else:
            last_nodes = self._match_all(waiting)
            if policy == "lpm":
                waiting.sort(key=lambda r: -r.match_len)
            else:
                waiting[:] = _dfs_weight_order(waiting, last_nodes, self.tree_cache.root_node)
            self._deprioritize_in_batch_sharing(waiting)

    def _match_all(self, waiting: list[Req]) -> dict[int, object]:
        """Match every request once; returns ``id(req) -> last_node``."""
        last_nodes = {}
        for req in waiting:
            indices, node = self.tree_cache.match_prefix(req.all_ids)
            req.match_len = int(indices.numel())
            last_nodes[id(req)] = node
        return last_nodes

    def _deprioritize_in_batch_sharing(self, waiting: list[Req]) -> None:
        """Keep one request per group sharing a long uncached prefix; move the others back."""
        threshold = self.in_batch_prefix_threshold
        if threshold <= 0 or len(waiting) < 2:
            return
        seen = RadixCache(None)  # key-only tree of the eligible requests so far
        eligible, later = [], []
        for req in waiting:
            ids = req.all_ids
            shared = seen.match_prefix(ids).indices.numel()
            if shared - req.match_len >= threshold:
                req.deprioritized = True
                later.append(req)
                continue
            if len(ids) - req.match_len >= threshold:
                seen.insert(ids, torch.empty(len(ids), dtype=torch.int64))
            eligible.append(req)
        waiting[:] = eligible + later


def _dfs_weight_order(waiting: list[Req], last_nodes: dict[int, object], root) -> list[Req]:
    """SGLang's DFS order: children by descending weight (waiting requests in the subtree, ties
    by earliest queue position), each node's own requests after its subtree. Only the part of the
    tree that holds matches is visited."""
    at_node: dict[object, list[Req]] = {}
    weight: dict[object, int] = {}
    first: dict[object, int] = {}
    for pos, req in enumerate(waiting):
        node = last_nodes[id(req)]
        at_node.setdefault(node, []).append(req)
        while node is not None:
            weight[node] = weight.get(node, 0) + 1
            first.setdefault(node, pos)
            node = node.parent
    order: list[Req] = []
    # Iterative post-order DFS: (node, expanded?)
    stack: list[tuple[object, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.extend(at_node.get(node, ()))
            continue
        stack.append((node, True))
        kids = [c for c in node.children.values() if c in weight]
        kids.sort(key=lambda c: (-weight[c], first[c]))
        stack.extend((c, False) for c in reversed(kids))
    return order
