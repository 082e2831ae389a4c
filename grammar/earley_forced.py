"""Jump-forward for the Earley engine: the bytes a matcher state forces, memoized per state.

A mixin of :class:`~radixlm.grammar.earley_engine.EarleyEngine` (it uses the engine's ``advance``,
``terms`` and the ``_forced`` / ``_live`` dicts the engine creates and bounds).
"""

from __future__ import annotations

import numpy as np


class ForcedBytes:
    """``forced_bytes`` over the engine's interned states."""

    def forced_bytes(self, state, limit: int = 4096) -> bytes:
        """The bytes forced from ``state`` (one way to continue, not accepting), up to ``limit``;
        memoized per state."""
        key = (state, limit)
        got = self._forced.get(key)
        if got is None:
            got = self._forced[key] = self._forced_walk(state, limit)
        return got

    def _forced_walk(self, state, limit: int) -> bytes:
        """Step single forced bytes from ``state`` (:meth:`forced_bytes` uncached)."""
        out = bytearray()
        while len(out) < limit and not state.accepting:
            options: set[int] = set()
            for _, t, q in state.threads:
                options.update(self._live_bytes(t, q))
                if len(options) > 1:
                    break
            if len(options) != 1:
                break
            b = options.pop()
            nxt = self.advance(state, bytes([b]))
            if nxt is None:
                break
            out.append(b)
            state = nxt
        return bytes(out)

    def _live_bytes(self, t: int, q: int) -> tuple[int, ...]:
        """Bytes with a live transition from state ``q`` of terminal ``t`` (cached)."""
        got = self._live.get((t, q))
        if got is None:
            got = self._live[(t, q)] = tuple(np.flatnonzero(self.terms[t].trans[q]).tolist())
        return got
