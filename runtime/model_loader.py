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


def iter_safetensors(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` from ``model.safetensors`` or the shards named by
    ``model.safetensors.index.json``. Raises ``FileNotFoundError`` when there are none."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        files = [os.path.join(path, x) for x in files]
    else:
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path!r} (use load_format='dummy' for random weights)")
    for file in files:
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


@torch.no_grad()
def load_model(
    path: str, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, load_format: str = "auto", seed: int = 0
) -> CausalLM:
    """Instantiate the architecture on ``device`` in ``dtype`` and fill its weights.

    ``load_format``: ``auto``/``safetensors`` reads the checkpoint; ``dummy`` draws random weights
    (normal, std 0.02; norms at 1) from ``config.json`` alone. Raises ``ValueError`` otherwise.
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
        gen = torch.Generator(device=device).manual_seed(seed)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    else:
        model.load_weights((n, t.to(device=device, dtype=dtype)) for n, t in iter_safetensors(path))
    # NOTE: the rotary cos/sin table stays fp32 whatever the model dtype.
    for module in model.modules():
        if hasattr(module, "cos_sin_cache"):
            module.cos_sin_cache = module.cos_sin_cache.to(device=device, dtype=torch.float32)
    return model.eval()
