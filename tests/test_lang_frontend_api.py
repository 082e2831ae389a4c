"""radixlm's frontend API has SGLang's names, module paths and signatures (issue 17).

``SGLANG_API`` is a static table of SGLang's public frontend (``sglang/__init__.py``,
``sglang/lang/api.py``, ``SglFunction``, ``ProgramState``, backends) checked everywhere; when the
real ``sglang`` package is importable the same comparison runs against its live objects too (this
test installs nothing).  radixlm may add keyword-only parameters or a trailing ``**kwargs``, never
change SGLang's parameter order, kinds or defaults.
"""

from __future__ import annotations

import importlib
import inspect
import re

import pytest

import radixlm as sgl

E = inspect.Parameter.empty
_R = [("return_logprob", None), ("logprob_start_len", None), ("top_logprobs_num", None),
      ("return_text_in_logprobs", None)]
_SAMPLING = [("stop", None), ("stop_token_ids", None), ("stop_regex", None),
             ("temperature", None), ("top_p", None), ("top_k", None), ("min_p", None),
             ("frequency_penalty", None), ("presence_penalty", None), ("ignore_eos", None), *_R]
_RUN = [("max_new_tokens", 128), ("n", 1), ("stop", None), ("stop_token_ids", None),
        ("stop_regex", None), ("temperature", 1.0), ("top_p", 1.0), ("top_k", -1), ("min_p", 0.0),
        ("frequency_penalty", 0.0), ("presence_penalty", 0.0), ("ignore_eos", False), *_R]
_TYPED = [("name", None), ("max_tokens", None), ("n", None), *_SAMPLING]

# name -> SGLang's parameters in order: (name, default) or "*args" / "**kwargs"; "*" marks the
# start of keyword-only parameters.
SGLANG_API: dict[str, list] = {
    "gen": [("name", None), ("max_tokens", None), ("min_tokens", None), ("n", None), *_SAMPLING,
            ("dtype", None), ("choices", None), ("choices_method", None), ("regex", None),
            ("json_schema", None)],
    "gen_int": _TYPED,
    "gen_string": _TYPED,
    "select": [("name", None), ("choices", None), ("temperature", 0.0),
               ("choices_method", "token_length_normalized")],
    "image": [("expr", E)],
    "video": [("path", E), ("num_frames", E)],
    "separate_reasoning": [("expr", None), ("model_type", None)],
    "function": [("func", None), ("num_api_spec_tokens", None)],
    "set_default_backend": [("backend", E)],
    "flush_cache": [("backend", None), ("empty_cache", True)],
    "get_server_info": [("backend", None)],
    **{r: [("expr", None)] for r in ("system", "user", "assistant")},
    **{f"{r}_{x}": [] for r in ("system", "user", "assistant") for x in ("begin", "end")},
    "RuntimeEndpoint": [("base_url", E), ("api_key", None), ("verify", None),
                        ("chat_template_name", None)],
    "Runtime": [("log_level", "error"), ("launch_timeout", 300.0), "*args", "**kwargs"],
    "OpenAI": [("model_name", E), ("is_chat_model", None), ("chat_template", None),
               ("is_azure", False), "*args", "**kwargs"],
    "Function.run": ["*args", *_RUN, ("stream", False), ("backend", None), ("use_thread", True),
                     "**kwargs"],
    "Function.run_batch": [("batch_kwargs", E), "*", *_RUN, ("backend", None),
                           ("num_threads", "auto"), ("progress_bar", False),
                           ("generator_style", False)],
    "Function.trace": ["*", ("backend", None), "**kwargs"],
    "Function.cache": [("backend", None)],
    "Function.compile": ["*", ("backend", None)],
    "Function.bind": ["**kwargs"],
    "ProgramState.fork": [("size", 1), ("position_ids_offset", None)],
    "ProgramState.copy": [("position_ids_offset", None)],
    "ProgramState.text_iter": [("var_name", None)],
    "ProgramState.text_async_iter": [("var_name", None), ("return_meta_data", False)],
    "ProgramState.get_var": [("name", E)],
    "ProgramState.set_var": [("name", E), ("value", E)],
    "ProgramState.get_meta_info": [("name", E)],
    "ProgramState.var_scope": [("name", E)],
    **{f"ProgramState.{m}": [] for m in ("text", "messages", "sync", "error")},
    "ProgramStateGroup.join": [("mode", "gather_variable")],
}
SGLANG_NAMES = ["Engine", "ServerArgs", "Runtime", "RuntimeEndpoint", "OpenAI", "Anthropic",
                "Crusoe", "LiteLLM", "VertexAI", "global_config", "__version__", "greedy_token_selection",
                "token_length_normalized", "unconditional_likelihood_normalized",
                *[k for k in SGLANG_API if "." not in k]]
MODULE_NAMES = {
    "radixlm.lang.ir": ["REGEX_INT", "REGEX_FLOAT", "REGEX_STR", "REGEX_BOOL", "SglGen",
                        "SglSelect", "SglExpr", "SglFunction", "SglSamplingParams"],
    "radixlm.global_config": ["global_config"],
    "radixlm.lang.global_config": ["global_config", "GlobalConfig"],
    "radixlm.lang.interpreter": ["ProgramState", "ProgramStateGroup", "StreamExecutor",
                                 "run_program", "run_program_batch", "cache_program"],
    "radixlm.lang.choices": ["ChoicesSamplingMethod", "ChoicesDecision",
                             "token_length_normalized"],
    "radixlm.lang.chat_template": ["get_chat_template", "get_chat_template_by_model_path"],
    "radixlm.lang.backend.runtime_endpoint": ["RuntimeEndpoint", "Runtime"],
    "radixlm.lang.backend.openai": ["OpenAI"],
    "radixlm.lang.backend.base_backend": ["BaseBackend"],
    "radixlm.lang.api": ["gen", "select", "separate_reasoning", "image", "video"],
}


def resolve(root, dotted: str):
    from radixlm.interpreter.state import ProgramState, ProgramStateGroup
    from radixlm.lang.function import Function

    head, _, attr = dotted.partition(".")
    if root is sgl:
        obj = {"Function": Function, "ProgramState": ProgramState,
               "ProgramStateGroup": ProgramStateGroup}.get(head) or getattr(sgl, head)
    else:
        obj = {"Function": "sglang.lang.ir:SglFunction", "ProgramState":
               "sglang.lang.interpreter:ProgramState", "ProgramStateGroup":
               "sglang.lang.interpreter:ProgramStateGroup",
               # NOTE: sglang exposes these through lazy wrappers taking (*args, **kwargs).
               "Runtime": "sglang.lang.backend.runtime_endpoint:Runtime",
               "OpenAI": "sglang.lang.backend.openai:OpenAI"}.get(head)
        obj = getattr(importlib.import_module(obj.split(":")[0]), obj.split(":")[1]) if obj \
            else getattr(root, head)
    if attr:
        obj = getattr(obj, attr)
    return inspect.unwrap(obj)


def describe(fn) -> list:
    """A signature as the table writes it (``self`` dropped; object defaults by type name)."""
    sig = inspect.signature(fn.__init__ if inspect.isclass(fn) else fn)
    out, kw_only = [], False
    for p in sig.parameters.values():
        if p.name == "self":
            continue
        if p.kind is p.VAR_POSITIONAL:
            out.append("*args")
        elif p.kind is p.VAR_KEYWORD:
            out.append("**kwargs")
        else:
            if p.kind is p.KEYWORD_ONLY and not kw_only and "*args" not in out:
                out.append("*")
            kw_only = kw_only or p.kind is p.KEYWORD_ONLY
            d = p.default
            if d is not E and not isinstance(d, (int, float, str, bool, type(None))):
                d = re.sub(r"(?<!^)(?=[A-Z])", "_", type(d).__name__).lower()
            out.append((p.name, d))
    return out


def compatible(ours: list, theirs: list) -> bool:
    """``ours`` starts with ``theirs``; after that only optional parameters (with defaults),
    keyword-only parameters and ``**kwargs`` (what newer SGLang versions add, e.g.
    ``flush_cache(backend, empty_cache=True)``)."""
    if ours[: len(theirs)] != theirs:
        return False
    kw_only = "*" in theirs or "*args" in theirs
    for item in ours[len(theirs):]:
        if item in ("*", "**kwargs"):
            kw_only = True
        elif item == "*args" or (not kw_only and item[1] is E):
            return False
    return True


@pytest.mark.parametrize("name", sorted(SGLANG_API))
def test_signature_matches_sglang_table(name):
    ours = describe(resolve(sgl, name))
    assert compatible(ours, SGLANG_API[name]), f"{name}: {ours} vs {SGLANG_API[name]}"


def test_compatible_detects_differences():
    assert compatible([("a", 1), "*", ("b", 2)], [("a", 1)])
    assert not compatible([("a", 2)], [("a", 1)])
    assert not compatible([("b", None), ("a", 1)], [("a", 1)])
    assert compatible([("a", 1), ("extra", None)], [("a", 1)])
    assert not compatible([("a", 1), ("required", E)], [("a", 1)])
    assert not compatible([("a", 1), "*args"], [("a", 1)])


def test_public_names_and_module_paths_exist():
    missing = [n for n in SGLANG_NAMES if not hasattr(sgl, n)]
    assert not missing
    for module, names in MODULE_NAMES.items():
        mod = importlib.import_module(module)
        assert not [n for n in names if not hasattr(mod, n)], module
    from radixlm.global_config import global_config

    assert sgl.global_config is global_config
    for attr in ("verbosity", "default_backend", "enable_precache_with_tracing",
                 "enable_parallel_encoding", "skip_special_tokens_in_output",
                 "spaces_between_special_tokens_in_out", "default_init_new_token_ratio"):
        assert hasattr(global_config, attr)


@pytest.mark.parametrize("name", ["Anthropic", "Crusoe", "LiteLLM", "VertexAI"])
def test_unsupported_api_backends_say_so(name):
    with pytest.raises(NotImplementedError, match="not supported"):
        getattr(sgl, name)("model")
    with pytest.raises(NotImplementedError, match="not supported"):
        sgl.image("cat.png")
    with pytest.raises(NotImplementedError, match="not supported"):
        sgl.video("cat.mp4", 4)


# SGLang's regex values: the strings each must (and must not) fully match.
REGEX_TABLE = [
    ("REGEX_INT", r"[-+]?[0-9]+[ \n]*", ["7", "-12", "+3", "42 ", "42\n\n"], ["", "4.2", "a1", " 1"]),
    ("REGEX_FLOAT", r"[-+]?[0-9]*\.?[0-9]+[ \n]*", ["1.5", ".5", "-3", "2.0\n"], ["1.", "e5", "1.2.3"]),
    ("REGEX_BOOL", r"(True|False)", ["True", "False"], ["true", "0", "Truee"]),
    ("REGEX_STR", r"\"[\w\d\s]*\"", ['"abc 12"', '""', '"a_b"'], ['"a-b"', "abc", '"x'],),
]


@pytest.mark.parametrize("name,value,good,bad", REGEX_TABLE)
def test_regex_constants_have_sglang_values(name, value, good, bad):
    from radixlm.lang import ir

    assert getattr(ir, name) == value
    assert all(re.fullmatch(value, s) for s in good)
    assert not any(re.fullmatch(value, s) for s in bad)


def test_against_installed_sglang():
    real = pytest.importorskip("sglang", reason="sglang not installed; the static table covers it")
    problems = []
    for name in SGLANG_API:
        try:
            theirs = describe(resolve(real, name))
        except (AttributeError, ImportError, ValueError, TypeError):
            continue  # not in this sglang version
        if not compatible(describe(resolve(sgl, name)), theirs):
            problems.append((name, theirs))
    assert not problems
    ir = importlib.import_module("sglang.lang.ir")
    for name, value, _, _ in REGEX_TABLE:
        assert getattr(ir, name) == value
    assert not [n for n in getattr(real, "__all__", []) if not hasattr(sgl, n)]
