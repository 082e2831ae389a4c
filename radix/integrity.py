"""Consistency checks behind ``PrefixCache.check_integrity`` (run by the scheduler when idle)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.radix.cache import RadixCache
    from radixlm.runtime.memory import TokenToKVPoolAllocator


def check_tree(cache: RadixCache, held: torch.Tensor | None = None) -> list[str]:
    """Structural checks of ``cache``'s tree, then the pool identity (see :func:`check_pool`)."""
    errors: list[str] = []
    page = cache.page_size
    root = cache.root_node
    evictable = protected = 0
    leaves = set()
    slots = []
    stack = [root]
    nodes = 0
    while stack:
        node = stack.pop()
        nodes += 1
        child_locks = 0
        for key, child in node.children.items():
            stack.append(child)
            child_locks += child.lock_ref
            if child.parent is not node:
                errors.append(f"node {child.id}: parent link broken")
            if not child.key or cache._child_key(child.key, 0) != key:
                errors.append(f"node {child.id}: child key {key!r} does not match its edge")
        if node is root:
            continue
        if not node.children:
            leaves.add(node)
        n = len(node.key)
        if n == 0 or n % page:
            errors.append(f"node {node.id}: edge length {n} is not a positive multiple of {page}")
        if node.value.numel() != n:
            errors.append(f"node {node.id}: {node.value.numel()} slots for {n} tokens")
        errors += _chain_errors(node)
        if node.lock_ref < child_locks:
            errors.append(f"node {node.id}: lock_ref {node.lock_ref} < children's {child_locks}")
        if node.lock_ref > 0:
            protected += n
        else:
            evictable += n
        slots.append(node.value)
    if evictable != cache.evictable_size():
        errors.append(f"evictable_size {cache.evictable_size()} != {evictable} counted in the tree")
    if protected != cache.protected_size():
        errors.append(f"protected_size {cache.protected_size()} != {protected} counted in the tree")
    if nodes != cache.num_nodes():
        errors.append(f"num_nodes {cache.num_nodes()} != {nodes} in the tree")
    live = {n for t, n in cache._lru if cache._lru_valid(t, n)}
    live |= {n for t, n in cache._lru_leased if cache._lru_valid(t, n, True)}
    missing = sum(1 for n in leaves if n.lock_ref == 0 and n not in live)
    if missing:
        errors.append(f"{missing} evictable leaves missing from the LRU heaps")
    errors += _lease_errors(cache)
    if cache.allocator is not None:
        cached = torch.cat(slots) if slots else torch.empty(0, dtype=torch.int64)
        errors += check_pool(cache.allocator, cached, evictable, protected, held)
    return errors


def _lease_errors(cache: RadixCache) -> list[str]:
    """Every lease names a live node, and each node's ``lease_ref`` counts the leases at or below it."""
    errors: list[str] = []
    table = cache.leases
    want: dict[int, int] = {}
    for lease in table.by_id.values():
        node = lease.node
        if node.parent is None or lease.id not in table.by_node.get(node.id, ()):
            errors.append(f"lease {lease.id!r}: node {node.id} is not in the tree or not indexed")
            continue
        while node.parent is not None:
            want[node.id] = want.get(node.id, 0) + 1
            node = node.parent
    stack = [cache.root_node]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if node.parent is not None and node.lease_ref != want.get(node.id, 0):
            errors.append(f"node {node.id}: lease_ref {node.lease_ref} != {want.get(node.id, 0)} leases")
    if sum(len(v) for v in table.by_node.values()) != len(table.by_id):
        errors.append("lease index by node disagrees with the leases by id")
    return errors


def _chain_errors(node) -> list[str]:
    """A node is registered in its chain, and the chain's nodes are a parent -> child path."""
    chain = node.chain
    if node not in chain.nodes:
        return [f"node {node.id}: missing from its chain"]
    i = chain.nodes.index(node)
    errors = []
    if chain.ends[i] != node.end or node.end - chain.base > len(chain.tokens):
        errors.append(f"node {node.id}: chain ends {chain.ends[i]} / tokens disagree with {node.end}")
    if i == 0 and node.start != chain.base:
        errors.append(f"node {node.id}: first of its chain but starts at {node.start}, not {chain.base}")
    if i > 0 and (chain.nodes[i - 1] is not node.parent or node.parent.end != node.start):
        errors.append(f"node {node.id}: the previous node of its chain is not its parent")
    return errors


def check_pool(
    allocator: TokenToKVPoolAllocator,
    cached: torch.Tensor,
    evictable: int,
    protected: int,
    held: torch.Tensor | None = None,
) -> list[str]:
    """``free + evictable + protected + held == size`` and every slot ``1..size`` owned once.

    ``cached``: the cache's slots; ``held``: slots owned by running requests (``None``: none).
    """
    errors: list[str] = []
    free = allocator.free_slots()
    held = torch.empty(0, dtype=torch.int64) if held is None else held.detach().cpu().long()
    held = held.flatten()
    size = allocator.size
    total = free.numel() + evictable + protected + held.numel()
    if total != size:
        errors.append(
            f"pool accounting: free {free.numel()} + evictable {evictable} + protected {protected}"
            f" + held {held.numel()} = {total} != pool size {size}"
        )
    owned = torch.cat([free, cached.detach().cpu().long(), held])
    if owned.numel() and (int(owned.min()) < 1 or int(owned.max()) > size):
        lo, hi = int(owned.min()), int(owned.max())
        errors.append(f"slot out of range 1..{size}: min {lo}, max {hi}")
        return errors
    counts = torch.bincount(owned, minlength=size + 1)
    dup = int((counts > 1).sum())
    if dup:
        where = (counts > 1).nonzero().flatten()[:8].tolist()
        errors.append(f"{dup} slots owned twice (free list / cache / requests), e.g. {where}")
    missing = int((counts[1:] == 0).sum())
    if missing:
        where = ((counts[1:] == 0).nonzero().flatten()[:8] + 1).tolist()
        errors.append(f"{missing} slots leaked (neither free, cached nor held), e.g. {where}")
    return errors
