"""GrammarMatcher: the per-sequence state of a constrained generation."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from radixlm.grammar.utf8 import decode_complete_prefix

if TYPE_CHECKING:
    from radixlm.grammar.compiler import CompiledGrammar

_TERMINATED = object()
_CPU_VIEWS: dict[int, tuple[Any, int, tuple, np.ndarray]] = {}  # id -> (ref, data_ptr, shape, view)


def _cpu_view(bitmask: torch.Tensor) -> np.ndarray | None:
    """The numpy view of a CPU ``bitmask`` (None for a device tensor), cached per tensor while
    its storage pointer and shape stay the same. NOTE: ``Tensor.numpy()`` costs ~2 us, and
    30-50 us on the first step after a compile (torch's code and tables out of the caches)."""
    got = _CPU_VIEWS.get(id(bitmask))
    if got is not None and got[0]() is bitmask and got[1] == bitmask.data_ptr() and got[2] == bitmask.shape:
        return got[3]
    if bitmask.device.type != "cpu":
        return None
    view = bitmask.numpy()
    if len(_CPU_VIEWS) >= 16:
        _CPU_VIEWS.clear()
    _CPU_VIEWS[id(bitmask)] = (weakref.ref(bitmask), bitmask.data_ptr(), bitmask.shape, view)
    return view


class GrammarMatcher:
    """Tracks one output against a :class:`CompiledGrammar`, token by token.

    Usage per decode step: ``fill_next_token_bitmask(bitmask, i)``, apply the bitmask to the
    logits, sample, ``accept_token(token)``. A stop token (EOS) is allowed exactly where the
    grammar accepts; accepting it terminates the matcher.

    Args:
        compiled: from :class:`GrammarCompiler`; one compiled grammar serves many matchers.
        max_rollback_tokens: how many tokens :meth:`rollback` can undo (None: unlimited).
    """

    def __init__(self, compiled: "CompiledGrammar", max_rollback_tokens: int | None = None) -> None:
        self.compiled = compiled
        self._engine = compiled.engine
        self._info = compiled.tokenizer_info
        self._stops = frozenset(self._info.stop_token_ids)
        self._max_rollback = max_rollback_tokens
        self._history: list[Any] = [self._engine.initial()]

    # --- state --------------------------------------------------------------------------------

    def reset(self) -> None:
        """Back to the start of the grammar."""
        self._history = [self._engine.initial()]

    def is_terminated(self) -> bool:
        """True once a stop token was accepted (the output is complete and valid)."""
        return self._history[-1] is _TERMINATED

    def can_terminate(self) -> bool:
        """True when the output so far is a complete match (a stop token would be accepted)."""
        cur = self._history[-1]
        return cur is not _TERMINATED and self._engine.accepting(cur)

    def _push(self, state: Any) -> None:
        self._history.append(state)
        if self._max_rollback is not None and len(self._history) > self._max_rollback + 1:
            del self._history[0]

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token. Returns False (state unchanged) if the grammar forbids it."""
        cur = self._history[-1]
        if cur is _TERMINATED:
            return False
        if token_id in self._stops:
            if not self._engine.accepting(cur):
                return False
            self._push(_TERMINATED)
            return True
        data = self._info.token_bytes[token_id] if 0 <= token_id < self._info.tokenizer_size else None
        if data is None:
            return False
        nxt = self._engine.advance(cur, data)
        if nxt is None:
            return False
        self._push(nxt)
        return True

    def accept_string(self, text: str | bytes) -> bool:
        """Advance by raw text (one rollback step). Returns False (state unchanged) if forbidden."""
        cur = self._history[-1]
        if cur is _TERMINATED:
            return False
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        nxt = self._engine.advance(cur, data)
        if nxt is None:
            return False
        self._push(nxt)
        return True

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (or strings).

        Raises:
            ValueError: when more than were accepted (or kept, see ``max_rollback_tokens``).
        """
        if num_tokens < 0 or num_tokens > len(self._history) - 1:
            raise ValueError(f"cannot roll back {num_tokens} tokens ({len(self._history) - 1} kept)")
        if num_tokens:
            del self._history[-num_tokens:]

    # --- masks --------------------------------------------------------------------------------

    def mask_state(self) -> Any:
        """The key of the current state in ``compiled.masks`` (None once terminated): what a
        batched fill (:func:`fill_batch_bitmask`) gathers by."""
        cur = self._history[-1]
        return None if cur is _TERMINATED else cur

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> bool:
        """Write the allowed next tokens into row ``index`` of ``bitmask``.

        Args:
            bitmask: int32 ``[B, W]`` from :func:`allocate_token_bitmask` (CPU or device). Words
                past the grammar's vocabulary are cleared (those tokens are never allowed).
            index: the row to fill.
        Returns:
            True (the mask restricts something; kept for xgrammar compatibility).
        """
        table = self.compiled.masks
        row = table.row_np(table.row_id(self.mask_state()))
        view = _cpu_view(bitmask)
        if view is not None:
            dst = view[index]
            w = min(row.shape[0], dst.shape[0])
            dst[:w] = row[:w]
            dst[w:] = 0
            return True
        w = min(row.shape[0], bitmask.shape[1])
        dst = bitmask[index]
        dst[:w].copy_(torch.from_numpy(row[:w]))
        if bitmask.shape[1] > w:
            dst[w:].zero_()
        return True

    def next_token_mask(self) -> np.ndarray:
        """The packed int32 mask of the current state as a numpy array (a copy)."""
        table = self.compiled.masks
        return table.row_np(table.row_id(self.mask_state())).copy()

    def allows_longer_token(self, token_id: int) -> bool:
        """Whether a token longer (in bytes) than ``token_id`` is allowed next: jump-forward's
        retokenization rule (docs/grammar.md) jumps a forced text's last token only when none is.
        One AND of the packed mask with a per-tokenizer packed mask of the tokens longer than
        ``n`` bytes (built once per ``n``)."""
        info = self._info
        data = info.token_bytes[token_id] if 0 <= token_id < info.tokenizer_size else None
        n = len(data) if data else 0
        cache = info.__dict__.setdefault("_longer_than", {})
        longer = cache.get(n)
        if longer is None:
            bits = np.zeros(info.mask_words * 32, dtype=bool)
            bits[: info.tokenizer_size] = [bool(b) and len(b) > n for b in info.token_bytes]
            longer = cache[n] = np.packbits(bits, bitorder="little").view(np.int32)
        table = self.compiled.masks
        return bool(np.bitwise_and(table.row_np(table.row_id(self.mask_state())), longer).any())

    def find_jump_forward_string(self) -> str:
        """The longest string the grammar forces from here (exactly one way to continue), cut at
        the last complete UTF-8 character; "" when the next character is a choice or the output
        may end here."""
        cur = self._history[-1]
        if cur is _TERMINATED:
            return ""
        return decode_complete_prefix(self._engine.forced_bytes(cur))


def fill_batch_bitmask(matchers: list["GrammarMatcher | None"], bitmask: torch.Tensor,
                       device_masks: bool | None = None) -> None:
    """Fill row ``i`` of ``bitmask`` with the next-token mask of ``matchers[i]`` for the whole batch
    at once: one row-id lookup per request, then one gather per distinct grammar (rows of
    ``None`` matchers are left as they are).

    Args:
        matchers: one per bitmask row (None: unconstrained row).
        bitmask: int32 ``[len(matchers), W]`` on the CPU or a device (a device-side copy of each
            grammar's mask table is kept and updated incrementally). ``W`` must equal the
            grammar's ``tokenizer_info.mask_words``.
        device_masks: compute the masks of DFA states without a row yet on ``bitmask``'s device
            (:mod:`radixlm.grammar.device_masks`) instead of on the host; default: on CUDA.
    Raises:
        ValueError: a grammar compiled for another bitmask width.
    """
    from radixlm.grammar.device_masks import device_masks as device_cache
    from radixlm.grammar.mask_table import gather_rows

    groups: dict[int, tuple[Any, list[int], list[Any]]] = {}
    for i, m in enumerate(matchers):
        if m is None:
            continue
        g = groups.get(id(m.compiled))
        if g is None:
            g = groups[id(m.compiled)] = (m.compiled, [], [])
        g[1].append(i)
        g[2].append(m.mask_state())
    on_device = bitmask.is_cuda if device_masks is None else device_masks
    tables, ids, pos = [], [], []
    for compiled, rows, states in groups.values():
        if compiled.masks.words != bitmask.shape[1]:
            raise ValueError(f"grammar masks have {compiled.masks.words} words, bitmask {bitmask.shape[1]}")
        rows = np.asarray(rows, dtype=np.int64)
        table = compiled.masks
        cache = device_cache(compiled, bitmask.device) if on_device else None
        if cache is None:
            tables.append(table)
            ids.append(table.row_ids(states))
            pos.append(rows)
            continue
        known = table.known_rows(states)  # NOTE: rows the host has; the others come from the device
        miss = known < 0
        if miss.any():
            tables.append(cache)
            ids.append(cache.slots(np.fromiter((s for s, m in zip(states, miss) if m), np.int64, int(miss.sum()))))
            pos.append(rows[miss])
        if not miss.all():
            tables.append(table)
            ids.append(known[~miss])
            pos.append(rows[~miss])
    gather_rows(tables, ids, bitmask, pos)
