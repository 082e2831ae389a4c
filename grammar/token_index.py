"""DFA state -> allowed-token bitmask, by walking the vocabulary trie against the byte DFA.

Two numpy walks: sparse (:func:`walk_from`, live ``(trie node, DFA state)`` pairs breadth-first:
restrictive states cost little) and dense (:func:`dense_walk`, every node of a depth at once).

Free states are further shared across contexts and grammars through their *loop region*: the
states on short cycles through the state (a string body with its escapes and UTF-8 continuation
states, a digit loop). Tokens that stay inside the region are the same wherever that region
appears, so they are computed once per tokenizer and region shape (:class:`RegionCache`); only
tokens that leave it (a closing quote and what follows) are walked per state.

First visits while serving (one or a few states per call) avoid numpy's per-call overhead where
they can: narrow states, region exits and differential masks walk the trie in Python under a step
budget (:mod:`radixlm.grammar.narrow_walk`), and the copies of a counting chain (``maxLength``
strings) share masks (:mod:`radixlm.grammar.shift_classes`), near a chain's ends for the short
tokens only (the long ones walked: :mod:`radixlm.grammar.tall_trie`).
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

from radixlm.grammar.budget import check_budget
from radixlm.grammar.chain_batch import share_by_depth_batch, share_whole
from radixlm.grammar.mask_pack import pack_ids, pack_nodes, pack_pairs, pack_tokens  # noqa: F401 (re-exported)
from radixlm.grammar.narrow_walk import NarrowWalker, edit_tokens, or_tokens, pack_few
from radixlm.grammar.region_cache import RegionCache, RegionEntry  # noqa: F401 (re-exported)
from radixlm.grammar.region_match import (build_entry, canonical_order, exit_parts, match_region, region_codes,
                                          register, within)
from radixlm.grammar.shift_classes import ShiftClasses
from radixlm.grammar.state_costs import StateCosts, pair_cost, pair_costs
from radixlm.grammar.token_delta import delta_bounds, delta_mask, reference_state
from radixlm.grammar.trie import TokenTrie
from radixlm.grammar.trie_walks import dense_walk, walk_from  # noqa: F401 (re-exported)

REGION_CYCLE = 7  # cycles up to this many bytes (content, \\uXXXX, content) stay inside a loop region
FEW_NARROW = 4  # first visits of up to this many narrow states try Python walks first
FEW_LIVE = 16  # ... and those with this few live bytes before their two-byte cost (cold: 15-100 us)
WIDE_NODES = 4_000  # states whose first two bytes lead to more trie nodes use the region path
DENSE_NODES = 40_000  # ... and past this, the dense walk when there is no region
MANY_EXITS = 1024  # regions with more exit nodes are walked below them as they come (no merged trie)
TALL_SHARE = 2  # depth-limited shift matches: the long tokens' trie under 1/TALL_SHARE of the walk


class DfaIndex:
    """Token masks of one byte DFA's states against one vocabulary, computed on demand and cached.

    Masks exclude stop tokens (the matcher adds them in accepting states).
    """

    def __init__(self, trans: np.ndarray, trie: TokenTrie, words: int, regions: RegionCache,
                 accept: np.ndarray | None = None) -> None:
        self.trans = trans
        self.accept = accept  # given: also track boundary nodes (where the DFA accepts)
        self.bounds: dict[int, np.ndarray] = {}
        self.trie = trie
        self.words = words
        self.regions = regions
        self.masks: dict[int, np.ndarray] = {}
        self._narrow: dict[bytes, np.ndarray] = {}  # sorted token ids -> packed mask
        self._busy: set[int] = set()  # states whose mask is being derived from a reference
        self.costs = StateCosts(trans, trie.byte_weight)  # NOTE: per state, for the states asked about
        self._cost2: dict[int, int] = {}
        self._graph: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._runs: tuple[np.ndarray, ...] = ()  # (ptr, dst, first byte) of each row's byte runs
        self._shifts: ShiftClasses | None = None  # states sharing masks (see _wide)
        self._walker: NarrowWalker | None = None  # Python walks of single narrow states
        self._lut: np.ndarray | None = None  # see _wide
        self._adj: tuple[dict[int, tuple[int, ...]], dict[int, tuple[int, ...]]] = ({}, {})  # see within

    def _neighbours(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """CSR successor and predecessor lists of the state graph ``(succ_ptr, succ, pred_ptr,
        pred)``, built on the first region lookup (cold states never need them)."""
        if self._graph is None:
            trans = self.trans
            n = trans.shape[0]
            change = np.empty(trans.shape, dtype=bool)  # NOTE: one edge per byte run, not per byte
            change[:, 0] = True
            np.not_equal(trans[:, 1:], trans[:, :-1], out=change[:, 1:])
            # NOTE: flat indices, not a 2-D nonzero (several times slower); sorted, as np.unique
            # would give, by a plain sort and a neighbour test (np.unique hashes: slower here)
            idx = np.flatnonzero(change)
            src, col = idx >> 8, idx & 255
            dst = trans.reshape(-1)[idx]
            keep = dst != 0
            self._runs = (np.searchsorted(src, np.arange(n + 1)), dst, col)  # runs in byte order
            pairs = np.sort(src[keep] * n + dst[keep])
            if pairs.size:
                pairs = pairs[np.r_[True, pairs[1:] != pairs[:-1]]]
            succ_ptr = np.searchsorted(pairs // n, np.arange(n + 1))
            rev = pairs[np.argsort(pairs % n, kind="stable")]
            pred_ptr = np.searchsorted(rev % n, np.arange(n + 1))
            self._graph = (succ_ptr, pairs % n, pred_ptr, rev // n)
        return self._graph

    @property
    def cost(self) -> np.ndarray:
        """int64 ``[n_states]``: trie nodes below each state's live first bytes (all computed)."""
        return self.costs.all()[1]

    @property
    def n_live(self) -> np.ndarray:
        """int64 ``[n_states]``: live bytes of each state (all computed)."""
        return self.costs.all()[0]

    def cost2(self, s: int) -> int:
        """Trie nodes below the live two-byte prefixes from ``s`` (an upper bound of a walk)."""
        c = self.costs.cost_of(s)
        if c < WIDE_NODES:
            return c
        got = self._cost2.get(s)
        if got is None:
            got = self._cost2[s] = pair_cost(self.trans, self.trie, s)
        return got

    def boundary(self, state: int) -> np.ndarray:
        """Trie nodes (not the root) after which the DFA, from ``state``, is accepting."""
        if state not in self.bounds:
            self.masks.pop(state, None)
            self.compute([state])
        return self.bounds[state]

    def mask(self, state: int) -> np.ndarray:
        if state not in self.masks:
            self.compute([state])
        return self.masks[state]

    def compute(self, states: list[int]) -> None:
        """Fill the cache for ``states`` (batched: restrictive ones in one sparse walk)."""
        todo = [s for s in dict.fromkeys(states) if s not in self.masks]
        if todo and len(todo) <= FEW_NARROW and self.accept is None and self.regions.by_sig:
            todo = [s for s in todo if not self._matched(s)]  # NOTE: a known region shape: no search
        cheap = []
        if todo:
            arr = np.asarray(todo, dtype=np.int64)
            cheap = (self.costs.fill(arr)[arr] < WIDE_NODES).tolist()
            if self._shifts is not None and len(todo) <= FEW_NARROW:  # NOTE: first visits: ~25 µs less
                pairs = [(q, c) for q, c in zip(todo, cheap) if c or not share_whole(self, q)]
                todo, cheap = [q for q, _ in pairs], [c for _, c in pairs]
        if todo and len(todo) <= FEW_NARROW and self.accept is None:  # NOTE: see FEW_LIVE
            few = [s for s, c in zip(todo, cheap) if not c and self.costs.live_of(s) <= FEW_LIVE]
            if few and len(self._few(few)) < len(few):
                todo, cheap = [s for s in todo if s not in self.masks], [c for s, c in zip(todo, cheap) if s not in self.masks]
        new = [s for s, c in zip(todo, cheap) if not c and s not in self._cost2]
        if len(new) > 1:  # NOTE: batched (an eager compile asks hundreds), same integers
            self._cost2.update(zip(new, pair_costs(self.trans, self.trie, np.asarray(new, np.int64)).tolist()))
        is_wide = [not c and self.cost2(s) >= WIDE_NODES for s, c in zip(todo, cheap)]
        narrow = [s for s, w in zip(todo, is_wide) if not w]
        wide = [s for s, w in zip(todo, is_wide) if w]
        if narrow and len(narrow) <= FEW_NARROW and self.accept is None:
            narrow = self._few(narrow)
        for lo in range(0, len(narrow), 256):
            chunk = narrow[lo : lo + 256]
            arr = np.asarray(chunk, dtype=np.int64)
            src, node, st = walk_from(self.trans, self.trie, np.zeros(arr.size, np.int64), arr)
            check_budget("computing token masks", 8 * len(chunk) + src.size // 20)
            tok = self.trie.node_token[node]
            keep = tok >= 0
            t_src, t_tok = src[keep], tok[keep].astype(np.int64)
            order = np.lexsort((t_tok, t_src))
            t_src, t_tok = t_src[order], t_tok[order]
            bounds = np.searchsorted(t_src, np.arange(arr.size + 1)).tolist()
            if self.accept is not None:
                acc = self.accept[st]
                a_src, a_node = src[acc], node[acc]
                order = np.argsort(a_src, kind="stable")
                cuts = np.searchsorted(a_src[order], np.arange(1, arr.size))
                for s, nodes in zip(chunk, np.split(a_node[order], cuts)):
                    self.bounds[s] = nodes
            seen = self._narrow
            for i, s in enumerate(chunk):
                toks = t_tok[bounds[i] : bounds[i + 1]]
                key = toks.tobytes()
                got = seen.get(key)  # NOTE: one array per distinct mask (the table dedups by id)
                if got is None:
                    got = seen[key] = pack_tokens(toks, self.trie, self.words)
                self.masks[s] = got
        pending: list[tuple[int, RegionEntry, list[int]]] = []
        for s in wide:  # NOTE: in state order, so a chain's copies find the earlier ones registered
            if s in self.masks:  # NOTE: done already, as the reference of an earlier one (_wide)
                continue
            if self._shifts is not None and self._shared(s):
                continue
            check_budget("computing token masks", 300 + self.cost2(s) // 100)  # NOTE: no-op outside a compile
            got = self._wide(s, pending)
            if got is not None:
                self.masks[s] = got
                if self._shifts is not None:
                    self._shifts.register(s)
        if pending:
            self._finish_exits(pending)
        if self._shifts is not None:
            for s in wide:
                self._shifts.register(s)

    def _few(self, states: list[int]) -> list[int]:
        """Masks of a few narrow states by Python walks (:mod:`radixlm.grammar.narrow_walk`);
        returns the states that were not narrow enough for it."""
        if self._walker is None:
            self._walker = NarrowWalker(self.trans, self.trie)
        left = []
        for s in states:
            toks = self._walker.tokens([(0, s)])
            if toks is None:
                left.append(s)
                continue
            check_budget("computing token masks", 8)
            toks.sort()  # NOTE: the batched path's key (sorted int64 bytes): both share one array per mask
            key = struct.pack(f"={len(toks)}q", *toks)
            got = self._narrow.get(key)
            if got is None:
                got = self._narrow[key] = or_tokens(None, toks, self.trie, self.words)
            self.masks[s] = got
        return left

    def _delta(self, s: int, g: int, base: np.ndarray) -> np.ndarray:
        """``mask(s)`` from ``base = mask(g)`` (:mod:`radixlm.grammar.token_delta`): a Python
        lockstep walk when the states differ on few nodes, else the vectorized one."""
        if self._walker is None:
            self._walker = NarrowWalker(self.trans, self.trie)
        got = self._walker.delta(s, g)
        if got is None:
            return delta_mask(self.trans, self.trie, self.words, s, g, base, pack_tokens)
        tokens, live = got
        if not tokens:
            return base  # NOTE: as delta_mask: the same array (tables dedup rows by identity)
        return edit_tokens(base, tokens, live, self.trie, self.words)

    def _matched(self, s: int) -> bool:
        """Mask of ``s`` through a cached region shape found without a search
        (:func:`~radixlm.grammar.region_match.match_region`); False (nothing set) when none fits."""
        got = self._match(s)
        if got is None:
            return False
        entry, order = got
        if not entry.exit_nodes.size:
            self.masks[s] = entry.internal
            return True
        self._finish_exits([(s, entry, order)])
        return True

    def _match(self, s: int) -> tuple[RegionEntry, list[int]] | None:
        """:func:`~radixlm.grammar.region_match.match_region` of ``s``. NOTE: first visits only: in
        a compile's batch, the region the search finds (often larger) leaves fewer tokens to walk
        below its exits, and the batched walk below a smaller shape's exits cost more (measured)."""
        if self._walker is None:
            self._walker = NarrowWalker(self.trans, self.trie)
        rows = self._walker._rows
        return match_region(self.regions, self.trans, rows, s) if rows is not None else None

    def _few_exits(self, s: int, entry: RegionEntry, order: list[int]) -> bool:
        """Mask of region state ``s`` (see :meth:`_finish_exits`) by a Python walk below its exit
        nodes; False when the walk was not narrow enough (nothing is set then)."""
        rows = self._walker._rows
        if rows is None:
            return False
        if entry.exit_nodes.size > MANY_EXITS:  # NOTE: a large region met by the search: nothing kept on it
            e = self.trans[np.asarray(order, dtype=np.int64)[entry.exit_from], self.trie.node_byte[entry.exit_nodes]]
            toks = self._walker.tokens(list(zip(entry.exit_nodes.tolist(), e.tolist())))
            if toks is None:
                return False
            own = self.trie.node_token[entry.exit_nodes]
            toks = np.unique(np.concatenate([own[own >= 0].astype(np.int64), np.asarray(toks, dtype=np.int64)]))
            self.masks[s] = entry.internal | pack_few(toks, self.trie, self.words)
            return True
        base, merged, starts = exit_parts(entry, self.trie, self.words)
        if merged is not None:
            toks = merged.tokens(rows, order)
        else:
            toks = self._walker.tokens([(n, rows[(order[f] << 8) | b]) for n, f, b in starts])
        if toks is None:
            return False
        self.masks[s] = or_tokens(base, toks, self.trie, self.words) if toks else base
        return True

    def _scratch(self) -> np.ndarray:
        """int64 ``[n_states]`` scratch of :func:`~radixlm.grammar.region_match.region_codes`."""
        lut = self._lut  # NOTE: one array per index, the region's entries set and reset by users
        if lut is None:
            lut = self._lut = np.full(self.trans.shape[0], -1, dtype=np.int64)  # -1: exit
            lut[0] = -2
        return lut

    def _shared(self, s: int) -> bool:
        """Take the mask (and boundary nodes) of wide state ``s`` from a known state of its shift
        class (:mod:`radixlm.grammar.chain_share`), whole or for the tokens up to some length;
        False (nothing set) when none matches."""
        return share_whole(self, s) or self._by_depth(s)

    def _by_depth(self, s: int) -> bool:
        """Mask (and boundary nodes) of ``s`` from a known state matching it up to some token length,
        the longer tokens walked (for several copies at once: :mod:`~radixlm.grammar.chain_batch`)."""
        return share_by_depth_batch(self, s, TALL_SHARE)

    def _finish_exits(self, pending: list[tuple[int, RegionEntry, list[int]]]) -> None:
        """Masks of region states ``(s, region entry, s's region in canonical order)``: one
        batched walk below the exit nodes of all of them (the tokens leaving each region), or for
        a single one while serving, a Python walk (:mod:`radixlm.grammar.narrow_walk`)."""
        if len(pending) <= FEW_NARROW and self.accept is None:
            if self._walker is None:
                self._walker = NarrowWalker(self.trans, self.trie)
            pending = [p for p in pending if not self._few_exits(*p)]
            if not pending:
                return
        byte_ = self.trie.node_byte
        ex = [self.trans[np.asarray(o, dtype=np.int64)[en.exit_from], byte_[en.exit_nodes]].astype(np.int64)
              for _, en, o in pending]
        nodes = np.concatenate([en.exit_nodes for _, en, _ in pending])
        owner = np.repeat(np.arange(len(pending)), [en.exit_nodes.size for _, en, _ in pending])
        src, below, st = walk_from(self.trans, self.trie, nodes, np.concatenate(ex), owner)
        order = np.argsort(src, kind="stable")
        src, below, st = src[order], below[order], st[order]
        cuts = np.searchsorted(src, np.arange(len(pending) + 1)).tolist()
        for i, ((s, entry, _), e) in enumerate(zip(pending, ex)):
            internal, exit_nodes = entry.internal, entry.exit_nodes
            mine = below[cuts[i] : cuts[i + 1]]
            if self.accept is not None:
                entry_acc = self.bounds.pop(s)
                self.bounds[s] = np.concatenate([entry_acc, exit_nodes[self.accept[e]],
                                                 mine[self.accept[st[cuts[i] : cuts[i + 1]]]]])
            tok = self.trie.node_token[np.concatenate([exit_nodes, mine])]
            self.masks[s] = internal | pack_tokens(tok[tok >= 0], self.trie, self.words)

    # --- free states -------------------------------------------------------------------------

    def _region(self, s: int) -> list[int]:
        """States on cycles of <= REGION_CYCLE bytes through ``s`` (``s`` first)."""
        succ_ptr, succ, pred_ptr, pred = self._neighbours()
        fwd = within(s, succ_ptr, succ, self._adj[0], REGION_CYCLE)
        back = within(s, pred_ptr, pred, self._adj[1], REGION_CYCLE)
        return [s] + sorted((fwd & back) - {s})

    def _wide(self, s: int, pending: list) -> np.ndarray | None:
        """Mask of a wide state, or None when it was appended to ``pending`` (see
        :meth:`_finish_exits`)."""
        if s not in self._busy:
            g = reference_state(self.trans, self.costs.fill(np.asarray([s])), self.trie.byte_weight, s)
            # NOTE: with boundaries, not a g of this batch still waiting for its exits (its
            # boundary nodes are set, its mask not yet: _finish_exits completes both)
            if g and g not in self._busy and (self.accept is None or g in self.masks or g not in self.bounds):
                self._busy.add(s)
                try:
                    base = self.mask(g)
                    base_bounds = None if self.accept is None else self.boundary(g)
                finally:
                    self._busy.discard(s)
                if base_bounds is None:
                    return self._delta(s, g, base)
                # NOTE: an Earley terminal's boundary nodes too (the key prefixes of "any key but
                # the declared ones": one dense walk each, ~1 ms, before)
                got, self.bounds[s] = delta_bounds(self.trans, self.trie, self.words, s, g, base, base_bounds,
                                                   self.accept, pack_tokens)
                return got
        region = self._region(s)
        succ_ptr, succ, _, _ = self._neighbours()
        if len(region) == 1 and s not in succ[succ_ptr[s] : succ_ptr[s + 1]].tolist():
            if self._shifts is None:
                # NOTE: built on the first wide state off any cycle (a chain's copy, maybe)
                ptr, dst, col = self._runs
                self._shifts = ShiftClasses(ptr, col, dst, self.trie, self.accept)
            return self._single(s)
        # canonical numbering: BFS from s inside the region, targets in byte order.
        order = canonical_order(s, set(region), *self._runs[:2])
        codes = region_codes(self.trans, order, self._scratch())
        acc_bits = self.accept[np.asarray(order, dtype=np.int64)] if self.accept is not None else None
        h = hashlib.blake2b(codes.tobytes(), digest_size=16)
        if acc_bits is not None:
            h.update(b"A" + acc_bits.tobytes())
        key = h.digest()
        entry = self.regions.get(key)
        if entry is None:
            entry = build_entry(codes, acc_bits, self.trie, self.words)
            self.regions.put(key, entry)
            register(self.regions, key, entry)
        if self.accept is not None:
            self.bounds[s] = entry.accept_nodes
        if entry.exit_nodes.size == 0:
            return entry.internal
        pending.append((s, entry, order))
        return None

    def _single(self, s: int) -> np.ndarray:
        """Mask of a wide state on no short cycle: one sparse or dense walk of the trie."""
        if self.cost2(s) < DENSE_NODES:
            _, node, st = walk_from(self.trans, self.trie, np.zeros(1, np.int64), np.asarray([s]))
            if self.accept is not None:
                self.bounds[s] = node[self.accept[st]]
            tok = self.trie.node_token[node]
            return pack_tokens(tok[tok >= 0], self.trie, self.words)
        st = dense_walk(self.trans, self.trie, s)
        if self.accept is not None:
            b = np.nonzero(self.accept[st] & (st != 0))[0]
            self.bounds[s] = b[b != 0]
        return pack_nodes(st != 0, self.trie, self.words)
