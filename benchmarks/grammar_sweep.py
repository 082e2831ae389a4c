"""Compile every MaskBench schema file (also those without test instances) and report robustness.

Each schema gets a fresh :class:`GrammarCompiler` (no compiled grammar cached from an earlier
schema; the tokenizer's vocabulary index is built once and shared) and a wall-clock budget
(SIGALRM, default 20 s).
Recorded per schema: ``ok``, ``error`` (a :class:`GrammarError`: the schema is refused cleanly, its
message head is tallied), ``crash`` (any other exception: a bug), ``timeout`` (the alarm fired: a
bug, compiles must be bounded) and the compile's thread CPU time (``slow`` past ``--slow``).

    RADIXLM_SHARED_DATA=/work/shared/data .venv/bin/python benchmarks/grammar_sweep.py \
        --tokenizer deepseek-llm [--part 0 --parts 2] [--start-after NAME] [--jsonl out.jsonl]

``--jsonl`` appends one line per schema (resumable with ``--start-after``); ``--summary FILE``
summarizes such a file without compiling anything. Run it on one core: the compile is
single-threaded, and timings of concurrent runs are not comparable.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import signal
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _pkg import ensure_radixlm  # noqa: E402

ensure_radixlm()

from radixlm.grammar.compiler import GrammarCompiler  # noqa: E402
from radixlm.grammar.errors import GrammarError  # noqa: E402
from radixlm.grammar.maskbench import load_tokenizer, shared_data  # noqa: E402


class _Timeout(Exception):
    """Raised by the SIGALRM handler inside the compile."""


def _alarm(signum, frame):  # noqa: ARG001
    raise _Timeout()


_QUOTED = re.compile(r"(invalid regex|\$ref|\$ref to another document is not supported:|unknown type|"
                     r"undefined rule|multipleOf) ('(?:[^'\\]|\\.)*'|\S+)")


def error_head(message: str, width: int = 60) -> str:
    """The part of a GrammarError message that names the construct (its first ``width`` chars;
    quoted schema fragments such as a regex or a ``$ref`` replaced by ``…``, numbers by ``N``, so
    that messages about one construct tally together)."""
    head = _QUOTED.sub(lambda m: m.group(1) + " …", message.split("\n", 1)[0])
    head = re.sub(r"\d[\d,.]*", "N", head)
    for cut in (": {", ": [", " {", " ["):
        i = head.find(cut)
        if 0 <= i < width:
            head = head[:i]
    return head[:width]


def sweep_one(info, path: Path, timeout: int) -> dict:
    """Compile one schema file; returns a record (``name``, ``status``, ``cpu_s``, ``wall_s``,
    ``msg``)."""
    schema = json.loads(path.read_text())["schema"]
    comp = GrammarCompiler(info)
    rec = {"name": path.stem, "status": "ok", "msg": ""}
    t0, c0 = time.perf_counter(), time.thread_time()
    signal.alarm(timeout)
    try:
        comp.compile_json_schema(schema)
    except GrammarError as e:
        rec.update(status="error", msg=str(e).split("\n", 1)[0][:300])
    except _Timeout:
        rec.update(status="timeout", msg=f"{timeout}s")
    except Exception as e:  # noqa: BLE001 - the point is to find these
        tb = traceback.format_exc().splitlines()[-4:]
        rec.update(status="crash", msg=f"{type(e).__name__}: {str(e)[:200]}", tb=tb)
    finally:
        signal.alarm(0)
    rec["cpu_s"] = round(time.thread_time() - c0, 3)
    rec["wall_s"] = round(time.perf_counter() - t0, 3)
    return rec


def summarize(records: list[dict], slow: float, top: int = 25) -> str:
    """Counts per status, the crashes, timeouts and slow compiles, and the GrammarError heads."""
    by = collections.Counter(r["status"] for r in records)
    lines = [f"{len(records)} schemas: " + ", ".join(f"{k} {v}" for k, v in sorted(by.items()))]
    for r in records:
        if r["status"] in ("crash", "timeout"):
            lines.append(f"{r['status'].upper()} {r['name']}: {r['msg']}")
    slows = sorted((r for r in records if r["cpu_s"] > slow), key=lambda r: -r["cpu_s"])
    lines.append(f"compiles over {slow}s CPU: {len(slows)}")
    lines += [f"  SLOW {r['name']} {r['cpu_s']}s ({r['status']})" for r in slows]
    cpu = sorted(r["cpu_s"] for r in records)
    if cpu:
        lines.append(f"cpu p50 {cpu[len(cpu) // 2]:.3f}s p99 {cpu[int(len(cpu) * .99)]:.3f}s "
                     f"max {cpu[-1]:.2f}s total {sum(cpu):.0f}s")
    heads = collections.Counter(error_head(r["msg"]) for r in records if r["status"] == "error")
    lines.append(f"GrammarError heads ({sum(heads.values())} schemas):")
    lines += [f"  {n:5d} {h}" for h, n in heads.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", default="deepseek-llm")
    ap.add_argument("--part", type=int, default=0)
    ap.add_argument("--parts", type=int, default=1)
    ap.add_argument("--start-after", default=None, help="skip files up to this stem (sorted order)")
    ap.add_argument("--only", nargs="*", default=None, help="compile just these stems")
    ap.add_argument("--timeout", type=int, default=20)
    ap.add_argument("--slow", type=float, default=5.0, help="report compiles over this CPU time")
    ap.add_argument("--jsonl", default=None, help="append one record per schema here")
    ap.add_argument("--summary", default=None, help="summarize this jsonl file and exit")
    args = ap.parse_args()
    if args.summary:
        recs = [json.loads(x) for x in Path(args.summary).read_text().splitlines() if x.strip()]
        print(summarize(recs, args.slow))
        return
    files = sorted((shared_data() / "maskbench").glob("*.json"))
    if args.only:
        files = [f for f in files if f.stem in set(args.only)]
    if args.start_after:
        files = [f for f in files if f.stem > args.start_after]
    files = files[args.part::args.parts]
    info = GrammarCompiler(load_tokenizer(args.tokenizer)).tokenizer_info
    signal.signal(signal.SIGALRM, _alarm)
    out = open(args.jsonl, "a") if args.jsonl else None
    records = []
    for f in files:
        rec = sweep_one(info, f, args.timeout)
        records.append(rec)
        if out:
            out.write(json.dumps(rec) + "\n")
            out.flush()
        if rec["status"] in ("crash", "timeout") or rec["cpu_s"] > 1:
            print(rec["status"], rec["name"], rec["cpu_s"], rec["msg"], rec.get("tb", ""), flush=True)
    print(summarize(records, args.slow))


if __name__ == "__main__":
    main()
