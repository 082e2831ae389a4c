"""Explain an ITL tail: join a client's chunk times with the server's event timeline.

Run the server with ``RADIXLM_TRACE_DIR=DIR`` (``runtime/server/tracing.py``) and the client with
``bench_serving.py --chunk-log FILE``; after the server has stopped (its processes write their
traces at exit):

    python benchmarks/itl_tail.py --chunks FILE --trace-dir DIR [--factor 3]

Every gap between two chunks of one stream of at least ``factor`` x the median gap is assigned to
the first stage that explains it, in pipeline order (a stage explains a gap when it was silent
for at least half of it):
- ``scheduler``: the scheduler sent no output message for that long (a long step, a long host
  turn, or a pause of the scheduler process);
- ``http``: the HTTP process was paused (a garbage collection) or its event loop was late (``lag``)
  for that long;
- ``detokenizer``: the HTTP process ran, but received no step output for that long (detokenizer
  or IPC);
- ``client``: none of the above (SSE delivery, the client's own loop).
Also printed: the scheduler's inter-turn times (p50 / p99 / max), each process's garbage
collections (count, total, longest) and the event-loop lags, all within the load's window (from
a second before the first chunk to the last). Times are CLOCK_MONOTONIC seconds.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
from collections import Counter, defaultdict

import numpy as np


def load_trace(trace_dir: str) -> dict[str, list[dict]]:
    """``{process name: [event dict, ...]}`` from ``<trace_dir>/<name>-<pid>.jsonl`` files, each
    list sorted by time."""
    out: dict[str, list[dict]] = defaultdict(list)
    for path in glob.glob(os.path.join(trace_dir, "*.jsonl")):
        name = os.path.basename(path).rsplit("-", 1)[0]
        with open(path) as f:
            out[name] += [e for e in map(json.loads, filter(str.strip, f)) if "ev" in e]  # NOTE: not chunk logs
    for evs in out.values():
        evs.sort(key=lambda e: e["t"])
    return out


def longest_silence(times: np.ndarray, a: float, b: float) -> float:
    """Longest interval within ``[a, b]`` without an element of sorted ``times`` (seconds)."""
    inside = times[(times > a) & (times < b)]
    pts = np.concatenate([[a], inside, [b]])
    return float(np.max(np.diff(pts)))


def classify(gaps: list[tuple[float, float]], turns: np.ndarray, batches: np.ndarray,
             http_stalls: list[tuple[float, float]]) -> Counter:
    """Count ``gaps`` ((start, end) seconds) by the first pipeline stage that was silent for half
    of each: the scheduler's turns, then the HTTP process (``http_stalls``: its GC pauses and
    event-loop lags as (start, end)), then the step outputs arriving there (detokenizer / IPC)."""
    kinds: Counter = Counter()
    for a, b in gaps:
        half = (b - a) / 2
        if len(turns) and longest_silence(turns, a, b) >= half:
            kinds["scheduler"] += 1
        elif any(min(b, e) - max(a, s) >= half for s, e in http_stalls):
            kinds["http"] += 1
        elif len(batches) and longest_silence(batches, a, b) >= half:
            kinds["detokenizer"] += 1
        else:
            kinds["client"] += 1
    return kinds


def _ms(x: float) -> str:
    return f"{x * 1000:.1f}"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", required=True, help="bench_serving.py --chunk-log output")
    ap.add_argument("--trace-dir", required=True, help="the server's RADIXLM_TRACE_DIR")
    ap.add_argument("--factor", type=float, default=3.0, help="a gap this many times the median is a tail gap")
    a = ap.parse_args(argv)
    with open(a.chunks) as f:
        streams = [r["t"] for r in map(json.loads, f) if r["ok"] and len(r["t"]) > 1]
    gaps = [(t0, t1) for ts in streams for t0, t1 in zip(ts, ts[1:])]
    lengths = np.array([b - s for s, b in gaps])
    med = float(np.median(lengths))
    tail = [g for g, x in zip(gaps, lengths) if x >= a.factor * med]
    trace = load_trace(a.trace_dir)
    lo, hi = min(ts[0] for ts in streams), max(ts[-1] for ts in streams)  # NOTE: the load's window only

    def ev(proc: str, kind: str) -> list[dict]:
        return [e for e in trace.get(proc, []) if e["ev"] == kind and lo - 1.0 <= e["t"] <= hi]

    turns = np.array([e["t"] for e in ev("scheduler", "turn")])
    batches = np.array([e["t"] for e in ev("http", "batch")])
    lags = ev("http", "lag")
    stalls = [(e["t"], e["t"] + e["late"]) for e in lags] + [(e["t"], e["t"] + e["dur"]) for e in ev("http", "gc")]
    kinds = classify(tail, turns, batches, stalls)
    pauses = [(e["t"], e["t"] + e["dur"]) for p in trace for e in ev(p, "gc") if e["dur"] >= 0.005]
    kinds["with a gc pause >= 5 ms"] = sum(any(s < b and e > s0 for s, e in pauses) for s0, b in tail)
    print(f"chunk gaps: {len(gaps)}, p50 {_ms(med)} ms, p99 {_ms(float(np.percentile(lengths, 99)))} ms, "
          f"max {_ms(float(lengths.max()))} ms; tail (>= {a.factor:g}x p50): {len(tail)}")
    print("tail gaps by stage: " + ", ".join(f"{k} {v}" for k, v in kinds.most_common()))
    if len(turns) > 1:
        d = np.diff(turns)
        print(f"scheduler inter-turn: {len(d)} turns, p50 {_ms(np.median(d))} / p99 {_ms(np.percentile(d, 99))} "
              f"/ max {_ms(d.max())} ms")
        worst = np.argsort(d)[-5:][::-1]
        info = ev("scheduler", "turn")
        for i in worst:
            e0, e1 = info[i], info[i + 1]
            print(f"  turn gap {_ms(d[i])} ms at t={e1['t']:.3f}: prefilled {e1['prefill'] - e0['prefill']} "
                  f"tokens, {e1['running']} running, {e1['n']} outputs")
    for proc in sorted(trace):
        g = ev(proc, "gc")
        if g:
            durs = np.array([e["dur"] for e in g])
            print(f"{proc} gc: {len(g)} collections (gen2: {sum(e['gen'] == 2 for e in g)}), total "
                  f"{_ms(durs.sum())} ms, longest {_ms(durs.max())} ms"
                  + "".join(f"; gen{e['gen']} {_ms(e['dur'])} ms at +{e['t'] - lo:.2f} s" for e in g if e["dur"] >= 0.005))
    if lags:
        print(f"http event-loop lags over 5 ms: {len(lags)}, longest {_ms(max(e['late'] for e in lags))} ms")
    det = ev("detokenizer", "detok")
    if det:
        d = np.array([e["dur"] for e in det])
        print(f"detokenizer batches: {len(d)}, p50 {_ms(np.median(d))} / p99 {_ms(np.percentile(d, 99))} / "
              f"max {_ms(d.max())} ms")
    return {"tail": len(tail), **kinds}


if __name__ == "__main__":
    main()
