"""Shared helpers for the examples: pick the backend from ``--url`` and summarize cache use."""

from __future__ import annotations

import argparse
from typing import Any

import radixlm as sgl


def parse_args(description: str) -> argparse.Namespace:
    """``--url URL`` runs against a radixlm/SGLang server; without it an in-process Engine
    with ``--model-path`` (default: SmolLM2-135M-Instruct) is used."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--url", default=None, help="server base URL, e.g. http://127.0.0.1:30000")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--model-path", default=None, help="model for the in-process Engine")
    return ap.parse_args()


def make_backend(args: argparse.Namespace) -> sgl.Backend:
    """Create the backend and make it the default one."""
    if args.url:
        backend: sgl.Backend = sgl.RuntimeEndpoint(args.url, api_key=args.api_key)
    else:
        backend = sgl.EngineBackend(sgl.Engine(model_path=args.model_path))
    sgl.set_default_backend(backend)
    return backend


def cache_summary(metas: list[dict[str, Any]]) -> str:
    """``cached/prompt tokens (hit rate)`` over the meta infos of some generations."""
    prompt = sum(m.get("prompt_tokens", 0) for m in metas)
    cached = sum(m.get("cached_tokens", 0) for m in metas)
    rate = cached / prompt if prompt else 0.0
    return f"{cached}/{prompt} prompt tokens from the prefix cache ({rate:.0%} hit rate)"
