"""Conformance against the official JSON-Schema-Test-Suite (soundness first, then completeness).

The suite is external benchmark input, never part of the repository: point ``--suite`` at its
extracted ``tests/`` folder (one JSON file per keyword and draft, each a list of groups
``{"description", "schema", "tests": [{"description", "data", "valid"}]}``):

    RADIXLM_SHARED_DATA=/work/shared/data .venv/bin/python benchmarks/schema_test_suite.py \
        --suite /tmp/jsts/tests --drafts draft2020-12,draft7 --tokenizer deepseek-llm --jsonl out.jsonl

Per group: the schema is compiled (a fresh :class:`GrammarCompiler`, the vocabulary index shared)
under a wall-clock alarm with every network connection refused (the helpers of
``schema_corpus_sweep.py``): ``ok``, ``error`` (a GrammarError, by message head), ``crash`` (any other
exception: a bug), ``timeout`` (a bug). A draft-7 schema names no draft in the suite (its folder
does): the harness adds ``$schema`` so that the draft's keywords apply. Groups that need remote
documents (``refRemote.json``, ``http://localhost:1234`` refs) are tagged ``remote``: they compile
with sound approximations (:mod:`radixlm.grammar.schema_remote`) or fail with a GrammarError, never
fetch. Per test: ``json.dumps(data)`` is walked token by token
(:func:`radixlm.grammar.maskbench.run_instance`); the truth is the suite's ``valid`` flag
(``jsonschema`` cross-checks it, formats not asserted; disagreements are listed). An invalid
instance accepted is a soundness bug (``uniqueItems`` ones are marked: it is accepted, not
enforced, by design).
"""

from __future__ import annotations

import argparse
import collections
import json
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from schema_corpus_sweep import NETWORK, _alarm, _Timeout, block_network  # noqa: E402

from grammar_sweep import error_head  # noqa: E402

from radixlm.grammar.bitmask import allocate_token_bitmask  # noqa: E402
from radixlm.grammar.compiler import GrammarCompiler  # noqa: E402
from radixlm.grammar.errors import GrammarError  # noqa: E402
from radixlm.grammar.maskbench import load_tokenizer, run_instance  # noqa: E402

DRAFT_URI = {"draft7": "http://json-schema.org/draft-07/schema#", "draft2020-12": "https://json-schema.org/draft/2020-12/schema",
             "draft2019-09": "https://json-schema.org/draft/2019-09/schema", "draft6": "http://json-schema.org/draft-06/schema#",
             "draft4": "http://json-schema.org/draft-04/schema#"}
REMOTE = "http://localhost:1234"


def suite_files(suite: Path, draft: str, optional: bool) -> list[Path]:
    """The test files of ``draft`` (and, ``optional``, of its ``optional/`` folder, formats included)."""
    files = sorted((suite / draft).glob("*.json"))
    if optional:
        files += sorted((suite / draft / "optional").rglob("*.json"))
    return files


def with_draft(schema: Any, draft: str) -> Any:
    """``schema`` naming ``draft`` in ``$schema`` when it names none (a boolean schema as is)."""
    if isinstance(schema, dict) and "$schema" not in schema and draft in DRAFT_URI:
        return {"$schema": DRAFT_URI[draft], **schema}
    return schema


def truth_of(schema: Any, value: Any) -> bool | None:
    """``jsonschema``'s verdict under the schema's draft, formats not asserted (None: it failed)."""
    import jsonschema

    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        return bool(cls(schema).is_valid(value))
    except Exception:  # noqa: BLE001 - e.g. an unresolvable remote $ref
        return None


def run_group(info: Any, tokenizer: Any, path: Path, draft: str, group: dict, args: argparse.Namespace) -> dict:
    """Compile one group's schema and walk its tests; returns a record (see the module doc)."""
    schema = with_draft(group["schema"], draft)
    text = json.dumps(group["schema"])
    remote = path.name == "refRemote.json" or REMOTE in text
    rec: dict[str, Any] = {"file": f"{draft}/{path.relative_to(args.suite / draft)}", "group": group["description"],
                           "schema": group["schema"],
                           "status": "ok", "msg": "", "remote": remote, "unique": "uniqueItems" in text, "tests": []}
    del NETWORK[:]
    compiled = None
    c0 = time.thread_time()
    signal.alarm(args.timeout)
    try:
        compiled = GrammarCompiler(info).compile_json_schema(schema)
    except GrammarError as e:
        rec.update(status="error", msg=str(e).split("\n", 1)[0][:300])
    except _Timeout:
        rec.update(status="timeout", msg=f"{args.timeout}s")
    except Exception as e:  # noqa: BLE001 - the point is to find these
        rec.update(status="crash", msg=f"{type(e).__name__}: {str(e)[:200]}", tb=traceback.format_exc().splitlines()[-6:])
    finally:
        signal.alarm(0)
    rec["cpu_s"] = round(time.thread_time() - c0, 3)
    if NETWORK:
        rec["network"] = list(NETWORK)
    bitmask = allocate_token_bitmask(1, info.vocab_size)
    for test in group["tests"]:
        t: dict[str, Any] = {"desc": test["description"], "valid": bool(test["valid"]), "data": test["data"]}
        t["jsonschema"] = truth_of(schema, test["data"])
        if compiled is not None:
            signal.alarm(args.timeout)
            try:
                res = run_instance(compiled, tokenizer, json.dumps(test["data"]), t["valid"], bitmask)
                t["accepted"] = res.accepted
                if res.mismatch:
                    t["mismatch"] = res.mismatch
            except _Timeout:
                t["walk_error"] = f"timeout {args.timeout}s"
            except Exception as e:  # noqa: BLE001
                t["walk_error"] = f"{type(e).__name__}: {str(e)[:160]}"
            finally:
                signal.alarm(0)
        rec["tests"].append(t)
    return rec


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "integer" if float(v).is_integer() else "number"
    return {str: "string", list: "array", dict: "object"}[type(v)]


def rejection_cause(rec: dict, test: dict) -> str:
    """Why a valid instance of a compiled group was refused, where a documented restriction
    explains it: an untyped schema restricted to the type its keywords constrain (``implied
    type``), ``format`` enforced (an annotation by default in 2020-12), an integer written ``1.0``;
    else ``other``."""
    from radixlm.grammar.schema_checks import implied_types

    schema, data = rec["schema"], test["data"]
    if isinstance(schema, dict) and "type" not in schema:
        try:
            ts = implied_types(schema)
        except Exception:  # noqa: BLE001
            ts = None
        kind = _json_type(data)
        if ts is None and any(k in schema for k in ("dependentRequired", "dependentSchemas")):
            ts = {"object"}  # NOTE: rewritten into object branches
        if ts is not None and kind not in ts and not (kind == "integer" and "number" in ts):
            return "implied type"
    if "format" in json.dumps(schema) and isinstance(data, str):
        return "format enforced"
    if isinstance(data, float) and data.is_integer():
        return "integer written as 1.0"
    return "other"


def summarize(records: list[dict]) -> str:
    """A per-file table and, below it, every soundness bug, crash, timeout and error head."""
    rows: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    unsound, bugs, disagree = [], [], []
    heads: collections.Counter = collections.Counter()
    for r in records:
        c = rows[r["file"]]
        c["groups"] += 1
        c[r["status"]] += 1
        if r["remote"]:
            c["remote"] += 1
            if r.get("network"):  # NOTE: a remote group may compile when its refs resolve locally
                bugs.append(f"REMOTE {r['file']} | {r['group']}: {r['status']} {r.get('network', '')}")
        elif r["status"] == "error":
            empty = not any(t["valid"] for t in r["tests"])  # NOTE: nothing valid: refusing is right
            heads[error_head(r["msg"]) + (" [no valid instance: correct]" if empty else "")] += 1
        if r["status"] in ("crash", "timeout"):
            bugs.append(f"{r['status'].upper()} {r['file']} | {r['group']}: {r['msg'][:160]}")
        for t in r["tests"]:
            key = "valid" if t["valid"] else "invalid"
            c[key] += 1
            if t["jsonschema"] is not None and t["jsonschema"] != t["valid"]:
                disagree.append(f"{r['file']} | {r['group']} | {t['desc']}")
            if t.get("mismatch") or t.get("walk_error"):
                bugs.append(f"WALK {r['file']} | {r['group']} | {t['desc']}: {t.get('mismatch') or t.get('walk_error')}")
            if t.get("accepted"):
                c[key + "_acc"] += 1
                if not t["valid"]:
                    tag = " (uniqueItems: not enforced by design)" if r["unique"] else ""
                    unsound.append(f"{r['file']} | {r['group']} | {t['desc']}{tag}: {json.dumps(t['data'])[:80]}")
    lines = [f"{'file':44s} {'groups':>6s} {'ok':>4s} {'err':>4s} {'valid acc':>10s} {'inval acc':>10s} {'crash':>5s} {'t/o':>4s}"]
    total: collections.Counter = collections.Counter()
    for f in sorted(rows):
        c = rows[f]
        total.update(c)
        lines.append(f"{f:44s} {c['groups']:6d} {c['ok']:4d} {c['error']:4d} {c['valid_acc']:4d}/{c['valid']:<5d} "
                     f"{c['invalid_acc']:4d}/{c['invalid']:<5d} {c['crash']:5d} {c['timeout']:4d}")
    for draft in sorted({f.split("/")[0] for f in rows}):
        d: collections.Counter = collections.Counter()
        for f in rows:
            if f.split("/")[0] == draft:
                d.update(rows[f])
        lines.append(f"TOTAL {draft}: groups compiled {d['ok']}/{d['groups']} ({d['remote']} remote), valid accepted "
                     f"{d['valid_acc']}/{d['valid']}, invalid accepted {d['invalid_acc']}/{d['invalid']}, "
                     f"crashes {d['crash']}, timeouts {d['timeout']}")
    lines.append(f"SOUNDNESS BUGS (invalid accepted): {len(unsound)}")
    lines += [f"  {x}" for x in unsound]
    lines += [f"  BUG {x}" for x in bugs]
    lines.append(f"jsonschema disagrees with the suite's flag: {len(disagree)}")
    lines += [f"  {x}" for x in disagree[:20]]
    causes: collections.Counter = collections.Counter()
    others = []
    for r in records:
        for t in r["tests"]:
            if t["valid"] and t.get("accepted") is False:
                cause = rejection_cause(r, t)
                causes[(r["file"].split("/")[0], cause)] += 1
                if cause == "other":
                    others.append(f"{r['file']} | {r['group']} | {t['desc']}")
    lines.append("valid instances refused, by cause (compiled groups):")
    lines += [f"  {n:4d} {d}: {c}" for (d, c), n in sorted(causes.items())]
    lines += [f"    {x}" for x in others]
    lines.append("GrammarError heads (non-remote groups):")
    lines += [f"  {n:4d} {h}" for h, n in heads.most_common()]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", type=Path, help="the suite's extracted tests/ folder")
    ap.add_argument("--drafts", default="draft2020-12,draft7")
    ap.add_argument("--optional", action="store_true", help="also the optional/ files")
    ap.add_argument("--only", nargs="*", default=None, help="just these file stems (e.g. ref items)")
    ap.add_argument("--tokenizer", default="deepseek-llm")
    ap.add_argument("--timeout", type=int, default=60, help="wall-clock alarm per compile / walk (s)")
    ap.add_argument("--jsonl", default=None, help="write one record per group here")
    ap.add_argument("--summary", default=None, help="summarize this jsonl file and exit")
    ap.add_argument("--failures", action="store_true", help="also list valid instances rejected")
    args = ap.parse_args()
    if args.summary:
        records = [json.loads(x) for x in Path(args.summary).read_text().splitlines() if x.strip()]
    else:
        tokenizer = load_tokenizer(args.tokenizer)
        info = GrammarCompiler(tokenizer).tokenizer_info
        block_network()
        signal.signal(signal.SIGALRM, _alarm)
        out = open(args.jsonl, "w") if args.jsonl else None
        records = []
        for draft in args.drafts.split(","):
            for path in suite_files(args.suite, draft, args.optional):
                if args.only and path.stem not in args.only:
                    continue
                for group in json.loads(path.read_text()):
                    rec = run_group(info, tokenizer, path, draft, group, args)
                    records.append(rec)
                    if out:
                        out.write(json.dumps(rec) + "\n")
                        out.flush()
    print(summarize(records))
    if args.failures:
        for r in records:
            if r["status"] == "error" and not r["remote"]:
                print(f"ERROR {r['file']} | {r['group']}: {r['msg'][:120]}")
            for t in r["tests"]:
                if t["valid"] and t.get("accepted") is False:
                    print(f"REJECTED {r['file']} | {r['group']} | {t['desc']}: {json.dumps(t['data'])[:80]}")


if __name__ == "__main__":
    main()
