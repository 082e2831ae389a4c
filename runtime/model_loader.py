"""Build a model from an HF folder: safetensors weights (single or sharded) or dummy weights."""

from __future__ import annotations

import glob
import json
import os
from typing import Iterator

import torch
from safetensors import safe_open

from radixlm.runtime.model_config import ModelConfig
from radixlm.runtime.models import get_model_class
from radixlm.runtime.models.layers import CausalLM


def resolve_dtype(dtype: str, cfg: ModelConfig, device: torch.device) -> torch.dtype:
    """``auto``: float32 on CPU; on CUDA the checkpoint's 16-bit dtype, else bfloat16.

    Raises ``ValueError`` for names other than auto/float32/bfloat16/float16.
    """
    names = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype == "auto":
        if device.type == "cpu":
            return torch.float32
        return names.get(str(cfg.torch_dtype), torch.bfloat16) if cfg.torch_dtype in ("bfloat16", "float16") else torch.bfloat16
    if dtype not in names:
        raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
    return names[dtype]


KV_CACHE_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def resolve_kv_dtype(kv_cache_dtype: str, dtype: torch.dtype) -> torch.dtype:
    """The KV pool's element type: ``auto`` is the model's ``dtype``; ``fp8_e4m3`` /
    ``fp8_e5m2`` (SGLang's and vLLM's names) store keys and values in 8 bits, half the bytes
    of bf16 (twice the tokens in the same memory, half the bytes each decode step reads), without
    scales: e4m3 (3 mantissa bits) saturates at +-448, e5m2 (2 bits) reaches +-57,344. Attention
    widens them back to the query's dtype and accumulates in fp32.

    Raises ``ValueError`` for other names.
    """
    if kv_cache_dtype == "auto":
        return dtype
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be auto, fp8_e4m3 or fp8_e5m2, got {kv_cache_dtype!r}")
    return KV_CACHE_DTYPES[kv_cache_dtype]


class SafetensorsReader:
    """Reader over one tensor of an open safetensors file: ``read`` fetches only the requested
    rows/columns from disk (``safe_open(...).get_slice(name)[...]``)."""

    def __init__(self, handle, name: str) -> None:
        self.slice = handle.get_slice(name)
        self.shape = tuple(self.slice.get_shape())

    def read(self, dim: int, start: int, length: int) -> torch.Tensor:
        """Rows (``dim`` 0) or columns (``dim`` 1) ``[start, start + length)``."""
        part = slice(start, start + length)
        return self.slice[part] if dim == 0 else self.slice[:, part]

    def full(self) -> torch.Tensor:
        return self.slice[:]


def _safetensors_files(path: str) -> list[str]:
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        files = [os.path.join(path, x) for x in files]
    else:
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path!r} (use load_format='dummy' for random weights)")
    return files


def iter_safetensors(path: str) -> Iterator[tuple[str, SafetensorsReader]]:
    """Yield ``(name, reader)`` from ``model.safetensors`` or the shards named by
    ``model.safetensors.index.json`` (a reader is valid until the next item is drawn). Raises
    ``FileNotFoundError`` when there are none."""
    for file in _safetensors_files(path):
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, SafetensorsReader(f, name)


def hf_weight_shapes(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """The HF checkpoint tensors of ``cfg``'s architecture, ``(name, full shape)`` in a fixed order."""
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (cfg.vocab_size, h))]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        out.append((p + "input_layernorm.weight", (h,)))
        for proj, rows in (("q_proj", cfg.q_size), ("k_proj", cfg.kv_size), ("v_proj", cfg.kv_size)):
            out.append((p + f"self_attn.{proj}.weight", (rows, h)))
            if cfg.attention_bias:
                out.append((p + f"self_attn.{proj}.bias", (rows,)))
        out.append((p + "self_attn.o_proj.weight", (h, cfg.q_size)))
        if cfg.qk_norm:
            out += [(p + "self_attn.q_norm.weight", (d,)), (p + "self_attn.k_norm.weight", (d,))]
        out.append((p + "post_attention_layernorm.weight", (h,)))
        out += [(p + "mlp.gate_proj.weight", (inter, h)), (p + "mlp.up_proj.weight", (inter, h))]
        out.append((p + "mlp.down_proj.weight", (h, inter)))
    out.append(("model.norm.weight", (h,)))
    if not cfg.tie_word_embeddings:
        out.append(("lm_head.weight", (cfg.vocab_size, h)))
    return out


def iter_dummy_weights(
    cfg: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int = 0
) -> Iterator[tuple[str, torch.Tensor]]:
    """Random HF-named weights: normal(0, 0.02) drawn from ``seed`` (norms at 1), each tensor
    generated whole in the order of :func:`hf_weight_shapes`, so every TP size slices the very same
    weights (TP=2 computes what TP=1 computes)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, shape in hf_weight_shapes(cfg):
        if "norm" in name:
            yield name, torch.ones(shape, dtype=dtype, device=device)
        else:
            yield name, torch.empty(shape, dtype=dtype, device=device).normal_(0.0, 0.02, generator=gen)


@torch.no_grad()
def load_model(
    path: str, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, load_format: str = "auto", seed: int = 0
) -> CausalLM:
    """Instantiate the architecture on ``device`` in ``dtype`` and fill its weights.

    ``load_format``: ``auto``/``safetensors`` reads the checkpoint; ``dummy`` draws random weights
    (normal, std 0.02; norms at 1) from ``config.json`` alone. Raises ``ValueError`` otherwise.
    Under tensor parallelism (:mod:`radixlm.runtime.distributed` set up) each rank builds its
    shard and reads only its slices of every tensor.
    """
    if load_format not in ("auto", "safetensors", "dummy"):
        raise ValueError(f"load_format must be auto, safetensors or dummy, got {load_format!r}")
    cls = get_model_class(cfg.architecture)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls(cfg)
    finally:
        torch.set_default_dtype(prev)
    if load_format == "dummy":
        model.load_weights(iter_dummy_weights(cfg, dtype, device, seed))
    else:
        model.load_weights(iter_safetensors(path))
    # NOTE: the rotary cos/sin table stays fp32 whatever the model dtype.
    for module in model.modules():
        if hasattr(module, "cos_sin_cache"):
            module.cos_sin_cache = module.cos_sin_cache.to(device=device, dtype=torch.float32)
    return model.eval()
