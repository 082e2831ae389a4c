"""Every sampling parameter the edge accepts is read by the runtime (issue 16: the third copy of
the parameters is how ``stop_regex`` came to be silently ignored). Static: each field of
``SamplingParams`` must be read as an attribute somewhere in the runtime outside its own module
(or, for the three constraint fields, through ``SamplingParams.grammar``, which the grammar
backend reads); the HTTP protocol and the DSL must not accept a sampling field the runtime lacks."""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import radixlm
from radixlm.runtime.sampling_params import SamplingParams

ROOT = pathlib.Path(radixlm.__file__).parent
GRAMMAR_FIELDS = {"regex", "json_schema", "ebnf"}  # read via SamplingParams.grammar


def _attribute_reads(paths) -> set[str]:
    names = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                names.add(node.attr)
    return names


def test_every_sampling_field_is_read_by_the_runtime():
    runtime = [p for p in (ROOT / "runtime").rglob("*.py") if p.name != "sampling_params.py"
               and "server" not in p.parts]
    reads = _attribute_reads(runtime)
    fields = {f.name for f in dataclasses.fields(SamplingParams)}
    unread = sorted(f for f in fields - GRAMMAR_FIELDS if f not in reads)
    assert not unread, f"sampling parameters accepted but never read by the runtime: {unread}"
    assert "grammar" in reads  # the constraint fields' reader
    source = (ROOT / "runtime" / "sampling_params.py").read_text()
    assert all(f"self.{f}" in source for f in GRAMMAR_FIELDS)


def test_edge_sampling_fields_exist_in_the_runtime():
    from radixlm.runtime.server.protocol import NativeSamplingParams

    edge = set(NativeSamplingParams.model_fields)
    runtime = {f.name for f in dataclasses.fields(SamplingParams)}
    assert edge - runtime == set(), f"accepted at the HTTP edge, unknown to the runtime: {sorted(edge - runtime)}"


def test_dsl_sampling_fields_reach_the_runtime():
    """The DSL's sampling fields are the runtime's, plus request-level ones (logprobs, dtype)."""
    from radixlm.lang.ir import SamplingParams as DslSamplingParams

    request_level = {"dtype", "logprob_start_len", "return_logprob", "return_text_in_logprobs", "top_logprobs_num"}
    dsl = {f.name for f in dataclasses.fields(DslSamplingParams)} - request_level
    runtime = {f.name for f in dataclasses.fields(SamplingParams)}
    assert dsl <= runtime, f"DSL sampling fields unknown to the runtime: {sorted(dsl - runtime)}"
