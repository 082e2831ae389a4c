"""Token bitmasks of byte-DFA states computed on the device: every token's bytes run through the DFA.

For each requested DFA state ``s`` and every token ``t`` of the vocabulary, token ``t`` is allowed
when its bytes ``b_1..b_n`` (``n >= 1``) lead from ``s`` through live states only:
``trans[...trans[trans[s, b_1], b_2]..., b_n] != 0`` with no zero (dead) state on the way. Tokens
without bytes (special tokens, ids past the tokenizer) are never allowed. This is the mask a
vocabulary-trie walk computes (:mod:`radixlm.grammar.token_index`) for a trimmed DFA (state 0
dead, every other state co-reachable to an accepting one), without a trie: one thread per token,
``len(token)`` dependent table lookups each, so a first visit costs tens of microseconds of GPU
time whatever the state's width (issue 12's "a GPU kernel that runs the DFA over all tokens").

Layouts:
    trans: int32 ``[n_states, 256]`` (row 0 all zero), contiguous.
    states: int64 ``[k]``, the states to mask.
    tokens: :class:`TokenBytes` (the vocabulary as one flat byte array with per-token offsets).
    out: int32 ``[k, W]`` packed masks, xgrammar's bit order (token ``t``: bit ``t % 32`` of word
        ``t // 32``); ``W * 32 >= vocab``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from radixlm.kernels._triton import check_triton, tl, triton

BLOCK = 1024  # tokens per program (a multiple of 32: whole words)


@dataclass
class TokenBytes:
    """The vocabulary's bytes on one device.

    Attributes:
        flat: uint8 ``[total_bytes + 1]`` all tokens' bytes back to back.
        start: int64 ``[W * 32]`` offset of each token's bytes in ``flat``.
        length: int32 ``[W * 32]`` byte length (0: never allowed).
        block_len: int32 ``[W * 32 / BLOCK]`` longest token of each block of BLOCK ids.
        max_len: the longest token in bytes.
    """

    flat: torch.Tensor
    start: torch.Tensor
    length: torch.Tensor
    block_len: torch.Tensor
    max_len: int

    @classmethod
    def build(cls, token_bytes: list[bytes | None], words: int, device: torch.device | str = "cpu") -> "TokenBytes":
        """From bytes per token id (None: never allowed) for ``words`` int32 words of mask."""
        width = words * 32
        if width % BLOCK:
            width += BLOCK - width % BLOCK
        length = np.zeros(width, dtype=np.int32)
        n = min(len(token_bytes), words * 32)
        length[:n] = [len(b) if b else 0 for b in token_bytes[:n]]
        start = np.zeros(width, dtype=np.int64)
        start[1:] = np.cumsum(length)[:-1]
        flat = np.frombuffer(b"".join(b for b in token_bytes[:n] if b) + b"\0", dtype=np.uint8)
        block_len = length.reshape(-1, BLOCK).max(axis=1).astype(np.int32)
        dev = torch.device(device)
        return cls(torch.from_numpy(flat.copy()).to(dev), torch.from_numpy(start).to(dev),
                   torch.from_numpy(length).to(dev), torch.from_numpy(block_len).to(dev),
                   int(length.max(initial=0)))


def _pack(allowed: torch.Tensor, words: int) -> torch.Tensor:
    """int32 ``[k, words]`` from bool ``[k, >= 32 * words]``."""
    bits = allowed[:, : words * 32].reshape(allowed.shape[0], words, 32).to(torch.int64)
    shifts = torch.arange(32, device=allowed.device, dtype=torch.int64)
    packed = (bits << shifts).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def dfa_token_mask_ref(trans: torch.Tensor, states: torch.Tensor, tokens: TokenBytes, words: int) -> torch.Tensor:
    """Torch reference of :func:`dfa_token_mask_triton`: int32 ``[k, words]`` masks of ``states``.

    Tokens are visited longest first so that step ``j`` touches only the tokens longer than ``j``
    bytes (work proportional to the vocabulary's total bytes per state)."""
    k = states.shape[0]
    length = tokens.length.long()
    order = torch.argsort(length, descending=True)
    sorted_len = length[order]
    cur = states.long().view(k, 1).expand(k, order.shape[0]).clone()
    flat_trans = trans.reshape(-1).long()
    for j in range(tokens.max_len):
        n = int((sorted_len > j).sum())
        if n == 0:
            break
        byte = tokens.flat[tokens.start[order[:n]] + j].long()
        live = cur[:, :n]
        nxt = flat_trans[live * 256 + byte]
        cur[:, :n] = torch.where(live != 0, nxt, live)
    allowed = torch.zeros((k, length.shape[0]), dtype=torch.bool, device=states.device)
    allowed[:, order] = (cur != 0) & (sorted_len > 0)
    return _pack(allowed, words)


@triton.jit
def _dfa_mask_kernel(trans_ptr, states_ptr, flat_ptr, start_ptr, len_ptr, block_len_ptr, out_ptr,
                     stride_out, words, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    blk = tl.program_id(1)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    n = tl.load(len_ptr + offs)
    base = tl.load(start_ptr + offs)
    s0 = tl.load(states_ptr + row).to(tl.int32)
    cur = tl.zeros((BLOCK,), dtype=tl.int32) + s0
    longest = tl.load(block_len_ptr + blk)
    for j in range(0, longest):
        active = (j < n) & (cur != 0)
        byte = tl.load(flat_ptr + base + j, mask=active, other=0).to(tl.int64)
        nxt = tl.load(trans_ptr + cur.to(tl.int64) * 256 + byte, mask=active, other=0)
        cur = tl.where(active, nxt, cur)
    ok = ((cur != 0) & (n > 0)).to(tl.int32)
    shifts = tl.arange(0, 32)
    bits = tl.reshape(ok, (BLOCK // 32, 32)) << shifts[None, :]
    packed = tl.sum(bits, axis=1)  # NOTE: distinct bits: the sum is their OR (bit 31 wraps in int32)
    w = blk * (BLOCK // 32) + tl.arange(0, BLOCK // 32)
    tl.store(out_ptr + row.to(tl.int64) * stride_out + w, packed, mask=w < words)


def dfa_token_mask_triton(trans: torch.Tensor, states: torch.Tensor, tokens: TokenBytes, words: int,
                          num_warps: int = 4) -> torch.Tensor:
    """int32 ``[k, words]`` token masks of DFA ``states`` (see the module docstring for layouts).

    One program per (state, block of :data:`BLOCK` token ids); each runs its block's tokens through
    ``trans`` for as many bytes as the block's longest token.
    """
    assert trans.dtype == torch.int32 and trans.dim() == 2 and trans.shape[1] == 256 and trans.is_contiguous()
    assert states.dim() == 1, states.shape
    check_triton(trans, states, tokens.flat)
    k = states.shape[0]
    out = torch.empty((k, words), dtype=torch.int32, device=trans.device)
    n_blocks = tokens.block_len.shape[0]
    assert n_blocks * BLOCK >= words * 32, (n_blocks, words)
    if k:
        _dfa_mask_kernel[(k, n_blocks)](trans, states.long(), tokens.flat, tokens.start, tokens.length,
                                        tokens.block_len, out, out.stride(0), words,
                                        BLOCK=BLOCK, num_warps=num_warps)
    return out
