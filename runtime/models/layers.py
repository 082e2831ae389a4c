"""Shared transformer layers the per-architecture files are built from.

Weights use the Hugging Face parameter names, except that q/k/v are fused into ``qkv_proj`` and
gate/up into ``gate_up_proj`` (one GEMM each); ``load_weights`` maps the HF names onto them.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from radixlm import kernels as ops
from radixlm.runtime.forward_batch import ForwardBatch
from radixlm.runtime.model_config import ModelConfig


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
    ``linear``/``llama3`` scaling; a fp32 cos/sin table over ``max_position_embeddings``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        table = ops.compute_cos_sin_cache(
            cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling, torch.float32
        )
        self.register_buffer("cos_sin_cache", table, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """positions int64 ``[T]``; q ``[T, H, D]``, k ``[T, KH, D]`` -> rotated (q, k), in place."""
        return ops.apply_rotary(q, k, positions, self.cos_sin_cache)


class Attention(nn.Module):
    """GQA self-attention with optional qkv bias (Qwen2) and per-head q/k RMSNorm (Qwen3)."""

    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.cfg, self.layer_id = cfg, layer_id
        self.qkv_proj = nn.Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        c = self.cfg
        q, k, v = self.qkv_proj(x).split([c.q_size, c.kv_size, c.kv_size], dim=-1)
        q = q.view(-1, c.num_attention_heads, c.head_dim)
        k = k.view(-1, c.num_key_value_heads, c.head_dim)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        o = fb.attn_backend.forward(q, k, v.view(-1, c.num_key_value_heads, c.head_dim), self.layer_id, fb)
        return self.o_proj(o)


class MLP(nn.Module):
    """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(ops.silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_id)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

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
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
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
    rows to fp32 logits ``[N, vocab]``. Subclasses (one per architecture) only set the name.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = DecoderModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self.model(input_ids, positions, fb)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def _shard_sizes(self, fused: str) -> list[int]:
        c = self.cfg
        if fused == "qkv_proj":
            return [c.q_size, c.kv_size, c.kv_size]
        return [c.intermediate_size, c.intermediate_size]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors into the parameters. Raises ``KeyError`` for unknown names and
        ``ValueError`` when a parameter stayed unloaded (except a tied ``lm_head``)."""
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.cfg.tie_word_embeddings:
                continue
            for fused, frag, shard in _STACKED:
                if f".{frag}." in name:
                    target = name.replace(frag, fused)
                    sizes = self._shard_sizes(fused)
                    offset = sum(sizes[:shard])
                    params[target].data[offset : offset + sizes[shard]].copy_(tensor)
                    loaded.add(f"{target}#{shard}")
                    break
            else:
                if name not in params:
                    raise KeyError(f"checkpoint tensor {name!r} has no matching parameter")
                params[name].data.copy_(tensor)
                loaded.add(name)
        for pname in params:
            if pname == "lm_head.weight" and self.cfg.tie_word_embeddings:
                continue
            fused = next((f for f, _, _ in _STACKED if f".{f}." in pname), None)
            if fused is not None:
                n = len(self._shard_sizes(fused))
                missing = [s for s in range(n) if f"{pname}#{s}" not in loaded]
            else:
                missing = [] if pname in loaded else [0]
            if missing:
                raise ValueError(f"parameter {pname!r} was not found in the checkpoint")
