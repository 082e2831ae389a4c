"""Time to first token at batch 1: short prefills through the decode CUDA graphs (one row per
token, ``cuda_graph_max_extend_tokens``) vs eager prefill kernels, same process, dummy weights.

    python benchmarks/bench_prefill_graph.py --config-dir MODEL_DIR --lengths 32,128,256,512
    python benchmarks/bench_prefill_graph.py --write-config llama-3.1-8b /tmp/l8b

Per prompt length: median wall time of ``generate(max_new_tokens=1)`` over fresh prompts (no
prefix-cache hit) and over prompts that extend a cached 256-token prefix (a chat turn after a
system prompt), for each setting.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_dims import add_model_args, model_dir  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(ap)
    ap.add_argument("--lengths", default="32,128,256,512")
    ap.add_argument("--settings", default="0,default", help="cuda_graph_max_extend_tokens values ('default': None)")
    ap.add_argument("--repeats", type=int, default=10)
    a = ap.parse_args()
    import torch

    from radixlm.runtime.engine import Engine

    path, name = model_dir(ap, a)
    lengths = [int(x) for x in a.lengths.split(",")]
    rng = random.Random(0)
    system = [rng.randrange(100, 30000) for _ in range(256)]
    rows = []
    for setting in a.settings.split(","):
        limit = None if setting == "default" else int(setting)
        with Engine(path, load_format="dummy", device="cuda", skip_tokenizer_init=True, max_total_tokens=65536,
                    max_running_requests=512, cuda_graph_max_extend_tokens=limit) as e:
            for cached in (False, True):
                for n in lengths:
                    times = []
                    for i in range(a.repeats + 2):
                        new = [rng.randrange(100, 30000) for _ in range(n)]
                        ids = system + new if cached else new
                        if cached and i == 0:
                            e.generate(input_ids=system + [1], sampling_params={"max_new_tokens": 1})
                        t0 = time.perf_counter()
                        e.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0})
                        if i >= 2:  # NOTE: the first two per length warm up kernels
                            times.append(time.perf_counter() - t0)
                    rows.append((setting, "256 cached + " if cached else "", n, statistics.median(times)))
        torch.cuda.empty_cache()
    print(f"{name} dims, batch 1, {torch.cuda.get_device_name()}, median of {a.repeats}")
    print("| cuda_graph_max_extend_tokens | prompt | TTFT ms |\n|---|---|---:|")
    for setting, prefix, n, t in rows:
        print(f"| {setting} | {prefix}{n} new | {t * 1000:.2f} |")


if __name__ == "__main__":
    main()
