"""Flattening ``allOf`` and merging ``$ref`` targets with their siblings in place (a mixin of the
schema converter): :meth:`NormalizeMixin.normalize`."""

from __future__ import annotations

from typing import Any

from radixlm.grammar.budget import check_budget
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.schema_merge import ASSERTIONS, merge, resolve_pointer, seal, types_of, unevaluated
from radixlm.grammar.schema_rewrite import fold_discriminated, rewrite_conditionals


class NormalizeMixin:
    """``normalize`` of :class:`radixlm.grammar.json_schema.SchemaConverter`."""

    root: Any
    stack: list[str]

    def normalize(self, schema: dict, chain: tuple = (), expand: bool = False) -> Any:
        """Resolve ``$ref`` with sibling assertions and flatten ``allOf`` into one schema; a ``$ref``
        there to a schema of ``chain`` (those merged in place around this one) is False. One to
        a definition being converted stays a ``$ref`` with siblings (see ``recursive_allof``)
        unless ``expand``: its target merged once, in the conversion named after both."""
        chain += (id(schema),)
        rounds = 0  # NOTE: per call (a $ref cycle through siblings loops here); the budget bounds the total
        while True:
            rounds += 1
            check_budget("merging allOf / $ref", 2)
            if rounds > 1_000:
                raise GrammarError("$ref / allOf nesting too deep")
            schema = rewrite_conditionals(schema, self._negatable)
            rest = {k: v for k, v in schema.items() if k in ASSERTIONS}  # NOTE: others constrain nothing
            if "$ref" in schema and len(rest) > 1:
                # NOTE: the target merged in place (one level inlined; a recursive target's own
                # $refs stay references)
                if schema["$ref"] in self.stack and not (expand and rounds == 1):
                    return schema
                others = {k: v for k, v in schema.items() if k != "$ref"}
                target = resolve_pointer(self.root, schema["$ref"])
                if isinstance(target, bool):
                    schema = merge(target, others) if target else False
                else:
                    schema = merge(seal(target), others)  # NOTE: the $ref target's unevaluated* sees only it
            elif "not" in schema or "not" in schema.get("x-all", {}):
                schema = self.fold_nots(schema, defer=True)
            elif "allOf" in schema:
                branches = schema["allOf"]
                if types_of(schema) == {"object"} and isinstance(branches, list):
                    branches = fold_discriminated(branches)
                out: Any = {k: v for k, v in schema.items() if k != "allOf"}
                deferred: list = []  # NOTE: $refs to definitions being converted (recursive)
                for b in branches:
                    if isinstance(b, dict) and ("anyOf" in b or "oneOf" in b) and "properties" not in out:
                        out["x-any-first"] = True  # the combinator's properties come first
                    if isinstance(b, dict) and "$ref" in b:
                        target = resolve_pointer(self.root, b["$ref"])
                        if id(target) in chain:  # NOTE: in place, at the same location: no validator ends
                            b = False
                        elif b["$ref"] in self.stack:
                            deferred.append(b)  # NOTE: kept as a reference, see below
                            continue
                        else:
                            b = self.normalize(b, chain) if len(b) > 1 else target
                    if isinstance(b, dict) and "allOf" in b and unevaluated(out) and not unevaluated(b):
                        # NOTE: the branch's in-place keywords are the parent's: its nots and ifs
                        # are rewritten beside the parent's unevaluatedProperties (see guard)
                        out = merge(out, {k: v for k, v in b.items() if k != "allOf"})
                        if isinstance(out, dict):
                            out["allOf"] = list(out.get("allOf", [])) + list(b["allOf"])
                    else:
                        if isinstance(b, dict) and "allOf" in b:
                            # NOTE: flattened here, not after the later branches are merged: the
                            # properties keep the order in which the schema lists them
                            b = self.normalize(b, chain)
                        out = merge(out, seal(b))
                    if out is False:
                        return False
                    if out is True:
                        out = {}
                schema = out
                if deferred:
                    return self.recursive_allof(out, deferred)
            else:
                return schema
            if not isinstance(schema, dict):
                return schema
