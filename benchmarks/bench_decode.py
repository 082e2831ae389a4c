"""Decode and prefill throughput of the runtime vs HF transformers on the same model, same run.

Drives the scheduler directly so each phase is timed alone: for every batch size, all requests
(random ``--context``-token prompts) are prefilled first, then ``--steps`` decode steps are timed.
Prefill is timed on ``--prefill-batch`` prompts of ``--prefill-len`` tokens. The roofline of batch-1
decode (weight bytes / measured copy bandwidth) is printed beside them. Both sides prefill the
``--prefill-batch`` prompts as one batch (HF: left-padded with an attention mask).

    python benchmarks/bench_decode.py --write-config llama-3.1-8b /tmp/l8b --batch-sizes 1,64,256
    python benchmarks/bench_decode.py --model-path TINY_DIR --device cpu --batch-sizes 1,2 \
        --context 32 --steps 4 --hf-steps 2 --prefill-batch 2 --prefill-len 64 --profile-bs 2 --profile-prefill
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_offline import PUBLISHED, make_prompts, write_config  # noqa: E402

from radixlm.runtime.model_runner import ModelRunner  # noqa: E402
from radixlm.runtime.request import Req  # noqa: E402
from radixlm.runtime.sampling_params import SamplingParams  # noqa: E402
from radixlm.runtime.scheduler import Scheduler  # noqa: E402
from radixlm.runtime.server_args import ServerArgs  # noqa: E402


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def copy_bandwidth(device: str, nbytes: int = 2 << 30) -> float:
    """Device copy bandwidth in bytes/s (read + write), median of 5."""
    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    times = []
    for _ in range(6):
        sync()
        t0 = time.perf_counter()
        b.copy_(a)
        sync()
        times.append(time.perf_counter() - t0)
    return 2 * nbytes / sorted(times[1:])[2]


def ours(path: str, args) -> dict:
    bs_list = [int(b) for b in args.batch_sizes.split(",")]
    sa = ServerArgs(model_path=path, load_format="dummy", skip_tokenizer_init=True, context_length=args.context_len_max,
                    device=args.device, dtype=args.dtype,
                    max_running_requests=max(bs_list), chunked_prefill_size=16384, max_prefill_tokens=16384,
                    disable_cuda_graph=args.disable_cuda_graph, disable_radix_cache=True,
                    enable_overlap_schedule=args.overlap)
    runner = ModelRunner(sa, path, [])
    sched = Scheduler.create(sa, runner, None)
    weight_bytes = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    out = {"weight_bytes": weight_bytes}
    vocab = runner.cfg.vocab_size
    for bs in bs_list:
        reqs = [Req(f"d{bs}-{i}", p, SamplingParams(max_new_tokens=args.steps + 8, temperature=0, ignore_eos=True))
                for i, p in enumerate(make_prompts(bs, args.context, vocab, seed=bs))]
        for r in reqs:
            sched.add_request(r)
        while sched.waiting or sched.chunked_req:
            sched.step()
        sched.step()  # one decode step outside the timing (graph warm-up for this size)
        sync()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            sched.step()
        sync()
        dt = time.perf_counter() - t0
        out[f"decode_bs{bs}"] = {"ms_per_step": dt / args.steps * 1e3, "tok_s": bs * args.steps / dt}
        if bs == args.profile_bs:
            out["profile"] = profile_steps(sched, args.device)
        while sched.has_work():
            sched.step()
    prompts = make_prompts(args.prefill_batch, args.prefill_len, vocab, seed=7)
    reqs = [Req(f"p{i}", p, SamplingParams(max_new_tokens=1)) for i, p in enumerate(prompts)]
    for r in reqs[:1]:  # warm-up
        sched.add_request(Req("warm", r.origin_input_ids, SamplingParams(max_new_tokens=1)))
    while sched.has_work():
        sched.step()
    sync()
    t0 = time.perf_counter()
    for r in reqs:
        sched.add_request(r)
    while sched.has_work():
        sched.step()
    sync()
    out["prefill_tok_s"] = args.prefill_batch * args.prefill_len / (time.perf_counter() - t0)
    if args.profile_prefill:
        for i, r in enumerate(reqs):
            sched.add_request(Req(f"pp{i}", r.origin_input_ids[::-1], SamplingParams(max_new_tokens=1)))
        out["prefill_profile"] = profile_steps(sched, args.device, steps=1)
        while sched.has_work():
            sched.step()
    del sched, runner
    release_memory()
    return out


def profile_steps(sched, device: str, steps: int = 4) -> str:
    """Where one step's time goes: host (Python) vs device, top ops by device (CUDA) time."""
    from torch.profiler import ProfilerActivity, profile

    sync()
    t0 = time.perf_counter()
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    with profile(activities=activities) as prof:
        for _ in range(steps):
            sched.step()
        sync()
    wall = (time.perf_counter() - t0) / steps * 1e3
    events = prof.key_averages()
    gpu_us = sum(e.self_device_time_total for e in events) / steps
    table = events.table(sort_by=sort, row_limit=12, max_name_column_width=50)
    return f"profiled step: {wall:.2f} ms wall (profiler on), {gpu_us / 1e3:.2f} ms device busy\n{table}"


def left_pad(prompts: list[list[int]], pad_id: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged prompts -> (ids, attention_mask), both int64 ``[B, max_len]``, padded on the left
    (so every row's last column is its last prompt token, as HF batched generation expects)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


def model_dtype(path: str, args) -> torch.dtype:
    """The dtype radixlm resolves for ``--dtype`` (HF runs in the same one)."""
    from radixlm.runtime.model_config import ModelConfig
    from radixlm.runtime.model_loader import resolve_dtype

    return resolve_dtype(args.dtype, ModelConfig.from_pretrained(path), torch.device(args.device))


@torch.no_grad()
def hf(path: str, args) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM

    dev = args.device
    cfg = AutoConfig.from_pretrained(path)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=model_dtype(path, args)).eval()
    vocab = model.config.vocab_size
    out = {}
    for bs in [int(b) for b in args.batch_sizes.split(",")]:
        ids = torch.tensor(make_prompts(bs, args.context, vocab, seed=bs), device=dev)
        kw = dict(do_sample=False, pad_token_id=0)
        model.generate(ids[:, :16], attention_mask=torch.ones_like(ids[:, :16]), max_new_tokens=2, min_new_tokens=2, **kw)
        times = []
        for n in (1, args.hf_steps + 1):
            sync()
            t0 = time.perf_counter()
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, **kw)
            sync()
            times.append(time.perf_counter() - t0)
        dt = times[1] - times[0]
        out[f"decode_bs{bs}"] = {"ms_per_step": dt / args.hf_steps * 1e3, "tok_s": bs * args.hf_steps / dt}
    # Prefill: the same prompts as radixlm's, as one left-padded batch, only the last logits kept.
    prompts = make_prompts(args.prefill_batch, args.prefill_len, vocab, seed=7)
    ids, mask = left_pad(prompts, pad_id=0, device=dev)
    model(ids[:1, :128], attention_mask=mask[:1, :128], logits_to_keep=1)  # warm-up
    sync()
    t0 = time.perf_counter()
    model(ids, attention_mask=mask, logits_to_keep=1)
    sync()
    out["prefill_tok_s"] = sum(len(p) for p in prompts) / (time.perf_counter() - t0)
    del model
    release_memory()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="auto", help="auto: bfloat16 on CUDA (or the checkpoint's), float32 on CPU")
    ap.add_argument("--write-config", nargs=2, metavar=("NAME", "DIR"), help=f"NAME in {sorted(PUBLISHED)}")
    ap.add_argument("--batch-sizes", default="1,64,256")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--hf-steps", type=int, default=16)
    ap.add_argument("--prefill-batch", type=int, default=4)
    ap.add_argument("--prefill-len", type=int, default=4096)
    ap.add_argument("--context-len-max", type=int, default=8192)
    ap.add_argument("--disable-cuda-graph", action="store_true")
    ap.add_argument("--overlap", action="store_true", help="enable_overlap_schedule")
    ap.add_argument("--profile-bs", type=int, default=64, help="profile decode steps at this batch size")
    ap.add_argument("--profile-prefill", action="store_true", help="profile one prefill step")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    path = write_config(*args.write_config) if args.write_config else args.model_path
    bw = copy_bandwidth(args.device, (2 << 30) if args.device.startswith("cuda") else (256 << 20))
    res = {"copy_bw": bw, "ours": ours(path, args)}
    if not args.skip_hf:
        res["hf"] = hf(path, args)
    roof_ms = res["ours"]["weight_bytes"] / bw * 1e3
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; batch-1 decode roofline {roof_ms:.2f} ms "
          f"({res['ours']['weight_bytes'] / 1e9:.1f} GB of weights)")
    print("| figure | radixlm | HF transformers | ratio |")
    print("|---|---|---|---|")
    for key in [k for k in res["ours"] if k.startswith("decode_bs")]:
        o, h = res["ours"][key], res.get("hf", {}).get(key)
        hs = f"{h['ms_per_step']:.2f} ms/step, {h['tok_s']:,.0f} tok/s" if h else "-"
        ratio = f"{o['tok_s'] / h['tok_s']:.2f}x" if h else "-"
        print(f"| decode {key[9:]}, context {args.context} | {o['ms_per_step']:.2f} ms/step, {o['tok_s']:,.0f} tok/s | {hs} | {ratio} |")
    o, h = res["ours"]["prefill_tok_s"], res.get("hf", {}).get("prefill_tok_s")
    print(f"| prefill {args.prefill_batch}x{args.prefill_len} | {o:,.0f} tok/s | {f'{h:,.0f} tok/s' if h else '-'} | "
          f"{f'{o / h:.2f}x' if h else '-'} |")
    for key in ("profile", "prefill_profile"):
        if key in res["ours"]:
            print(res["ours"][key])
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
