"""Object properties in a bounded relaxation of one order (for objects too large for any order).

Every order of ``n`` properties needs one automaton state per set of emitted properties (``2^n``,
see ``ContainerMixin._any_order``). Outputs of large objects mostly follow one canonical order
(the schema's, or the required properties first) with a few properties moved earlier. The
*window* relaxation of a canonical order ``e_0 .. e_{n-1}`` accepts every order in which at most
``k`` properties are written ahead of the first one still pending: a state is ``(i, ahead)``,
``e_i`` the first property neither written nor skipped and ``ahead`` the properties after it
already written (``|ahead| <= k``). Optional properties may be skipped only at the pointer (and
are then never written); each property is written at most once and every required one is written
before the undeclared pairs. About ``n^(k+1)`` states, so ``k`` is chosen within a budget of
fragments (copies of ``key: value`` pairs).
"""

from __future__ import annotations

import contextvars
from math import comb
from typing import Callable

from radixlm.grammar.ast import EMPTY, NOTHING, Node, alt, cat

WINDOW_MAX = 2  # properties that may be written ahead of the pending one
ANY_ORDER_HOT = 1.5  # see ``_hot_skips``
# Whether objects also take sorted keys (cold copies; the compiler retries
# without them when a schema is too large with them).
SORTED_ORDERS: contextvars.ContextVar[bool] = contextvars.ContextVar("sorted_orders", default=True)


class GrammarRetry(Exception):
    """Raised while a schema converts as one regex: on the first recursive ``$ref``, for an
    object whose sorted-keys copy fits only as a grammar (where large pairs are rules every order
    refers to) or a ``uniqueItems`` array best tracked by rules, or (``large``: long scalars become
    rules too) past the regex size limit; the schema converts again as a grammar."""

    def __init__(self, large: bool = False) -> None:
        super().__init__()
        self.large = large


def sorted_order(keys: list[str], entries: list[tuple[Node, bool]], always: bool = False) -> list | None:
    """``entries`` (one per key of ``keys``) with their keys sorted by code point, the order of
    ``json.dumps(sort_keys=True)``, ``jq -S`` and most key-sorting formatters; None when that is
    already their order (unless ``always``)."""
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    if not always and order == list(range(len(keys))):
        return None
    return [entries[i] for i in order]


def window_cost(sizes: list[int], k: int) -> int:
    """Pair fragments (by AST size) of the window-``k`` automaton over properties of ``sizes``:
    each state ``(i, ahead)`` copies every pair it may write next (an upper bound)."""
    n = len(sizes)
    total = 0
    for i in range(n):
        rest = n - i - 1
        states = sum(comb(rest, j) for j in range(min(k, rest) + 1))
        total += states * sum(sizes[i:])
    return total


def window_order(entries: list[tuple[Node, bool]], sizes: list[int], comma: Node,
                 extras: Callable[[int, bool], Node], uid: int, offset: int, budget: int) -> Node | None:
    """The object body (or its rest after ``offset`` pairs) with ``entries`` (``(key: value
    node, required)``) in the largest window relaxation of their order whose cost fits
    ``budget``, then the undeclared pairs (``extras(count, first)``, with ``count`` the pairs
    written only when it is 0 or not; callers use this for objects without property counts).
    None when even ``k = 1`` is over the budget or there are fewer than 3 entries."""
    n = len(entries)
    if n < 3:
        return None
    k = 0
    for cand in range(WINDOW_MAX, 0, -1):
        if window_cost(sizes, cand) <= budget:
            k = cand
            break
    if k == 0:
        return None
    need = [req for _, req in entries]
    memo: dict[tuple[int, frozenset[int], bool], Node] = {}

    def normal(i: int, ahead: frozenset[int]) -> tuple[int, frozenset[int]]:
        while i in ahead:
            ahead = ahead - {i}
            i += 1
        return i, ahead

    def state(i: int, ahead: frozenset[int], started: bool) -> Node:
        key = (i, ahead, started)
        got = memo.get(key)
        if got is not None:
            return got
        options: list[Node] = []
        if i < n:
            pending = [j for j in range(i, n) if j not in ahead]
            for j in pending:
                if j != i and len(ahead) >= k:
                    break
                pair = cat(comma, entries[j][0]) if started else entries[j][0]
                nxt = normal(i + 1, ahead) if j == i else (i, ahead | {j})
                options.append(cat(pair, state(nxt[0], nxt[1], True)))
            if not need[i]:  # NOTE: skip e_i for good (it is optional)
                nxt = normal(i + 1, ahead)
                options.append(state(nxt[0], nxt[1], started))
        if all(j in ahead for j in range(i, n) if need[j]):
            options.append(extras(1 if started else 0, not started))
        out = alt(*options)
        out = ("share", (uid, "window", offset, i, ahead, started), out) if out not in (EMPTY, NOTHING) else out
        memo[key] = out
        return out

    return state(0, frozenset(), offset > 0)


def _hot_skips(sizes: list[int], required: list[bool]) -> int:
    """How many skipped optional properties a schema-order path may have and keep precomputed
    masks: the largest ``k`` whose hot copies (entry ``i`` after every earlier required entry and
    all but at most ``k`` of the earlier optional ones) stay within ``ANY_ORDER_HOT`` times the
    schema-order object."""
    limit = ANY_ORDER_HOT * sum(sizes)
    best = 0
    for k in range(1, len(sizes)):
        hot, optional = 0, 0
        for size, req in zip(sizes, required):
            hot += size * sum(comb(optional, j) for j in range(min(k, optional) + 1))
            optional += not req
        if hot > limit:
            break
        best = k
    return best
