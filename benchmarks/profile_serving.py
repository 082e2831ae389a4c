"""Where the server's host time goes: run one ``bench_serving.py`` load against ``radixlm serve``
with ``RADIXLM_CPROFILE_DIR`` set, report each process's CPU use over the run (a process near
100% of a core is the bottleneck) and the top functions of the profiled children.

    python benchmarks/profile_serving.py --model-path DIR --load-format dummy --device cuda \\
        -- --num-prompts 2048 --random-input-len 256 --random-output-len 256 --random-range-ratio 1
"""

from __future__ import annotations

import argparse
import glob
import io
import os
import pstats
import shutil
import sys
import tempfile
import time


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--server-arg", action="append", default=[], help="extra server CLI token (repeatable)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--keep", default=None, help="copy the children's .prof files to this folder")
    ap.add_argument("--client", choices=["serving", "constrained"], default="serving",
                    help="load generator: bench_serving.py or bench_constrained.py (its args after --)")
    ap.add_argument("bench", nargs=argparse.REMAINDER, help="the client's args after --")
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(__file__))
    import bench_constrained
    import bench_serving

    from radixlm.runtime.server.testing import ServerProcess, child_pids

    prof_dir = tempfile.mkdtemp(prefix="radixlm-prof-")
    env = {**os.environ, "RADIXLM_CPROFILE_DIR": prof_dir}
    server = ServerProcess(["--device", a.device, "--model-path", a.model_path, *a.server_arg], ready_timeout=900, env=env)
    pids = {server.proc.pid: "http+tokenizer"}
    for pid in child_pids(server.proc.pid):
        with open(f"/proc/{pid}/comm") as f:
            pids[pid] = f.read().strip()
    start = {p: cpu_seconds(p) for p in pids}
    t0 = time.perf_counter()
    try:
        client = bench_serving if a.client == "serving" else bench_constrained
        client.main(["--base-url", server.url, *[x for x in a.bench if x != "--"]])
        wall = time.perf_counter() - t0
        used = {p: cpu_seconds(p) - start[p] for p in pids}
    finally:
        server.stop()
    print(f"\nCPU over the {wall:.1f} s run (share of one core):")
    for p, name in pids.items():
        print(f"  {name:<18} {used[p]:8.1f} s  {used[p] / wall:6.0%}")
    for path in sorted(glob.glob(os.path.join(prof_dir, "*.prof"))):
        if a.keep:
            os.makedirs(a.keep, exist_ok=True)
            shutil.copy(path, a.keep)
        buf = io.StringIO()
        pstats.Stats(path, stream=buf).sort_stats("tottime").print_stats(a.top)
        print(f"\n== {os.path.basename(path)} (by own time)\n" + "\n".join(buf.getvalue().splitlines()[6:]))


if __name__ == "__main__":
    main()
