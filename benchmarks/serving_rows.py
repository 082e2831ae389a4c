"""The serving rows of issue 16: start ``radixlm serve`` per row, drive it with
``bench_serving.py``, print one markdown row per run (and append JSON lines to ``--output-file``).

Rows (``--rows``, comma separated):
    l8b_512      Llama-3.1-8B dims, 512 requests 1024 in / 256 out, all at once
    l8b_bs1      Llama-3.1-8B dims, one request at a time (ITL p50)
    l8b_gsp_on   shared prefix: 8 groups x 64 prompts, 2,048-token system prompt, cache on
    l8b_gsp_off  the same, ``--disable-radix-cache``
    l8b_512_c2048  l8b_512 with ``--chunked-prefill-size 2048`` (ITL p99 vs TTFT of mixed batches)
    small_bs1    SmolLM2-135M dims, one request at a time
    small_2048   SmolLM2-135M dims, 2,048 requests 256 in / 256 out, all at once

Models use dummy weights: ``--l8b-dir`` gets the published Llama-3.1-8B config; ``--small-dir`` is a
folder with the default model's config.json. Run the same command against two trees (before /
after a change) in one device call for same-run ratios:

    PYTHONPATH=/path/to/pkg python benchmarks/serving_rows.py --tag after --rows l8b_512,small_2048
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROWS = {
    "l8b_512": ("l8b", [], ["--dataset", "random", "--num-prompts", "512", "--random-input-len", "1024",
                            "--random-output-len", "256", "--random-range-ratio", "1.0"]),
    "l8b_bs1": ("l8b", [], ["--dataset", "random", "--num-prompts", "6", "--random-input-len", "1024",
                            "--random-output-len", "128", "--random-range-ratio", "1.0", "--max-concurrency", "1"]),
    "l8b_gsp_on": ("l8b", [], ["--dataset", "generated-shared-prefix", "--gsp-num-groups", "8",
                               "--gsp-prompts-per-group", "64", "--gsp-system-prompt-len", "2048",
                               "--gsp-question-len", "128", "--gsp-output-len", "256"]),
    "l8b_gsp_off": ("l8b", ["--disable-radix-cache"], "l8b_gsp_on"),  # same load, cache off
    "l8b_512_c2048": ("l8b", ["--chunked-prefill-size", "2048"], "l8b_512"),  # smaller prefill chunks
    "small_bs1": ("small", [], ["--dataset", "random", "--num-prompts", "8", "--random-input-len", "256",
                                "--random-output-len", "256", "--random-range-ratio", "1.0", "--max-concurrency", "1"]),
    "small_2048": ("small", [], ["--dataset", "random", "--num-prompts", "2048", "--random-input-len", "256",
                                 "--random-output-len", "256", "--random-range-ratio", "1.0"]),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="l8b_512,l8b_bs1,l8b_gsp_on,l8b_gsp_off,small_bs1,small_2048")
    ap.add_argument("--tag", default="run", help="label of this tree (e.g. before / after)")
    ap.add_argument("--l8b-dir", default="/tmp/l8b")
    ap.add_argument("--small-dir", default="/tmp/smollm2-config", help="config.json + tokenizer files")
    ap.add_argument("--l8b-tokenizer", default=".device/deepseek-llm",
                    help="any real tokenizer (ids are drawn below --l8b-vocab)")
    ap.add_argument("--l8b-vocab", type=int, default=100000)
    ap.add_argument("--server-arg", action="append", default=[], help="extra server CLI token (repeatable)")
    ap.add_argument("--output-file", default=None)
    ap.add_argument("--trace-dir", default=None,
                    help="trace each run (RADIXLM_TRACE_DIR + --chunk-log under DIR/<tag>-<row>) and print "
                         "benchmarks/itl_tail.py's analysis after it")
    ap.add_argument("--client-processes", type=int, default=4,
                    help="bench_serving.py --client-processes (load-generator processes; one Python "
                         "process reading 512 streams decided the ITL tail, H200 session 7)")
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(__file__))
    import bench_serving
    from bench_offline import write_config

    from radixlm.runtime.server.testing import ServerProcess

    write_config("llama-3.1-8b", a.l8b_dir)
    dirs = {"l8b": (a.l8b_dir, ["--context-length", "8192", "--tokenizer-path", a.l8b_tokenizer]),
            "small": (a.small_dir, [])}
    for name in a.rows.split(","):
        model, extra, load = ROWS[name]
        load = ROWS[load][2] if isinstance(load, str) else load
        path, model_args = dirs[model]
        env, trace = os.environ.copy(), []
        if a.trace_dir:
            run_dir = os.path.join(a.trace_dir, f"{a.tag}-{name}")
            k = 1
            while os.path.exists(run_dir):  # NOTE: a repeated run gets a folder of its own
                k += 1
                run_dir = os.path.join(a.trace_dir, f"{a.tag}-{name}-{k}")
            os.makedirs(run_dir)
            env["RADIXLM_TRACE_DIR"] = run_dir
            trace = ["--chunk-log", os.path.join(run_dir, "chunks.jsonl")]
        t0 = time.perf_counter()
        server = ServerProcess(["--device", "cuda", "--model-path", path, "--load-format", "dummy",
                                *model_args, *extra, *a.server_arg], ready_timeout=900, env=env)
        ready = time.perf_counter() - t0
        try:
            vocab = ["--vocab-size", str(a.l8b_vocab)] if model == "l8b" else []
            s = bench_serving.main(["--base-url", server.url, *load, *vocab, *trace,
                                    "--client-processes", str(a.client_processes)])
        finally:
            server.stop()
        if a.trace_dir:
            import itl_tail

            itl_tail.main(["--chunks", trace[1], "--trace-dir", run_dir])
        s.update(row=name, tag=a.tag, ready_s=ready)
        print(f"| {a.tag} | {name} | {s['completed']}/{s['completed'] + s['failed']} | {s['duration_s']:.1f} s | "
              f"{s['output_throughput']:,.0f} | {s['ttft_p50_ms']:.0f} / {s['ttft_p99_ms']:.0f} | "
              f"{s['itl_p50_ms']:.2f} / {s['itl_p99_ms']:.2f} | {s['server_cache_hit_rate']} | client CPU {s.get('client_cpu_share') or 0:.2f} |", flush=True)
        if a.output_file:
            with open(a.output_file, "a") as f:
                f.write(json.dumps(s) + "\n")


if __name__ == "__main__":
    main()
