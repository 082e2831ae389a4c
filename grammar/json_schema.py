"""JSON Schema -> regex AST (non-recursive schemas) or grammar rules (recursive ``$ref``s).

Output conventions (what a constrained model may write):
- Whitespace: by default the separators of ``json.dumps`` (``", "`` / ``": "``) or compact ones
  (``","`` / ``":"``), nothing else; ``any_whitespace=True`` allows up to ``MAX_WS`` JSON
  whitespace characters at every token boundary.
- Objects list properties in schema order. An unspecified ``additionalProperties`` is treated as
  ``false`` (the usual "strict" mode of constrained decoding); ``true`` or a schema allows extra
  properties after the declared ones.
- Strings use the encodings ``json.dumps`` produces (raw UTF-8 or ``\\uXXXX``).
- Bounded numbers are plain decimals (no exponent).
- A value with no constraints (``{}`` / ``true``) is any JSON value (a recursive rule, so such
  schemas compile to a grammar like recursive ones do).

Unsupported keywords raise :class:`GrammarError` naming the keyword.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from radixlm.grammar.ast import EMPTY, NOTHING, Node, alt, cat, char, chars, lit, opt, rep
from radixlm.grammar.automaton import dfa_from_ast
from radixlm.grammar.dfa_ops import product, union
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.json_lexical import NUMBER, string, string_literal, value_literal
from radixlm.grammar.json_scalars import number_node, string_node
from radixlm.grammar.schema_checks import disjoint, implied_types, valid_values
from radixlm.grammar.schema_merge import ANNOTATIONS, merge, resolve_pointer

MAX_WS = 20
UNSUPPORTED = (
    "patternProperties", "dependencies", "dependentRequired", "dependentSchemas", "if", "contains",
    "minContains", "maxContains", "unevaluatedItems", "$dynamicRef", "$recursiveRef",
)
ANY_RULE = "__json_value"


class SchemaConverter:
    """One conversion; see :func:`json_schema_to_ast`."""

    def __init__(self, root: Any, any_whitespace: bool, grammar_mode: bool) -> None:
        self.root = root
        self.grammar_mode = grammar_mode
        if any_whitespace:
            ws = rep(chars((9, 10), (13, 13), (32, 32)), 0, MAX_WS)
            self.comma, self.colon, self.inner = cat(ws, char(","), ws), cat(ws, char(":"), ws), ws
        else:
            self.comma, self.colon, self.inner = cat(char(","), opt(char(" "))), cat(char(":"), opt(char(" "))), EMPTY
        self.rules: dict[str, Node] = {}
        self.recursive: set[str] = set()
        self.stack: list[str] = []
        self.uid = itertools.count()
        self.merges = 0

    # --- entry points -------------------------------------------------------------------------

    def node(self, schema: Any) -> Node:
        if schema is True:
            return self.any_value()
        if schema is False:
            return NOTHING
        if not isinstance(schema, dict):
            raise GrammarError(f"a schema must be an object or a boolean, got {type(schema).__name__}")
        schema = self.normalize(schema)
        if not isinstance(schema, dict):
            return self.node(schema)
        if "$ref" in schema:
            return self.ref(schema["$ref"])
        if "x-any" in schema or "anyOf" in schema or "oneOf" in schema:
            return self.combinator(schema)
        for key in UNSUPPORTED:
            if key in schema:
                raise GrammarError(f"unsupported JSON Schema keyword: {key!r}")
        if schema.get("uniqueItems") is True and schema.get("maxItems", 2) > 1:
            raise GrammarError("unsupported JSON Schema keyword: 'uniqueItems'")
        extra = schema.get("x-all", {})
        nots = list(schema.get("x-nots", []))
        types = implied_types(schema)
        for n in nots:
            types = self.apply_not_types(schema, n, types)
        if "enum" in schema or "const" in schema:
            values = valid_values(schema, self.root)
            out = alt(*(self.literal(v) for v in values))
        elif types is None:
            out = self.any_value()
        else:
            t_list = [t for t in ("null", "boolean", "object", "array", "string", "number", "integer") if t in types]
            if "number" in types:
                t_list.remove("integer")
            out = alt(*(self.typed(schema, t, extra) for t in t_list))
        for n in nots:
            out = self.apply_not(schema, n, out)
        return out

    def ref(self, ref: str) -> Node:
        if ref in self.rules or ref in self.stack:
            self.recursive.add(ref)
            if not self.grammar_mode:
                raise _Recursive()
            return ("ref", ref)
        self.stack.append(ref)
        try:
            out = self.node(resolve_pointer(self.root, ref))
        finally:
            self.stack.pop()
        if ref in self.recursive:
            self.rules[ref] = out
            return ("ref", ref)
        return out

    def normalize(self, schema: dict) -> Any:
        """Resolve ``$ref`` with sibling assertions and flatten ``allOf`` into one schema."""
        while True:
            self.merges += 1
            if self.merges > 10_000:
                raise GrammarError("$ref / allOf nesting too deep")
            rest = {k: v for k, v in schema.items() if k not in ANNOTATIONS}
            if "$ref" in schema and len(rest) > 1:
                ref = schema["$ref"]
                if ref in self.stack:
                    raise GrammarError("unsupported: $ref to a recursive definition with sibling keywords")
                others = {k: v for k, v in schema.items() if k != "$ref"}
                target = resolve_pointer(self.root, ref)
                if isinstance(target, bool):
                    schema = merge(target, others) if target else False
                else:
                    schema = merge(target, others)
            elif "not" in schema or "not" in schema.get("x-all", {}):
                schema = self.fold_nots(schema)
            elif "allOf" in schema:
                branches = schema["allOf"]
                out: Any = {k: v for k, v in schema.items() if k != "allOf"}
                for b in branches:
                    if isinstance(b, dict) and ("anyOf" in b or "oneOf" in b) and "properties" not in out:
                        out["x-any-first"] = True  # the combinator's properties come first
                    if isinstance(b, dict) and "$ref" in b:
                        if b["$ref"] in self.stack:
                            raise GrammarError("unsupported: allOf with a recursive $ref")
                        b = self.normalize(b) if len(b) > 1 else resolve_pointer(self.root, b["$ref"])
                    out = merge(out, b)
                    if out is False:
                        return False
                schema = out
            else:
                return schema
            if not isinstance(schema, dict):
                return schema

    # --- combinators --------------------------------------------------------------------------

    def combinator(self, schema: dict) -> Node:
        rest = dict(schema)
        pending = list(rest.pop("x-any", []))
        for key in ("anyOf", "oneOf"):
            if key in rest:
                pending.insert(0, (key, rest.pop(key)))
        kind, branches = pending[0]
        if pending[1:]:
            rest["x-any"] = pending[1:]
        plain = not any(k not in ANNOTATIONS for k in rest)
        merged = []
        for b in branches:
            if isinstance(b, dict) and "$ref" in b and (plain or b["$ref"] in self.stack):
                if not plain:
                    raise GrammarError(f"unsupported: {kind} with a recursive $ref and sibling keywords")
                merged.append(b)
                continue
            if isinstance(b, dict):
                b = self.normalize(b)
                if isinstance(b, dict) and "$ref" in b and not plain:
                    b = resolve_pointer(self.root, b["$ref"])
            merged.append(b if plain else merge(b, rest) if schema.get("x-any-first") else merge(rest, b))
        if kind == "oneOf":
            norm = [self.normalize(b) if isinstance(b, dict) and "$ref" not in b else b for b in merged]
            resolved = [resolve_pointer(self.root, b["$ref"]) if isinstance(b, dict) and "$ref" in b else b for b in norm]
            for i, j in itertools.combinations(range(len(resolved)), 2):
                if not disjoint(resolved[i], resolved[j], self.root, self._string_dfa):
                    raise GrammarError("unsupported: oneOf whose branches may overlap (only disjoint oneOf is exact)")
        return alt(*(self.node(b) for b in merged))

    def _string_dfa(self, s: dict) -> Any:
        return dfa_from_ast(string_node(s, s.get("x-all", {})))

    def fold_nots(self, schema: dict) -> Any:
        """Rewrite ``not`` into positive keywords where possible; what needs an automaton
        difference (enum / const / pattern / type) is kept in ``x-nots``."""
        schema = dict(schema)
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
            keys = set(neg) - ANNOTATIONS
            pos: Any = None
            if not keys:
                return False
            if keys == {"not"}:
                pos = neg["not"]
            elif keys == {"anyOf"}:
                todo.extend(neg["anyOf"])
                continue
            elif keys == {"required"} and len(neg["required"]) == 1:
                pos = {"type": "object", "properties": {neg["required"][0]: False}}
            elif keys <= {"minimum", "exclusiveMinimum"} or keys <= {"maximum", "exclusiveMaximum"}:
                pos = _negate_bound(neg)
            elif keys == {"type"} or keys <= {"enum", "const"} or keys == {"pattern"} or (
                    keys == {"type", "pattern"} and neg.get("type") == "string"):
                keep.append(neg)
                continue
            else:
                raise GrammarError("unsupported JSON Schema keyword: 'not' (with " + ", ".join(sorted(keys)) + ")")
            schema = merge(schema, pos)
            if not isinstance(schema, dict):
                return schema
        if keep:
            schema["x-nots"] = keep
        return schema

    def apply_not_types(self, schema: dict, neg: Any, types: set[str] | None) -> set[str] | None:
        if isinstance(neg, dict) and set(neg) - ANNOTATIONS == {"type"}:
            banned = implied_types({"type": neg["type"]}) or set()
            base = set(types) if types is not None else {"null", "boolean", "object", "array", "string", "number", "integer"}
            left = base - banned
            if "number" in base and "number" not in left and "integer" in left:
                left.discard("integer")
            return left
        return types

    def apply_not(self, schema: dict, neg: Any, out: Node) -> Node:
        if not isinstance(neg, dict):
            return NOTHING if neg is True else out
        keys = set(neg) - ANNOTATIONS
        if keys == {"type"}:
            return out
        if keys <= {"enum", "const"} or (keys == {"pattern"} or keys == {"type", "pattern"} and neg.get("type") == "string"):
            if "pattern" in keys:
                banned = self.node({"type": "string", "pattern": neg["pattern"]})
            else:
                vals = [neg["const"]] if "const" in neg else list(neg.get("enum", []))
                if any(isinstance(v, float) or (isinstance(v, (int, float)) and not isinstance(v, bool)
                       and "number" in (implied_types(schema) or {"number"})) for v in vals):
                    raise GrammarError("unsupported JSON Schema keyword: 'not' (numbers)")
                banned = alt(*(self.literal(v) for v in vals))
            if banned == NOTHING:
                return out
            return ("dfa", product(dfa_from_ast(out), dfa_from_ast(banned), "diff"))
        raise GrammarError("unsupported JSON Schema keyword: 'not'")

    # --- values -------------------------------------------------------------------------------

    def literal(self, value: Any) -> Node:
        return value_literal(value, self.comma, self.colon, self.inner)

    def any_value(self) -> Node:
        """Any JSON value: a recursive rule, so only in grammar mode."""
        if not self.grammar_mode:
            raise _Recursive()
        if ANY_RULE not in self.rules:
            self.rules[ANY_RULE] = NOTHING
            self.rules[ANY_RULE] = self._any(("ref", ANY_RULE))
        return ("ref", ANY_RULE)

    def _any(self, inner: Node | None) -> Node:
        scalars = alt(string(), NUMBER, lit("true"), lit("false"), lit("null"))
        if inner is None:
            arr = cat(char("["), self.inner, char("]"))
            obj = cat(char("{"), self.inner, char("}"))
        else:
            items = opt(cat(inner, rep(cat(self.comma, inner), 0, None)))
            arr = cat(char("["), self.inner, items, self.inner, char("]"))
            kv = cat(string(), self.colon, inner)
            obj = cat(char("{"), self.inner, opt(cat(kv, rep(cat(self.comma, kv), 0, None))), self.inner, char("}"))
        return alt(scalars, arr, obj)

    def typed(self, schema: dict, t: str, extra: dict) -> Node:
        if t == "null":
            return lit("null")
        if t == "boolean":
            return alt(lit("true"), lit("false"))
        if t in ("integer", "number"):
            return number_node(schema, extra, t == "integer")
        if t == "string":
            return string_node(schema, extra)
        if t == "array":
            return self.array(schema)
        return self.object(schema)

    def array(self, s: dict) -> Node:
        items = s.get("items")
        prefix = s.get("prefixItems")
        if isinstance(items, list):  # draft 4-7 tuple form
            prefix, rest = items, s.get("additionalItems", True)
        else:
            rest = True if items is None else items
        prefix = list(prefix or [])
        lo = int(s.get("minItems", 0))
        hi = s.get("maxItems")
        hi = None if hi is None else int(hi)
        rest_node = self.node(rest) if rest is not False else NOTHING
        if rest_node == NOTHING:
            hi = len(prefix) if hi is None else min(hi, len(prefix))
        if hi is not None and hi < lo:
            return NOTHING
        nodes = [self.node(p) for p in prefix]

        def elem(i: int) -> Node:
            return nodes[i] if i < len(nodes) else rest_node

        def tail(i: int) -> Node:  # elements i.. after at least one, each after a comma
            if hi is not None and i >= hi:
                return EMPTY
            if i >= len(nodes):
                return rep(cat(self.comma, rest_node), max(lo - i, 0), None if hi is None else hi - i)
            more = cat(self.comma, elem(i), tail(i + 1))
            return more if i < lo else opt(more)

        body = cat(elem(0), tail(1)) if hi is None or hi > 0 else EMPTY
        if lo == 0 and body != EMPTY:
            body = opt(body)
        return cat(char("["), self.inner, body, self.inner, char("]"))

    def object(self, s: dict) -> Node:
        props = dict(s.get("properties", {}))
        required = list(dict.fromkeys(s.get("required", [])))
        explicit = "additionalProperties" in s or "unevaluatedProperties" in s
        # NOTE: strict by default (no extra keys) only where properties are declared; a free-form
        # object ({"type": "object"}) keeps the JSON Schema default.
        addl = s.get("additionalProperties", s.get("unevaluatedProperties", not props))
        names = s.get("propertyNames")
        for k in required:
            if k not in props:
                props[k] = addl if explicit else True
        lo_p = int(s.get("minProperties", 0))
        hi_p = s.get("maxProperties")
        hi_p = None if hi_p is None else int(hi_p)
        entries = []
        for k, v in props.items():
            node = NOTHING if v is False else self.node(v)
            if names is not None and node != NOTHING:
                key_dfa = dfa_from_ast(string_literal(k))
                if not product(key_dfa, dfa_from_ast(self.node(names)), "and").start:
                    node = NOTHING
            if node == NOTHING:
                if k in required:
                    return NOTHING
                continue
            entries.append((cat(string_literal(k), self.colon, node), k in required))
        extra_kv = NOTHING
        if addl is not False:
            key = product(dfa_from_ast(string()), union([dfa_from_ast(string_literal(k)) for k in props]), "diff") if props else dfa_from_ast(string())
            if names is not None:
                key = product(key, dfa_from_ast(self.node(names)), "and")
            value = self.node(addl)
            if key.start and value != NOTHING:
                extra_kv = cat(("dfa", key), self.colon, value)
        uid = next(self.uid)
        n = len(entries)
        counted = lo_p > 0 or hi_p is not None
        memo: dict[tuple[int, int], Node] = {}

        def extras(c: int, first: bool) -> Node:
            need = max(lo_p - c, 0)
            room = None if hi_p is None else hi_p - c
            if extra_kv == NOTHING or room == 0:
                return EMPTY if need == 0 else NOTHING
            if not first:
                return rep(cat(self.comma, extra_kv), need, room)
            more = rep(cat(self.comma, extra_kv), max(need - 1, 0), None if room is None else room - 1)
            return opt(cat(extra_kv, more)) if need == 0 else cat(extra_kv, more)

        def rest(i: int, c: int) -> Node:  # properties i.. after c emitted (c >= 1)
            ck = c if counted else 1
            if (i, ck) in memo:
                return memo[(i, ck)]
            if i == n:
                out = extras(c, False)
            else:
                kv, req = entries[i]
                take = cat(self.comma, kv, rest(i + 1, c + 1)) if hi_p is None or c < hi_p else NOTHING
                out = take if req else alt(take, rest(i + 1, c))
            out = ("share", (uid, i, ck), out) if out not in (EMPTY, NOTHING) else out
            memo[(i, ck)] = out
            return out

        def first(i: int) -> Node:
            if i == n:
                return extras(0, True)
            kv, req = entries[i]
            take = cat(kv, rest(i + 1, 1)) if hi_p is None or hi_p >= 1 else NOTHING
            return take if req else alt(take, first(i + 1))

        body = first(0)
        if body == NOTHING:
            return NOTHING
        return ("scope", cat(char("{"), self.inner, body, self.inner, char("}")))


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


class _Recursive(Exception):
    """Raised in regex mode on the first recursive $ref: retry as a grammar."""


def parse_schema(schema: str | dict | bool) -> Any:
    if isinstance(schema, str):
        try:
            return json.loads(schema)
        except json.JSONDecodeError as e:
            raise GrammarError(f"json_schema is not valid JSON: {e}") from None
    if isinstance(schema, (dict, bool)):
        return schema
    raise GrammarError(f"json_schema must be a str or dict, got {type(schema).__name__}")


def json_schema_to_ast(schema: str | dict | bool, any_whitespace: bool = False) -> tuple[Node, dict[str, Node]]:
    """Convert a JSON Schema.

    Returns:
        ``(root, rules)``: ``rules`` is empty for a non-recursive schema (``root`` is then a plain
        regex AST); otherwise ``root`` and the rules contain ``("ref", name)`` nodes.
    Raises:
        GrammarError: invalid JSON, or an unsupported keyword (named in the message).
    """
    root = parse_schema(schema)
    try:
        conv = SchemaConverter(root, any_whitespace, grammar_mode=False)
        return conv.node(root), {}
    except _Recursive:
        conv = SchemaConverter(root, any_whitespace, grammar_mode=True)
        node = conv.node(root)
        return node, conv.rules
    except RecursionError:
        raise GrammarError("schema nesting too deep") from None
