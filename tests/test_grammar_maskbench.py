"""MaskBench, table-driven, on the four real vocabularies (issue 4 tests): for every schema the
compiler accepts, every valid instance (``json.dumps``, real tokenization) is accepted token by
token and terminates, no invalid instance is, and at every step the filled bitmask allows exactly
what ``accept_token`` accepts. A fixed subset keeps ``make test`` fast; the full run is
``benchmarks/bench_grammar.py``."""

from __future__ import annotations

import pytest

from radixlm.grammar.maskbench import TOKENIZERS, load_cases, load_compiler, load_tokenizer, run_case, shared_data

pytestmark = pytest.mark.skipif(not (shared_data() / "maskbench").is_dir(),
                                reason=f"MaskBench data not found under {shared_data()} (set RADIXLM_SHARED_DATA)")

STRIDE = 90  # every 90th file: ~60 schemas from all sources (GitHub, Glaive, Snowplow, BFCL, ...)


@pytest.fixture(scope="module")
def cases() -> list[tuple[str, dict]]:
    return load_cases(stride=STRIDE)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_maskbench_subset(name: str, cases: list[tuple[str, dict]]) -> None:
    tok, comp = load_tokenizer(name), load_compiler(name)
    compiled = valid = valid_ok = invalid = 0
    failures = []
    for case_name, case in cases:
        res = run_case(comp, tok, case_name, case)
        if not res.compiled:
            continue
        compiled += 1
        for i, inst in enumerate(res.instances):
            assert inst.mismatch is None, (case_name, i, inst.mismatch)
            if inst.valid:
                valid += 1
                valid_ok += inst.accepted
                if not inst.accepted:
                    failures.append((case_name, i))
            else:
                invalid += 1
                assert not inst.accepted, f"{name}: invalid instance {i} of {case_name} accepted"
    coverage = compiled / len(cases)
    print(f"\n{name}: coverage {compiled}/{len(cases)} = {coverage:.0%}, valid accepted {valid_ok}/{valid}, "
          f"invalid rejected {invalid}/{invalid}, valid rejected: {failures}")
    assert coverage >= 0.8, coverage
    assert valid_ok >= 0.95 * valid, failures
