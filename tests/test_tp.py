"""Tensor parallelism on CPU (gloo, 2 processes): TP=2 logits equal TP=1 for every architecture,
with KV heads split and replicated; sharded loading reads only a rank's slices; the divisibility
rules fail at start-up with a message naming them."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.multiprocessing as tmp
from safetensors.torch import save_file

from radixlm.runtime.model_config import ModelConfig

ARCHS = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
         "qwen3": "Qwen3ForCausalLM"}
# (arch, query heads, kv heads): kv 2 splits across 2 ranks, kv 1 is replicated on both.
CASES = [(a, 4, kv) for a in ARCHS for kv in (2, 1)]
PROMPTS = [[5, 17, 33, 2, 200, 9, 41, 41, 7, 120], [3, 99, 150, 11, 4]]


def hf_config(arch: str, heads: int, kv: int, **extra) -> dict:
    """A tiny HF ``config.json`` dict (vocab 203: not divisible by 2, so the vocab is padded)."""
    cfg = {"architectures": [ARCHS[arch]], "vocab_size": 203, "hidden_size": 64, "intermediate_size": 96,
           "num_hidden_layers": 2, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": 16,
           "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
    if arch == "llama":  # tied embeddings and llama3 rope scaling (Llama 3.2)
        cfg.update(tie_word_embeddings=True, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64})
    if arch == "mistral":
        cfg["sliding_window"] = 6  # shorter than the first prompt: the window masks
    return {**cfg, **extra}


def write_checkpoint(path: str, cfg_dict: dict, seed: int) -> str:
    """config.json + model.safetensors with random weights (std 0.1, norms around 1)."""
    from radixlm.runtime.model_loader import hf_weight_shapes

    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg_dict, f)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in hf_weight_shapes(ModelConfig.from_hf_dict(cfg_dict)):
        base = 1.0 if "norm" in name else 0.0
        tensors[name] = base + 0.1 * torch.randn(shape, generator=gen)
    save_file(tensors, os.path.join(path, "model.safetensors"))
    return path


def run_logits(model, cfg: ModelConfig) -> torch.Tensor:
    """Prefill both prompts, then one greedy decode step; returns all fp32 logits, prefill rows
    then decode rows ``[sum(len) + 2, vocab]``."""
    from radixlm.runtime.attention import AttentionBackend
    from radixlm.runtime.forward_batch import ForwardBatch, ForwardMode
    from radixlm.runtime.memory import KVPool

    tp = model.tp
    lens = [len(p) for p in PROMPTS]
    total = sum(lens)
    pool = KVPool(total + 8, cfg.num_hidden_layers, tp.num_kv_heads, cfg.head_dim, torch.float32, "cpu")
    backend = AttentionBackend(tp.num_heads, tp.num_kv_heads, cfg.head_dim, cfg.layer_windows)
    r2t = torch.zeros((2, 32), dtype=torch.int32)
    r2t[0, : lens[0]] = torch.arange(1, lens[0] + 1)
    r2t[1, : lens[1]] = torch.arange(lens[0] + 1, total + 1)
    idx = torch.tensor([0, 1])
    fb = ForwardBatch(
        mode=ForwardMode.EXTEND, input_ids=torch.tensor(PROMPTS[0] + PROMPTS[1]),
        positions=torch.tensor(list(range(lens[0])) + list(range(lens[1]))),
        out_cache_loc=torch.arange(1, total + 1), req_pool_indices=idx, seq_lens=torch.tensor(lens),
        seq_lens_cpu=lens, kv_pool=pool, req_to_token=r2t, attn_backend=backend,
        prefix_lens=torch.zeros(2, dtype=torch.int64), extend_lens=torch.tensor(lens),
        extend_start_loc=torch.tensor([0, lens[0]]), prefix_lens_cpu=[0, 0], extend_lens_cpu=lens,
    )
    with torch.inference_mode():
        prefill = model.compute_logits(model(fb.input_ids, fb.positions, fb))
        nxt = prefill[[lens[0] - 1, total - 1]].argmax(-1)
        r2t[0, lens[0]], r2t[1, lens[1]] = total + 1, total + 2
        seq = [lens[0] + 1, lens[1] + 1]
        fb = ForwardBatch(
            mode=ForwardMode.DECODE, input_ids=nxt, positions=torch.tensor(lens),
            out_cache_loc=torch.tensor([total + 1, total + 2]), req_pool_indices=idx, seq_lens=torch.tensor(seq),
            seq_lens_cpu=seq, kv_pool=pool, req_to_token=r2t, attn_backend=backend,
        )
        decode = model.compute_logits(model(fb.input_ids, fb.positions, fb))
    return torch.cat([prefill, decode])


def load(path: str, load_format: str = "auto"):
    from radixlm.runtime.model_loader import load_model

    cfg = ModelConfig.from_pretrained(path)
    return load_model(path, cfg, torch.float32, torch.device("cpu"), load_format, seed=3), cfg


def _worker(rank: int, init_method: str, jobs: list[tuple[str, str]], out_dir: str) -> None:
    from radixlm.runtime import distributed as dist

    torch.set_num_threads(1)
    dist.init_distributed(2, rank, init_method, "cpu")
    try:
        results = [run_logits(*load(path, fmt)) for path, fmt in jobs]
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_distributed()


@pytest.fixture(scope="module")
def tp2_results(tmp_path_factory):
    """Checkpoints of every case, their TP=1 logits (this process) and TP=2 logits (both ranks)."""
    from radixlm.runtime.distributed import default_init_method

    root = tmp_path_factory.mktemp("tp")
    jobs = [(write_checkpoint(str(root / f"{a}-{h}-{kv}"), hf_config(a, h, kv), seed=i), "auto")
            for i, (a, h, kv) in enumerate(CASES)]
    jobs.append((jobs[0][0], "dummy"))  # dummy weights: generated whole, then sliced
    tmp.spawn(_worker, args=(default_init_method(None), jobs, str(root)), nprocs=2, join=True)
    ranks = [torch.load(root / f"rank{r}.pt") for r in range(2)]
    torch.set_num_threads(1)
    ref = [run_logits(*load(path, fmt)) for path, fmt in jobs]
    return ref, ranks


@pytest.mark.parametrize("case", range(len(CASES) + 1),
                         ids=[f"{a}-h{h}-kv{kv}" for a, h, kv in CASES] + ["llama-dummy"])
def test_tp2_logits_equal_tp1(tp2_results, case):
    ref, ranks = tp2_results
    assert ref[case].shape == (sum(map(len, PROMPTS)) + 2, 203)
    assert ref[case].std() > 0.05  # logits that vary, so equality means something
    torch.testing.assert_close(ranks[0][case], ref[case], atol=1e-4, rtol=0)
    assert torch.equal(ranks[0][case], ranks[1][case])  # gathered logits: the same on every rank


class _CountingReader:
    def __init__(self, tensor: torch.Tensor, counter: list[int]) -> None:
        self.tensor, self.shape, self.counter = tensor, tuple(tensor.shape), counter

    def read(self, dim: int, start: int, length: int) -> torch.Tensor:
        out = self.tensor.narrow(dim, start, length)
        self.counter[0] += out.numel()
        return out

    def full(self) -> torch.Tensor:
        self.counter[0] += self.tensor.numel()
        return self.tensor


@pytest.mark.parametrize("rank", [0, 1])
def test_rank_reads_only_its_slices(monkeypatch, rank):
    """A rank of 2 reads half of every split tensor (the replicated KV head: its one head)."""
    from radixlm.runtime.model_loader import hf_weight_shapes
    from radixlm.runtime.models import layers
    from radixlm.runtime.models.llama import LlamaForCausalLM

    monkeypatch.setattr(layers, "get_tensor_model_parallel_world_size", lambda: 2)
    monkeypatch.setattr(layers, "get_tensor_model_parallel_rank", lambda: rank)
    cfg = ModelConfig.from_hf_dict(hf_config("llama", 4, 1, vocab_size=204))
    model = LlamaForCausalLM(cfg)
    full = {n: torch.randn(s) for n, s in hf_weight_shapes(cfg)}
    counter = [0]
    model.load_weights((n, _CountingReader(t, counter)) for n, t in full.items())
    norms = sum(t.numel() for n, t in full.items() if "norm" in n)
    kv = sum(t.numel() for n, t in full.items() if "k_proj" in n or "v_proj" in n)
    split = sum(t.numel() for t in full.values()) - norms - kv
    assert counter[0] == norms + kv + split // 2  # kv: 1 head, replicated = read whole
    q = full["model.layers.0.self_attn.q_proj.weight"]
    torch.testing.assert_close(model.model.layers[0].self_attn.qkv_proj.weight[:32], q[32 * rank: 32 * rank + 32])
    emb = full["model.embed_tokens.weight"]
    torch.testing.assert_close(model.model.embed_tokens.weight, emb[102 * rank: 102 * rank + 102])


@pytest.mark.parametrize("heads,kv,inter,rule", [
    (3, 1, 96, "num_attention_heads \\(3\\) divisible by tp_size \\(2\\)"),
    (6, 3, 96, "num_key_value_heads \\(3\\) divisible by tp_size \\(2\\)"),
    (4, 2, 95, "intermediate_size \\(95\\) divisible by tp_size \\(2\\)"),
])
def test_indivisible_shapes_fail_with_the_rule(heads, kv, inter, rule):
    from radixlm.runtime.models.parallel import TPShard

    cfg = ModelConfig.from_hf_dict(hf_config("qwen3", heads, kv, intermediate_size=inter))
    with pytest.raises(ValueError, match=rule):
        TPShard.of(cfg, 2, 0)
    TPShard.of(cfg, 1, 0)  # one rank takes any shape
