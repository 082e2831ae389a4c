"""JSON Schema -> regex AST (non-recursive schemas) or grammar rules (recursive ``$ref``s).

Output conventions (what a constrained model may write):
- Whitespace: the separators of ``json.dumps`` (``", "`` / ``": "``) or compact ones (``","`` /
  ``":"``), nothing else, each in either style unless ``separators`` says otherwise
  (:mod:`radixlm.grammar.json_separators`); ``any_whitespace=True`` allows up to ``MAX_WS`` JSON
  whitespace characters at every token boundary.
- Objects: declared properties in any order when the object has at most ``ANY_ORDER_MAX`` (4) of
  them and the automaton of all orders stays small, else in schema order or with the required ones
  first in the order ``required`` lists them, then (in a single-DFA schema, within
  ``RELAX_BUDGET``) the optional ones in any order or nearly in order
  (:mod:`radixlm.grammar.json_orders`) (a sound restriction); also, in objects up to
  ``SORTED_BUDGET``, keys sorted (``sort_keys``);
  each at most once, every required one present. Undeclared properties follow the declared ones:
  allowed when ``additionalProperties`` is absent (JSON Schema semantics; in a single-DFA schema
  values nested at most ``EXTRA_DEPTH_ROOT`` (3) levels in the outermost object, ``EXTRA_DEPTH``
  (1) in inner ones; none with ``closed`` per compile or ``RADIXLM_JSON_EXTRAS=0`` globally),
  ``true`` or a schema; their keys are written as ``json.dumps`` does, so a declared key never
  comes back under another spelling (:mod:`.json_containers`).
- ``not``: rewritten into positive keywords where an exact form exists
  (:mod:`radixlm.grammar.schema_not`); otherwise, where the schema enumerates its values
  (``enum`` / ``const``), the values are filtered by a validator (exact); else a compile error
  naming the keyword. Unknown keywords constrain nothing (also under ``not`` and in ``allOf``).
- ``oneOf`` branches are exclusive when proven disjoint over what each branch may accept (not what
  the converter emits for it; through nested ``anyOf`` / ``oneOf`` branches and objects whose
  allowed keys differ); else narrowed (see below). ``not oneOf`` is "none of the branches, or two".
- Strings use the encodings ``json.dumps`` produces (raw UTF-8 or ``\\uXXXX``).
- Bounded numbers are plain decimals (no exponent).
- A value with no constraints (``{}`` / ``true``) is any JSON value (a recursive rule, so such
  schemas compile to a grammar like recursive ones do).

- Sound restrictions (valid instances that may be rejected, never an invalid one accepted):
  ``maxLength`` above 512 is lowered to 512 (and, counted with a pattern of ``n`` DFA states, to
  about ``PATTERN_LENGTH_WORK / n``); overlapping ``oneOf`` branches are narrowed until
  provably exclusive (:mod:`radixlm.grammar.schema_oneof`); ``if`` without an expressible
  ``not if`` becomes ``then and (if or else)`` (:mod:`radixlm.grammar.schema_rewrite`);
  ``patternProperties`` keys matching three patterns (or two of more than four) are left out; number bounds beyond
  ``BOUND_CLAMP`` (10^40) are clamped to it; ``format: regex`` allows a regular subset of the
  regexes valid in Python and ECMA-262
  (``json_scalars.valid_regex``: groups nested at most 3 deep, bounded counts).
- ``uniqueItems``: enforced over a finite item domain (:mod:`radixlm.grammar.json_unique`), else
  not enforced (accepted as written). ``nullable`` (OpenAPI) is an annotation,
  as in JSON Schema validators.
- Keywords apply in the draft ``$schema`` names (:mod:`radixlm.grammar.schema_drafts`); none: all.
- ``$ref`` is resolved with ``referencing`` (local pointers, anchors, ``$id``-relative). Remote
  documents are never fetched: a ``$ref`` to one is approximated soundly by polarity
  (:mod:`radixlm.grammar.schema_remote`: ``false`` where it constrains positively, ``true`` under
  ``not``; ``if`` / ``oneOf`` / ``maxContains`` / ``unevaluated*`` around one rewritten
  conservatively), with a warning naming the refs; a schema that needs one at its root, or a
  ``$ref`` into the document itself that does not resolve, is a GrammarError.
- A ``$ref`` to a definition being converted (recursion) beside sibling keywords, as an ``allOf``
  branch, or as an ``anyOf`` / ``oneOf`` branch beside the parent's keywords, converts under one
  name (the ``$ref`` and its siblings: :meth:`CombinatorMixin.recursive_allof`): its target merged
  once with the siblings, its own ``$ref`` s staying references, so the recursion ends as a rule
  (exact). Siblings that grow at each level (a new name each time) are a GrammarError after
  ``MERGED_NESTING`` levels.
- Compilation runs under a time budget (:mod:`radixlm.grammar.budget`); shared sub-schemas are
  converted once (memoized), large non-recursive schemas compile as grammars, and so does a schema
  whose single DFA is too large (``GrammarCompiler``: past ``MAX_DFA_STATES`` or ``DFA_SHARE`` of
  the budget); long scalars are then rules of their own.

Unsupported keywords raise :class:`GrammarError` naming the keyword.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from radixlm.grammar.ast import EMPTY, NOTHING, Node, Walk, alt, cat, char, lit, opt, rep
from radixlm.grammar.automaton import dfa_from_ast
from radixlm.grammar.budget import check_budget, compile_budget
from radixlm.grammar.dfa_ops import exactly_one
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.json_containers import ANY_RULE, ContainerMixin
from radixlm.grammar.json_separators import check_separators, separator_nodes, union_of_styles
from radixlm.grammar.json_lexical import ENUM_ORDERS_CHARS, NUMBER, string, value_literal
from radixlm.grammar.json_orders import GrammarRetry as _Recursive
from radixlm.grammar.json_scalars import clamped_bounds, number_node, string_node
from radixlm.grammar.schema_checks import implied_types, valid_values
from radixlm.grammar.schema_combinators import CombinatorMixin
from radixlm.grammar.schema_merge import resolve_pointer
from radixlm.grammar.schema_not import NotMixin, unchecked_error
from radixlm.grammar.schema_drafts import apply_dialect
from radixlm.grammar.schema_refs import canonical_refs
from radixlm.grammar.schema_memo import ConvertOnce
from radixlm.grammar.schema_normalize import NormalizeMixin

UNSUPPORTED = ("$dynamicRef", "$recursiveRef")
MAX_REGEX_SIZE = 200_000  # larger (as a tree) non-recursive schemas compile as grammars
RULE_SIZE = 2_000  # in a grammar, a $ref target larger than this becomes a rule of its own
LEAF_RULE_STATES = 400  # in a grammar, a scalar automaton larger than this too (see leaf_rule)


class SchemaConverter(ConvertOnce, ContainerMixin, NotMixin, CombinatorMixin, NormalizeMixin):
    """One conversion; see :func:`json_schema_to_ast`."""

    def __init__(self, root: Any, any_whitespace: bool, grammar_mode: bool, closed: bool = False,
                 separators: str = "either") -> None:
        self.root = root
        self.grammar_mode = grammar_mode
        self.closed = closed  # NOTE: no undeclared keys where the schema is silent (json_schema_to_ast)
        self.comma, self.colon, self.inner = separator_nodes(any_whitespace, separators)
        self.rules: dict[str, Node] = {}
        self.recursive: set[str] = set()
        self.stack: list[str] = []
        self.uid = itertools.count()
        self.done: dict[str, Node] = {}
        self.obj_depth = 0  # objects around the one being converted (see ``extra_value``)
        self.walk = Walk()
        self.leaves: dict[int, str] = {}  # id of a large scalar automaton -> its rule (leaf_rule)
        self.split_leaves = False
        self.strings: dict[str, Node] = {}  # string keywords (canonical JSON) -> their automaton
        self.converted: dict[int, tuple[Any, Node]] = {}  # see ConvertOnce
        self.objects: dict[tuple[str, bool], Node] = {}

    # --- entry points -------------------------------------------------------------------------

    def _node(self, schema: Any) -> Node:
        if schema is True:
            return self.any_value()
        if schema is False:
            return NOTHING
        if not isinstance(schema, dict):
            raise GrammarError(f"a schema must be an object or a boolean, got {type(schema).__name__}")
        check_budget("converting the schema")
        key = self.merged_key(schema)
        if key is not None and self.types_apart(schema):
            return NOTHING
        if key is not None:  # NOTE: a $ref with siblings: converted once per distinct siblings
            return self.shared(key, lambda: self.normalize(schema, expand=True))
        schema = self.normalize(schema)
        if not isinstance(schema, dict):
            return self.node(schema)
        if "$ref" in schema:
            key = self.merged_key(schema)
            if key is None:
                return self.ref(schema["$ref"])
            if self.types_apart(schema):
                return NOTHING
            return self.shared(key, lambda: self.normalize(schema, expand=True))
        if "x-any" in schema or "anyOf" in schema or "oneOf" in schema:
            return self.combinator(schema)
        for key in UNSUPPORTED:
            if key in schema:
                raise GrammarError(f"unsupported JSON Schema keyword: {key!r}")
        err = unchecked_error(schema)
        if err is not None:
            raise err
        # NOTE: uniqueItems is accepted without being enforced (see the module docstring).
        extra = schema.get("x-all", {})
        nots = list(schema.get("x-nots", []))
        types = implied_types(schema)
        for n in nots:
            types = self.apply_not_types(schema, n, types)
        if "enum" in schema or "const" in schema:
            # NOTE: the values are filtered by the nots too (exact, also for numbers: 2 == 2.0)
            values = valid_values(schema, self.root)
            nots = []
            orders = len(json.dumps(values)) <= ENUM_ORDERS_CHARS  # NOTE: every key order of small objects
            out = alt(*(self.literal(v, orders) for v in values))
        elif types is None:
            out = self.any_value()
        else:
            t_list = [t for t in ("null", "boolean", "object", "array", "string", "number", "integer") if t in types]
            if "number" in types:
                t_list.remove("integer")
            out = alt(*(self.typed(schema, t, extra) for t in t_list))
            if "x-fraction" in types:  # NOTE: numbers that are not integers (not {type: integer})
                out = alt(out, self.fraction(schema, extra))
        for n in nots:
            out = self.apply_not(schema, n, out)
        return out

    def ref(self, ref: str) -> Node:
        """The node of a ``$ref`` target: converted once (a DAG, not a tree, when shared);
        recursive targets (and, in a grammar, large ones) become rules."""
        return self.shared(ref, lambda: resolve_pointer(self.root, ref))

    def shared(self, ref: str, target: Any) -> Node:
        """The node of the schema ``target()`` under the name ``ref`` (a ``$ref``, or a ``$ref``
        merged with sibling keywords, see ``merged_key``): converted once per name; met again
        while it is being converted, a rule (grammar mode) or a retry as a grammar."""
        got = self.done.get(ref)
        if got is not None:
            return got
        if ref in self.rules or ref in self.stack:
            self.recursive.add(ref)
            if not self.grammar_mode:
                raise _Recursive()
            return ("ref", ref)
        self.check_merged_nesting(ref)
        self.stack.append(ref)
        try:
            out = self.node(target())
        finally:
            self.stack.pop()
        if ref in self.recursive or (self.grammar_mode and self.walk.size(out) > RULE_SIZE):
            self.rules[ref] = out
            out = ("ref", ref)
        elif not self.grammar_mode and self.walk.size(out) > MAX_REGEX_SIZE:
            raise _Recursive(large=True)
        self.done[ref] = out
        return out

    def literal(self, value: Any, orders: bool = True) -> Node:
        return value_literal(value, self.comma, self.colon, self.inner, orders)

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
            return _leaf(lit("null"))
        if t == "boolean":
            return _leaf(alt(lit("true"), lit("false")))
        if t in ("integer", "number"):
            return self.leaf_rule(_leaf(number_node(clamped_bounds(schema), extra, t == "integer")))
        if t == "string":
            return self.leaf_rule(self.string_leaf(schema, extra))
        if t == "array":
            return self.array(schema)
        return self.object_once(schema)

    def string_leaf(self, schema: dict, extra: dict) -> Node:
        """A string value's automaton, built once per conversion for the same length bounds,
        patterns and formats (a pattern times a length counter can be tens of thousands of states,
        and a schema repeats the same string definition in many objects)."""
        own = {k: schema[k] for k in ("minLength", "maxLength", "pattern", "format") if k in schema}
        more = {k: extra[k] for k in ("pattern", "format") if k in extra}
        try:
            key = json.dumps([own, more], sort_keys=True)
        except (TypeError, ValueError):
            return _leaf(string_node(schema, extra))
        got = self.strings.get(key)
        if got is None:
            got = self.strings[key] = _leaf(string_node(schema, extra))
        return got

    def leaf_rule(self, node: Node) -> Node:
        """In a grammar compiled because one automaton was too large (``split_leaves``), a scalar
        automaton over ``LEAF_RULE_STATES`` states (a long ``maxLength`` string) becomes a rule of
        its own, one per distinct automaton: the pieces around it stay small and every use shares
        one terminal."""
        if not self.split_leaves or node[0] != "dfa" or node[1].n_states <= LEAF_RULE_STATES:
            return node
        name = self.leaves.get(id(node[1]))
        if name is None:
            name = self.leaves[id(node[1])] = f"__leaf{len(self.leaves)}"
            self.rules[name] = node
        return ("ref", name)


def _leaf(node: Node) -> Node:
    """A scalar value as an embedded DFA (memoized per process by its AST): an object built
    around it copies the DFA's states in bulk instead of determinizing them again (see
    :mod:`radixlm.grammar.determinize`)."""
    if node in (EMPTY, NOTHING) or node[0] == "dfa":
        return node
    got = dfa_from_ast(node)
    return ("dfa", got) if got.start else NOTHING


def parse_schema(schema: str | dict | bool) -> Any:
    if isinstance(schema, str):
        try:
            return json.loads(schema)
        except json.JSONDecodeError as e:
            raise GrammarError(f"json_schema is not valid JSON: {e}") from None
    if isinstance(schema, (dict, bool)):
        return schema
    raise GrammarError(f"json_schema must be a str or dict, got {type(schema).__name__}")


def json_schema_to_ast(schema: str | dict | bool, any_whitespace: bool = False,
                       grammar: bool = False, closed: bool = False,
                       separators: str = "either") -> tuple[Node, dict[str, Node]]:
    """Convert a JSON Schema (within the current compile budget, see
    :mod:`radixlm.grammar.budget`).

    Args:
        grammar: convert as a grammar even when the schema is not recursive (a schema whose single
            automaton is too large: undeclared values are then any JSON value).
        closed: objects that declare (pattern) properties and are silent on additional /
            unevaluated ones take no undeclared keys (xgrammar's ``strict_mode``); a sound subset.
        separators: ``"either"`` (default: every comma ``,`` or ``, ``, every colon ``:`` or
            ``: ``), ``"compact"``, ``"spaced"`` or ``"consistent"`` (either style, the first
            separator fixing it for the document; about twice the work): see
            :mod:`radixlm.grammar.json_separators`. Only ``"either"`` with ``any_whitespace``.
    Returns:
        ``(root, rules)``: ``rules`` is empty for a non-recursive schema (``root`` is then a plain
        regex AST); otherwise ``root`` and the rules contain ``("ref", name)`` nodes.
    Raises:
        GrammarError: invalid JSON or schema, an unsupported keyword (named in the message), or a
            schema too large for the compile budget.
    """
    check_separators(any_whitespace, separators)
    with compile_budget():
        try:
            root = canonical_refs(apply_dialect(parse_schema(schema)))
            if separators != "consistent":
                return _convert(root, any_whitespace, grammar, closed, separators)
            return union_of_styles(_convert(root, False, grammar, closed, "compact"),
                                   _convert(root, False, grammar, closed, "spaced"))
        except GrammarError:
            raise
        except RecursionError:
            raise GrammarError("schema nesting too deep") from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError) as e:
            raise GrammarError(f"invalid or unsupported schema ({type(e).__name__}: {e})") from None


def _convert(root: Any, any_whitespace: bool, grammar: bool, closed: bool,
             separators: str) -> tuple[Node, dict[str, Node]]:
    try:
        if grammar:
            raise _Recursive(large=True)
        conv = SchemaConverter(root, any_whitespace, grammar_mode=False, closed=closed, separators=separators)
        node = conv.node(root)
        if conv.walk.size(node) > MAX_REGEX_SIZE:
            raise _Recursive(large=True)
        return node, {}
    except _Recursive as e:
        conv = SchemaConverter(root, any_whitespace, grammar_mode=True, closed=closed, separators=separators)
        conv.split_leaves = e.large
        node = conv.node(root)
        if not conv.rules:  # NOTE: the Earley engine needs a rule: the root value as one
            conv.rules["__root"] = node
            node = ("ref", "__root")
        return node, conv.rules

