"""The embedded default model: a small random-weight HF model with a real byte-level BPE tokenizer.

``make_tiny_model(out_dir, arch)`` trains the tokenizer offline on Python's own standard-library
sources (present on every machine), builds the model with transformers and ``save_pretrained``s
both, so the folder loads in radixlm and in plain ``AutoModelForCausalLM``/``AutoTokenizer``.
``tiny_model_path(arch)`` creates ``$RADIXLM_CACHE/tiny-<arch>`` (default ``~/.cache/radixlm``) once.
The real default model is SmolLM2-135M-Instruct (``radixlm.runtime.default_model``).
"""

from __future__ import annotations

import os
import shutil
import sysconfig
import tempfile

from radixlm.runtime.default_model import cache_dir

ARCHS = ("llama", "mistral", "qwen2", "qwen3")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Standard-library packages whose sources train the tokenizer (stable across CPython 3.10+).
_CORPUS_PACKAGES = ("json", "email", "asyncio", "http", "logging", "unittest", "xml", "concurrent")


def _corpus() -> list[str]:
    stdlib = sysconfig.get_paths()["stdlib"]
    texts = []
    for pkg in _CORPUS_PACKAGES:
        root = os.path.join(stdlib, pkg)
        for dirpath, dirnames, filenames in sorted(os.walk(root)):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(".py"):
                    with open(os.path.join(dirpath, name), encoding="utf-8", errors="replace") as f:
                        texts.append(f.read())
    if not texts:
        raise RuntimeError(f"no standard-library sources found under {stdlib!r} to train the tokenizer")
    return texts


def train_tokenizer(vocab_size: int = 2048):
    """Byte-level BPE (GPT-2 style) trained on stdlib sources, as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _hf_config(arch: str, vocab_size: int, eos_ids: list[int], bos_id: int, sliding_window: int | None = None):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        initializer_range=0.05,
        bos_token_id=bos_id,
        eos_token_id=eos_ids,
        pad_token_id=bos_id,
    )
    if arch == "llama":  # tied embeddings + llama3 rope scaling, as in Llama 3.2
        return LlamaConfig(
            **common,
            tie_word_embeddings=True,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 1024,
            },
        )
    if arch == "llama" and sliding_window is not None:
        raise ValueError("llama has no sliding window")
    # Qwen: with a window, layer 0 stays full and layer 1 is windowed (max_window_layers=1).
    qwen_window = dict(use_sliding_window=False)
    if sliding_window is not None:
        qwen_window = dict(use_sliding_window=True, sliding_window=sliding_window, max_window_layers=1)
    if arch == "mistral":
        return MistralConfig(**common, tie_word_embeddings=False, sliding_window=sliding_window)
    if arch == "qwen2":
        return Qwen2Config(**common, tie_word_embeddings=False, **qwen_window)
    if arch == "qwen3":
        return Qwen3Config(**common, head_dim=32, tie_word_embeddings=False, **qwen_window)
    raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")


def make_tiny_model(
    out_dir: str, arch: str = "llama", vocab_size: int = 2048, seed: int = 0, sliding_window: int | None = None
) -> str:
    """Write a tiny random-weight model of ``arch`` with its tokenizer to ``out_dir``; returns it.

    ``sliding_window``: attention window in keys (mistral: every layer; qwen2/qwen3: layer 1 of 2);
    ``None`` = full attention. Raises ``ValueError`` for an unknown ``arch`` or a window on llama.
    """
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = train_tokenizer(vocab_size)
    eos_ids = [tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>")]
    cfg = _hf_config(arch, len(tokenizer), eos_ids, eos_ids[0], sliding_window)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config.eos_token_id = eos_ids
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def tiny_model_path(arch: str = "llama") -> str:
    """Path of the cached tiny model of ``arch``, created on first use (atomically, safe across
    processes). Raises ``ValueError`` for an unknown ``arch``."""
    path = os.path.join(cache_dir(), f"tiny-{arch}")
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    os.makedirs(cache_dir(), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".tiny-{arch}-", dir=cache_dir())
    try:
        make_tiny_model(tmp, arch)
        try:
            os.rename(tmp, path)
        except OSError:  # another process won the race
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
