"""MaskBench: radixlm's grammar engine against xgrammar, llguidance and outlines-core.

For every JSON schema of ``$RADIXLM_SHARED_DATA/maskbench`` (a subset with ``--stride``) and every
engine: compile time, then for each test instance (``json.dumps``, tokenized once with the real
tokenizer) the per-token time to fill the next-token bitmask, whether each token is allowed and
accepted, and whether the instance terminates. Reported: compile p50/p90, mask p50/p99, coverage
(schemas compiled), valid instances accepted, invalid instances accepted (must be 0). Every engine
is scored on the SAME schemas and instances: a schema an engine fails to compile (or times out on)
counts against its coverage, and its valid instances count as rejected. Mask times are per
request-step (one ``fill_next_token_bitmask`` of one sequence).

``--separators consistent`` compiles radixlm's grammars with serving's separator rule (the first
separator fixes the style; about twice the states). ``--closed`` compiles as serving does by default (``disable_additional_properties``: objects that
declare properties take no undeclared keys; xgrammar's ``strict_mode``, the llguidance schema with
``additionalProperties: false`` written in): valid instances with undeclared keys are then refused
by every engine. Without it every engine gets JSON Schema's semantics (xgrammar ``strict_mode``
off, which is not its default).

    .venv/bin/python benchmarks/bench_grammar.py --tokenizer deepseek-llm --stride 20
    .venv/bin/pip install xgrammar llguidance outlines-core   # optional peers (benchmark only)
"""

from __future__ import annotations

import argparse
import gc
import json
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from radixlm.grammar import GrammarCompiler, GrammarError, GrammarMatcher, allocate_token_bitmask  # noqa: E402
from radixlm.grammar.maskbench import encode_exact, load_cases, load_tokenizer  # noqa: E402


class _Timeout(Exception):
    pass


def _alarm(_sig: int, _frame: Any) -> None:
    raise _Timeout()


# --- engines ------------------------------------------------------------------------------------

CLOSED = False  # --closed
SEPARATORS = "either"  # --separators (radixlm only)


class RadixLM:
    name = "radixlm"

    def __init__(self, tok: Any) -> None:
        self.compiler = GrammarCompiler(tok)
        self.info = self.compiler.tokenizer_info
        self.vocab = self.info.vocab_size

    def compile(self, schema: str) -> Any:
        return self.compiler.compile_json_schema(schema, disable_additional_properties=CLOSED,
                                                 separators=SEPARATORS)

    def matcher(self, g: Any) -> Any:
        return GrammarMatcher(g)

    def fill(self, m: Any, bm: torch.Tensor) -> None:
        m.fill_next_token_bitmask(bm, 0)

    def accept(self, m: Any, t: int) -> bool:
        return m.accept_token(t)

    def done(self, m: Any) -> bool:
        return m.is_terminated()


class XGrammar:
    name = "xgrammar"

    def __init__(self, tok: Any) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.tinfo = xgr.TokenizerInfo.from_huggingface(tok)
        self.compiler = xgr.GrammarCompiler(self.tinfo, max_threads=1, cache_enabled=False)
        self.vocab = self.tinfo.vocab_size

    def compile(self, schema: str) -> Any:
        return self.compiler.compile_json_schema(schema, strict_mode=CLOSED)

    def matcher(self, g: Any) -> Any:
        return self.xgr.GrammarMatcher(g)

    def fill(self, m: Any, bm: torch.Tensor) -> None:
        m.fill_next_token_bitmask(bm, 0)

    def accept(self, m: Any, t: int) -> bool:
        return m.accept_token(t)

    def done(self, m: Any) -> bool:
        return m.is_terminated()


class LLGuidance:
    name = "llguidance"

    def __init__(self, tok: Any) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.ll = llguidance
        self.llt = llguidance.torch
        self.tok = llguidance.hf.from_tokenizer(tok)
        self.vocab = self.tok.vocab_size

    def compile(self, schema: str) -> Any:
        from radixlm.grammar.backends import close_objects

        grammar = self.ll.LLMatcher.grammar_from_json_schema(close_objects(schema) if CLOSED else schema)
        err = self.ll.LLMatcher.validate_grammar(grammar, self.tok)
        if err:
            raise ValueError(err)
        return grammar

    def matcher(self, g: Any) -> Any:
        m = self.ll.LLMatcher(self.tok, g)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def fill(self, m: Any, bm: torch.Tensor) -> None:
        self.llt.fill_next_token_bitmask(m, bm, 0)

    def accept(self, m: Any, t: int) -> bool:
        return m.consume_token(t) and not m.is_error()

    def done(self, m: Any) -> bool:
        return m.is_stopped() and not m.is_error()


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tok: Any) -> None:
        import outlines_core
        from outlines_core.json_schema import build_regex_from_schema

        self.oc = outlines_core
        self.build = build_regex_from_schema
        info = GrammarCompiler(tok).tokenizer_info
        self.eos = info.stop_token_ids[0]
        table: dict[bytes, list[int]] = {}
        for tid, b in enumerate(info.token_bytes):
            if b is not None and tid != self.eos:
                table.setdefault(b, []).append(tid)
        self.vocabulary = outlines_core.Vocabulary(self.eos, table)
        self.vocab = info.vocab_size

    def compile(self, schema: str) -> Any:
        return self.oc.Index(self.build(schema), self.vocabulary)

    def matcher(self, g: Any) -> Any:
        return self.oc.Guide(g)

    def fill(self, m: Any, bm: torch.Tensor) -> None:
        m.write_mask_into(bm.data_ptr(), bm.numel(), 4)

    def accept(self, m: Any, t: int) -> bool:
        if t == self.eos:  # NOTE: outlines ends in a final state instead of consuming EOS
            self.stopped = m.is_finished()
            return self.stopped
        self.stopped = False
        try:
            m.advance(t)
            return True
        except Exception:  # noqa: BLE001 - outlines raises on a forbidden token
            return False

    def done(self, m: Any) -> bool:
        return self.stopped


ENGINES = {"radixlm": RadixLM, "xgrammar": XGrammar, "llguidance": LLGuidance, "outlines-core": OutlinesCore}


# --- the run ------------------------------------------------------------------------------------

@dataclass
class Stats:
    compile_times: list[float] = field(default_factory=list)
    mask_times: list[float] = field(default_factory=list)
    cases: int = 0
    compiled: int = 0
    valid: int = 0
    valid_ok: int = 0
    invalid: int = 0
    invalid_ok: int = 0
    mismatches: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    misses: list[dict] = field(default_factory=list)  # rejected valid instances (``--misses``)


def run_engine(engine: Any, tok: Any, eos: int, cases: list, timeout: float) -> Stats:
    st = Stats()
    bm = torch.zeros((1, (engine.vocab + 31) // 32), dtype=torch.int32)
    words = bm[0].numpy()
    signal.signal(signal.SIGALRM, _alarm)
    for name, case, instances in cases:
        st.cases += 1
        schema = json.dumps(case["schema"])
        t0 = time.perf_counter()
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout)
            g = engine.compile(schema)
            signal.setitimer(signal.ITIMER_REAL, 0)
        except Exception as e:  # noqa: BLE001 - every engine has its own errors
            signal.setitimer(signal.ITIMER_REAL, 0)
            key = "timeout" if isinstance(e, _Timeout) else type(e).__name__
            st.errors[key] = st.errors.get(key, 0) + 1
            st.misses.extend({"case": name, "compile_error": f"{key}: {e}"[:300], "data": t["data"]}
                             for t in case["tests"] if t["valid"])
            # NOTE: same instance set for every engine: a schema it cannot compile rejects them all.
            st.valid += sum(1 for v, _ in instances if v)
            st.invalid += sum(1 for v, _ in instances if not v)
            continue
        st.compile_times.append(time.perf_counter() - t0)
        st.compiled += 1
        for (valid, ids), test in zip(instances, case["tests"]):
            try:
                m = engine.matcher(g)
            except Exception:  # noqa: BLE001
                st.errors["matcher"] = st.errors.get("matcher", 0) + 1
                continue
            ok = True
            at = 0
            for at, tid in enumerate(ids + [eos]):
                t1 = time.perf_counter()
                engine.fill(m, bm)
                st.mask_times.append(time.perf_counter() - t1)
                allowed = bool((int(words[tid // 32]) >> (tid % 32)) & 1)
                acc = allowed and engine.accept(m, tid)
                if allowed and not acc:
                    st.mismatches += 1
                if not acc:
                    ok = False
                    break
            ok = ok and engine.done(m)
            if valid and not ok:
                st.misses.append({"case": name, "data": test["data"], "token": at, "of": len(ids) + 1,
                                  "ids": ids})
            if valid:
                st.valid += 1
                st.valid_ok += ok
            else:
                st.invalid += 1
                st.invalid_ok += ok
    return st


def _pct(xs: list[float], q: float, scale: float) -> str:
    return f"{np.percentile(xs, q) * scale:.1f}" if xs else "-"


def report(results: dict[str, Stats]) -> str:
    lines = ["| engine | compile p50 / p90 (ms) | mask p50 / p99 per request-step (µs) | coverage | valid accepted | invalid accepted |",
             "|---|---|---|---|---|---|"]
    for name, st in results.items():
        lines.append(
            f"| {name} | {_pct(st.compile_times, 50, 1e3)} / {_pct(st.compile_times, 90, 1e3)} | "
            f"{_pct(st.mask_times, 50, 1e6)} / {_pct(st.mask_times, 99, 1e6)} | "
            f"{st.compiled}/{st.cases} = {st.compiled / max(st.cases, 1):.1%} | "
            f"{st.valid_ok}/{st.valid} = {st.valid_ok / max(st.valid, 1):.1%} | {st.invalid_ok}/{st.invalid} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="deepseek-llm")
    ap.add_argument("--stride", type=int, default=10, help="every n-th MaskBench file")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--timeout", type=float, default=30.0, help="compile timeout per schema (s)")
    ap.add_argument("--json", default=None, help="also write the raw figures here")
    ap.add_argument("--misses", default=None,
                    help="write the valid instances each engine rejects here (JSON lines: case, "
                         "compile error or the index of the first refused token)")
    ap.add_argument("--closed", action="store_true",
                    help="objects closed as in serving (disable_additional_properties; see above)")
    ap.add_argument("--separators", default="either", choices=("either", "consistent", "compact", "spaced"),
                    help="radixlm's separators option (serving uses consistent; instances are spaced)")
    args = ap.parse_args()
    global CLOSED, SEPARATORS
    CLOSED, SEPARATORS = args.closed, args.separators
    tok = load_tokenizer(args.tokenizer)
    info = GrammarCompiler(tok).tokenizer_info
    eos = info.stop_token_ids[0]
    cases = []
    for name, case in load_cases(limit=args.limit, stride=args.stride):
        instances = [(t["valid"], encode_exact(tok, info, json.dumps(t["data"]))) for t in case["tests"]]
        cases.append((name, case, instances))
    results: dict[str, Stats] = {}
    gc.collect()
    gc.freeze()  # NOTE: as a long-running server would: GC passes skip the tokenizer and the cases
    for name in args.engines.split(","):
        try:
            engine = ENGINES[name](tok)
        except ImportError as e:
            print(f"# {name}: not installed ({e})", file=sys.stderr)
            continue
        t0 = time.perf_counter()
        results[name] = run_engine(engine, tok, eos, cases, args.timeout)
        st = results[name]
        print(f"# {name}: {time.perf_counter() - t0:.1f}s, errors {st.errors}, mask/accept mismatches "
              f"{st.mismatches}", file=sys.stderr)
    print(f"MaskBench, {len(cases)} schemas (every {args.stride}th file with tests), tokenizer {args.tokenizer} "
          f"({info.tokenizer_size} tokens), one CPU thread\n")
    print(report(results))
    if args.misses:
        with open(args.misses, "w") as f:
            for k, v in results.items():
                for miss in v.misses:
                    f.write(json.dumps({"engine": k} | miss) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({k: {kk: vv for kk, vv in vars(v).items() if not kk.endswith("times") and kk != "misses"}
                                               | {"compile_times": v.compile_times, "mask_times": v.mask_times}
                                               for k, v in results.items()}))


if __name__ == "__main__":
    main()
