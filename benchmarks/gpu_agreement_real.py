"""Greedy agreement of radixlm with HF transformers on the real default model (SmolLM2-135M-Instruct)
on CUDA: ``--prompts`` chat prompts x ``--tokens`` greedy tokens (EOS does not stop either side),
radixlm with its Triton kernels and CUDA graphs, both in ``--dtype`` (default bfloat16).

Usage (GPU machine, after ``. benchmarks/device_model.sh``):
    python3 benchmarks/gpu_agreement_real.py [--model-path DIR] [--dtype bfloat16|float32]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_agreement import report  # noqa: E402

QUESTIONS = [
    "What is the capital of France?", "Write a haiku about the sea.", "Give me three tips for staying healthy.",
    "Explain what a binary search does.", "What is 12 times 7?", "Name a famous painting by Leonardo da Vinci.",
    "How do plants make their food?", "Translate 'good morning' into Spanish.", "Why is the sky blue?",
    "Write a short poem about autumn leaves.", "What are the three states of matter?",
    "Describe a cat in two sentences.", "How many days are there in a leap year?",
    "What does a CPU do in a computer?", "Suggest a name for a bakery.", "Summarize the story of Cinderella.",
    "List four fruits that are red.", "What is the boiling point of water in Celsius?",
    "Give an example of a renewable energy source.", "Explain gravity to a child.",
]


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", default=os.environ.get("RADIXLM_MODEL"))
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from radixlm.runtime.default_model import default_model_path
    from radixlm.runtime.engine import Engine

    path = args.model_path or default_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=True, add_generation_prompt=True,
                                       return_dict=False) for q in QUESTIONS[: args.prompts]]
    dtype = getattr(torch, args.dtype)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to("cuda").eval()
    ref = []
    for p in prompts:  # NOTE: one at a time: padding would change HF's own bf16 numerics
        out = hf.generate(torch.tensor([p], device="cuda"), max_new_tokens=args.tokens, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
        ref.append(out[0, len(p):].tolist())
    with Engine(path, device="cuda", dtype=args.dtype, mem_fraction_static=0.3) as engine:
        sp = {"max_new_tokens": args.tokens, "temperature": 0, "ignore_eos": True}
        ours = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=sp)]
        alone = [engine.generate(input_ids=p, sampling_params=sp)["output_ids"] for p in prompts]
    exact = report(hf, prompts, ours, ref)
    same = sum(a == b for a, b in zip(ours, alone))
    print(f"{args.dtype}: radixlm == HF on all {args.tokens} tokens for {exact}/{len(prompts)} prompts; "
          f"radixlm batched == radixlm alone for {same}/{len(prompts)}")
    print("example:", repr(tok.decode(ours[0], skip_special_tokens=True)))


if __name__ == "__main__":
    main()
