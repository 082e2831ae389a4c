"""Prefix cache (RadixAttention): radix tree over token ids, LRU eviction, lock refs, self-check."""

from radixlm.radix.base import MatchResult, PrefixCache
from radixlm.radix.cache import RadixCache
from radixlm.radix.node import TreeNode, pack_ids
from radixlm.radix.noop import ChunkCache, NoOpPrefixCache

__all__ = ["ChunkCache", "MatchResult", "NoOpPrefixCache", "PrefixCache", "RadixCache", "TreeNode", "pack_ids"]
