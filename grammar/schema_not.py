"""JSON Schema ``not``: rewritten into positive keywords where possible, else an automaton
difference for the forms whose language is exact (a mixin of the schema converter)."""

from __future__ import annotations

from typing import Any

from radixlm.grammar.ast import NOTHING, Node, alt
from radixlm.grammar.automaton import dfa_from_ast
from radixlm.grammar.budget import check_budget
from radixlm.grammar.dfa_ops import product
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.json_containers import ANY_RULE
from radixlm.grammar.json_lexical import FRACTION, literal_exact
from radixlm.grammar.schema_checks import implied_types
from radixlm.grammar.schema_merge import ANNOTATIONS, ASSERTIONS, guard, merge, resolve_pointer


# keyword -> (instance type, the opposite keyword, whether it is a lower bound)
_COUNTS = {
    "minLength": ("string", "maxLength", True), "maxLength": ("string", "minLength", False),
    "minItems": ("array", "maxItems", True), "maxItems": ("array", "minItems", False),
    "minProperties": ("object", "maxProperties", True), "maxProperties": ("object", "minProperties", False),
}


NOT_ONEOF_MAX = 4  # branches of a negated oneOf (its positive form has one anyOf branch per pair)
_TOGETHER = {"exclusiveMinimum": "minimum", "exclusiveMaximum": "maximum", "additionalProperties": "properties",
             "patternProperties": "properties", "additionalItems": "items", "prefixItems": "items",
             "minContains": "contains", "maxContains": "contains", "then": "if", "else": "if"}


def _groups(neg: dict, keys: set[str]) -> list[dict]:
    """``neg``'s keywords split into groups that constrain an instance independently."""
    groups: dict[str, dict] = {}
    for k in sorted(keys):
        lead = _TOGETHER.get(k, k)
        if k in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(neg[k], bool):
            lead = k  # draft 6+: a bound of its own
        groups.setdefault(lead, {})[k] = neg[k]
    return list(groups.values())


class NotMixin:
    """``fold_nots`` / ``apply_not`` of :class:`radixlm.grammar.json_schema.SchemaConverter`."""

    def fold_nots(self, schema: dict, defer: bool = False) -> Any:
        """Rewrite ``not`` into positive keywords where possible; what needs an automaton
        difference (enum / const / pattern / type) is kept in ``x-nots``. With ``defer``, a ``not``
        that has no such form is kept in ``x-checks`` (``{"not": s}`` entries): exact where the
        schema also has ``enum`` / ``const`` (the values are filtered by a validator), a
        compile error naming the keyword otherwise (see :func:`unchecked_error`)."""
        schema = dict(schema)
        checks = list(schema.get("x-checks", []))
        extra = dict(schema.get("x-all", {}))
        todo = ([schema.pop("not")] if "not" in schema else []) + list(extra.pop("not", []))
        schema["x-all"] = extra
        keep = list(schema.get("x-nots", []))
        while todo:
            neg = todo.pop()
            if neg is False:
                continue
            if neg is True:
                return False
            if not isinstance(neg, dict):
                raise GrammarError("a 'not' schema must be an object or a boolean")
            if set(neg) == {"$ref"} and neg["$ref"] not in self.stack:
                neg = resolve_pointer(self.root, neg["$ref"])
                todo.append(neg)
                continue
            keys = set(neg) & ASSERTIONS
            if not keys:
                return False
            if keys == {"anyOf"}:
                todo.extend(neg["anyOf"])
                continue
            if len(keys) == 1 and keys <= {"enum", "const"} and _numbers(neg):
                # NOTE: a number other than the values: open intervals between them (positive);
                # the other values stay an automaton difference
                others = [v for v in _values(neg) if not _is_number(v)]
                if others:
                    keep.append({"enum": others})
                pos = _not_numbers(_numbers(neg))
                schema = merge(schema, guard(pos, schema))
                if not isinstance(schema, dict):
                    return schema
                continue
            if keys == {"type"} or keys <= {"enum", "const"} or keys == {"pattern"} or (
                    keys == {"type", "pattern"} and neg.get("type") == "string"):
                keep.append(neg)
                continue
            try:
                pos = self._positive(neg, keys)
            except GrammarError:
                if not defer:
                    raise
                checks.append({"not": neg})
                continue
            # NOTE: a not's annotations never count: guarded against unevaluatedProperties
            schema = merge(schema, guard(pos, schema))
            if not isinstance(schema, dict):
                return schema
        if keep:
            schema["x-nots"] = keep
        if checks:
            schema["x-checks"] = checks
        return schema

    def _positive(self, neg: dict, keys: set[str]) -> Any:
        """A schema for ``not neg`` without ``not`` at its top level (raises when none is known)."""
        if keys == {"not"}:
            return neg["not"]
        if keys == {"allOf"}:
            return {"anyOf": [self.fold_nots({"not": b}) for b in neg["allOf"]]}
        if keys == {"oneOf"} and isinstance(neg["oneOf"], list) and len(neg["oneOf"]) <= NOT_ONEOF_MAX:
            # NOTE: not exactly one branch = none of them, or two of them at once
            branches = neg["oneOf"]
            pairs = [{"allOf": [a, b]} for i, a in enumerate(branches) for b in branches[i + 1:]]
            return {"anyOf": [self.fold_nots({"not": {"anyOf": branches}})] + pairs}
        if keys == {"required"}:
            if not neg["required"]:
                return False
            return {"type": "object", "anyOf": [{"properties": {k: False}} for k in neg["required"]]}
        if keys == {"properties"} and isinstance(neg["properties"], dict):
            if not neg["properties"]:
                return False
            # NOTE: an object in which some declared property is present and fails its schema
            return {"type": "object", "anyOf": [{"required": [k], "properties": {k: self.fold_nots({"not": v})}}
                                                for k, v in neg["properties"].items()]}
        if keys == {"items"} and isinstance(neg["items"], (dict, bool)):
            return {"type": "array", "contains": self.fold_nots({"not": neg["items"]})}
        if keys == {"contains"}:
            # NOTE: an array none of whose items satisfies it
            return {"type": "array", "items": self.fold_nots({"not": neg["contains"]})}
        if keys == {"propertyNames"}:
            return _some_name(neg["propertyNames"])
        if len(keys) == 1 and next(iter(keys)) in _COUNTS:
            key = next(iter(keys))
            kind, other, is_min = _COUNTS[key]
            bound = int(neg[key])
            if is_min and bound <= 0:
                return False
            return {"type": kind, other: bound - 1 if is_min else bound + 1}
        if keys <= {"minimum", "exclusiveMinimum"} or keys <= {"maximum", "exclusiveMaximum"}:
            return _negate_bound(neg)
        if len(_groups(neg, keys)) > 1:
            # NOTE: not (A and B) = (not A) or (not B), for independent keyword groups
            return {"anyOf": [self.fold_nots({"not": g}) for g in _groups(neg, keys)]}
        raise GrammarError("unsupported JSON Schema keyword: 'not' (with " + ", ".join(sorted(keys)) + ")")

    def apply_not_types(self, schema: dict, neg: Any, types: set[str] | None) -> set[str] | None:
        """The instance types left by ``not {type: ...}`` (``x-fraction``: numbers that are not
        integers, see :meth:`fraction`)."""
        if isinstance(neg, dict) and set(neg) & ASSERTIONS == {"type"}:
            banned = implied_types({"type": neg["type"]}) or set()
            base = set(types) if types is not None else {"null", "boolean", "object", "array", "string", "number", "integer"}
            left = base - banned
            if "number" in base and "number" not in left and "integer" in left:
                left.discard("integer")
            if "integer" in banned and "number" in left:  # NOTE: numbers that are not integers
                left.discard("number")
                left.add("x-fraction")
            if "number" in banned:
                left.discard("x-fraction")
            return left
        return types

    def fraction(self, schema: dict, extra: dict) -> Node:
        """The numbers of ``schema`` that are not integers, as plain decimals (inside a grammar's
        rule of its own: refused, a sound restriction)."""
        node = self.typed(schema, "number", extra)
        if self.walk.has_ref(node):
            return NOTHING
        got = product(dfa_from_ast(node), dfa_from_ast(FRACTION), "and")
        return ("dfa", got) if got.start else NOTHING

    def apply_not(self, schema: dict, neg: Any, out: Node) -> Node:
        if not isinstance(neg, dict):
            return NOTHING if neg is True else out
        keys = set(neg) & ASSERTIONS
        if keys == {"type"}:
            return out
        if keys <= {"enum", "const"} or (keys == {"pattern"} or keys == {"type", "pattern"} and neg.get("type") == "string"):
            if "pattern" in keys:
                # NOTE: an automaton, never a grammar's leaf rule (a large pattern in a grammar)
                split, self.split_leaves = self.split_leaves, False
                try:
                    banned = self.node({"type": "string", "pattern": neg["pattern"]})
                finally:
                    self.split_leaves = split
            else:
                vals = [neg["const"]] if "const" in neg else list(neg.get("enum", []))
                if any(isinstance(v, float) or (isinstance(v, (int, float)) and not isinstance(v, bool)
                       and "number" in (implied_types(schema) or {"number"})) for v in vals):
                    raise GrammarError("unsupported JSON Schema keyword: 'not' (numbers)")
                if not all(literal_exact(v) for v in vals):
                    raise GrammarError("unsupported JSON Schema keyword: 'not' (an enum / const array or object "
                                       "holding numbers or many keys)")
                # NOTE: each literal and the difference below cost ~20 us, met 10^5 times in a
                # schema whose conditionals multiply (template.json), unseen by the budget
                check_budget("converting 'not'", 20 * len(vals) + 10)
                banned = alt(*(self.literal(v) for v in vals))
            if banned == NOTHING:
                return out
            return self._without(out, dfa_from_ast(banned), keys)
        raise GrammarError("unsupported JSON Schema keyword: 'not'")

    def _without(self, out: Node, banned: Any, keys: set[str]) -> Node:
        """``out`` minus the regular language ``banned`` (a byte DFA). A plain regex is an
        automaton difference; in a grammar, ``out`` may hold rules (any JSON value, a long scalar
        as a rule of its own): the difference goes into the alternatives of ``out`` and of those
        rules, and an alternative that still holds a rule is kept whole when no string of
        ``banned`` starts with a byte it can start with (``[`` / ``{`` against banned strings).
        Raises GrammarError naming ``not`` where that does not decide it."""
        if not self.walk.has_ref(out):
            got = product(dfa_from_ast(out), banned, "diff")
            return ("dfa", got) if got.start else NOTHING
        if out[0] == "ref" and out[1] in self.rules:
            body = self.rules[out[1]]
            if out[1] == ANY_RULE:
                body = self._any(out)  # one level unrolled: its inner values stay the rule
            elif self.walk.has_ref(body):
                body = None
            if body is not None:
                got = self._without(body, banned, keys)
                return self.leaf_rule(got) if got[0] == "dfa" else got
        elif out[0] == "alt":
            return alt(*(self._without(it, banned, keys) for it in out[1]))
        elif out[0] in ("scope", "cold"):
            return self._without(out[1], banned, keys)
        first = _first_bytes(out)
        if first is not None and not first & _dfa_first_bytes(banned):
            return out
        raise GrammarError("unsupported JSON Schema keyword: 'not' (with " + ", ".join(sorted(keys)) +
                           ", around a recursive value)")

    # --- values -------------------------------------------------------------------------------



def _dfa_first_bytes(dfa: Any) -> set[int]:
    """The bytes a non-empty string of ``dfa`` may start with."""
    if not dfa.start:
        return set()
    return {b for b in range(256) if dfa.trans[dfa.start, b]}


def _first_bytes(node: Node) -> set[int] | None:
    """The bytes a string of ``node`` may start with, where the node starts with a literal set of
    ASCII characters or an automaton (None: not known, e.g. a rule or a nullable prefix)."""
    while node[0] in ("scope", "cold", "share"):
        node = node[2] if node[0] == "share" else node[1]
    if node[0] == "cat" and node[1]:
        node = node[1][0]
        while node[0] in ("scope", "cold", "share"):
            node = node[2] if node[0] == "share" else node[1]
    if node[0] == "set" and node[1] and all(hi < 128 for _, hi in node[1]):
        return {b for lo, hi in node[1] for b in range(lo, hi + 1)}
    if node[0] == "dfa":
        if node[1].start and node[1].accept[node[1].start]:
            return None  # NOTE: nullable: the bytes after it may come first
        return _dfa_first_bytes(node[1])
    return None


def unchecked_error(schema: dict) -> GrammarError | None:
    """The compile error for ``x-checks`` that no ``enum`` / ``const`` lets a validator check."""
    checks = schema.get("x-checks")
    if not checks or "enum" in schema or "const" in schema:
        return None
    neg = checks[0]["not"]
    keys = sorted(set(neg) & ASSERTIONS) if isinstance(neg, dict) else []
    return GrammarError("unsupported JSON Schema keyword: 'not' (with " + ", ".join(keys) + ")")


def _some_name(names: Any) -> Any:
    """``not {propertyNames: names}``: an object with a key that fails ``names`` (the forms whose
    negation is a plain "some key is present"; else a compile error)."""
    if names is False:
        return {"type": "object", "minProperties": 1}
    if names is True or names == {}:
        return False
    inner = names.get("not") if isinstance(names, dict) and set(names) & ASSERTIONS == {"not"} else None
    if isinstance(inner, dict) and set(inner) & ASSERTIONS <= {"enum", "const"} and set(inner) & ASSERTIONS:
        vals = [inner["const"]] if "const" in inner else list(inner["enum"])
        if "const" in inner and "enum" in inner:
            vals = [v for v in vals if v in inner["enum"]]
        keys = [v for v in vals if isinstance(v, str)]
        if not keys:
            return False
        return {"type": "object", "anyOf": [{"required": [k]} for k in keys]}
    raise GrammarError("unsupported JSON Schema keyword: 'not' (with propertyNames)")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _values(neg: dict) -> list:
    return [neg["const"]] if "const" in neg else list(neg["enum"]) if isinstance(neg.get("enum"), list) else []


def _numbers(neg: dict) -> list:
    """The numeric values of ``neg``'s ``enum`` / ``const``, ascending, without duplicates."""
    return sorted({v for v in _values(neg) if _is_number(v)})


def _not_numbers(nums: list) -> dict:
    """Any instance but the numbers ``nums`` (ascending): the other types, or a number in one of
    the open intervals between them."""
    branches: list[Any] = [{"type": ["null", "boolean", "object", "array", "string"]}]
    bounds = [None] + list(nums) + [None]
    for lo, hi in zip(bounds, bounds[1:]):
        part: dict = {"type": "number"}
        if lo is not None:
            part["exclusiveMinimum"] = lo
        if hi is not None:
            part["exclusiveMaximum"] = hi
        branches.append(part)
    return {"anyOf": branches}


def _negate_bound(neg: dict) -> dict:
    """``not {minimum: m}`` -> a number below m (and so on for the other bounds)."""
    out: dict = {"type": "number"}
    if "minimum" in neg:
        out["maximum" if neg.get("exclusiveMinimum") is True else "exclusiveMaximum"] = neg["minimum"]
    elif "exclusiveMinimum" in neg and not isinstance(neg["exclusiveMinimum"], bool):
        out["maximum"] = neg["exclusiveMinimum"]
    if "maximum" in neg:
        out["minimum" if neg.get("exclusiveMaximum") is True else "exclusiveMinimum"] = neg["maximum"]
    elif "exclusiveMaximum" in neg and not isinstance(neg["exclusiveMaximum"], bool):
        out["minimum"] = neg["exclusiveMaximum"]
    return out

