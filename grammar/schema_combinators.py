"""JSON Schema ``anyOf`` / ``oneOf`` -> regex AST (a mixin of the schema converter)."""

from __future__ import annotations

import itertools
import json
from typing import Any

from radixlm.grammar.ast import Node, alt
from radixlm.grammar.automaton import dfa_from_ast
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.json_scalars import string_node
from radixlm.grammar.schema_checks import disjoint, unsatisfiable
from radixlm.grammar.schema_merge import ASSERTIONS, merge, resolve_pointer, seal, types_of, unevaluated
from radixlm.grammar.schema_oneof import exclusive_branches


MAX_REF_CHAIN = 8  # $ref to $ref ... that ``_prepared`` follows
MERGED_NESTING = 3  # see ``check_merged_nesting``


def closed_over(branch: Any, late: dict) -> dict:
    """What ``unevaluatedProperties`` / ``unevaluatedItems`` of ``late`` require of an instance of
    ``branch``, counting as evaluated only the keys and positions ``branch`` declares at its top
    level (its nested applicators' are not counted: stricter, never looser)."""
    b = branch if isinstance(branch, dict) else {}
    out: dict = {}
    u, ui = late.get("unevaluatedProperties", True), late.get("unevaluatedItems", True)
    if u is not True and "additionalProperties" not in b:
        out["properties"] = {k: True for k in b.get("properties", {})}
        out["patternProperties"] = {p: True for p in b.get("patternProperties", {})}
        out["additionalProperties"] = u
    if ui is not True and "items" not in b:
        out["prefixItems"] = [True] * len(b.get("prefixItems", []))
        out["items"] = ui
    return out


def _text_key(branch: dict) -> str | None:
    """A memo name for a combinator branch: its canonical JSON text (None where not JSON)."""
    try:
        return "#branch&" + json.dumps(branch, sort_keys=True)
    except (TypeError, ValueError):
        return None


class CombinatorMixin:
    """``combinator`` (``anyOf`` / ``oneOf`` / pending ``x-any``) and ``merged_key`` of
    :class:`radixlm.grammar.json_schema.SchemaConverter`."""

    root: Any
    stack: list[str]

    def combinator(self, schema: dict) -> Node:
        """The first pending ``anyOf`` / ``oneOf`` of ``schema``, each branch merged with the
        other keywords (a ``$ref`` branch with siblings converted once per name, see
        ``merged_key``); overlapping ``oneOf`` branches narrowed until exclusive."""
        rest = dict(schema)
        pending = list(rest.pop("x-any", []))
        for key in ("anyOf", "oneOf"):
            if key in rest:
                pending.insert(0, (key, rest.pop(key)))
        kind, branches = pending[0]
        if pending[1:]:
            rest["x-any"] = pending[1:]
        late = None
        if kind == "oneOf" and unevaluated(rest):
            # NOTE: which oneOf branches hold is judged without the parent's unevaluatedProperties
            # (a branch that fails only by it still counts): merged after the narrowing
            late = {k: rest.pop(k) for k in ("unevaluatedProperties", "unevaluatedItems") if k in rest}
        plain = not any(k in ASSERTIONS for k in rest)  # NOTE: unknown keywords constrain nothing
        merged = []
        keys: list[str | None] = []  # per branch: its memo name when it is a $ref merged with ``rest``
        recursive = any(isinstance(b, dict) and b.get("$ref") in self.stack for b in branches)
        for b in branches:
            keys.append(None)
            if isinstance(b, dict) and "$ref" in b and plain:
                merged.append(b)
                continue
            if isinstance(b, dict) and ("$ref" in b or (late is None and not unevaluated(rest))):
                # NOTE: beside the parent's unevaluatedProperties a branch is normalized merged
                # with it: its nots and ifs are rewritten knowing it (schema_merge.guard)
                b = self.normalize(b)
                if isinstance(b, dict) and "$ref" in b and not plain:
                    # NOTE: the same target with the same siblings is converted once (a schema
                    # whose definitions combine each other this way grows exponentially inlined;
                    # one that comes back to itself never ends: a recursive target is inlined
                    # once under this name, its own $refs staying references)
                    if self.types_apart({"$ref": b["$ref"], **rest}):
                        keys.pop()  # NOTE: accepts nothing (a oneOf holds without it too)
                        continue
                    keys[-1] = self.merged_key({"$ref": b["$ref"], **rest}, bool(schema.get("x-any-first")))
                    b = resolve_pointer(self.root, b["$ref"])
            b = seal(b)  # NOTE: a branch's unevaluated* sees only the branch
            merged.append(b if plain else merge(b, rest) if schema.get("x-any-first") else merge(rest, b))
        if kind == "oneOf":
            norm = [self.normalize(b) if isinstance(b, dict) and "$ref" not in b else b for b in merged]
            resolved = [resolve_pointer(self.root, b["$ref"]) if isinstance(b, dict) and "$ref" in b else b for b in norm]
            overlap = any(not self._disjoint(resolved[i], resolved[j])
                          for i, j in itertools.combinations(range(len(resolved)), 2))
            if overlap:
                raw = [resolve_pointer(self.root, b["$ref"]) if isinstance(b, dict) and "$ref" in b else b
                       for b in merged]
                merged = exclusive_branches([self.normalize(b) if isinstance(b, dict) else b for b in resolved],
                                            self._disjoint, self._negated, self._prepared)
                keys = [None] * len(merged)
                if late is not None:
                    # NOTE: narrowed branches hold negations: the parent's unevaluated* applies to
                    # all but what the branch itself declares (sound: see closed_over)
                    merged = [merge(n, closed_over(r, late)) if isinstance(n, dict) else n
                              for n, r in zip(merged, raw)]
                    late = None
        if late is not None:
            merged = [merge(b, late) if isinstance(b, dict) else b for b in merged]
            keys = [None] * len(merged)
        if recursive and not plain:
            # NOTE: branches merged (narrowed) with a recursive target inlined meet this very
            # combinator again inside it: named by their text, the same branch ends as a rule
            keys = [k if k is not None or not isinstance(b, dict) else _text_key(b) for b, k in zip(merged, keys)]
        # NOTE: a contradictory branch (conditionals merged into each other: two discriminator
        # values at once) is dropped before it is expanded further
        return alt(*(self.node(b) if k is None else self.shared(k, lambda b=b: b)
                     for b, k in zip(merged, keys) if k is not None or not unsatisfiable(b)))

    def merged_key(self, schema: dict, first: bool = False) -> str | None:
        """The memo name of a ``$ref`` with sibling assertions (None for anything else): the
        target and the siblings, in canonical JSON (``first``: the target's properties first)."""
        ref = schema.get("$ref")
        # NOTE: only assertions name it: annotations and unknown keywords (a generator's
        # ``_metadata`` beside every ``$ref``) constrain nothing, and kept in the name they made
        # each use of one target a fresh conversion with fresh automata
        rest = {k: v for k, v in schema.items() if k != "$ref" and k in ASSERTIONS}
        if not isinstance(ref, str) or not rest:
            return None
        try:
            text = json.dumps(rest, sort_keys=True)
        except (TypeError, ValueError):
            return None
        key = f"{ref}&{int(first)}{text}"
        self.__dict__.setdefault("_merged_refs", {})[key] = ref
        return key

    def types_apart(self, schema: dict) -> bool:
        """Whether the ``type`` of a ``$ref`` 's target and that of its siblings share no instance
        type (the pair accepts nothing: never expanded, see ``merged_key``)."""
        target = resolve_pointer(self.root, schema["$ref"])
        if not isinstance(target, dict):
            return False
        a, b = types_of(target), types_of(schema)
        return a is not None and b is not None and not a & b

    def check_merged_nesting(self, key: str) -> None:
        """Refuse a ``merged_key`` conversion nested in ``MERGED_NESTING`` others of the same
        ``$ref`` (a recursion through ``$ref`` s with siblings whose siblings grow at each level:
        a new name each time, never a rule) with a GrammarError, before it inlines further."""
        names = self.__dict__.get("_merged_refs", {})
        ref = names.get(key)
        if ref is not None and sum(names.get(s) == ref for s in self.stack) >= MERGED_NESTING:
            raise GrammarError(f"unsupported: allOf with a recursive $ref (or a $ref with siblings) "
                               f"nested {MERGED_NESTING} levels with other siblings each time ({ref})")

    def _prepared(self, s: Any) -> Any:
        """``s`` with its top-level ``$ref`` resolved and ``allOf`` merged (``normalize``); None
        for a ``$ref`` to a definition being converted (recursive)."""
        for _ in range(MAX_REF_CHAIN):
            if not isinstance(s, dict):
                return s
            ref = s.get("$ref")
            if isinstance(ref, str) and ref in self.stack:
                return None
            if isinstance(ref, str) and not any(k in ASSERTIONS for k in s if k != "$ref"):
                s = resolve_pointer(self.root, ref)
                continue
            s = self.normalize(s)
            if not isinstance(s, dict) or "$ref" not in s:
                return s
        return None

    def _disjoint(self, a: Any, b: Any) -> bool:
        return disjoint(a, b, self.root, self._string_dfa)

    def _negated(self, schema: Any) -> Any:
        try:
            return self.fold_nots({"not": schema})
        except GrammarError:
            return None

    def _negatable(self, cond: Any) -> bool:
        try:
            self.fold_nots({"not": cond})
            return True
        except GrammarError:
            return False

    def _string_dfa(self, s: dict) -> Any:
        return dfa_from_ast(string_node(s, s.get("x-all", {})))

    def recursive_allof(self, out: dict, deferred: list) -> Any:
        """The ``allOf`` whose ``$ref`` branches ``deferred`` name definitions being converted
        (recursive), its other branches merged into ``out``: a ``$ref`` with siblings (the first
        of them beside ``out``, the others in an ``allOf`` there). ``_node`` converts it under its
        ``merged_key`` name: the target merged with the siblings once (exact: ``allOf`` of a
        ``$ref`` and schemas is the ``$ref`` with those siblings), the target's own ``$ref`` s
        staying references, so a recursion through this ``allOf`` meets the name again and ends
        as a rule reference instead of inlining the target at every level."""
        if "$ref" in out:
            raise GrammarError("unsupported: allOf with a recursive $ref (beside another $ref)")
        first, *others = deferred
        siblings = {k: v for k, v in first.items() if k != "$ref"}
        got = merge(out, {**siblings, "allOf": others} if others else siblings)
        if got is False:
            return False
        return {**(got if isinstance(got, dict) else {}), "$ref": first["$ref"]}
