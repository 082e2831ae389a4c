"""Shared transformer layers the per-architecture files are built from.

Weights use the Hugging Face parameter names, except that q/k/v are fused into ``qkv_proj`` and
gate/up into ``gate_up_proj`` (one GEMM each); ``load_weights`` maps the HF names onto them.
Linear layers and the embedding are the tensor-parallel ones of :mod:`.parallel` (plain at TP 1).
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from radixlm import kernels as ops
from radixlm.runtime.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from radixlm.runtime.forward_batch import ForwardBatch
from radixlm.runtime.model_config import ModelConfig
from radixlm.runtime.models.parallel import (
    ColumnParallelLinear, ParallelLMHead, RowParallelLinear, TensorReader, TPShard, VocabParallelEmbedding,
)


class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019) over the last dim, rounding like HF Llama.

    Runs ``radixlm.kernels.rmsnorm`` / ``fused_add_rmsnorm`` (Triton on CUDA, torch elsewhere).
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """x ``[..., dim]``; with ``residual`` returns ``(norm(x + residual), x + residual)``."""
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if residual is None:
            return ops.rmsnorm(x2, self.weight, self.eps).view(shape)
        y, new_residual = ops.fused_add_rmsnorm(x2, residual.reshape(-1, shape[-1]), self.weight, self.eps)
        return y.view(shape), new_residual.view(shape)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al. 2021) in the HF ``rotate_half`` (neox) layout, with
    ``linear``/``llama3`` scaling: holds the fp32 cos/sin table ``[max_position_embeddings, D]``
    that the attention backend applies (fused with the KV store, ``runtime/attention.py``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        table = ops.compute_cos_sin_cache(
            cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling, torch.float32
        )
        self.register_buffer("cos_sin_cache", table, persistent=False)


class Attention(nn.Module):
    """GQA self-attention with optional qkv bias (Qwen2) and per-head q/k RMSNorm (Qwen3).

    Under tensor parallelism (``tp``: :class:`TPShard`) the rank holds ``tp.num_heads`` query and
    ``tp.num_kv_heads`` KV heads: QKV is column-parallel, O row-parallel (one all-reduce)."""

    def __init__(self, cfg: ModelConfig, layer_id: int, tp: TPShard) -> None:
        super().__init__()
        self.cfg, self.layer_id = cfg, layer_id
        d = cfg.head_dim
        self.num_heads, self.num_kv_heads = tp.num_heads, tp.num_kv_heads
        self.q_size, self.kv_size = tp.num_heads * d, tp.num_kv_heads * d
        kv_rows = (tp.kv_head_start * d, self.kv_size)
        self.qkv_proj = ColumnParallelLinear(
            cfg.hidden_size, [(tp.tp_rank * self.q_size, self.q_size), kv_rows, kv_rows], bias=cfg.attention_bias
        )
        self.o_proj = RowParallelLinear(tp.tp_rank * self.q_size, self.q_size, cfg.hidden_size)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg)

    def split_qkv(self, qkv: torch.Tensor, in_place: bool = False):
        """Split the fused projection ``qkv`` ``[T, q_size + 2 * kv_size]`` into q ``[T, H, D]``
        and k, v ``[T, KH, D]`` (views of ``qkv``), applying the per-head q/k norms (Qwen3): as new
        tensors, or with ``in_place`` written back into ``qkv`` (the piecewise CUDA graphs keep
        attention's input in a static buffer, ``runtime/piecewise_graph.py``)."""
        d = self.cfg.head_dim
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, d)
        k = k.view(-1, self.num_kv_heads, d)
        v = v.view(-1, self.num_kv_heads, d)
        if self.cfg.qk_norm:
            if in_place:
                q.copy_(self.q_norm(q))
                k.copy_(self.k_norm(k))
            else:
                q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def forward(self, positions: torch.Tensor, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self.split_qkv(self.qkv_proj(x))
        # NOTE: the backend applies rotary, fused with its KV store (and in decode with attention)
        o = fb.attn_backend.forward(q, k, v, self.layer_id, fb,
                                    positions=positions, cos_sin_cache=self.rotary.cos_sin_cache)
        return self.o_proj(o)


class MLP(nn.Module):
    """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))``; gate-up column-parallel, down
    row-parallel (one all-reduce) under tensor parallelism."""

    def __init__(self, cfg: ModelConfig, tp: TPShard) -> None:
        super().__init__()
        n = tp.intermediate_size
        rows = (tp.tp_rank * n, n)
        self.gate_up_proj = ColumnParallelLinear(cfg.hidden_size, [rows, rows], bias=False)
        self.down_proj = RowParallelLinear(tp.tp_rank * n, n, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(ops.silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, tp: TPShard) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_id, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, tp)

    def forward(self, positions, x, residual, fb: ForwardBatch):
        if residual is None:
            residual = x
            x = self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x, fb)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPShard) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(
            cfg.vocab_size, cfg.hidden_size, tp.vocab_start, tp.vocab_per_rank, tp.tp_size
        )
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, tp) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(positions, x, residual, fb)
        x, _ = self.norm(x, residual)
        return x


# (fused parameter, HF name fragment, shard index) — shard order defines the fused layout.
_STACKED = (
    ("qkv_proj", "q_proj", 0),
    ("qkv_proj", "k_proj", 1),
    ("qkv_proj", "v_proj", 2),
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
)


class CausalLM(nn.Module):
    """Decoder-only causal LM: ``hidden = model(ids)``, ``logits = lm_head(hidden)``.

    ``forward`` returns final hidden states ``[T, hidden]``; :meth:`compute_logits` maps selected
    rows to fp32 logits ``[N, vocab]`` (all-gathered: the same full logits on every TP rank).
    The TP rank and size come from :mod:`radixlm.runtime.distributed` at construction (``tp``:
    :class:`TPShard`; ``ValueError`` when the heads cannot be split). Subclasses (one per
    architecture) only set the name.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tp = TPShard.of(cfg, get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank())
        self.model = DecoderModel(cfg, self.tp)
        self.lm_head = ParallelLMHead(
            cfg.vocab_size, cfg.hidden_size, self.tp.vocab_start, self.tp.vocab_per_rank, self.tp.tp_size
        )
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self.model(input_ids, positions, fb)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden)

    def load_weights(self, weights: Iterable[tuple[str, object]]) -> None:
        """Load HF-named checkpoint entries, each a tensor or a reader (``shape``,
        ``read(dim, start, length)``, ``full()``) from which the owning layer reads only this
        rank's slice. Raises ``KeyError`` for unknown names, ``ValueError`` for a shape mismatch or
        when a parameter stayed unloaded (except a tied ``lm_head``)."""
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[tuple[str, int | None]] = set()
        for name, reader in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.cfg.tie_word_embeddings:
                continue
            if isinstance(reader, torch.Tensor):
                reader = TensorReader(reader)
            target, shard = name, None
            for fused, frag, idx in _STACKED:
                if f".{frag}." in name:
                    target, shard = name.replace(frag, fused), idx
                    break
            if target not in params:
                raise KeyError(f"checkpoint tensor {name!r} has no matching parameter")
            owner, attr = target.rsplit(".", 1)
            module = self.get_submodule(owner)
            if hasattr(module, "load_shard"):
                module.load_shard(attr, reader, shard)
            else:
                _copy_full(params[target].data, reader.full(), name)
            loaded.add((target, shard))
        for pname in params:
            if pname == "lm_head.weight" and self.cfg.tie_word_embeddings:
                continue
            fused = next((f for f, _, _ in _STACKED if f".{f}." in pname), None)
            need = [(pname, i) for i in range(3 if fused == "qkv_proj" else 2)] if fused else [(pname, None)]
            if any(k not in loaded for k in need):
                raise ValueError(f"parameter {pname!r} was not found in the checkpoint")


def _copy_full(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    if tuple(dst.shape) != tuple(src.shape):
        raise ValueError(f"{name}: checkpoint shape {tuple(src.shape)}, expected {tuple(dst.shape)}")
    dst.copy_(src)
