"""MaskBench harness shared by the tests and ``benchmarks/bench_grammar.py``.

A case is one JSON file of ``$RADIXLM_SHARED_DATA/maskbench``: ``{"schema", "tests": [{"data",
"valid"}]}``. Each instance is serialized with ``json.dumps`` and tokenized with the real tokenizer;
it is *accepted* when every token is allowed by the filled bitmask and accepted by the matcher and
the stop token terminates it. Sound: no invalid instance accepted; complete: every valid one is.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from radixlm.grammar.bitmask import allocate_token_bitmask
from radixlm.grammar.compiler import GrammarCompiler
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.matcher import GrammarMatcher
from radixlm.grammar.tokenizer_info import TokenizerInfo


def shared_data() -> Path:
    """``$RADIXLM_SHARED_DATA`` or ``../shared/data`` relative to the project root."""
    env = os.environ.get("RADIXLM_SHARED_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent.parent / "shared" / "data"


TOKENIZERS = ("gpt-2", "deepseek-llm", "phi-3", "llama-spm")
# The default model's own 49,152-token byte-level BPE: present wherever radixlm is installed.
DEFAULT_TOKENIZER = "smollm2"


def tokenizer_available(name: str) -> bool:
    """True for the default model's tokenizer and for shared tokenizers present on disk."""
    return name == DEFAULT_TOKENIZER or (shared_data() / "tokenizers" / name).is_dir()


@lru_cache(maxsize=None)
def load_tokenizer(name: str) -> Any:
    """``"smollm2"`` (the default model's tokenizer) or a tokenizer of
    ``$RADIXLM_SHARED_DATA/tokenizers`` (cached per process)."""
    from transformers import AutoTokenizer

    if name == DEFAULT_TOKENIZER:
        from radixlm.runtime.default_model import default_model_path

        return AutoTokenizer.from_pretrained(default_model_path())
    return AutoTokenizer.from_pretrained(str(shared_data() / "tokenizers" / name))


@lru_cache(maxsize=None)
def load_compiler(name: str) -> GrammarCompiler:
    """A :class:`GrammarCompiler` for a shared tokenizer (cached per process)."""
    return GrammarCompiler(load_tokenizer(name))


def table_vocabularies() -> list[str]:
    """The vocabularies accept/reject tables walk token by token: the default model's byte-level
    BPE, and SentencePiece ``llama-spm`` where the shared data is present."""
    return [n for n in (DEFAULT_TOKENIZER, "llama-spm") if tokenizer_available(n)]


def table_failures(compiler: GrammarCompiler, tokenizer: Any, cases: list[tuple], each: Any = None,
                   **options: Any) -> list[tuple]:
    """Walk every instance of an accept/reject table token by token (:func:`run_instance`).

    ``cases``: ``(name, schema, valid values, invalid values)``; ``each(compiled, text)``: an extra
    check per instance (e.g. no dead end); ``options``: keyword arguments of
    :meth:`GrammarCompiler.compile_json_schema`. Returns ``(name, value, expected)`` for each instance
    accepted or refused against expectation; raises ``AssertionError`` when a step's bitmask and
    the matcher disagree."""
    bitmask = allocate_token_bitmask(1, compiler.tokenizer_info.vocab_size)
    failures = []
    for name, schema, valid, invalid in cases:
        compiled = compiler.compile_json_schema(schema, **options)
        for value, want in [(v, True) for v in valid] + [(v, False) for v in invalid]:
            res = run_instance(compiled, tokenizer, json.dumps(value), want, bitmask)
            assert res.mismatch is None, (name, value, res.mismatch)
            if res.accepted != want:
                failures.append((name, value, want))
            if each is not None:
                each(compiled, json.dumps(value))
    return failures


def schema_validator(schema: Any, formats: bool = False) -> Any:
    """A jsonschema validator for ``schema`` (its ``$schema`` draft, else 2020-12); ``formats``:
    also assert ``format`` keywords."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER) if formats else cls(schema)


def encode_exact(tokenizer: Any, info: TokenizerInfo, text: str) -> list[int]:
    """Token ids whose bytes are exactly ``text``, as the tokenizer would produce them mid-stream
    (SentencePiece adds a leading ``▁`` at the start of a text: tokenize after a newline then)."""
    want = text.encode("utf-8")
    ids = tokenizer.encode(text, add_special_tokens=False)
    if b"".join(info.token_bytes[i] or b"?" for i in ids) == want:
        return ids
    ids = tokenizer.encode("\n" + text, add_special_tokens=False)
    acc = b""
    for k, i in enumerate(ids):
        acc += info.token_bytes[i] or b"?"
        if acc in (b"\n", b" \n"):
            rest = ids[k + 1 :]
            if b"".join(info.token_bytes[j] or b"?" for j in rest) == want:
                return rest
            break
    raise ValueError(f"cannot tokenize {text[:60]!r} exactly")


@dataclass
class InstanceResult:
    valid: bool
    accepted: bool
    mask_times: list[float] = field(default_factory=list)
    mismatch: str | None = None  # a mask / accept_token disagreement (a bug)
    failed_at: int | None = None  # bytes of the text accepted before the refused token (refused only)


def run_instance(compiled: Any, tokenizer: Any, text: str, valid: bool, bitmask: torch.Tensor) -> InstanceResult:
    """Walk ``text`` token by token, checking the filled bitmask against ``accept_token``."""
    info = compiled.tokenizer_info
    matcher = GrammarMatcher(compiled)
    ids = encode_exact(tokenizer, info, text) + [info.stop_token_ids[0]]
    res = InstanceResult(valid, False)
    words = bitmask[0].numpy()
    done = 0
    for tid in ids:
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask, 0)
        res.mask_times.append(time.perf_counter() - t0)
        allowed = bool((int(words[tid // 32]) >> (tid % 32)) & 1)
        ok = matcher.accept_token(tid)
        if allowed != ok:
            res.mismatch = f"token {tid} allowed={allowed} accepted={ok}"
            return res
        if not ok:
            res.failed_at = done
            return res
        done += len(info.token_bytes[tid] or b"")
    res.accepted = matcher.is_terminated()
    return res


@dataclass
class CaseResult:
    name: str
    compiled: bool
    error: str | None = None
    compile_time: float = 0.0
    instances: list[InstanceResult] = field(default_factory=list)


def load_cases(limit: int | None = None, stride: int = 1, with_tests_only: bool = True) -> list[tuple[str, dict]]:
    root = shared_data() / "maskbench"
    files = sorted(root.glob("*.json"))[::stride]
    out = []
    for f in files:
        case = json.loads(f.read_text())
        if with_tests_only and not case.get("tests"):
            continue
        out.append((f.stem, case))
        if limit is not None and len(out) >= limit:
            break
    return out


def run_case(compiler: GrammarCompiler, tokenizer: Any, name: str, case: dict) -> CaseResult:
    t0 = time.perf_counter()
    try:
        compiled = compiler.compile_json_schema(case["schema"])
    except GrammarError as e:
        return CaseResult(name, False, str(e))
    res = CaseResult(name, True, compile_time=time.perf_counter() - t0)
    bitmask = allocate_token_bitmask(1, compiler.tokenizer_info.vocab_size)
    for test in case.get("tests", []):
        res.instances.append(run_instance(compiled, tokenizer, json.dumps(test["data"]), test["valid"], bitmask))
    return res


def count_first_visits() -> list[int]:
    """Count, from now on in this process, the masks computed on a first visit: wraps
    ``CompiledGrammar._compute`` (it runs exactly when a step needs a mask not yet computed) and
    returns the one-element counter it increments. For benchmarks; the wrap is permanent."""
    from radixlm.grammar import compiler as compiler_mod

    counter = [0]
    plain = compiler_mod.CompiledGrammar._compute

    def counting(self, states):
        counter[0] += 1
        return plain(self, states)

    compiler_mod.CompiledGrammar._compute = counting
    return counter


def timed_steps(compiled: Any, ids: list[int], eos: int, bitmask: torch.Tensor,
                first_visits: list[int]) -> list[tuple[float, bool]]:
    """Walk token ids ``ids`` then ``eos`` through a fresh matcher of ``compiled``, timing each
    mask fill: ``(thread CPU seconds, computed on a first visit?)`` per step (``first_visits``
    from :func:`count_first_visits`), up to the first refused token. ``bitmask``: int32
    ``[1, mask_words]``."""
    m, out = GrammarMatcher(compiled), []
    for tid in ids + [eos]:
        before = first_visits[0]
        t0 = time.thread_time()
        m.fill_next_token_bitmask(bitmask, 0)
        out.append((time.thread_time() - t0, first_visits[0] > before))
        if not m.accept_token(tid):
            break
    return out
