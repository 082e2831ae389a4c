"""Loop regions of DFA states (see :mod:`radixlm.grammar.token_index`): canonical shapes, their
cached entries, and first visits that find a state's shape without searching for its region.

A free state's mask comes from its *loop region*: the states on short cycles through it, numbered
canonically from it (breadth-first, targets in byte order), the numbered transition table
(``codes``: region index, -1 a live state outside, -2 dead) hashed and looked up in the
per-tokenizer :class:`~radixlm.grammar.region_cache.RegionCache`. Two searches of the state
graph, the numbering and the hash cost ~65 µs per state, most of a first visit's time for a
string body met in a new context (its shape is nearly always cached already).

:func:`match_region` skips them. Every cached shape (of an index without accept tracking)
records its canonical spanning tree: for each region index but 0, the index of the state it was
first reached from and the byte. A state ``s`` is looked up by the classes of its targets on a
few bytes (:func:`row_probe`), mapped onto each candidate shape (smallest first) along the tree,
and the map is checked against the shape's ``codes``: every target coded inside is the mapped
state, every exit's target is live, every other target dead. The shape's automaton then
*simulates* the DFA from ``s`` (each region index standing for its mapped state), which is all
the entry needs: the tokens it keeps inside are exactly those whose walk from ``s`` follows coded
moves, the exit nodes are live, and the tokens below an exit node are walked from the DFA state
the exit leads to. So the mask is exact even where the map is not one-to-one, an exit leads
back into the region, or the region search would have found a larger region around ``s`` (a
string body followed by the next key's states: a string body's own shape matches it).
"""

from __future__ import annotations

import numpy as np

from radixlm.grammar.mask_pack import pack_nodes
from radixlm.grammar.narrow_walk import pack_few, trie_view
from radixlm.grammar.region_cache import RegionCache, RegionEntry
from radixlm.grammar.trie import TokenTrie
from radixlm.grammar.trie_walks import dense_walk

SELF, DEAD, ELSE = 1, 2, 0  # classes of a row's targets in its probe (row_probe)
MATCH_CHECKS = 3  # candidate shapes a first visit checks in full (numpy) before giving up
MATCH_EXITS = 1024  # shapes with more exit nodes are not matched (register)
MERGE_NODES = 1024  # exit subtrees of a shape merged (ExitTrie) up to this many trie nodes
EXIT_BUDGET = 1200  # merged children a first visit's exit walk looks at before the numpy walk
PROBES = (0x00, 0x0A, 0x20, 0x22, 0x2C, 0x30, 0x41, 0x5C, 0x61, 0x7B, 0x7D, 0x80, 0xC3, 0xE2, 0xF0, 0xFF)


def within(s: int, ptr: np.ndarray, nbrs: np.ndarray, adj: dict[int, tuple[int, ...]], depth: int) -> set[int]:
    """States within ``depth`` moves of ``s`` along the CSR graph ``ptr`` / ``nbrs`` (int
    arrays); ``adj`` caches each state's list (NOTE: regions of neighbouring states overlap)."""
    seen = {s}
    frontier = [s]
    for _ in range(depth):
        nxt = []
        for q in frontier:
            out = adj.get(q)
            if out is None:
                out = adj[q] = tuple(nbrs[ptr[q] : ptr[q + 1]].tolist())  # NOTE: untracked by GC
            for r in out:
                if r not in seen:
                    seen.add(r)
                    nxt.append(r)
        frontier = nxt
    return seen


def canonical_order(s: int, inside: set[int], run_ptr: np.ndarray, run_dst: np.ndarray) -> list[int]:
    """The states of region ``inside`` (a set holding ``s``) in canonical order: breadth-first
    from ``s``, each state's targets in order of their first byte. ``run_ptr`` / ``run_dst``:
    the CSR byte runs of every row (target of each run, runs in byte order)."""
    order = [s]
    seen = {s}
    k = 0
    while k < len(order):
        q = order[k]
        k += 1
        for t in run_dst[run_ptr[q] : run_ptr[q + 1]].tolist():  # NOTE: in order of first byte
            if t in inside and t not in seen:
                seen.add(t)
                order.append(t)
    return order


def region_codes(trans: np.ndarray, order: list[int], lut: np.ndarray) -> np.ndarray:
    """int16 ``[len(order), 256]``: the rows of ``order`` renumbered (region index, -1 a live
    state outside, -2 dead). ``lut``: int64 ``[n_states]`` scratch, -1 everywhere but ``lut[0] =
    -2`` (restored on return)."""
    table = trans[np.asarray(order, dtype=np.int64)]
    lut[order] = np.arange(len(order))
    codes = lut[table].astype(np.int16)
    lut[order] = -1
    return codes


def spanning_tree(codes: np.ndarray) -> tuple[list[int], list[int]]:
    """``(parent, byte)`` lists over region indices 1..n-1 of canonical ``codes`` (int ``[n,
    256]``): index ``t`` is the first target of row ``parent[t]`` reached by ``byte[t]``, the
    first time ``t`` occurs when the rows are read in order (how the numbering found it)."""
    n = codes.shape[0]
    parent, byte_ = [0] * n, [0] * n
    seen = np.zeros(n, dtype=bool)
    seen[0] = True
    for j in range(n):
        row = codes[j]
        cand = np.flatnonzero(row >= 0)
        for b, t in zip(cand.tolist(), row[cand].tolist()):
            if not seen[t]:
                seen[t] = True
                parent[t], byte_[t] = j, b
    return parent[1:], byte_[1:]


def codes_probe(codes: np.ndarray) -> int:
    """:func:`row_probe` of a state of this shape (from the shape's first row)."""
    fp = 0
    for b in PROBES:
        c = int(codes[0, b])
        fp = fp * 3 + (SELF if c == 0 else DEAD if c == -2 else ELSE)
    return fp


def row_probe(rows, s: int) -> int:
    """The classes (SELF: back to ``s``, DEAD, ELSE) of ``s``'s targets on the bytes ``PROBES``,
    as an int: the key candidates are found under. Plain Python (NOTE: a first visit runs cold
    code, where each numpy call costs several µs more than warm)."""
    fp, base = 0, s << 8
    for b in PROBES:
        t = rows[base | b]
        fp = fp * 3 + (SELF if t == s else DEAD if t == 0 else ELSE)
    return fp


def build_entry(codes: np.ndarray, acc_bits: np.ndarray | None, trie: TokenTrie, words: int) -> RegionEntry:
    """The :class:`RegionEntry` of a region shape: one dense walk of the trie through the local
    automaton (region states, an absorbing exit state, dead). ``acc_bits``: bool ``[n]``
    accepting region states, or None (no accept tracking; the shape then gets its spanning tree
    for :func:`match_region`)."""
    n = codes.shape[0]
    exit_state = n + 1
    local = np.zeros((n + 2, 256), dtype=np.int32)
    c = codes.astype(np.int32)
    local[1 : n + 1] = np.where(c >= 0, c + 1, np.where(c == -1, exit_state, 0))
    local[exit_state] = exit_state
    st = dense_walk(local, trie, 1)
    inside = (st >= 1) & (st <= n)
    internal = pack_nodes(inside, trie, words)
    par = st[trie.parent]
    par[0] = 0
    exits = np.nonzero((st == exit_state) & (par != exit_state))[0]
    acc_nodes = np.zeros(0, np.int64)
    if acc_bits is not None:
        local_acc = np.zeros(n + 2, dtype=bool)
        local_acc[1 : n + 1] = acc_bits
        acc_nodes = np.nonzero(local_acc[st])[0]
        acc_nodes = acc_nodes[acc_nodes != 0]
    entry = RegionEntry(internal, exits.astype(np.int64), (par[exits] - 1).astype(np.int64), acc_nodes)
    if acc_bits is None:
        flat = codes.reshape(-1).astype(np.int64)
        ins, exits = np.flatnonzero(flat >= 0), np.flatnonzero(flat == -1)
        entry.codes = codes
        entry.tree = spanning_tree(codes)
        spots = [(j, b, int(codes[j, b])) for j in range(min(codes.shape[0], 3)) for b in PROBES]
        entry.check = (ins, flat[ins], exits, ins.size + exits.size, spots)
    return entry


def register(regions: RegionCache, key: bytes, entry: RegionEntry) -> None:
    """Make a shape's entry findable by :func:`match_region` (entries with a spanning tree and at
    most ``MATCH_EXITS`` exit nodes: walking on below many costs more than the search saves)."""
    if entry.tree is not None and entry.exit_nodes.size <= MATCH_EXITS:
        regions.register(codes_probe(entry.codes), key, entry)


def _spots_agree(rows, order: list[int], spots: list[tuple[int, int, int]]) -> bool:
    """The rows of ``order`` agree with a shape's codes at ``spots`` (``(region index, byte,
    code)``): a plain-Python look at a few rows on the probe bytes, before the numpy check."""
    for j, b, c in spots:
        t = rows[(order[j] << 8) | b]
        if (t != order[c]) if c >= 0 else ((t == 0) != (c == -2)):
            return False
    return True


def match_region(regions: RegionCache, trans: np.ndarray, rows, s: int) -> tuple[RegionEntry, list[int]] | None:
    """A cached shape that ``s`` has (see the module docstring) and the states its region indices
    map to, or None. ``rows``: a memoryview of ``trans`` (int ``[n_states, 256]``) flattened
    (int32, ``state << 8 | byte``)."""
    sig = row_probe(rows, s)
    checks = MATCH_CHECKS
    for key, entry in regions.candidates(sig):
        parent, byte_ = entry.tree
        order = [s]
        for p, b in zip(parent, byte_):
            order.append(rows[(order[p] << 8) | b])
        if 0 in order:
            continue
        ins, ins_code, exits, live, spots = entry.check
        if not _spots_agree(rows, order, spots):
            continue
        checks -= 1
        if checks < 0:
            return None
        idx = np.asarray(order, dtype=np.int64)
        full = trans[idx].reshape(-1)
        # NOTE: the targets inside compared, those of exits live, and no more live targets than
        # those: every other position is dead. The map need not be one-to-one (it then unfolds
        # s's region: the walk inside follows the DFA all the same), and an exit may lead back
        # into the region (the walk below it follows the DFA from there)
        if np.count_nonzero(full) == live and full[exits].all() and np.array_equal(full[ins], idx[ins_code]):
            regions.hit(sig, key)
            return entry, order
    return None


class ExitTrie:
    """The trie below a shape's exit nodes, merged by the bytes after each exit: one small trie
    per ``(region index, exit byte)``, its nodes holding the tokens of every trie node on that
    path below any exit node of the pair. All exit nodes of a pair lead to one DFA state, so a
    walk from there visits the merged paths once, where a walk below each exit node (dozens for a
    string body: every token ending in a quote) scans each one's children.

    Args:
        starts: ``(exit node, region index before it, its byte)`` of exit nodes with children.
        trie: the trie they are nodes of.
    """

    def __init__(self, starts: list[tuple[int, int, int]], trie: TokenTrie) -> None:
        view = trie_view(trie)
        lo_, cnt_, byte_, token_ = view.lo, view.cnt, view.byte, view.token
        self.kids: list[dict[int, int]] = []
        self.toks: list[list[int]] = []
        self.roots: list[tuple[int, int, int]] = []  # (region index, exit byte, merged root)
        root_of: dict[tuple[int, int], int] = {}
        for node, f, b in starts:
            r = root_of.get((f, b))
            if r is None:
                r = root_of[(f, b)] = self._new()
                self.roots.append((f, b, r))
            stack = [(node, r)]
            while stack:
                n, m = stack.pop()
                lo = lo_[n]
                kids = self.kids[m]
                for c in range(lo, lo + cnt_[n]):
                    k = kids.get(byte_[c])
                    if k is None:
                        k = kids[byte_[c]] = self._new()
                    if token_[c] >= 0:
                        self.toks[k].append(token_[c])
                    if cnt_[c]:
                        stack.append((c, k))

    def _new(self) -> int:
        self.kids.append({})
        self.toks.append([])
        return len(self.kids) - 1

    def tokens(self, rows, order: list[int], budget: int = EXIT_BUDGET) -> list[int] | None:
        """Primary token ids below the exit nodes that stay live, for the state whose region
        indices map to ``order`` (``rows``: the flattened DFA, as in :func:`match_region`); None
        past ``budget`` merged children looked at."""
        kids_, toks_ = self.kids, self.toks
        out: list[int] = []
        steps = 0
        for f, b, root in self.roots:
            q = rows[(order[f] << 8) | b]
            stack = [root, q] if q else []  # NOTE: merged node, state, ...: no tuples (GC)
            while stack:
                q = stack.pop()
                m = stack.pop()
                base = q << 8
                kids = kids_[m]
                steps += len(kids)
                for cb, c in kids.items():
                    r = rows[base | cb]
                    if r:
                        out += toks_[c]
                        if kids_[c]:
                            stack.append(c)
                            stack.append(r)
            if steps > budget:
                return None
        return out


def exit_parts(entry: RegionEntry, trie: TokenTrie, words: int) -> tuple[np.ndarray, ExitTrie | None, list]:
    """``(base, merged, starts)`` of an entry, built once: ``base`` int32 ``[words]``, the tokens
    inside the region and those ending on an exit node (live in every state of the shape: an exit
    byte leads to a live state); ``starts``: ``(exit node, region index before it, its byte)`` of
    the exit nodes with children, where the walk on from the exit's target begins; ``merged``:
    their :class:`ExitTrie` (None when too large)."""
    got = entry.exits
    if got is None:
        own = trie.node_token[entry.exit_nodes]
        own = np.unique(own[own >= 0].astype(np.int64))
        base = entry.internal | pack_few(own, trie, words) if own.size else entry.internal
        kids = np.flatnonzero(trie.child_cnt[entry.exit_nodes] > 0)
        nodes = entry.exit_nodes[kids]
        starts = list(zip(nodes.tolist(), entry.exit_from[kids].tolist(), trie.node_byte[nodes].tolist()))
        below = int(trie.subtree_sizes()[nodes].sum()) - nodes.size
        merged = ExitTrie(starts, trie) if below <= MERGE_NODES else None
        got = entry.exits = (base, merged, starts)
    return got
