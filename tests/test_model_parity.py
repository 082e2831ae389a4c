"""Numerical parity with HF transformers (fp32, CPU) for every supported architecture."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.batch import ReqSlice, ScheduleBatch
from radixlm.runtime.forward_batch import ForwardMode
from radixlm.runtime.model_runner import ModelRunner
from radixlm.runtime.request import Req
from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.server_args import ServerArgs

ARCHS = ("llama", "mistral", "qwen2", "qwen3")
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n"


def _hf(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


def _runner(path: str) -> ModelRunner:
    return ModelRunner(ServerArgs(model_path=path, device="cpu", max_total_tokens=512), path, [])


def _run_slice(runner: ModelRunner, req: Req, start: int, end: int, mode: ForwardMode) -> torch.Tensor:
    """Allocate slots for all_ids[start:end], run them, and return logits at every position."""
    slots = runner.allocator.alloc(end - start)
    runner.req_to_token_pool.write(req.req_pool_idx, start, slots)
    s = ReqSlice(req, start, end, sample=True, logprob_from=start, logprob_to=end)
    logits, _ = runner.forward_logits(ScheduleBatch(mode, [s], out_cache_loc=slots))
    return logits


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_and_decode_logits_match_hf(tiny_models, arch):
    path = tiny_models[arch]
    hf, tok = _hf(path)
    runner = _runner(path)
    ids = tok.encode(PROMPT)
    req = Req("r", ids, SamplingParams())
    req.req_pool_idx = runner.req_to_token_pool.alloc()

    ours = _run_slice(runner, req, 0, len(ids), ForwardMode.EXTEND)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    assert (ours - ref).abs().max().item() <= 1e-4

    # 16 greedy decode steps, each compared with HF's full forward over the same sequence.
    seq = list(ids)
    last = ours[-1]
    for _ in range(16):
        seq.append(int(last.argmax()))
        req.origin_input_ids = list(seq)
        last = _run_slice(runner, req, len(seq) - 1, len(seq), ForwardMode.DECODE)[-1]
        with torch.no_grad():
            ref_last = hf(torch.tensor([seq])).logits[0, -1]
        assert (last - ref_last).abs().max().item() <= 1e-4


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_ids_equal_hf_generate(tiny_models, arch):
    from radixlm.runtime.engine import Engine

    path = tiny_models[arch]
    hf, tok = _hf(path)
    prompts = [PROMPT, "import json\n", "class Parser:"]
    with Engine(path, device="cpu", max_total_tokens=2048) as engine:
        outs = engine.generate(prompts, {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True})
    for prompt, out in zip(prompts, outs):
        ids = tok.encode(prompt)
        with torch.no_grad():
            gen = hf.generate(
                torch.tensor([ids]), max_new_tokens=24, do_sample=False, min_new_tokens=24, pad_token_id=0
            )
        assert out["output_ids"] == gen[0, len(ids) :].tolist()


def test_tiny_model_loads_in_plain_transformers(tiny_models):
    for arch, path in tiny_models.items():
        model, tok = _hf(path)
        assert type(model).__name__.lower().startswith(arch)
        assert tok.chat_template and "<|im_start|>" in tok.apply_chat_template(
            [{"role": "user", "content": "hi"}], tokenize=False
        )


def test_dummy_load_format_needs_only_config(tiny_llama, tmp_path):
    import shutil

    shutil.copy(f"{tiny_llama}/config.json", tmp_path / "config.json")
    args = ServerArgs(model_path=str(tmp_path), device="cpu", max_total_tokens=64, load_format="dummy")
    runner = ModelRunner(args, str(tmp_path), [])
    norms = [p for n, p in runner.model.named_parameters() if n.endswith("norm.weight")]
    assert norms and all(bool((p == 1).all()) for p in norms)
    with pytest.raises(FileNotFoundError):
        ModelRunner(ServerArgs(model_path=str(tmp_path), device="cpu", max_total_tokens=64), str(tmp_path), [])


def test_sharded_checkpoint_loads(tiny_llama, tmp_path):
    """A checkpoint split into shards with an index loads to the same logits."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    AutoTokenizer.from_pretrained(tiny_llama).save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors.index.json").exists()
    a, b = _runner(tiny_llama), _runner(str(tmp_path))
    for (na, pa), (nb, pb) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert na == nb and torch.equal(pa, pb)


# ---------------------------------------------------------------- sliding window beyond the window

WINDOW = 8
WINDOW_ARCHS = ("mistral", "qwen2", "qwen3")  # qwen: layer 0 full, layer 1 windowed (max_window_layers=1)
LONG_TEXT = "import json\nimport os\n\n\ndef load(path):\n    with open(path) as f:\n        return json.load(f)\n\n\ndef save(path, data):\n    with open(path, \"w\") as f:\n        json.dump(data, f, indent=2)\n"


@pytest.fixture(scope="module")
def windowed_models(tmp_path_factory) -> dict[str, str]:
    from radixlm.runtime.tiny_model import make_tiny_model

    root = tmp_path_factory.mktemp("tiny-windowed")
    return {a: make_tiny_model(str(root / a), a, sliding_window=WINDOW) for a in WINDOW_ARCHS}


def test_window_config_is_read_as_hf_applies_it(windowed_models):
    from radixlm.runtime.model_config import ModelConfig

    assert ModelConfig.from_pretrained(windowed_models["mistral"]).layer_windows == (WINDOW, WINDOW)
    assert ModelConfig.from_pretrained(windowed_models["qwen2"]).layer_windows == (0, WINDOW)


@pytest.mark.parametrize("arch", WINDOW_ARCHS)
def test_windowed_prefill_and_decode_logits_match_hf(windowed_models, arch):
    """Prompt of 24 tokens (3 windows) + 16 decode steps, each against HF's full forward."""
    _check_windowed_logits(windowed_models[arch], arch)


def test_windowed_model_through_triton_kernels_matches_hf(windowed_models, monkeypatch):
    """The same through the Triton kernels (interpreted on CPU) where the dispatcher allows it."""
    import radixlm.kernels as K

    monkeypatch.setenv("RADIXLM_FORCE_TRITON_OPS", "1")
    if not K.use_triton(torch.zeros(1)):
        pytest.skip("Triton kernels cannot run on CPU tensors here (needs TRITON_INTERPRET=1 and triton)")
    _check_windowed_logits(windowed_models["mistral"], "mistral")


def _check_windowed_logits(path: str, arch: str) -> None:
    hf, tok = _hf(path)
    ids = tok.encode(LONG_TEXT)[:24]
    assert len(ids) == 24
    if arch == "mistral":  # the window matters: HF without it gives other logits
        from transformers import AutoModelForCausalLM

        full = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, sliding_window=None).eval()
        with torch.no_grad():
            assert (full(torch.tensor([ids])).logits - hf(torch.tensor([ids])).logits).abs().max() > 1e-3
    runner = _runner(path)
    req = Req("r", ids, SamplingParams())
    req.req_pool_idx = runner.req_to_token_pool.alloc()
    ours = _run_slice(runner, req, 0, len(ids), ForwardMode.EXTEND)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    assert (ours - ref).abs().max().item() <= 1e-4
    seq, last = list(ids), ours[-1]
    for _ in range(16):
        seq.append(int(last.argmax()))
        req.origin_input_ids = list(seq)
        last = _run_slice(runner, req, len(seq) - 1, len(seq), ForwardMode.DECODE)[-1]
        with torch.no_grad():
            ref_last = hf(torch.tensor([seq])).logits[0, -1]
        assert (last - ref_last).abs().max().item() <= 1e-4


@pytest.mark.parametrize("arch", WINDOW_ARCHS)
def test_windowed_greedy_equals_hf_generate_with_cached_prefix(windowed_models, arch):
    """Greedy ids equal HF ``generate`` past the window; the second prompt's first 24 tokens come
    from the radix cache (extend over a cached prefix longer than the window)."""
    from radixlm.runtime.engine import Engine

    path = windowed_models[arch]
    hf, tok = _hf(path)
    all_ids = tok.encode(LONG_TEXT)
    first, second = all_ids[:24], all_ids[:24] + all_ids[30:36]
    params = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
    with Engine(path, device="cpu", max_total_tokens=2048) as engine:
        outs = [engine.generate(input_ids=ids, sampling_params=params) for ids in (first, second)]
    assert outs[1]["meta_info"]["cached_tokens"] >= 24
    # chunked prefill (chunks of 5 < window) in a batch, without the cache: the same ids
    with Engine(path, device="cpu", max_total_tokens=2048, chunked_prefill_size=5, disable_radix_cache=True) as engine:
        chunked = engine.generate(input_ids=[first, second], sampling_params=params)
    assert [o["output_ids"] for o in chunked] == [o["output_ids"] for o in outs]
    for ids, out in zip((first, second), outs):
        with torch.no_grad():
            gen = hf.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, min_new_tokens=16, pad_token_id=0)
        assert out["output_ids"] == gen[0, len(ids) :].tolist()
