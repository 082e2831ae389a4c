"""The scheduler's step cadence from a ``RADIXLM_TRACE_DIR`` trace, split into busy periods.

Each ``turn`` event of ``scheduler-*.jsonl`` is one output message (one step's results). A busy
period is a run of turns with requests running, ended by a pause of ``--idle`` seconds (a
benchmark's modes run one after another with pauses between them). Per period: turns, duration,
inter-turn time p50 / p90 / p99 / max, host seconds in grammar mask filling (``mask_s``) and the
share of the period it took, turns whose mask filling took over ``--slow-mask`` ms (first visits
of grammar states computed on the decode path), and overlapped jump-forward steps.

    python benchmarks/turn_stats.py --trace-dir DIR [--idle 0.5]
"""

from __future__ import annotations

import argparse
import glob
import json
import os


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else 0.0


def periods(turns: list[dict], idle: float) -> list[list[dict]]:
    """``turns`` (time-ordered ``turn`` events) split where the gap exceeds ``idle`` seconds or
    nothing is running."""
    out: list[list[dict]] = []
    cur: list[dict] = []
    for ev in turns:
        if cur and (ev["t"] - cur[-1]["t"] > idle or not ev.get("running")):
            out.append(cur)
            cur = []
        if ev.get("running"):
            cur.append(ev)
    if cur:
        out.append(cur)
    return [p for p in out if len(p) > 2]


def summarize(turns: list[dict], idle: float, slow_mask_ms: float) -> list[str]:
    """One markdown row per busy period (see the module docstring)."""
    rows = ["| period | turns | seconds | inter-turn p50 / p90 / p99 / max (ms) | mask fill s (share) "
            "| turns with mask fill > %g ms | jump steps |" % slow_mask_ms, "|---|---|---|---|---|---|---|"]
    for k, p in enumerate(periods(turns, idle)):
        gaps = [(b["t"] - a["t"]) * 1e3 for a, b in zip(p, p[1:])]
        masks = [b.get("mask_s", 0.0) - a.get("mask_s", 0.0) for a, b in zip(p, p[1:])]
        dur = p[-1]["t"] - p[0]["t"]
        mask = sum(masks)
        slow = sum(m * 1e3 > slow_mask_ms for m in masks)
        jumps = p[-1].get("jumps", 0) - p[0].get("jumps", 0)
        rows.append(f"| {k} | {len(p)} | {dur:.2f} | {_pct(gaps, .5):.2f} / {_pct(gaps, .9):.2f} / "
                    f"{_pct(gaps, .99):.2f} / {max(gaps):.2f} | {mask:.3f} ({mask / max(dur, 1e-9):.0%}) | {slow} | {jumps} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace-dir", required=True)
    ap.add_argument("--idle", type=float, default=0.5, help="a gap this long (s) ends a busy period")
    ap.add_argument("--slow-mask", type=float, default=2.0, help="ms of mask filling that counts as slow")
    a = ap.parse_args()
    for path in sorted(glob.glob(os.path.join(a.trace_dir, "scheduler-*.jsonl"))):
        with open(path) as f:
            turns = [ev for ev in map(json.loads, f) if ev["ev"] == "turn"]
        print(f"{os.path.basename(path)}:")
        print("\n".join(summarize(turns, a.idle, a.slow_mask)))


if __name__ == "__main__":
    main()
