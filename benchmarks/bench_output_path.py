"""Host cost of the server's output path per request-step, on CPU, no sockets: the scheduler's
result processing (``OutputProcessor.process``, lazy detokenization), the detokenizer
process (decode the scheduler's message, detokenize, encode its message to the tokenizer manager)
and the tokenizer manager (decode that message, apply it to the request states, wake the waiters),
plus the native streaming handler's event per update (``sse(ReqState.result())`` before,
``ReqState.sse_chunk()`` where the tree has it; the handler in http_native.py uses the former).

Synthetic decode steps: ``--reqs`` running requests for ``--steps`` steps, one new token each, the
token ids of real text (English, code, accented and CJK text, emoji: UTF-8 characters split
across tokens) in the default model's tokenizer; every 4th request has stop strings (that never
match), every 3rd streams. Step 0 carries every request's first output (with its ``DetokInit``),
the last step finishes them all (``length``). The same steps go through the baseline tree
(``--base``, a git revision: its modules are loaded from ``git show``) and the working tree in the
same run, and their final texts and streamed increments are checked to be equal.

    python benchmarks/bench_output_path.py [--reqs 256 --steps 256 --base f95d10b --repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import subprocess
import sys
import time
import types

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # NOTE: as in the detokenizer process
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = (
    "def fibonacci(n: int) -> int:\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n\n"
    "The café on the corner serves crème brûlée and piña coladas — naïve déjà vu. "
    "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다. "
    "Emoji: 🚀🔥✨👍🏽 and math: ∑ x² ≤ ∞, ½ ≠ ⅓. "
    "Large language models generate text one token at a time; the server streams each token as "
    "soon as the scheduler samples it, so the host must keep up with thousands of requests. "
)
MODULES = {  # name in the tree -> alias for the baseline copy
    "runtime/server/io_struct.py": "radixlm_base_io_struct",
    "runtime/detokenizer.py": "radixlm_base_detokenizer",
    "runtime/server/detokenizer_process.py": "radixlm_base_detokenizer_process",
    "runtime/server/tokenizer_manager.py": "radixlm_base_tokenizer_manager",
    "runtime/output_processor.py": "radixlm_base_output_processor",
}


def load_base(rev: str) -> dict[str, types.ModuleType]:
    """Import the baseline revision's output-path modules under aliases (their imports of each
    other rewritten to the aliases; everything else from the working tree)."""
    mods = {}
    for path, alias in MODULES.items():
        src = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:{path}"], check=True, capture_output=True,
                             text=True).stdout
        for p, a in MODULES.items():
            src = src.replace("radixlm." + p[:-3].replace("/", "."), a)
        spec = importlib.util.spec_from_loader(alias, loader=None)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[alias] = mod
        exec(compile(src, f"{rev}:{path}", "exec"), mod.__dict__)
        mods[path] = mod
    return mods


def load_current() -> dict[str, types.ModuleType]:
    import importlib

    return {p: importlib.import_module("radixlm." + p[:-3].replace("/", ".")) for p in MODULES}


def make_steps(io, tok, reqs: int, steps: int) -> tuple[list[bytes], dict[str, dict]]:
    """The scheduler's encoded messages, one per step, and per rid its settings."""
    ids = tok.encode(TEXT * (1 + reqs * 3 * steps // 1000 // max(len(tok.encode(TEXT)), 1) + 3))
    snap = io.SchedulerSnapshot(reqs, 0, 1000, 100000, 0.5, 0)
    cfg = {}
    for r in range(reqs):
        start = (r * 37) % (len(ids) - steps - 8)
        cfg[f"r{r}"] = {"stop": ["\n\nUser:", "<|im_end|>"] if r % 4 == 0 else [], "stream": r % 3 == 0,
                        "start": start, "prompt": ids[start:start + 5], "out": ids[start + 5:start + 5 + steps]}
    msgs = []
    for s in range(steps):
        b = io.BatchTokenIDOut([], snap)
        for rid, c in cfg.items():
            tid = ids[c["start"] + 5 + s]
            if s == 0 or s == steps - 1:
                b.outputs.append(io.TokenIDOut(
                    rid, [tid], {"type": "length", "length": steps} if s == steps - 1 else None, 200, 0, s + 1,
                    detok=io.DetokInit(ids[c["start"]:c["start"] + 5], c["stop"]) if s == 0 else None))
            else:
                b.plain_rids.append(rid)
                b.plain_new_ids.append([tid])
                b.plain_prompt_tokens.append(200)
                b.plain_cached_tokens.append(0)
                b.plain_completion_tokens.append(s + 1)
        msgs.append(io.encode(b))
    return msgs, cfg


class Run:
    """One implementation's pipeline with per-stage timers."""

    def __init__(self, name: str, mods: dict, tok, cfg: dict) -> None:
        self.name, self.io = name, mods["runtime/server/io_struct.py"]
        dp, tm_mod = mods["runtime/server/detokenizer_process.py"], mods["runtime/server/tokenizer_manager.py"]
        self.dm = dp.DetokenizerManager(tok)
        self.columnar = hasattr(self.dm, "process_batch")
        from radixlm.runtime.server.metrics import ServerMetrics

        tm = self.tm = tm_mod.TokenizerManager.__new__(tm_mod.TokenizerManager)
        tm.states, tm.groups, tm.snapshot, tm.metrics = {}, {}, None, ServerMetrics("bench-" + name)
        self.queue = asyncio.Queue()
        self.states = {}
        for k, (rid, c) in enumerate(cfg.items()):
            st = tm_mod.ReqState(rid, k, self.queue, False, 0)
            if not c["stream"] and hasattr(st, "stream"):
                st.stream = False  # what wait_all sets: woken only when finished
            tm.states[rid] = self.states[rid] = st
        self.streamed = {rid: [] for rid, c in cfg.items() if c["stream"]}
        from radixlm.runtime.batch import StepOutput
        from radixlm.runtime.request import build_req
        from radixlm.runtime.sampling_params import SamplingParams

        self.op = mods["runtime/output_processor.py"].OutputProcessor(tok, [tok.eos_token_id], 1 << 20)
        self.reqs = []
        for rid, c in cfg.items():
            req = build_req(rid, [1] * 195 + c["prompt"], SamplingParams(max_new_tokens=1 << 20, stop=c["stop"]))
            self.op.init_req(req)
            self.reqs.append((req, [StepOutput(next_token_id=t) for t in c["out"]]))
        self.slice = types.SimpleNamespace(start=0, end=0, sample=True, draft_ids=None)
        self.n_step = 0
        self.clock = time.perf_counter
        self.t = dict.fromkeys(("sched: output_processor.process", "detok: decode msg", "detok: detokenize", "detok: encode msg", "tm: decode msg",
                                "tm: apply", "stream handler: event"), 0.0)
        from radixlm.runtime.server.http_native import sse

        self.event = ((lambda st: st.sse_chunk()) if hasattr(tm_mod.ReqState, "sse_chunk")
                      else (lambda st: sse(st.result())))

    def _detok_old(self, batch):
        io, dm = self.io, self.dm
        outs = []
        for out in batch.outputs + batch.plain():  # the baseline's loop body (detokenizer_process.py)
            outs.append(dm.process(out))
        return io.BatchStrOut(outs, batch.snapshot)

    def _tm_old(self, msg):
        tm = self.tm
        tm.snapshot = msg.snapshot
        tm.metrics.observe_snapshot(msg.snapshot)
        for out in msg.outputs:
            tm._apply(out)

    def step(self, data: bytes) -> None:
        t, io, pc = self.t, self.io, self.clock
        k, s, process = self.n_step, self.slice, self.op.process
        self.n_step += 1
        t_op = pc()
        for req, outs in self.reqs:
            process(req, s, outs[k])
        t0 = pc()
        batch = io.decode(data)
        t1 = pc()
        out = self.dm.process_batch(batch) if self.columnar else self._detok_old(batch)
        t2 = pc()
        data2 = io.encode(out)
        t3 = pc()
        msg = io.decode(data2)
        t4 = pc()
        if self.columnar:
            self.tm._on_batch(msg)
        else:
            self._tm_old(msg)
        t5 = pc()
        q, states = self.queue, list(self.states.values())
        while not q.empty():
            st = states[q.get_nowait()]
            if hasattr(st, "queued"):
                st.queued = False  # what TokenizerManager.updates does when it takes an index
            if st.rid in self.streamed:
                self.streamed[st.rid].append(self.event(st).split(', "e2e_latency"')[0])
        t6 = pc()
        for k, v in zip(t, (t0 - t_op, t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)):
            t[k] += v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reqs", type=int, default=256)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--base", default="f95d10b", help="baseline git revision")
    ap.add_argument("--repeat", type=int, default=3, help="best of N passes")
    ap.add_argument("--tokenizer", default=None, help="default: the default model's")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="cpu: this thread's CPU time (steadier on a shared machine); wall: perf_counter")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from radixlm.runtime.default_model import default_model_path
    tok = AutoTokenizer.from_pretrained(args.tokenizer or default_model_path())
    impls = {"base": load_base(args.base), "current": load_current()}
    best: dict[str, dict[str, float]] = {}
    texts: dict[str, dict] = {}
    for _ in range(args.repeat):
        for name, mods in impls.items():
            msgs, cfg = make_steps(mods["runtime/server/io_struct.py"], tok, args.reqs, args.steps)
            run = Run(name, mods, tok, cfg)
            run.clock = time.thread_time if args.clock == "cpu" else time.perf_counter
            for data in msgs:
                run.step(data)
            assert all(st.finished for st in run.states.values())
            texts[name] = ({rid: st.text for rid, st in run.states.items()}, run.streamed,
                           [(req.detok.text, req.output_ids) for req, _ in run.reqs])
            b = best.setdefault(name, {})
            for k, v in run.t.items():
                b[k] = min(b.get(k, float("inf")), v)
    assert texts["base"] == texts["current"], "the output differs from the baseline's"
    n = args.reqs * args.steps
    print(f"{args.reqs} requests x {args.steps} steps; us ({args.clock} time) per request-step, best of {args.repeat}; "
          f"base = {args.base}, current = working tree")
    print(f"| stage | base | current | speedup |\n|---|---:|---:|---:|")
    tot = {name: sum(v for k, v in b.items() if k.startswith(("detok", "tm"))) for name, b in best.items()}
    for k in best["base"]:
        b, c = best["base"][k] / n * 1e6, best["current"][k] / n * 1e6
        print(f"| {k} | {b:.2f} | {c:.2f} | {b / c if c else float('inf'):.2f}x |")
    b, c = tot["base"] / n * 1e6, tot["current"] / n * 1e6
    print(f"| detokenizer + tokenizer manager | {b:.2f} | {c:.2f} | {b / c:.2f}x |")


if __name__ == "__main__":
    main()
