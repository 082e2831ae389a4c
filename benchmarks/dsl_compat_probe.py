"""Probe: run SGLang-style frontend program shapes through radixlm's DSL on the in-process Engine.

Each shape (``dsl_compat_shapes*.py``) is a small ``@function`` in the style of SGLang's own
programs (test_programs.py, examples/frontend_language, benchmark/*/bench_sglang.py).  The probe
records per shape: ``ok``, ``wrong`` (ran, but a result differs from SGLang's semantics),
``error`` (an exception) or ``hang`` (no answer within ``--timeout`` seconds).

Optionally (``--sglang-programs PATH``) it also runs the ``test_*`` functions of a copy of SGLang's
``python/sglang/test/test_programs.py`` (external input, not part of this repository) with a small
shim that makes ``import sglang as sgl`` import radixlm.  Assertion failures there are reported as
``assert`` (mostly answer-quality checks that a 135M model fails), other exceptions as ``error``.

Usage (``--http``: through ``RuntimeEndpoint`` to a ``radixlm serve`` child process instead)::

    RADIXLM_CACHE=/tmp/rlcache .venv/bin/python benchmarks/dsl_compat_probe.py [--http] \
        [--only NAME ...] [--sglang-programs /tmp/sglang_ref/test_programs.py] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import sys
import threading
import time
import traceback
import types
from typing import Any, Callable

import radixlm as sgl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsl_compat_shapes2  # noqa: E402,F401 - registers more shapes
from dsl_compat_shapes import SHAPES, Wrong  # noqa: E402


def run_one(fn: Callable[[], Any], timeout: float) -> tuple[str, str, float]:
    """Run ``fn`` on a daemon thread: ``(status, detail, seconds)``."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            fn()
            box["r"] = ("ok", "")
        except Wrong as exc:
            box["r"] = ("wrong", str(exc))
        except AssertionError as exc:
            box["r"] = ("assert", str(exc)[:160] or traceback.format_exc(limit=-1).strip()[-160:])
        except BaseException as exc:  # noqa: BLE001 - the probe records every failure
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            box["r"] = ("error", f"{type(exc).__name__}: {str(exc)[:160]} "
                                 f"@{tb.filename.rsplit('/', 1)[-1]}:{tb.lineno}")

    t0 = time.time()
    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(timeout)
    dt = time.time() - t0
    if "r" not in box:
        return "hang", f"no result after {timeout:.0f}s", dt
    return box["r"][0], box["r"][1], dt


def install_sglang_shim(engine: Any) -> None:
    """Make ``import sglang`` (and the submodules test_programs.py imports) resolve to radixlm."""
    import radixlm.lang.ir as ir

    utils = types.ModuleType("sglang.utils")

    def read_jsonl(path: str) -> Any:
        with open(path) as f:
            return [json.loads(line) for line in f]

    def download_and_cache_file(url: str, filename: str | None = None) -> str:
        raise RuntimeError("offline probe: no downloads")

    utils.read_jsonl = read_jsonl
    utils.download_and_cache_file = download_and_cache_file
    hf = types.ModuleType("sglang.srt.hf_transformers_utils")
    hf.get_tokenizer = lambda path, **kw: engine.tokenizer
    mods = {"sglang": sgl, "sglang.lang": sgl.lang, "sglang.lang.ir": ir, "sglang.utils": utils,
            "sglang.global_config": sgl.global_config, "sglang.srt": types.ModuleType("sglang.srt"),
            "sglang.srt.hf_transformers_utils": hf}
    sys.modules.update(mods)


def sglang_program_tests(path: str, engine: Any) -> dict[str, Callable[[], Any]]:
    """The ``test_*`` functions of SGLang's test_programs.py at ``path``, as zero-arg callables."""
    install_sglang_shim(engine)
    spec = importlib.util.spec_from_file_location("sglang_test_programs", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    args = {"check_answer": False, "model_path": engine.tokenizer.name_or_path}
    out = {}
    for name, fn in vars(mod).items():
        if name.startswith("test_") and callable(fn):
            params = inspect.signature(fn).parameters
            kw = {k: args[k] for k in params if k in args}
            out["sglang:" + name] = (lambda f=fn, k=kw: f(**k))
    return out


def main() -> None:
    """Parse arguments, start the Engine, run every shape, print a table (and JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--sglang-programs", default=None)
    ap.add_argument("--timeout", type=float, default=180.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--http", action="store_true",
                    help="run on a `radixlm serve` child process through RuntimeEndpoint")
    args = ap.parse_args()

    if args.http:
        engine = sgl.Runtime(device="cpu", max_total_tokens=16384)
        be = engine.endpoint
        engine.tokenizer = engine.get_tokenizer()
    else:
        engine = sgl.Engine(device="cpu", max_total_tokens=16384)
        be = sgl.EngineBackend(engine)
    jobs: dict[str, Callable[[], Any]] = {k: (lambda f=f: f(sgl, be)) for k, f in SHAPES.items()}
    if args.sglang_programs:
        sgl.set_default_backend(be)
        jobs.update(sglang_program_tests(args.sglang_programs, engine))
    if args.only:
        jobs = {k: v for k, v in jobs.items() if any(o in k for o in args.only)}
    results = {}
    for name, job in jobs.items():
        if name.startswith("sglang:"):
            sgl.set_default_backend(be)
        status, detail, dt = run_one(job, args.timeout)
        results[name] = {"status": status, "detail": detail, "seconds": round(dt, 2)}
        print(f"{name:40s} {status:6s} {dt:6.1f}s {detail}", flush=True)
    counts: dict[str, int] = {}
    for r in results.values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print("summary:", counts)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    engine.shutdown()


if __name__ == "__main__":
    main()
