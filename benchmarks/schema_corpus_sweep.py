"""Compile a directory of JSON Schemas and walk their instances token by token (coverage, soundness).

A general harness for a schema corpus laid out as SchemaStore's is (``src/schemas/json/NAME.json``,
valid instances in ``src/test/NAME/*``, invalid ones in ``src/negative_test/NAME/*``):

    RADIXLM_SHARED_DATA=/work/shared/data .venv/bin/python benchmarks/schema_corpus_sweep.py \
        --schemas /tmp/schemastore/src/schemas/json --valid /tmp/schemastore/src/test \
        --invalid /tmp/schemastore/src/negative_test --tokenizer deepseek-llm --jsonl out.jsonl

Each schema gets a fresh :class:`GrammarCompiler` (the tokenizer's vocabulary index is shared) under
a wall-clock alarm (``--timeout``; the compile's own work budget normally ends it first). Recorded:
``ok``, ``error`` (a :class:`GrammarError`, tallied by message head), ``crash`` (any other
exception: a bug), ``timeout`` (a bug: compiles must be bounded), the compile's thread CPU time,
and whether the compile tried to open a network connection (a ``$ref`` to a URL compiles with a
sound approximation (:mod:`radixlm.grammar.schema_remote`) or fails cleanly, never fetches: every
socket connect is refused and recorded while compiling).

Instances (``--formats``: JSON by default; YAML / TOML when they load to JSON data) are judged by
``jsonschema`` (the schema's own draft, formats not asserted), not by their folder: valid ones
should be accepted, invalid ones must never be (soundness first). Each is serialized with
``json.dumps`` and walked token by token (:func:`radixlm.grammar.maskbench.run_instance`: the filled
bitmask must agree with ``accept_token`` at every step); each step's mask time is recorded
(``mask_us``) and summarized as MaskBench's mask p50 / p99 per request-step. ``--summary FILE``
summarizes a jsonl file without compiling anything.
"""

from __future__ import annotations

import argparse
import collections
import json
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _pkg import ensure_radixlm  # noqa: E402

ensure_radixlm()

from grammar_sweep import error_head  # noqa: E402

from radixlm.grammar.bitmask import allocate_token_bitmask  # noqa: E402
from radixlm.grammar.compiler import GrammarCompiler  # noqa: E402
from radixlm.grammar.errors import GrammarError  # noqa: E402
from radixlm.grammar.maskbench import load_tokenizer, run_instance, schema_validator  # noqa: E402

WRAPPED = "invalid or unsupported schema ("  # a Python exception the converter turned into a GrammarError


class _Timeout(Exception):
    """Raised by the SIGALRM handler."""


def _alarm(signum, frame):  # noqa: ARG001
    raise _Timeout()


NETWORK: list[str] = []


def _no_network(*args: Any, **kwargs: Any) -> Any:  # noqa: ARG001
    NETWORK.append(repr(args[1:2])[:120])
    raise OSError("network access is disabled in the schema sweep")


def block_network() -> None:
    """Refuse (and record in ``NETWORK``) every outgoing connection and name lookup."""
    socket.socket.connect = _no_network  # type: ignore[method-assign]
    socket.socket.connect_ex = _no_network  # type: ignore[method-assign]
    socket.create_connection = _no_network  # type: ignore[assignment]
    socket.getaddrinfo = _no_network  # type: ignore[assignment]


def load_instance(path: Path) -> tuple[bool, Any]:
    """``(True, value)`` for a JSON / YAML / TOML file holding JSON data, else ``(False, why)``."""
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        if path.suffix == ".json":
            value = json.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            import yaml

            docs = list(yaml.safe_load_all(text))
            if len(docs) != 1:
                return False, f"{len(docs)} YAML documents"
            value = docs[0]
        elif path.suffix == ".toml":
            import tomllib

            value = tomllib.loads(text)
        else:
            return False, "unknown format"
        # NOTE: YAML / TOML dates and the like are not JSON data: such files are skipped
        return True, json.loads(json.dumps(value, allow_nan=False))
    except Exception as e:  # noqa: BLE001
        return False, f"{type(e).__name__}: {str(e)[:80]}"


def instance_files(folder: Path | None, name: str, formats: set[str]) -> list[Path]:
    """The instance files of schema ``name`` under ``folder/name`` with a suffix in ``formats``."""
    if folder is None or not (folder / name).is_dir():
        return []
    return sorted(p for p in (folder / name).rglob("*") if p.is_file() and p.suffix.lstrip(".") in formats)


def judge(schema: Any, value: Any) -> bool | None:
    """``jsonschema``'s verdict (``None`` when the validator itself fails on this schema)."""
    try:
        return bool(schema_validator(schema).is_valid(value))
    except Exception:  # noqa: BLE001 - e.g. a $ref it cannot resolve, a pattern Python rejects
        return None


def sweep_one(info: Any, tokenizer: Any, path: Path, args: argparse.Namespace) -> dict:
    """Compile one schema file and walk its instances; returns a record (see the module doc)."""
    rec: dict[str, Any] = {"name": path.stem, "status": "ok", "msg": "", "instances": []}
    try:
        schema = json.loads(path.read_text(encoding="utf-8-sig"))
    except Exception as e:  # noqa: BLE001
        rec.update(status="badjson", msg=str(e)[:200], cpu_s=0.0, wall_s=0.0)
        return rec
    comp = GrammarCompiler(info)
    del NETWORK[:]
    t0, c0 = time.perf_counter(), time.thread_time()
    signal.alarm(args.timeout)
    compiled = None
    try:
        compiled = comp.compile_json_schema(schema)
    except GrammarError as e:
        rec.update(status="error", msg=str(e).split("\n", 1)[0][:300])
    except _Timeout:
        rec.update(status="timeout", msg=f"{args.timeout}s")
    except Exception as e:  # noqa: BLE001 - the point is to find these
        rec.update(status="crash", msg=f"{type(e).__name__}: {str(e)[:200]}",
                   tb=traceback.format_exc().splitlines()[-6:])
    finally:
        signal.alarm(0)
    rec["cpu_s"] = round(time.thread_time() - c0, 3)
    rec["wall_s"] = round(time.perf_counter() - t0, 3)
    if NETWORK:
        rec["network"] = list(NETWORK)
    formats = set(args.formats.split(","))
    bitmask = allocate_token_bitmask(1, info.vocab_size) if compiled is not None else None
    for folder, label in ((args.valid, True), (args.invalid, False)):
        for f in instance_files(folder, path.stem, formats):
            inst: dict[str, Any] = {"file": f.name, "label": label}
            ok, value = load_instance(f)
            if not ok:
                inst["skip"] = value
                rec["instances"].append(inst)
                continue
            inst["truth"] = judge(schema, value)
            if compiled is not None:
                text = json.dumps(value)
                signal.alarm(args.walk_timeout)
                t1 = time.thread_time()
                try:
                    res = run_instance(compiled, tokenizer, text, label, bitmask)
                    inst["accepted"] = res.accepted
                    inst["mask_us"] = [round(t * 1e6) for t in res.mask_times]
                    if res.mismatch:
                        inst["mismatch"] = res.mismatch
                    if res.failed_at is not None:
                        raw = text.encode("utf-8")
                        inst["at"] = res.failed_at
                        inst["context"] = raw[max(0, res.failed_at - 60):res.failed_at + 20].decode("utf-8", "replace")
                except _Timeout:
                    inst["walk_error"] = f"timeout {args.walk_timeout}s"
                except Exception as e:  # noqa: BLE001
                    inst["walk_error"] = f"{type(e).__name__}: {str(e)[:160]}"
                finally:
                    signal.alarm(0)
                inst["walk_s"] = round(time.thread_time() - t1, 3)
            rec["instances"].append(inst)
    return rec


def _pct(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else 0.0


def summarize(records: list[dict], top: int = 30) -> str:
    """Compile coverage, error heads, compile CPU percentiles and the instance verdicts."""
    by = collections.Counter(r["status"] for r in records)
    lines = [f"{len(records)} schemas: " + ", ".join(f"{k} {v}" for k, v in sorted(by.items()))]
    ok = by.get("ok", 0)
    lines.append(f"compile coverage {ok}/{len(records)} ({100 * ok / max(1, len(records)):.1f}%)")
    for r in records:
        if r["status"] in ("crash", "timeout") or r["msg"].startswith(WRAPPED):
            lines.append(f"  {r['status'].upper()} {r['name']}: {r['msg'][:160]}")
        if r.get("network"):
            lines.append(f"  NETWORK {r['name']}: {r['network'][:2]}")
    cpu = sorted(r["cpu_s"] for r in records)
    lines.append(f"compile CPU p50 {_pct(cpu, .5):.3f}s p90 {_pct(cpu, .9):.3f}s p99 {_pct(cpu, .99):.3f}s "
                 f"max {cpu[-1] if cpu else 0:.2f}s")
    lines += [f"  SLOW {r['name']} {r['cpu_s']}s ({r['status']})" for r in records if r["cpu_s"] > 5]
    heads = collections.Counter(error_head(r["msg"]) for r in records if r["status"] == "error")
    lines.append(f"GrammarError heads ({sum(heads.values())} schemas):")
    lines += [f"  {n:5d} {h}" for h, n in heads.most_common(top)]
    # instances, judged by jsonschema
    c = collections.Counter()
    rejected, unsound, bugs = [], [], []
    for r in records:
        for i in r["instances"]:
            if "skip" in i:
                c["skipped"] += 1
                continue
            t = i["truth"]
            if t is None:
                c["unjudged"] += 1
                continue
            if t != i["label"]:
                c["label_disagrees"] += 1
            key = "valid" if t else "invalid"
            c[key] += 1
            if r["status"] != "ok":
                c[key + "_uncompiled"] += 1
                continue
            c[key + "_compiled"] += 1
            if i.get("mismatch") or i.get("walk_error"):
                bugs.append(f"{r['name']}/{i['file']}: {i.get('mismatch') or i.get('walk_error')}")
            if i.get("accepted"):
                c[key + "_accepted"] += 1
                if not t:
                    unsound.append(f"{r['name']}/{i['file']}")
            elif t:
                rejected.append(f"{r['name']}/{i['file']}")
    lines.append(f"valid instances accepted {c['valid_accepted']}/{c['valid_compiled']} of compiled schemas "
                 f"({c['valid_accepted']}/{c['valid']} of all; {c['valid_uncompiled']} with an uncompiled schema)")
    lines.append(f"invalid instances accepted {c['invalid_accepted']}/{c['invalid_compiled']} of compiled "
                 f"schemas ({c['invalid']} in all)")
    lines.append(f"instances skipped (not loadable as JSON data) {c['skipped']}, unjudged (jsonschema "
                 f"failed) {c['unjudged']}, folder label disagrees with jsonschema {c['label_disagrees']}")
    masks = sorted(t for r in records for i in r["instances"] for t in i.get("mask_us", ()))
    if masks:
        slow = collections.Counter({r["name"]: sum(t > 1000 for i in r["instances"] for t in i.get("mask_us", ()))
                                    for r in records})
        lines.append(f"mask per step ({len(masks)} steps, each schema's first compile): p50 {_pct(masks, .5)} us, "
                     f"p99 {_pct(masks, .99)} us, max {masks[-1]} us; over 1 ms: "
                     + ", ".join(f"{n} {k}" for k, n in slow.most_common(8) if n))
    lines += [f"  UNSOUND {x}" for x in unsound]
    lines += [f"  BUG {x}" for x in bugs]
    lines += [f"  REJECTED {x}" for x in rejected[:top]]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schemas", help="directory of *.json schemas")
    ap.add_argument("--valid", type=Path, default=None, help="folder of NAME/ instance folders (valid)")
    ap.add_argument("--invalid", type=Path, default=None, help="folder of NAME/ instance folders (invalid)")
    ap.add_argument("--formats", default="json", help="instance suffixes, e.g. json,yaml,yml,toml")
    ap.add_argument("--tokenizer", default="deepseek-llm")
    ap.add_argument("--part", type=int, default=0)
    ap.add_argument("--parts", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=None, help="just these schema names")
    ap.add_argument("--skip-done", action="store_true", help="skip names already in --jsonl")
    ap.add_argument("--timeout", type=int, default=60, help="wall-clock alarm per compile (s)")
    ap.add_argument("--walk-timeout", type=int, default=60, help="wall-clock alarm per instance walk (s)")
    ap.add_argument("--jsonl", default=None, help="append one record per schema here")
    ap.add_argument("--summary", default=None, help="summarize this jsonl file and exit")
    args = ap.parse_args()
    if args.summary:
        recs = {}
        for x in Path(args.summary).read_text().splitlines():
            if x.strip():
                r = json.loads(x)
                recs[r["name"]] = r  # NOTE: a rerun of a schema replaces its earlier record
        print(summarize(list(recs.values())))
        return
    files = sorted(Path(args.schemas).glob("*.json"))
    if args.only:
        files = [f for f in files if f.stem in set(args.only)]
    if args.skip_done and args.jsonl and Path(args.jsonl).exists():
        done = {json.loads(x)["name"] for x in Path(args.jsonl).read_text().splitlines() if x.strip()}
        files = [f for f in files if f.stem not in done]
    files = files[args.part::args.parts]
    tokenizer = load_tokenizer(args.tokenizer)
    info = GrammarCompiler(tokenizer).tokenizer_info
    block_network()
    signal.signal(signal.SIGALRM, _alarm)
    out = open(args.jsonl, "a") if args.jsonl else None
    records = []
    for f in files:
        rec = sweep_one(info, tokenizer, f, args)
        records.append(rec)
        if out:
            out.write(json.dumps(rec) + "\n")
            out.flush()
        bad = [i for i in rec["instances"] if i.get("accepted") is not None
               and i.get("truth") is not None and i["accepted"] != i["truth"]]
        if rec["status"] != "ok" or rec["cpu_s"] > 2 or bad:
            print(rec["status"], rec["name"], rec["cpu_s"], rec["msg"][:150], rec.get("tb", ""),
                  f"{len(bad)} misjudged" if bad else "", flush=True)
    print(summarize(records))


if __name__ == "__main__":
    main()
