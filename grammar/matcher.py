"""GrammarMatcher: the per-sequence state of a constrained generation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from radixlm.grammar.compiler import CompiledGrammar

_TERMINATED = object()


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

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> bool:
        """Write the allowed next tokens into row ``index`` of ``bitmask``.

        Args:
            bitmask: int32 ``[B, W]`` from :func:`allocate_token_bitmask` (CPU).
            index: the row to fill.
        Returns:
            True (the mask restricts something; kept for xgrammar compatibility).
        """
        row = self.compiled.mask_row(self._history[-1])
        w = min(row.shape[0], bitmask.shape[1])
        dst = bitmask[index]
        dst[:w].copy_(row[:w])
        if bitmask.shape[1] > w:
            dst[w:].zero_()
        return True

    def next_token_mask(self) -> np.ndarray:
        """The packed int32 mask of the current state as a numpy array (a copy)."""
        return self.compiled.mask_row(self._history[-1]).numpy().copy()

    def find_jump_forward_string(self) -> str:
        """The longest string the grammar forces from here (exactly one way to continue), cut at
        the last complete UTF-8 character; "" when the next character is a choice or the output
        may end here."""
        cur = self._history[-1]
        if cur is _TERMINATED:
            return ""
        data = self._engine.forced_bytes(cur)
        while data:
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError as e:
                data = data[: e.start]
        return ""
