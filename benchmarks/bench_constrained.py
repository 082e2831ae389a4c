"""Constrained vs free decoding throughput through a running server (issue 12).

N concurrent ``/generate`` requests per mode — free (``ignore_eos``), ``json_schema``, ``regex``,
``ebnf`` — with the same prompts and ``max_new_tokens``; prints output tok/s per mode, the ratio to
free decoding measured in the same run, mean output length, and the share of constrained outputs
that validate (``jsonschema`` / ``re.fullmatch``; of all outputs, and of those the grammar ended).
After each constrained mode, free decoding runs again on its prompts with each request capped at
the length the grammar produced, the like-for-like baseline (``--no-matched`` skips it); the
prefix cache is flushed before every timed run.

    # CPU, default model (SmolLM2-135M-Instruct):
    .venv/bin/python benchmarks/bench_constrained.py --num-prompts 16 --max-new-tokens 48
    # GPU, Llama-3.1-8B dims with random weights and the DeepSeek tokenizer:
    python benchmarks/bench_constrained.py --write-config llama-3.1-8b /tmp/llama8b --load-format dummy \\
        --tokenizer-path ../shared/data/tokenizers/deepseek-llm --device cuda --num-prompts 128
    # against a server already running:
    python benchmarks/bench_constrained.py --base-url http://127.0.0.1:30000
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "maxLength": 60},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 8},
        "address": {"type": "object", "properties": {"street": {"type": "string", "maxLength": 60},
                                                     "city": {"type": "string", "maxLength": 30}},
                    "required": ["street", "city"]},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "tags", "address", "active"],
}
REGEX = r"[A-Z][a-z]{2,12}( [a-z]{2,12}){16,60}\."  # >= 17 words: outputs as long as free ones
EBNF = 'root: "[" item (", " item)~12..60 "]"\nitem: NUM | "\\"" WORD "\\""\nNUM: /[0-9]{3,8}/\nWORD: /[a-z]{3,12}/'
EBNF_REGEX = r'\[([0-9]{3,8}|"[a-z]{3,12}")(, ([0-9]{3,8}|"[a-z]{3,12}")){12,60}\]'
PROMPT = ("Record {i}: write the profile of a person (name, age, email, tags, address, active) "
          "as structured data. Be detailed.")
MODES = {
    "free": {"ignore_eos": True},
    "json_schema": {"json_schema": json.dumps(SCHEMA)},
    # NOTE: JSON Schema's semantics (undeclared keys allowed where the schema is silent); the
    # serving default closes objects (disable_additional_properties)
    "json_schema_open": {"json_schema": json.dumps(SCHEMA), "disable_additional_properties": False},
    "regex": {"regex": REGEX},
    "ebnf": {"ebnf": EBNF},
}


def validate(mode: str, text: str) -> bool:
    if mode.startswith("json_schema"):
        import jsonschema

        try:
            jsonschema.validate(json.loads(text), SCHEMA)
            return True
        except (ValueError, jsonschema.ValidationError):
            return False
    if mode == "regex":
        return re.fullmatch(REGEX, text) is not None
    if mode == "ebnf":
        return re.fullmatch(EBNF_REGEX, text) is not None
    return True


def run_mode(url: str, mode: str, n: int, max_new: int, timeout: float, first: int = 0,
             lengths: list[int] | None = None) -> dict:
    """``n`` concurrent requests of ``mode`` with prompts ``first .. first + n - 1``; with
    ``lengths``, request ``first + k`` gets ``max_new_tokens = lengths[k]`` instead of ``max_new``
    (free decoding at the lengths a constrained mode produced)."""

    def one(i: int) -> dict:
        limit = max_new if lengths is None else max(1, lengths[i - first])
        sp = {"max_new_tokens": limit, "temperature": 0, **MODES[mode]}
        t = time.perf_counter()
        r = requests.post(url + "/generate", json={"text": PROMPT.format(i=i), "sampling_params": sp}, timeout=timeout)
        if r.status_code != 200:
            raise RuntimeError(f"{mode}: HTTP {r.status_code}: {r.text[:300]}")
        out = r.json()
        out["_rate"] = out["meta_info"]["completion_tokens"] / (time.perf_counter() - t)
        return out

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=n) as pool:
        outs = list(pool.map(one, range(first, first + n)))
    dt = time.perf_counter() - t0
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    ended = [o for o in outs if (o["meta_info"]["finish_reason"] or {}).get("type") == "stop"]
    aborted = [o for o in outs if (o["meta_info"]["finish_reason"] or {}).get("type") == "abort"]
    valid = sum(validate(mode, o["text"]) for o in outs)
    valid_ended = sum(validate(mode, o["text"]) for o in ended)
    rates = sorted(o["_rate"] for o in outs)
    return {"mode": mode, "seconds": dt, "tokens": tokens, "tok_s": tokens / dt, "mean_len": tokens / n,
            "req_tok_s": rates[len(rates) // 2],
            "valid": valid, "ended": len(ended), "valid_ended": valid_ended, "aborted": len(aborted), "n": n,
            "sample": outs[0]["text"][:80], "lengths": [o["meta_info"]["completion_tokens"] for o in outs]}


def flush(url: str) -> None:
    """Empty the server's prefix cache (``/flush_cache``), so a timed run's prompts are not cached
    by the run before it."""
    r = requests.post(url + "/flush_cache", timeout=60)
    if r.status_code != 200:
        print(f"# /flush_cache: HTTP {r.status_code}", file=sys.stderr)


def report(rows: list[dict], header: str) -> str:
    """Markdown table; each row's ratios are to the free mode of its own pass, and (when measured)
    to free decoding at the same prompts and output lengths.

    "output tok/s" is all output tokens over the mode's wall time: a mode whose outputs end early
    (a grammar that completes) scores lower even at equal step speed, since the batch's longest
    request sets the wall time and prefill weighs more in a short run. "per-request tok/s" is the
    median over requests of each one's tokens over its own latency (TTFT included): the decode
    speed each request saw. "same lengths" compares with free decoding run right after on the
    same prompts, each request capped at the output length the constrained mode produced for it
    (``ignore_eos``): equal work but for the grammar."""
    free = {r.get("pass", 1): r for r in rows if r["mode"] == "free"}
    lines = [header, "", "| pass | mode | output tok/s | ratio to free | per-request tok/s (median) | ratio to free "
             "| same lengths: free tok/s | ratio | per-request ratio | mean output tokens | valid (all) "
             "| valid (ended) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = free.get(r.get("pass", 1))
        ratio = f"{r['tok_s'] / base['tok_s']:.2f}x" if base else "-"
        req_ratio = f"{r['req_tok_s'] / base['req_tok_s']:.2f}x" if base else "-"
        m = r.get("matched")
        same = (f"{m['tok_s']:.1f} | {r['tok_s'] / m['tok_s']:.2f}x | {r['req_tok_s'] / m['req_tok_s']:.2f}x"
                if m else "- | - | -")
        valid = "-" if r["mode"] == "free" else f"{r['valid']}/{r['n']}"
        ended = "-" if r["mode"] == "free" else f"{r['valid_ended']}/{r['ended']}"
        lines.append(f"| {r.get('pass', 1)} | {r['mode']} | {r['tok_s']:.1f} | {ratio} | {r['req_tok_s']:.1f} | "
                     f"{req_ratio} | {same} | {r['mean_len']:.1f} | {valid} | {ended} |")
    return "\n".join(lines)


def server_args(a: argparse.Namespace) -> list[str]:
    out: list[str] = []
    if a.model_path:
        out += ["--model-path", a.model_path]
    if a.tokenizer_path:
        out += ["--tokenizer-path", a.tokenizer_path]
    out += ["--load-format", a.load_format, "--device", a.device, "--grammar-backend", a.grammar_backend]
    if a.dtype:
        out += ["--dtype", a.dtype]
    if a.max_total_tokens:
        out += ["--max-total-tokens", str(a.max_total_tokens)]
    if a.context_length:
        out += ["--context-length", str(a.context_length)]
    if a.overlap != "default":
        out += ["--enable-overlap-schedule" if a.overlap == "on" else "--no-enable-overlap-schedule"]
    return out + a.server_arg


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default=None, help="use a running server instead of starting one")
    p.add_argument("--model-path", default=None, help="default: the default model")
    p.add_argument("--write-config", nargs=2, metavar=("NAME", "DIR"), default=None,
                   help="write a published config (see bench_offline.py) to DIR and use it as --model-path")
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None)
    p.add_argument("--max-total-tokens", type=int, default=None)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--grammar-backend", default="radixlm", choices=["radixlm", "xgrammar", "llguidance"])
    p.add_argument("--overlap", choices=["default", "on", "off"], default="default",
                   help="overlap scheduling of the started server (default: the server's default)")
    p.add_argument("--passes", type=int, default=1,
                   help="timed passes over all modes, each with new prompts; a grammar's lazily computed "
                        "state masks stay cached across passes (pass 1 is the cold start)")
    p.add_argument("--server-arg", action="append", default=[], help="extra server CLI token (repeatable)")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--json-schema", default=None, metavar="FILE",
                   help="the json_schema mode's schema (default: SCHEMA above); outputs validate against it")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--output-file", default=None, help="append the markdown table here")
    p.add_argument("--no-matched", dest="matched", action="store_false",
                   help="skip the free run at each constrained mode's output lengths")
    a = p.parse_args(argv)
    if a.json_schema:
        global SCHEMA
        with open(a.json_schema) as f:
            SCHEMA = json.load(f)
        for m in ("json_schema", "json_schema_open"):
            MODES[m] = {**MODES[m], "json_schema": json.dumps(SCHEMA)}
    if a.write_config:
        from benchmarks.bench_offline import write_config  # noqa: PLC0415

        a.model_path = write_config(*a.write_config)
        a.context_length = a.context_length or 4096
    server = None
    url = a.base_url
    if url is None:
        from radixlm.runtime.server.testing import ServerProcess

        server = ServerProcess(server_args(a), ready_timeout=900)
        url = server.url
    try:
        modes = a.modes.split(",")
        # NOTE: warm-up at full concurrency (grammar compiles, kernel autotuning and the first
        # large prefill batches), so the first timed mode does not pay first-use costs
        for m in modes:
            run_mode(url, m, a.num_prompts, min(16, a.max_new_tokens), a.timeout)
        rows = []
        for k in range(a.passes):
            first = (k + 1) * a.num_prompts
            for m in modes:
                flush(url)  # NOTE: every timed run starts without cached prompts (same footing)
                row = {**run_mode(url, m, a.num_prompts, a.max_new_tokens, a.timeout, first=first), "pass": k + 1}
                if m != "free" and a.matched:
                    flush(url)
                    row["matched"] = run_mode(url, "free", a.num_prompts, a.max_new_tokens, a.timeout,
                                              first=first, lengths=row["lengths"])
                rows.append(row)
    finally:
        if server is not None:
            server.stop()
    header = (f"bench_constrained: {a.num_prompts} concurrent requests per mode, max_new_tokens "
              f"{a.max_new_tokens}, greedy, model {a.model_path or 'default'} ({a.load_format}), tokenizer "
              f"{a.tokenizer_path or 'the model'}, device {a.device}, grammar backend {a.grammar_backend}"
              f", overlap {a.overlap}")
    text = report(rows, header)
    print(text)
    for r in rows:
        print(f"# {r['mode']}: {r['seconds']:.1f}s, aborted {r['aborted']}, sample {r['sample']!r}", file=sys.stderr)
    if a.output_file:
        with open(a.output_file, "a") as f:
            f.write(text + "\n\n")
    return rows


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
