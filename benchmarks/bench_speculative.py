"""N-gram speculative decoding vs plain decoding at batch 1 (issue 14), same run, same prompts.

Workloads (greedy, chat template of the model):
  extraction   passages with names, dates and quantities -> JSON with quoted spans (free text)
  extract_json the same with a ``json_schema`` constraint (grammar-forced drafts join n-gram ones)
  summarize    a summary that quotes the passage verbatim

Per workload and mode it reports forward passes per output token (all batches, prefill included,
over output tokens), wall time per request, draft acceptance, and whether the outputs are
identical to plain decoding's (greedy speculation must not change them).

Modes: ``plain``; ``ngram[:K[:MIN[:MAX[:CAP]]]]`` (own index + the global store of other requests'
tokens, ``speculative_ngram_capacity`` CAP, default 1,000,000); ``ngram_local[:K[:MIN[:MAX]]]``
(own index only, capacity 0). No timed request ever sees its own earlier output: per workload the
store is cleared, then one untimed warm-up request on a passage of a different seed (never among
the timed ones) runs, then the timed requests, each of which can only draft from the warm-up and
the timed requests before it (extraction and extract_json share passages, hence the clearing).

    # CPU, default model (SmolLM2-135M-Instruct), fp32:
    .venv/bin/python benchmarks/bench_speculative.py --num-prompts 6 --max-new-tokens 96
    # GPU:
    python benchmarks/bench_speculative.py --device cuda --dtype bfloat16 --model-path PATH
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FIRST = ["Maria", "Jonas", "Aiko", "Pedro", "Fatima", "Liam", "Chen", "Olga", "Kwame", "Sofia"]
LAST = ["Alvarez", "Becker", "Tanaka", "Silva", "Haddad", "O'Brien", "Wei", "Petrova", "Mensah", "Rossi"]
CITIES = ["Lisbon", "Hamburg", "Osaka", "Recife", "Beirut", "Galway", "Chengdu", "Kazan", "Accra", "Turin"]
ITEMS = ["tons of wheat", "solar panels", "liters of olive oil", "laptops", "bags of cement", "bicycles"]
MONTHS = ["January", "March", "April", "June", "August", "October", "November"]
SCHEMA = {
    "type": "object",
    "properties": {
        "people": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 4},
        "dates": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 4},
        "quantities": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 4},
    },
    "required": ["people", "dates", "quantities"],
}


def passage(rng: random.Random) -> str:
    a, b = (f"{rng.choice(FIRST)} {rng.choice(LAST)}" for _ in range(2))
    d1 = f"{rng.choice(MONTHS)} {rng.randint(1, 28)}, {rng.randint(1990, 2024)}"
    d2 = f"{rng.choice(MONTHS)} {rng.randint(1, 28)}, {rng.randint(1990, 2024)}"
    q1, q2 = f"{rng.randint(12, 950)} {rng.choice(ITEMS)}", f"{rng.randint(3, 80)} {rng.choice(ITEMS)}"
    city = rng.choice(CITIES)
    return (f"On {d1}, {a} signed a contract in {city} to deliver {q1} to the cooperative run by {b}. "
            f"The first shipment left the port on {d2} and carried {q2}. {b} said the deal "
            f"\"changes everything for the farmers of {city}\" and thanked {a} for the patience.")


def workloads(n: int, seed: int) -> dict[str, list[tuple[str, dict]]]:
    rng = random.Random(seed)
    texts = [passage(rng) for _ in range(n)]
    extract = ("Extract every person, date and quantity from the passage. Answer with JSON only, "
               "{{\"people\": [...], \"dates\": [...], \"quantities\": [...]}}, copying each span "
               "exactly as written.\n\nPassage: {p}")
    summarize = ("Summarize the passage in two sentences. Quote the sentence that {who} said "
                 "word for word, in double quotes.\n\nPassage: {p}")
    return {
        "extraction": [(extract.format(p=p), {}) for p in texts],
        "extract_json": [(extract.format(p=p), {"json_schema": json.dumps(SCHEMA)}) for p in texts],
        "summarize": [(summarize.format(p=p, who="the cooperative's head"), {}) for p in texts],
    }


def store_counts(drafter) -> tuple[int, int, int]:
    """(verify steps, draft tokens, accepted tokens) of drafts from the global store."""
    return tuple(getattr(drafter, a, 0) for a in ("store_draft_ct", "store_draft_tokens", "store_accepted_tokens"))


def run_mode(engine, tok, prompts: list[tuple[str, dict]], max_new: int) -> dict:
    stats = engine.scheduler.stats
    drafter = getattr(engine.scheduler, "spec_drafter", None)
    spec0 = (drafter.stats.spec_draft_tokens, drafter.stats.spec_accepted_tokens) if drafter else (0, 0)
    store0 = store_counts(drafter)
    passes0 = stats.num_prefill_batches + stats.num_decode_batches
    outs, times, tokens = [], [], 0
    for text, extra in prompts:
        chat = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                       add_generation_prompt=True)
        t0 = time.perf_counter()
        r = engine.generate(chat, {"max_new_tokens": max_new, "temperature": 0, **extra})
        times.append(time.perf_counter() - t0)
        outs.append(r["output_ids"])
        tokens += len(r["output_ids"])
    passes = stats.num_prefill_batches + stats.num_decode_batches - passes0
    rate = None
    if drafter is not None:
        proposed = drafter.stats.spec_draft_tokens - spec0[0]
        rate = (drafter.stats.spec_accepted_tokens - spec0[1]) / proposed if proposed else 0.0
    store = tuple(b - a for a, b in zip(store0, store_counts(drafter)))
    return {"outs": outs, "passes": passes, "tokens": tokens, "time": sum(times) / len(times), "accept_rate": rate,
            "store": store}


def mode_args(mode: str, spec: dict) -> dict:
    """Engine keyword arguments of a ``--modes`` entry (see the module docstring)."""
    name, *nums = mode.split(":")
    if name == "plain":
        return {}
    if name not in ("ngram", "ngram_local"):
        raise SystemExit(f"unknown mode {mode!r}: plain, ngram[:K[:MIN[:MAX[:CAP]]]] or ngram_local[:K[:MIN[:MAX]]]")
    k, lo, hi, cap = (list(map(int, nums)) + [None] * 4)[:4]
    if name == "ngram_local":
        cap = 0
    return {**spec, **({"speculative_num_draft_tokens": k} if k else {}),
            **({"speculative_ngram_min_match_window_size": lo} if lo else {}),
            **({"speculative_ngram_max_match_window_size": hi} if hi else {}),
            **({"speculative_ngram_capacity": cap} if cap is not None else {})}


def reset_store(engine, capacity: int | None) -> None:
    """Empty the drafter's global store (sized ``capacity`` when given, also where the scheduler
    of the tree under test does not pass ``speculative_ngram_capacity`` to the drafter)."""
    drafter = getattr(engine.scheduler, "spec_drafter", None)
    if drafter is None or not hasattr(drafter, "clear_store"):
        return
    if capacity is not None and drafter.store_capacity != capacity:
        engine._call(lambda: drafter.set_store_capacity(capacity))
    engine._call(drafter.clear_store)


def profile_steps(engine):
    """Profile the later scheduler steps of ``engine`` (its loop looks ``step`` up per call)
    while ``prof.active`` is true."""
    import cProfile

    prof, sched = cProfile.Profile(), engine.scheduler
    step, prof.active = sched.step, True
    sched.step = lambda: prof.runcall(step) if prof.active else step()
    return prof


def report_profile(prof, mode: str, out_dir: str) -> None:
    """Print the top functions by own and cumulative time; save ``<out_dir>/<mode>.prof``."""
    import io
    import os
    import pstats

    if os.path.isdir(out_dir):
        prof.dump_stats(os.path.join(out_dir, f"{mode}.prof"))
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(22)
        print(f"--- cProfile {mode} by {key}\n" + "\n".join(buf.getvalue().splitlines()[4:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=None, help="default: SmolLM2-135M-Instruct")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--num-draft-tokens", type=int, default=8, help="speculative_num_draft_tokens (k; the server default)")
    ap.add_argument("--min-window", type=int, default=1)
    ap.add_argument("--max-window", type=int, default=12)
    ap.add_argument("--workloads", default="extraction,extract_json,summarize")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--modes", default="plain,ngram_local,ngram",
                    help="plain first (the others compare to it); ngram uses --num-draft-tokens, the windows "
                         "and the global store, ngram:K:MIN:MAX:CAP sets them per mode (a sweep in one run); "
                         "ngram_local[:K:MIN:MAX] has no global store (speculative_ngram_capacity=0)")
    ap.add_argument("--cprofile", default=None,
                    help="print a cProfile of the scheduler steps of the timed runs (DIR: also save .prof files)")
    args = ap.parse_args()

    import torch

    from radixlm import Engine

    torch.set_num_threads(max(torch.get_num_threads(), 1))
    loads = workloads(args.num_prompts, args.seed)
    warm = workloads(1, args.seed + 1)  # NOTE: other passages than the timed ones (see the docstring)
    assert all(warm[w][0] not in loads[w] for w in warm)
    names = [w for w in args.workloads.split(",") if w]
    common = dict(model_path=args.model_path, device=args.device, dtype=args.dtype)
    spec = dict(speculative_algorithm="ngram", speculative_num_draft_tokens=args.num_draft_tokens,
                speculative_ngram_min_match_window_size=args.min_window,
                speculative_ngram_max_match_window_size=args.max_window)
    results: dict[str, dict[str, dict]] = {w: {} for w in names}
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        kw = mode_args(mode, spec)
        with Engine(**common, **kw) as engine:
            tok = engine.tokenizer
            cap = kw.get("speculative_ngram_capacity", 1_000_000 if kw else None)
            prof = profile_steps(engine) if args.cprofile else None
            for w in names:
                reset_store(engine, cap)  # NOTE: no workload drafts from another's outputs
                if prof is not None:
                    prof.active = False
                run_mode(engine, tok, warm[w], args.max_new_tokens)  # warm-up (not counted), full length
                if prof is not None:
                    prof.active = True
                results[w][mode] = run_mode(engine, tok, loads[w], args.max_new_tokens)
            if prof is not None:
                report_profile(prof, mode, args.cprofile)
        del engine
        gc.collect()
        if torch.cuda.is_available():  # NOTE: the next Engine sizes its KV pool from free memory
            torch.cuda.empty_cache()
    print(f"device={args.device} dtype={args.dtype} model={args.model_path or 'SmolLM2-135M-Instruct'} "
          f"k={args.num_draft_tokens} windows={args.min_window}..{args.max_window} "
          f"prompts={args.num_prompts} max_new_tokens={args.max_new_tokens} batch=1")
    print("| workload | mode | out tokens | fwd passes / out token | wall s / request | speedup | draft accept rate "
          "| store drafts: steps / tokens / accepted | identical |")
    print("|---|---|---|---|---|---|---|---|---|")
    for w in names:
        base = results[w]["plain"]
        for mode in modes:
            r = results[w][mode]
            same = "-" if mode == "plain" else ("yes" if r["outs"] == base["outs"] else "NO")
            rate = "-" if r["accept_rate"] is None else f"{r['accept_rate']:.2f}"
            store = "-" if r["accept_rate"] is None else " / ".join(map(str, r["store"]))
            print(f"| {w} | {mode} | {r['tokens']} | {r['passes'] / max(r['tokens'], 1):.3f} | "
                  f"{r['time']:.3f} | {base['time'] / r['time']:.2f}x | {rate} | {store} | {same} |")


if __name__ == "__main__":
    main()
