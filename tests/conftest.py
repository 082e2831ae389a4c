"""Shared fixtures: tiny random-weight models of every architecture, built offline per session."""

from __future__ import annotations

import os

import pytest
import torch

# NOTE: Triton's interpreter must be chosen before anything imports triton (kernel tests on CPU).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ARCHS = ("llama", "mistral", "qwen2", "qwen3")


@pytest.fixture(scope="module")
def dev() -> str:
    """Device of the Triton kernel tests: CPU under the Triton interpreter, else CUDA; skips
    without triton (or without CUDA when the interpreter is off)."""
    from radixlm.kernels._triton import HAS_TRITON, interpreter_ready, interpreting

    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    if interpreting():
        if not interpreter_ready():
            pytest.fail("triton was imported before TRITON_INTERPRET=1 was set; set it in tests/conftest.py")
        return "cpu"
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device and TRITON_INTERPRET is not 1")
    return "cuda"


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Point RADIXLM_CACHE at a session directory unless the caller chose one (then the converted
    default model and the tiny models are reused across runs)."""
    if "RADIXLM_CACHE" not in os.environ:
        os.environ["RADIXLM_CACHE"] = str(tmp_path_factory.mktemp("radixlm-cache"))
    yield


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    """``{arch: path}`` of tiny models for every architecture (built once per session)."""
    from radixlm.runtime.tiny_model import make_tiny_model

    root = tmp_path_factory.mktemp("tiny-models")
    return {arch: make_tiny_model(str(root / arch), arch) for arch in ARCHS}


@pytest.fixture(scope="session")
def tiny_llama(tiny_models) -> str:
    return tiny_models["llama"]
