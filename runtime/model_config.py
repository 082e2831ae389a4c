"""The model's shape, normalized once from a Hugging Face ``config.json`` (DESIGN.md §6.6)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)


@dataclass(frozen=True)
class ModelConfig:
    """Normalized decoder-only transformer configuration.

    Attributes mirror the HF names; ``head_dim`` defaults to ``hidden_size // num_attention_heads``.
    ``rope_scaling`` is the HF dict (``{"rope_type": "llama3", "factor": 8.0, ...}``) or ``None``.
    ``sliding_window`` (HF semantics): a query at position ``p`` attends to keys ``(p - W, p]``, i.e.
    ``W`` keys including itself; ``None`` = full attention. ``layer_types`` names each layer
    ``"full_attention"`` or ``"sliding_attention"``; ``None`` with a window = every layer windowed.
    Raises ``ValueError`` from ``__post_init__`` on inconsistent shapes or window settings.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3)
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    torch_dtype: str | None = None

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; supported: {SUPPORTED_ARCHITECTURES}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.sliding_window is not None and (not isinstance(self.sliding_window, int) or self.sliding_window < 1):
            raise ValueError(f"sliding_window must be a positive int or None, got {self.sliding_window!r}")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_hidden_layers:
                raise ValueError(
                    f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers"
                )
            unknown = set(self.layer_types) - {"full_attention", "sliding_attention"}
            if unknown:
                raise ValueError(f"unsupported layer_types {sorted(unknown)}; supported: full_attention, sliding_attention")
            if "sliding_attention" in self.layer_types and self.sliding_window is None:
                raise ValueError("layer_types asks for sliding_attention but no sliding_window is set")

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def layer_windows(self) -> tuple[int, ...]:
        """Per layer, the attention window in keys (0 = full causal attention)."""
        if self.sliding_window is None:
            return (0,) * self.num_hidden_layers
        types = self.layer_types or ("sliding_attention",) * self.num_hidden_layers
        return tuple(self.sliding_window if t == "sliding_attention" else 0 for t in types)

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> "ModelConfig":
        """Normalize a parsed HF ``config.json``. Raises ``ValueError`` for unknown architectures."""
        archs = cfg.get("architectures") or []
        if not archs:
            raise ValueError("config.json has no 'architectures' entry")
        arch = archs[0]
        heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        rope_scaling = cfg.get("rope_scaling")
        rope_theta = cfg.get("rope_theta")
        if rope_theta is None:  # transformers >= 5 nests it in rope_parameters
            rope_theta = (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        if rope_scaling is None:
            params = cfg.get("rope_parameters") or {}
            if params.get("rope_type", "default") != "default":
                rope_scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            **_sliding_window(arch, cfg),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
        )

    @classmethod
    def from_pretrained(cls, path: str) -> "ModelConfig":
        """Read ``path/config.json``. Raises ``FileNotFoundError`` when it is missing."""
        with open(os.path.join(path, "config.json")) as f:
            return cls.from_hf_dict(json.load(f))


def _sliding_window(arch: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """``sliding_window``/``layer_types`` where transformers applies them.

    Mistral: ``sliding_window`` on every layer (HF's default is 4096 when the key is absent; ``null``
    turns it off; ``layer_types`` is ignored, as HF's Mistral ignores it). Qwen2/Qwen3: only with
    ``use_sliding_window``; layers given by ``layer_types``, else layers ``i >= max_window_layers``
    (default 28) are windowed. Llama: never. A ``layer_types`` list without ``use_sliding_window``
    that names sliding layers is rejected (HF itself fails on it).
    """
    if arch == "MistralForCausalLM":
        return {"sliding_window": cfg.get("sliding_window", 4096), "layer_types": None}
    if arch not in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        return {"sliding_window": None, "layer_types": None}
    types = cfg.get("layer_types")
    if not cfg.get("use_sliding_window"):
        if types and "sliding_attention" in types:
            raise ValueError("config.json lists sliding_attention layers but use_sliding_window is false")
        return {"sliding_window": None, "layer_types": None}
    window = cfg.get("sliding_window", 4096)
    if window is None:
        return {"sliding_window": None, "layer_types": None}
    if types is None:
        first = cfg.get("max_window_layers", 28)
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(cfg["num_hidden_layers"])]
    return {"sliding_window": window, "layer_types": tuple(types)}
