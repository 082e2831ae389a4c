"""Tensor-parallel layers (Megatron-LM, Shoeybi et al. 2019; the layout vLLM and SGLang use).

* :class:`ColumnParallelLinear` splits the output rows (QKV, gate-up): no communication.
* :class:`RowParallelLinear` splits the input columns (O, down) and all-reduces the partial sums.
* :class:`VocabParallelEmbedding` splits the vocabulary rows: masked local lookup + all-reduce.
* :class:`ParallelLMHead` computes the local vocabulary slice of the logits and all-gathers them,
  so every rank holds the same full logits (and samples the same token).

Each layer loads its own slice of a full checkpoint tensor through a *reader* (an object with
``shape`` and ``read(dim, start, length)``), so a rank reads only its rows/columns from disk.
At TP size 1 each layer is the plain ``F.linear`` / ``F.embedding`` with no extra work. The local
products go through ``radixlm.kernels.linear``: ``F.linear``, except one-row inputs on CUDA (batch-1
decode), which take the Triton GEMV with ``RADIXLM_SKINNY_GEMM=1`` (same result up to summation
order; off by default, see ``radixlm.kernels``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels import linear
from radixlm.runtime.distributed import tensor_model_parallel_all_gather, tensor_model_parallel_all_reduce
from radixlm.runtime.model_config import ModelConfig


class TensorReader:
    """Reader over an in-memory tensor (tests, dummy weights): ``read`` narrows it."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.shape = tuple(tensor.shape)

    def read(self, dim: int, start: int, length: int) -> torch.Tensor:
        """Rows (``dim`` 0) or columns (``dim`` 1) ``[start, start + length)``."""
        return self.tensor.narrow(dim, start, length)

    def full(self) -> torch.Tensor:
        return self.tensor


@dataclass(frozen=True)
class TPShard:
    """What rank ``tp_rank`` of ``tp_size`` holds of a model (all counts are per rank).

    Query heads ``[tp_rank * num_heads, ...)``; KV heads ``[kv_head_start, + num_kv_heads)``: split
    evenly when ``num_key_value_heads >= tp_size``, else each KV head is replicated on
    ``tp_size / num_key_value_heads`` ranks and a rank keeps the one its query heads read (vLLM's
    rule). The vocabulary is padded to a multiple of ``tp_size``; rank ``r`` holds rows
    ``[vocab_start, vocab_start + vocab_per_rank)``.
    """

    tp_size: int
    tp_rank: int
    num_heads: int
    num_kv_heads: int
    kv_head_start: int
    intermediate_size: int
    vocab_per_rank: int
    vocab_start: int

    @classmethod
    def of(cls, cfg: ModelConfig, tp_size: int = 1, tp_rank: int = 0) -> "TPShard":
        """Validate the divisibility rules and return the shard. Raises ``ValueError`` naming the
        rule: query heads and ``intermediate_size`` divisible by ``tp_size``; KV heads divisible
        by ``tp_size`` or ``tp_size`` divisible by the KV heads."""
        heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
        if heads % tp_size:
            raise ValueError(
                f"tensor parallelism needs num_attention_heads ({heads}) divisible by tp_size ({tp_size})"
            )
        if (kv >= tp_size and kv % tp_size) or (kv < tp_size and tp_size % kv):
            raise ValueError(
                f"tensor parallelism needs num_key_value_heads ({kv}) divisible by tp_size ({tp_size}), "
                f"or tp_size divisible by num_key_value_heads (KV heads are then replicated)"
            )
        if cfg.intermediate_size % tp_size:
            raise ValueError(
                f"tensor parallelism needs intermediate_size ({cfg.intermediate_size}) divisible by "
                f"tp_size ({tp_size})"
            )
        per_rank = -(-cfg.vocab_size // tp_size)
        return cls(
            tp_size=tp_size,
            tp_rank=tp_rank,
            num_heads=heads // tp_size,
            num_kv_heads=max(1, kv // tp_size),
            kv_head_start=tp_rank * kv // tp_size,
            intermediate_size=cfg.intermediate_size // tp_size,
            vocab_per_rank=per_rank,
            vocab_start=tp_rank * per_rank,
        )


def _copy_checked(dst: torch.Tensor, src: torch.Tensor, what: str) -> None:
    if tuple(dst.shape) != tuple(src.shape):
        raise ValueError(f"{what}: checkpoint slice has shape {tuple(src.shape)}, expected {tuple(dst.shape)}")
    dst.copy_(src)


class ColumnParallelLinear(nn.Module):
    """``y = x W^T + b`` with this rank's output rows of one or more fused matrices.

    Args:
        in_features: input width (full, every rank sees the whole input).
        shards: per fused part (shard id = index), ``(start, length)`` of the rows this rank takes
            from that part's checkpoint tensor; the parts are stacked in order.
        bias: whether a bias (split like the rows) exists.
    ``weight``: ``[sum(lengths), in_features]``. Output ``[..., sum(lengths)]``, not gathered.
    """

    def __init__(self, in_features: int, shards: list[tuple[int, int]], bias: bool = False) -> None:
        super().__init__()
        self.shards = list(shards)
        self.offsets = [sum(n for _, n in self.shards[:i]) for i in range(len(self.shards))]
        out = sum(n for _, n in self.shards)
        self.weight = nn.Parameter(torch.empty(out, in_features))
        self.bias = nn.Parameter(torch.empty(out)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

    def load_shard(self, param: str, reader, shard_id: int | None) -> None:
        """Copy this rank's rows of fused part ``shard_id`` (``None``: the only part) from ``reader``."""
        shard_id = shard_id or 0
        start, length = self.shards[shard_id]
        dst = getattr(self, param).data.narrow(0, self.offsets[shard_id], length)
        _copy_checked(dst, reader.read(0, start, length), f"{param} part {shard_id}")


class RowParallelLinear(nn.Module):
    """``y = all_reduce(x_r W_r^T) + b``: this rank's input columns ``[start, start + length)``.

    ``x`` is the rank's slice of the input (the output of a column-parallel layer); the result is
    the full ``[..., out_features]`` on every rank. The bias (replicated) is added once, after the
    reduction."""

    def __init__(self, start: int, length: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.start = start
        self.weight = nn.Parameter(torch.empty(out_features, length))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = tensor_model_parallel_all_reduce(linear(x, self.weight))
        return y if self.bias is None else y + self.bias

    def load_shard(self, param: str, reader, shard_id: int | None) -> None:
        """Weight: columns of this rank; bias: the whole vector."""
        if param == "bias":
            _copy_checked(self.bias.data, reader.full(), "bias")
        else:
            _copy_checked(self.weight.data, reader.read(1, self.start, self.weight.shape[1]), "weight")


class VocabParallelEmbedding(nn.Module):
    """Embedding of ``vocab_size`` rows, this rank holding rows ``[start, start + per_rank)`` (the
    rows past ``vocab_size`` are zero padding). Ids outside the slice look up zeros; the
    all-reduce sums the one non-zero contribution per token."""

    def __init__(self, vocab_size: int, hidden: int, start: int, per_rank: int, tp_size: int = 1) -> None:
        super().__init__()
        self.vocab_size, self.start, self.per_rank, self.tp_size = vocab_size, start, per_rank, tp_size
        self.weight = nn.Parameter(torch.empty(per_rank, hidden))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids int64 ``[T]`` -> ``[T, hidden]`` (the full embedding on every rank)."""
        if self.tp_size == 1:
            return F.embedding(ids, self.weight)
        inside = (ids >= self.start) & (ids < self.start + self.per_rank)
        out = F.embedding((ids - self.start) * inside, self.weight)
        out = out * inside.unsqueeze(-1).to(out.dtype)
        return tensor_model_parallel_all_reduce(out)

    def load_shard(self, param: str, reader, shard_id: int | None) -> None:
        """Rows of this rank's vocabulary slice; the padding rows are zeroed."""
        n = max(0, min(self.per_rank, self.vocab_size - self.start))
        self.weight.data.zero_()
        if n:
            _copy_checked(self.weight.data[:n], reader.read(0, self.start, n), "vocab rows")


class ParallelLMHead(VocabParallelEmbedding):
    """LM head over the vocabulary split as in :class:`VocabParallelEmbedding` (may share its
    weight for tied embeddings). :meth:`compute_logits` all-gathers the local slices."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # pragma: no cover - use compute_logits
        return self.compute_logits(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden ``[N, hidden]`` -> fp32 logits ``[N, vocab_size]``, identical on every rank."""
        local = linear(hidden, self.weight)
        if self.tp_size == 1:
            return local.float()
        return tensor_model_parallel_all_gather(local, dim=-1)[..., : self.vocab_size].float()
