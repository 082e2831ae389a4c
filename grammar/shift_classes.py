"""DFA states with provably equal token masks: translated copies along counting chains.

A string with ``maxLength`` compiles to a chain of copies of the string-body states, one copy per
remaining character, numbered in order by the determinization (a copy ``c`` states after the
previous one). Far from the chain's end, the copies admit the same tokens, but they are distinct
states, on no cycle, so neither the region cache nor a reference state helps, and each first visit
walked the whole trie (~1 ms, hundreds of slow steps on long strings).

Exact criterion. Encode each live transition ``q -b-> r`` as *relative* (``r - q`` when ``-back
<= r - q <= fwd``) or *absolute* (``r``; dead: 0), and give every state the id of its encoded row
(:attr:`ShiftClasses.keys`). Let ``low[q]`` be the smallest state reachable from ``q`` by at most
``depth - 1`` relative moves (``depth``: the trie's), and ``ahead`` bound how far a token prefix
of under ``depth`` bytes can move forward by relative moves (the largest sum, over the trie's
paths, of each byte's largest forward offset). If ``s - low[s] == t - low[t]`` and ``keys[s + i]
== keys[t + i]`` for every ``low[s] - s <= i <= ahead``, then ``s`` and ``t`` admit the same
tokens: walk both in lockstep along a token; a pair ``(a, a + c)`` (``c = t - s``) reached by
``k < depth`` relative moves lies in that window, and equal keys send it on a byte to a dead pair,
an *equal* pair (absolute move: both sides agree from there on) or ``(a', a' + c)`` again. Hence
equal masks. Windows are found by a rolling hash and then compared exactly, so a hash collision
never shares a mask.
"""

from __future__ import annotations

import numpy as np

from radixlm.grammar.trie import TokenTrie

MAX_STEP = 128  # relative moves span at most this many states (wider: absolute, still exact)
MIN_SHARE = 500  # ... and keep only offsets taken by >= 1/MIN_SHARE of the edges that way
_P = 0x9E3779B97F4A7C15  # odd multiplier of the rolling hash (mod 2**64)


def _common_max(off: np.ndarray) -> int:
    """The largest offset in ``off`` (int, ``1..MAX_STEP``, one per edge) taken by at least
    ``1/MIN_SHARE`` of the edges (0: none)."""
    if off.size == 0:
        return 0
    hist = np.bincount(off, minlength=MAX_STEP + 1)
    common = np.nonzero(hist >= max(8, off.size // MIN_SHARE))[0]
    return int(common.max()) if common.size else 0


def _mix(x: np.ndarray) -> np.ndarray:
    """A uint64 bit mixer (splitmix64's finalizer), elementwise."""
    x = x.astype(np.uint64)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def row_keys(ptr: np.ndarray, col: np.ndarray, enc: np.ndarray) -> np.ndarray:
    """int64 ``[n]``: an id per state, equal only for states with equal encoded rows. Rows are
    given as byte runs (state ``q``'s runs ``ptr[q]:ptr[q+1]`` start at bytes ``col`` and go to
    ``enc``); hashed, then checked exactly against the first row of their hash (a row that
    differs from it gets an id of its own, which only costs a missed match)."""
    n = ptr.size - 1
    cnt = np.diff(ptr)
    owner = np.repeat(np.arange(n), cnt)
    h = np.add.reduceat(_mix(_mix(col) + enc.astype(np.uint64)), ptr[:-1])  # NOTE: every row has a run at byte 0
    _, first, ids = np.unique(h, return_index=True, return_inverse=True)
    rep = first[ids]
    k = np.arange(owner.size) - ptr[owner]
    same = cnt[rep[owner]] == cnt[owner]
    other = ptr[rep[owner]] + np.minimum(k, cnt[rep[owner]] - 1)
    same &= (col[other] == col) & (enc[other] == enc)
    bad = np.zeros(n, dtype=bool)
    bad[owner[~same]] = True
    return np.where(bad, first.size + np.arange(n), ids).astype(np.int64)


def reach_low(src: np.ndarray, dst: np.ndarray, n: int, rounds: int) -> np.ndarray:
    """int64 ``[n]``: the smallest state reachable from each state along at most ``rounds`` of
    the edges ``src -> dst`` (sorted by ``src``); one gather per round, stops early once stable
    (then it is the minimum over any number of moves, the same value)."""
    low = np.arange(n, dtype=np.int64)
    if src.size == 0:
        return low
    starts = np.flatnonzero(np.r_[True, src[1:] != src[:-1]])
    heads = src[starts]
    for _ in range(rounds):
        new = np.minimum(low[heads], np.minimum.reduceat(low[dst], starts))
        if np.array_equal(new, low[heads]):
            break
        low[heads] = new
    return low


def byte_advance(ptr: np.ndarray, col: np.ndarray, off: np.ndarray, rel: np.ndarray) -> np.ndarray:
    """int64 ``[256]``: each byte's largest forward offset among the relative runs (``off``,
    ``rel`` per run; runs as in :class:`ShiftClasses`), 0 when it never moves forward."""
    end = np.empty_like(col)
    end[:-1] = col[1:]
    end[ptr[1:] - 1] = 256  # NOTE: a row's last run ends at byte 256
    fwd = rel & (off > 0)
    shapes = np.unique((col[fwd].astype(np.int64) * 512 + end[fwd]) * (MAX_STEP + 1) + off[fwd])
    out = np.zeros(256, dtype=np.int64)
    for key in shapes.tolist():  # NOTE: few distinct (first byte, end, offset) run shapes
        ce, o = divmod(key, MAX_STEP + 1)
        c, e = divmod(ce, 512)
        np.maximum(out[c:e], o, out=out[c:e])
    return out


def reach_ahead(trie: TokenTrie, adv: np.ndarray) -> int:
    """The largest sum of ``adv[byte]`` along a trie path of fewer than ``max_depth`` bytes."""
    best = 0
    total = np.zeros(trie.n_nodes, dtype=np.int64)
    for lo, hi, parent, byte in trie.levels():
        if hi > trie.depth_start[-2]:
            break  # NOTE: the deepest nodes need only liveness, which their parent's key covers
        total[lo:hi] = total[parent] + adv[byte]
        best = max(best, int(total[lo:hi].max()))
    return best


class ShiftClasses:
    """States of one DFA whose masks equal by the module's criterion, for one trie.

    ``match(s)`` returns a registered state with the same mask as ``s`` (or -1); ``register(s)``
    records that ``s``'s mask is known. Single-writer (the DfaIndex that owns it)."""

    def __init__(self, ptr: np.ndarray, col: np.ndarray, dst: np.ndarray, trie: TokenTrie) -> None:
        """``ptr``, ``col``, ``dst``: the DFA's rows as byte runs (state ``q``'s runs
        ``ptr[q]:ptr[q+1]`` start at bytes ``col`` and go to states ``dst``, 0 dead)."""
        n = ptr.size - 1
        self.ahead = 0  # 0: no classes (nothing ever matches)
        self.known: dict[tuple[int, int], int] = {}  # (hash, s - low[s]) -> a state with a mask
        self.hits = 0
        src = np.repeat(np.arange(n, dtype=np.int64), np.diff(ptr))
        off = dst.astype(np.int64) - src
        near = (dst != 0) & (np.abs(off) <= MAX_STEP)
        pairs = np.unique(src[near] * n + dst[near])  # NOTE: edges, not runs (one per target)
        e_src, e_dst = pairs // n, pairs % n
        e_off = e_dst - e_src
        fwd = _common_max(e_off[e_off > 0])
        back = _common_max(-e_off[e_off < 0])
        depth = trie.max_depth
        if fwd == 0 or fwd * max(depth - 1, 0) + 1 >= n:
            return  # NOTE: no window fits in the DFA: nothing can match
        rel = (dst != 0) & (off >= -back) & (off <= fwd)
        ahead = reach_ahead(trie, byte_advance(ptr, col, off, rel))
        if ahead + 1 >= n:
            return
        e_rel = (e_off >= -back) & (e_off <= fwd)
        self.low = reach_low(e_src[e_rel], e_dst[e_rel], n, depth - 1)
        enc = np.where(rel, off - (fwd + 1), dst)
        # NOTE: distinct negative sentinels past the last state: a window running off the end
        # matches no other window. State q's window is keys[low[q] : q + ahead + 1].
        keys = np.concatenate([row_keys(ptr, col, enc), -1 - np.arange(ahead, dtype=np.int64)])
        rnd = np.random.default_rng(0).integers(1, 2**63, size=keys.size, dtype=np.uint64)
        vals = rnd[np.where(keys >= 0, keys, keys.size + keys)]
        powers = np.cumprod(np.full(keys.size, _P, dtype=np.uint64))  # P^(i+1), wrapping
        inv = np.cumprod(np.full(n, pow(_P, -1, 1 << 64), dtype=np.uint64))
        prefix = np.concatenate([np.zeros(1, np.uint64), np.cumsum(vals * powers, dtype=np.uint64)])
        end = np.arange(n) + ahead + 1
        self.hash = (prefix[end] - prefix[self.low]) * inv[self.low]  # equal for equal windows
        self.keys = keys
        self.ahead = ahead

    def _key(self, s: int) -> tuple[int, int]:
        return int(self.hash[s]), s - int(self.low[s])

    def match(self, s: int) -> int:
        """A registered state whose mask ``s`` shares (its rows agree with ``s``'s, shifted, over
        the whole reach; checked exactly after the hash lookup), ``s`` itself if registered, or -1."""
        if not self.ahead:
            return -1
        t = self.known.get(self._key(s), -1)
        if t < 0 or t == s:
            return t
        lo_s, lo_t, a = int(self.low[s]), int(self.low[t]), self.ahead
        if not np.array_equal(self.keys[lo_s : s + a + 1], self.keys[lo_t : t + a + 1]):
            return -1
        self.hits += 1
        return t

    def register(self, s: int) -> None:
        """Offer ``s`` (whose mask is now known) as the representative of its key."""
        if self.ahead:
            self.known.setdefault(self._key(s), s)
