"""DSL primitives, IR nodes, sampling parameters and constraints (no model needed)."""

from __future__ import annotations

import json
import re

import pytest

import radixlm as sgl
from radixlm.lang import constraints
from radixlm.lang.function import run_defaults, split_run_kwargs
from radixlm.lang.ir import (
    Constant, ExprList, Gen, RoleBegin, RoleEnd, SamplingParams, Select, VarScopeBegin,
    VarScopeEnd, as_exprs,
)


def test_concatenation_flattens_in_order():
    expr = "Q: " + sgl.gen("a") + "\n" + sgl.select("b", ["x", "y"])
    assert isinstance(expr, ExprList)
    kinds = [type(e) for e in expr.items]
    assert kinds == [Constant, Gen, Constant, Select]
    assert [e.value for e in expr.items if isinstance(e, Constant)] == ["Q: ", "\n"]
    assert as_exprs(["a", ("b", sgl.gen())])[1].value == "b"
    with pytest.raises(TypeError):
        as_exprs(3)


def test_roles_and_var_scope_wrap_content():
    for fn, role in ((sgl.system, "system"), (sgl.user, "user"), (sgl.assistant, "assistant")):
        items = fn("hi").items
        assert isinstance(items[0], RoleBegin) and items[0].role == role
        assert isinstance(items[-1], RoleEnd) and items[-1].role == role
        assert items[1].value == "hi"
    assert sgl.user_begin().role == "user" and sgl.assistant_end().role == "assistant"
    scoped = sgl.var_scope("v", "abc").items
    assert isinstance(scoped[0], VarScopeBegin) and isinstance(scoped[-1], VarScopeEnd)


def test_gen_parameters_map_to_the_native_protocol():
    g = sgl.gen("x", max_tokens=7, min_tokens=2, stop=["\n"], temperature=0.5, top_k=3,
                return_logprob=True, top_logprobs_num=2)
    native = g.params.merged(run_defaults({})).to_native()
    assert native["max_new_tokens"] == 7 and native["min_new_tokens"] == 2
    assert native["stop"] == ["\n"] and native["temperature"] == 0.5 and native["top_k"] == 3
    assert native["top_p"] == 1.0  # from the run defaults
    assert "return_logprob" not in native
    assert g.params.request_options() == {"return_logprob": True, "top_logprobs_num": 2}


def test_run_defaults_fill_only_unset_fields():
    sampling, args = split_run_kwargs({"temperature": 0, "max_new_tokens": 5, "question": "q"})
    assert args == {"question": "q"}
    merged = sgl.gen("x", temperature=0.9).params.merged(run_defaults(sampling))
    assert merged.temperature == 0.9 and merged.max_new_tokens == 5
    assert SamplingParams().merged(None).max_new_tokens is None


# NOTE: SGLang's REGEX_* values (sglang.lang.ir): trailing spaces/newlines after numbers, \w/\s
# characters inside strings.
@pytest.mark.parametrize("dtype,good,bad", [
    (int, ["0", "-12", "+7", "1234567890", "12 ", "5\n"], ["1.5", "", "+", "a", " 1", "1 2"]),
    ("float", ["3", "-0.25", ".5", "10.5 ", "+1.0"], ["1.", "1e3", "x", "", "1.2.3", "-"]),
    (bool, ["True", "False"], ["true", "1", "", "TrueFalse"]),
    (str, ['"hello world"', '""', '"a_1 b"', '"line\nbreak"'],
     ['"unterminated', "plain", '"a"b"', '"a-b"', "'single'"]),
])
def test_dtype_regexes_accept_exactly_the_literals(dtype, good, bad):
    regex = sgl.gen("x", dtype=dtype).params.to_native()["regex"]
    assert all(re.fullmatch(regex, s) for s in good)
    assert not any(re.fullmatch(regex, s) for s in bad)


def test_gen_int_and_gen_string():
    assert sgl.gen_int("n").params.to_native()["regex"] == constraints.REGEX_INT
    assert sgl.gen_string("s", 9).params.max_new_tokens == 9
    assert sgl.gen_string("s").params.to_native()["regex"] == constraints.REGEX_STR


def test_json_schema_forms():
    from pydantic import BaseModel

    class Item(BaseModel):
        name: str
        price: float

    d = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert json.loads(sgl.gen(json_schema=d).params.json_schema) == d
    assert json.loads(sgl.gen(json_schema=Item).params.json_schema) == Item.model_json_schema()
    assert sgl.gen(json_schema='{"type": "string"}').params.json_schema == '{"type": "string"}'
    with pytest.raises(ValueError):
        sgl.gen(json_schema="{not json")
    with pytest.raises(TypeError):
        sgl.gen(json_schema=3)


def test_gen_validation_errors():
    with pytest.raises(ValueError):
        sgl.gen("x", n=0)
    with pytest.raises(ValueError):
        sgl.gen("x", regex="a", json_schema={"type": "string"})
    with pytest.raises(ValueError):
        sgl.gen("x", dtype=list)
    with pytest.raises(ValueError):
        sgl.select("x", [])
    with pytest.raises(ValueError):
        sgl.select("x", ["a", ""])
    with pytest.raises(ValueError):
        sgl.select("x", ["a", "b"], temperature=0.7)


def test_gen_with_choices_is_a_select():
    node = sgl.gen("pick", choices=["a", "b"], choices_method=sgl.greedy_token_selection)
    assert isinstance(node, Select)
    assert node.choices == ["a", "b"] and node.choices_method is sgl.greedy_token_selection
    assert sgl.select("p", ["a"]).choices_method is sgl.token_length_normalized


def test_function_binding_and_signature_checks():
    @sgl.function
    def prog(s, a, b="B"):
        s += a + b

    assert prog.arg_names == ["a", "b"]
    bound = prog.bind(a="A")
    assert bound.bind_call((), {}) == {"a": "A", "b": "B"}
    assert bound.bind_call((), {"b": "x"}) == {"a": "A", "b": "x"}
    assert prog.bind_call(("1", "2"), {}) == {"a": "1", "b": "2"}
    with pytest.raises(TypeError):
        prog.bind(c=1)
    with pytest.raises(TypeError):
        prog.bind_call((), {})  # missing a
    with pytest.raises(TypeError):
        sgl.function(lambda: None)

    @sgl.function(num_api_spec_tokens=64)
    def spec(s):
        s += "x"

    assert isinstance(spec, sgl.Function) and spec.num_api_spec_tokens == 64


def test_run_without_backend_raises():
    @sgl.function
    def prog(s):
        s += "x"

    old = sgl.get_default_backend()
    sgl.global_config.default_backend = None
    try:
        with pytest.raises(RuntimeError, match="no backend"):
            prog.run()
    finally:
        sgl.global_config.default_backend = old
    with pytest.raises(TypeError):
        prog.run(backend=object())


def test_import_radixlm_is_light():
    import subprocess
    import sys

    code = ("import sys, radixlm; print(int('torch' in sys.modules), "
            "int('transformers' in sys.modules), int(callable(radixlm.function)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "0", "1"]
