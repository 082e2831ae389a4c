"""Offline throughput of radixlm's Engine vs HF transformers ``generate`` on the same model.

Random-token prompts with fixed input/output lengths and ``ignore_eos``. Works on any HF folder,
including a config-only folder with ``--load-format dummy``; ``--write-config`` writes the published
dimensions of Llama-3.1-8B or Qwen2.5-7B (no download).

    python benchmarks/bench_offline.py                                   # CPU, tiny default model
    python benchmarks/bench_offline.py --write-config llama-3.1-8b /tmp/l8b \
        --load-format dummy --num-prompts 64 --input-len 1024 --output-len 128   # GPU
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import time

import torch

PUBLISHED = {
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16",
        "hidden_act": "silu",
    },
    "qwen2.5-7b": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 152064,
        "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
        "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16", "hidden_act": "silu",
        "use_sliding_window": False,
    },
}


def write_config(name: str, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(PUBLISHED[name], f, indent=2)
    return out_dir


def make_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab - 10) for _ in range(length)] for _ in range(n)]


def bench_radixlm(path: str, prompts, output_len: int, args) -> dict:
    from radixlm.runtime.engine import Engine

    kw = dict(device=args.device, load_format=args.load_format, dtype=args.dtype, kv_cache_dtype=args.kv_cache_dtype,
              skip_tokenizer_init=args.load_format == "dummy" or not os.path.exists(os.path.join(path, "tokenizer.json")))
    if args.max_total_tokens:
        kw["max_total_tokens"] = args.max_total_tokens
    if args.context_length:
        kw["context_length"] = args.context_length
    sp = {"max_new_tokens": output_len, "temperature": 0, "ignore_eos": True}
    with Engine(path, **kw) as engine:
        engine.generate(input_ids=prompts[:2], sampling_params={**sp, "max_new_tokens": 4})  # warm-up
        engine.flush_cache()
        _sync()
        t0 = time.perf_counter()
        outs = engine.generate(input_ids=prompts, sampling_params=sp)
        _sync()
        dt = time.perf_counter() - t0
        dtype = str(engine.runner.dtype)
    assert all(len(o["output_ids"]) == output_len for o in outs)
    del engine
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"seconds": dt, "dtype": dtype}


def bench_hf(path: str, prompts, output_len: int, args, dtype: torch.dtype) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM

    device = "cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu"
    if args.load_format == "dummy":
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    model.eval()
    ids = torch.tensor(prompts, device=device)
    gen = dict(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids[:2], **{**gen, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        _sync()
        t0 = time.perf_counter()
        for i in range(0, len(prompts), args.hf_batch_size):
            model.generate(ids[i : i + args.hf_batch_size], **gen)
        _sync()
        dt = time.perf_counter() - t0
    del model
    gc.collect()
    return {"seconds": dt}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=None, help="HF folder (default: the embedded tiny model)")
    ap.add_argument("--write-config", nargs=2, metavar=("NAME", "DIR"), help=f"NAME in {sorted(PUBLISHED)}")
    ap.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8_e4m3", "fp8_e5m2"])
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--hf-batch-size", type=int, default=64, help="HF generate batch size")
    ap.add_argument("--max-total-tokens", type=int, default=None)
    ap.add_argument("--context-length", type=int, default=None)
    ap.add_argument("--skip-hf", action="store_true")
    args = ap.parse_args()

    path = args.model_path
    if args.write_config:
        path = write_config(*args.write_config)
    if path is None:
        from radixlm.runtime.default_model import default_model_path

        path = default_model_path()
    with open(os.path.join(path, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    prompts = make_prompts(args.num_prompts, args.input_len, vocab)
    n_in, n_out = args.num_prompts * args.input_len, args.num_prompts * args.output_len

    ours = bench_radixlm(path, prompts, args.output_len, args)
    rows = [("radixlm", ours["seconds"])]
    if not args.skip_hf:
        dtype = getattr(torch, ours["dtype"].replace("torch.", ""))
        rows.append(("HF transformers generate", bench_hf(path, prompts, args.output_len, args, dtype)["seconds"]))
    print(f"model={path} device={args.device} dtype={ours['dtype']} kv_cache_dtype={args.kv_cache_dtype} prompts={args.num_prompts} "
          f"input_len={args.input_len} output_len={args.output_len}")
    print("| engine | seconds | input tok/s | output tok/s | total tok/s | vs HF |")
    print("|---|---|---|---|---|---|")
    base = rows[-1][1] if len(rows) > 1 else None
    for name, sec in rows:
        ratio = f"{base / sec:.2f}x" if base else "-"
        print(f"| {name} | {sec:.2f} | {n_in / sec:,.0f} | {n_out / sec:,.0f} | {(n_in + n_out) / sec:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
