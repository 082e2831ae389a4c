"""``format: regex`` (``json_scalars.valid_regex``): a regular subset of the regexes valid in
Python ``re`` and ECMA-262 (with and without ``u``). Sound: every string it accepts compiles in
Python (and in node when installed); common valid patterns are accepted."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import warnings

import pytest

from radixlm.grammar.json_scalars import format_dfa

COMMON = ["^[a-zA-Z0-9_]{3,16}$", "^\\+?[0-9 ()-]{7,20}$", "\\w+@\\w+\\.com", "[A-Fa-f0-9]{64}",
          "^(?:[a-z0-9-]+\\.)+[a-z]{2,}$", "(a(b(c)))", "x{0,9}?", "\\bword\\B", "[-a]", "[^-]", "."]
REFUSED_VALID = ["(a(b(c(d))))", "[b-e]", "a{12,15}", "(?=a)", "(?P<n>a)"]  # outside the subset (sound)
INVALID = ["*", "(a", "a)", "[z-a]", "a**", "[]", "[^]", "a{3,2}", "\\", "+", "a{", "(?", "[a-\\d]"]


def _samples(n: int) -> list[str]:
    d = format_dfa("regex")
    rng = random.Random(7)
    alpha = list("ab^$.|?*+()[]{}\\-,019:dwbBZ_/ ") + ["é", "\n"]
    out = set()
    for _ in range(n):
        s = "".join(rng.choice(alpha) for _ in range(rng.randint(1, 8)))
        if d.matches(json.dumps(s)):
            out.add(s)
    return sorted(out)


def test_table() -> None:
    d = format_dfa("regex")
    for s in COMMON:
        assert d.matches(json.dumps(s)), s
        assert d.matches(json.dumps(s, ensure_ascii=False)), s
    for s in REFUSED_VALID + INVALID:
        assert not d.matches(json.dumps(s)), s


def test_accepted_strings_compile_in_python() -> None:
    samples = _samples(60_000)
    assert len(samples) > 1_000
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s in samples:
            re.compile(s)


@pytest.mark.skipif(shutil.which("node") is None, reason="node not installed")
def test_accepted_strings_compile_in_ecmascript() -> None:
    js = ("const xs=JSON.parse(require('fs').readFileSync(0,'utf8'));const bad=[];"
          "for(const s of xs){for(const f of ['','u']){try{new RegExp(s,f)}catch(e){bad.push([s,f])}}}"
          "console.log(JSON.stringify(bad.slice(0,5)))")
    out = subprocess.run(["node", "-e", js], input=json.dumps(_samples(60_000)), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []
