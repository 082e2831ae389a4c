"""DFA states with provably equal token masks: translated copies along counting chains.

A string with ``maxLength`` compiles to a chain of copies of the string-body states, one copy per
remaining character, numbered in order by the determinization (a copy ``c`` states after the
previous one). Far from the chain's end, the copies admit the same tokens, but they are distinct
states, on no cycle, so neither the region cache nor a reference state helps, and each first visit
walked the whole trie (~1 ms, hundreds of slow steps on long strings).

Exact criterion. Encode each live transition ``q -b-> r`` as *relative* (``r - q`` when that
offset is a common one, :func:`common_offsets`) or *absolute* (``r``; dead: 0), and give every state the id of its encoded row
(:attr:`ShiftClasses.keys`). Let ``low[q]`` and ``high[q]`` be the smallest and largest states
reachable from ``q`` by at most ``depth - 1`` relative moves (``depth``: the trie's). If ``s -
low[s] == t - low[t]``, ``high[s] - s == high[t] - t`` and ``keys[s + i] == keys[t + i]`` for
every ``low[s] - s <= i <= high[s] - s``, then ``s`` and ``t`` admit the same tokens: walk both in
lockstep along a token; a pair ``(a, a + c)`` (``c = t - s``) reached by ``k < depth`` relative
moves lies in that window, and equal keys send it on a byte to a dead pair, an *equal* pair
(absolute move: both sides agree from there on) or ``(a', a' + c)`` again. Hence
equal masks. Windows are found by a rolling hash and then compared exactly, so a hash collision
never shares a mask.

With ``high`` taken over ``D - 1`` moves instead, the argument holds for the tokens of at most
``D`` bytes: near a chain's end (or its ``minLength`` boundary) no copy matches over the whole
depth, but many match for the short tokens, and only the longer ones are walked
(:mod:`radixlm.grammar.tall_trie`).
"""

from __future__ import annotations

import numpy as np

from radixlm.grammar.trie import TokenTrie

MAX_STEP = 128  # relative moves span at most this many states (wider: absolute, still exact)
MIN_SHARE = 500  # ... and keep only offsets taken by >= 1/MIN_SHARE of the edges that way
DEPTHS = (12, 16, 24, 32, 48, 64, 96)  # token lengths (bytes) of the depth-limited windows
_P = 0x9E3779B97F4A7C15  # odd multiplier of the rolling hash (mod 2**64)


def common_offsets(off: np.ndarray) -> np.ndarray:
    """bool ``[2 * MAX_STEP + 1]`` (index ``o + MAX_STEP``): the offsets in ``off`` (int, one per
    edge, ``|o| <= MAX_STEP``) taken by at least ``1/MIN_SHARE`` of the edges (and 8), and 0.

    NOTE: a set, not an interval: a chain's exits (one edge per copy, each at its own distance
    from the state after the string) stay absolute, so the copies' rows agree."""
    hist = np.bincount(off + MAX_STEP, minlength=2 * MAX_STEP + 1)
    out = hist >= max(8, off.size // MIN_SHARE)
    out[MAX_STEP] = True
    return out


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


def reach_high(src: np.ndarray, dst: np.ndarray, n: int, rounds: list[int]) -> dict[int, np.ndarray]:
    """``{r: int64 [n]}`` for each ``r`` in ``rounds``: the largest state reachable from each state
    along at most ``r`` of the edges ``src -> dst`` (sorted by ``src``); one gather per round,
    later entries shared once stable (as :func:`reach_low`)."""
    high = np.arange(n, dtype=np.int64)
    out: dict[int, np.ndarray] = {}
    starts = np.flatnonzero(np.r_[True, src[1:] != src[:-1]]) if src.size else np.zeros(0, np.int64)
    heads = src[starts]
    done = 0
    stable = src.size == 0
    for r in sorted(rounds):
        while done < r and not stable:
            new = np.maximum(high[heads], np.maximum.reduceat(high[dst], starts))
            stable = np.array_equal(new, high[heads])
            high = high.copy()
            high[heads] = new
            done += 1
        out[r] = high
    return out


class ShiftClasses:
    """States of one DFA whose masks equal by the module's criterion, for one trie.

    ``match(s)`` returns a registered state with the same mask as ``s`` (or -1); ``register(s)``
    records that ``s``'s mask is known. ``match_depth(s)`` relaxes the criterion to the tokens of
    at most ``D`` bytes for ``D`` in ``DEPTHS`` (windows up to the states ``D - 1`` relative moves
    reach): those tokens fare alike from both states, by the same lockstep argument over their
    ``L <= D`` transitions. Single-writer (the DfaIndex that owns it)."""

    def __init__(self, ptr: np.ndarray, col: np.ndarray, dst: np.ndarray, trie: TokenTrie,
                 accept: np.ndarray | None = None) -> None:
        """``ptr``, ``col``, ``dst``: the DFA's rows as byte runs (state ``q``'s runs
        ``ptr[q]:ptr[q+1]`` start at bytes ``col`` and go to states ``dst``, 0 dead). ``accept``
        (bool per state), when given, is part of every row's key (each run's target acceptance):
        matched states then also agree on where along a token the DFA accepts
        (:mod:`radixlm.grammar.chain_share`)."""
        n = ptr.size - 1
        self.ahead = 0  # 0: no classes (nothing ever matches); else the longest full-depth window
        self.hits = 0
        self.levels: list[int] = []  # token bytes D of the windows, the full depth first
        src = np.repeat(np.arange(n, dtype=np.int64), np.diff(ptr))
        off = dst.astype(np.int64) - src
        near = (dst != 0) & (np.abs(off) <= MAX_STEP)
        pairs = np.unique(src[near] * n + dst[near])  # NOTE: edges, not runs (one per target)
        e_src, e_dst = pairs // n, pairs % n
        e_off = e_dst - e_src
        common = common_offsets(e_off)
        depth = trie.max_depth
        if not common[MAX_STEP + 1 :].any() or depth < 2:
            return  # NOTE: no chain (no common forward move): nothing can match
        rel = (dst != 0) & (np.abs(off) <= MAX_STEP) & common[np.clip(off, -MAX_STEP, MAX_STEP) + MAX_STEP]
        e_rel = common[e_off + MAX_STEP]
        self.levels = [depth] + [d for d in reversed(DEPTHS) if d < depth]
        # NOTE: a token of L bytes takes its transitions from states at most L - 1 moves away
        highs = reach_high(e_src[e_rel], e_dst[e_rel], n, [d - 1 for d in self.levels])
        self.high = {d: highs[d - 1] for d in self.levels}
        self.low = reach_low(e_src[e_rel], e_dst[e_rel], n, depth - 1)
        self.ahead = int((self.high[depth] - np.arange(n)).max())
        enc = np.where(rel, off - (MAX_STEP + 1), dst)  # NOTE: relative codes < 0 < states
        if accept is not None:
            enc = enc * 2 + accept[dst]
        keys = row_keys(ptr, col, enc)
        rnd = np.random.default_rng(0).integers(1, 2**63, size=2 * n + 1, dtype=np.uint64)  # NOTE: ids < 2n
        powers = np.cumprod(np.full(n, _P, dtype=np.uint64))  # P^(i+1), wrapping
        inv = np.cumprod(np.full(n, pow(_P, -1, 1 << 64), dtype=np.uint64))
        prefix = np.concatenate([np.zeros(1, np.uint64), np.cumsum(rnd[keys] * powers, dtype=np.uint64)])
        # NOTE: state q's window at depth D is keys[low[q] : high_D[q] + 1]; equal windows hash equal
        self.hash = {d: (prefix[h + 1] - prefix[self.low]) * inv[self.low] for d, h in self.high.items()}
        self.known: dict[tuple, int] = {}  # (D, hash, s - low[s], high[s] - s) -> a state with a mask
        self.keys = keys

    def _key(self, s: int, d: int) -> tuple[int, int, int, int]:
        return d, int(self.hash[d][s]), s - int(self.low[s]), int(self.high[d][s]) - s

    def _find(self, s: int, d: int) -> int:
        """A registered state whose depth-``d`` window equals ``s``'s (checked exactly), or -1."""
        t = self.known.get(self._key(s, d), -1)
        if t < 0 or t == s:
            return t
        hs, ht = int(self.high[d][s]), int(self.high[d][t])
        if not np.array_equal(self.keys[int(self.low[s]) : hs + 1], self.keys[int(self.low[t]) : ht + 1]):
            return -1
        return t

    def match(self, s: int) -> int:
        """A registered state whose mask ``s`` shares (its rows agree with ``s``'s, shifted, over
        the whole reach; checked exactly after the hash lookup), ``s`` itself if registered, or -1."""
        if not self.levels:
            return -1
        t = self._find(s, self.levels[0])
        if t >= 0 and t != s:
            self.hits += 1
        return t

    def match_depth(self, s: int) -> tuple[int, int]:
        """``(t, D)``: a registered state ``t != s`` from which every token of at most ``D`` bytes
        fares as from ``s``, for the largest such ``D`` below the full depth; ``(-1, 0)``: none."""
        for d in self.levels[1:]:
            t = self._find(s, d)
            if t >= 0 and t != s:
                return t, d
        return -1, 0

    def register(self, s: int) -> None:
        """Offer ``s`` (whose mask is now known) as the representative of its keys."""
        for d in self.levels:
            self.known.setdefault(self._key(s, d), s)
