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
times and edge splits). It remembers where each waiting request's last match ended and resumes
the next match there (:meth:`RadixCache.match_node`'s ``hint``): a request whose cached prefix did
not grow since costs O(1) per step instead of a walk over its tokens; the results, the order and
the cache's access times are those of full matches.
"""

from __future__ import annotations

import random
from operator import attrgetter
from typing import TYPE_CHECKING

import torch

from radixlm.radix.cache import RadixCache

if TYPE_CHECKING:
    from radixlm.radix.base import PrefixCache
    from radixlm.radix.node import TreeNode
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
        # NOTE: req -> (node its last match ended at, req.num_tokens then); rebuilt every match pass
        self._hints: dict[Req, tuple[TreeNode, int]] = {}

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
            waiting.sort(key=_ARRIVAL)
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
            self._deprioritize_in_batch_sharing(waiting, last_nodes)

    def hint_for(self, req: Req) -> TreeNode | None:
        """The node where ``req``'s last match (by this policy) ended, as a ``hint`` for matching
        ``req``'s tokens again (``None`` when unknown or when its tokens may have changed since)."""
        h = self._hints.get(req)
        if h is None:
            return None
        node, n = h
        # NOTE: a waiting request's tokens do not change; one that ran since only grew its output
        return node if n == req.num_tokens or node.end <= len(req.origin_input_ids) else None

    def _match_all(self, waiting: list[Req]) -> dict[int, object]:
        """Match every request once; returns ``id(req) -> last_node``."""
        cache, last_nodes = self.tree_cache, {}
        if not isinstance(cache, RadixCache):
            for req in waiting:
                indices, node = cache.match_prefix(req.all_ids)
                req.match_len = int(indices.numel())
                last_nodes[id(req)] = node
            return last_nodes
        hints: dict[Req, tuple[TreeNode, int]] = {}
        for req in waiting:
            node = cache.match_node(req_ids(req), hint=self.hint_for(req))
            req.match_len = node.end
            hints[req] = (node, req.num_tokens)
            last_nodes[id(req)] = node
        self._hints = hints
        return last_nodes

    def _deprioritize_in_batch_sharing(self, waiting: list[Req], last_nodes: dict[int, object]) -> None:
        """Keep one request per group sharing a long uncached prefix; move the others back.

        A request ``r`` waits when an earlier eligible request (one with at least ``threshold``
        uncached tokens) shares ``r.match_len + threshold`` tokens with it. NOTE: two such requests
        end their cache match at the same node (the shared part covers the first page past the
        match, when ``threshold >= page_size``), so the test is an exact lookup of
        ``(node, next threshold tokens)``: O(threshold) per request, not a walk over its tokens.
        """
        threshold = self.in_batch_prefix_threshold
        if threshold <= 0 or len(waiting) < 2:
            return
        if threshold < self.tree_cache.page_size:
            return self._deprioritize_by_tree(waiting)
        seen: set = set()
        eligible, later = [], []
        for req in waiting:
            m = req.match_len
            if req.num_tokens - m < threshold:  # NOTE: never deferred, never deferring another
                eligible.append(req)
                continue
            key = sharing_key(last_nodes[id(req)], req.token_slice(m, m + threshold))
            if key in seen:
                req.deprioritized = True
                later.append(req)
                continue
            seen.add(key)
            eligible.append(req)
        waiting[:] = eligible + later

    def _deprioritize_by_tree(self, waiting: list[Req]) -> None:
        """:meth:`_deprioritize_in_batch_sharing` with a key-only tree of the eligible requests
        (any ``threshold``; O(tokens) per request)."""
        threshold = self.in_batch_prefix_threshold
        seen = RadixCache(None)
        eligible, later = [], []
        for req in waiting:
            if req.num_tokens - req.match_len < threshold:
                eligible.append(req)
                continue
            ids = req_ids(req)
            if seen.match_node(ids).end - req.match_len >= threshold:
                req.deprioritized = True
                later.append(req)
                continue
            seen.insert(ids, torch.empty(len(ids), dtype=torch.int64))
            eligible.append(req)
        waiting[:] = eligible + later


def sharing_key(node: object, next_ids: list[int]) -> tuple:
    """Key of in-batch prefix sharing: two requests whose cache match ends at ``node`` and whose
    next ``in_batch_prefix_threshold`` tokens are ``next_ids`` would compute the same prefix."""
    return id(node), tuple(next_ids)


def req_ids(req: Req) -> list[int]:
    """``req.all_ids`` without a copy when nothing was generated yet (the prompt list itself:
    read-only for the caller)."""
    return req.origin_input_ids if not req.output_ids else req.all_ids


_ARRIVAL = attrgetter("arrival")


def _dfs_weight_order(waiting: list[Req], last_nodes: dict[int, object], root) -> list[Req]:
    """SGLang's DFS order: children by descending weight (waiting requests in the subtree, ties
    by earliest queue position), each node's own requests after its subtree. Only the part of the
    tree that holds matches is visited, each node once (not once per request below it)."""
    at_node: dict[object, list[Req]] = {}
    kids: dict[object, list] = {}  # visited node -> its visited children
    visited = {root}
    for req in waiting:
        node = last_nodes[id(req)]
        at_node.setdefault(node, []).append(req)
        while node not in visited:
            visited.add(node)
            kids.setdefault(node.parent, []).append(node)
            node = node.parent
    pos = {id(r): i for i, r in enumerate(waiting)}
    weight: dict[object, int] = {}
    first: dict[object, int] = {}
    preorder, stack = [], [root]
    while stack:
        node = stack.pop()
        preorder.append(node)
        stack.extend(kids.get(node, ()))
    for node in reversed(preorder):  # NOTE: children before parents
        own = at_node.get(node, ())
        w, f = len(own), pos[id(own[0])] if own else len(waiting)
        for c in kids.get(node, ()):
            w += weight[c]
            f = min(f, first[c])
        weight[node], first[node] = w, f
    order: list[Req] = []
    # Iterative post-order DFS: (node, expanded?)
    todo: list[tuple[object, bool]] = [(root, False)]
    while todo:
        node, expanded = todo.pop()
        if expanded:
            order.extend(at_node.get(node, ()))
            continue
        todo.append((node, True))
        ks = sorted(kids.get(node, ()), key=lambda c: (-weight[c], first[c]))
        todo.extend((c, False) for c in reversed(ks))
    return order
